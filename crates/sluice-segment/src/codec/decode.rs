//! The decoder: every length checked against the bytes that remain before anything is
//! allocated, UTF-8 validated, never a panic; [`EventDecoder`] reuses the previous event's root
//! keys when the next event repeats them.

use std::str;

use sluice_core::{Event, Map, SharedText, Str, Value};

use super::*;

/// UTF-8 validation. Most log text is ASCII, which a word-at-a-time scan confirms faster than
/// the general validator's entry costs for short strings; anything else goes to `from_utf8`.
#[inline(always)]
fn utf8(bytes: &[u8]) -> Result<&str, CodecError> {
    if bytes.is_ascii() {
        // SAFETY: ASCII is valid UTF-8.
        return Ok(unsafe { str::from_utf8_unchecked(bytes) });
    }
    str::from_utf8(bytes).map_err(|_| CodecError::InvalidUtf8)
}

/// Decoding state. Container decoding reports failure through `err` rather than `Result`, so
/// values are built where they are stored instead of being moved through `Result` temporaries.
struct Reader<'a, 'k> {
    buf: &'a [u8],
    pos: usize,
    err: Option<CodecError>,
    /// Root keys of the previous event, by position (empty when not caching).
    keys: &'k mut [Str],
    /// The buffer `buf` lies in, when strings may point into it rather than be copied.
    shared: Option<&'a SharedText>,
}

impl<'a, 'k> Reader<'a, 'k> {
    fn new(buf: &'a [u8], keys: &'k mut [Str]) -> Self {
        Reader { buf, pos: 0, err: None, keys, shared: None }
    }

    #[inline(always)]
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Records the first error and makes every later read fail; returns a placeholder.
    #[cold]
    #[inline(never)]
    fn fail(&mut self, e: CodecError) -> Value {
        self.err.get_or_insert(e);
        self.pos = self.buf.len();
        Value::Null
    }

    #[inline(always)]
    fn finish<T>(&mut self, v: T) -> Result<T, CodecError> {
        match self.err.take() {
            None => Ok(v),
            Some(e) => Err(e),
        }
    }

    #[inline(always)]
    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        let s = self.buf.get(self.pos..self.pos + n).ok_or(CodecError::UnexpectedEnd)?;
        self.pos += n;
        Ok(s)
    }

    #[inline(always)]
    fn varint(&mut self) -> Result<u64, CodecError> {
        match self.buf.get(self.pos) {
            Some(&b) if b < 0x80 => {
                self.pos += 1;
                Ok(u64::from(b))
            }
            _ => self.varint_slow(),
        }
    }

    fn varint_slow(&mut self) -> Result<u64, CodecError> {
        let rest = &self.buf[self.pos..];
        let mut v = 0u64;
        // `take(10)` bounds the loop, the iterator carries the bounds check.
        for (i, &b) in rest.iter().take(10).enumerate() {
            if i == 9 && b > 1 {
                return Err(CodecError::VarintOverflow);
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                self.pos += i + 1;
                return Ok(v);
            }
        }
        Err(if rest.len() < 10 { CodecError::UnexpectedEnd } else { CodecError::VarintOverflow })
    }

    /// A count of items of at least `min_size` bytes each, checked against what remains.
    #[inline(always)]
    fn count(&mut self, min_size: usize) -> Result<usize, CodecError> {
        let n = self.varint()?;
        if n > (self.remaining() / min_size) as u64 {
            return Err(CodecError::LengthOutOfBounds(n));
        }
        Ok(n as usize)
    }

    /// A length-prefixed run of bytes (a string's or a key's, not yet checked as UTF-8).
    #[inline(always)]
    fn prefixed(&mut self) -> Result<&'a [u8], CodecError> {
        let n = self.count(1)?;
        self.take(n)
    }

    #[inline(always)]
    fn str(&mut self) -> Result<&'a str, CodecError> {
        utf8(self.prefixed()?)
    }

    /// A string value: a slice of the shared buffer when there is one and the text is too long
    /// to be inline, else its own copy.
    #[inline(always)]
    fn string(&mut self) -> Result<Str, CodecError> {
        let Some(text) = self.shared else { return self.str().map(Str::from) };
        let bytes = self.prefixed()?;
        match text.range_of(bytes) {
            Some(range) => text.slice(range).map_err(|_| CodecError::InvalidUtf8),
            None => utf8(bytes).map(Str::from),
        }
    }

    /// The key of entry `i` of a map at `depth`. Events of one source repeat their root keys in
    /// the same order, so a root key equal to the one at the same position in the previous
    /// event is a copy of that one: no UTF-8 check, no construction.
    #[inline(always)]
    fn key(&mut self, i: usize, depth: usize) -> Result<Str, CodecError> {
        let bytes = self.prefixed()?;
        if depth == 0
            && let Some(cached) = self.keys.get_mut(i)
        {
            if cached.as_bytes() == bytes {
                return Ok(cached.clone());
            }
            let k = Str::from(utf8(bytes)?);
            if k.is_inline() {
                *cached = k.clone();
            }
            return Ok(k);
        }
        Ok(Str::from(utf8(bytes)?))
    }

    /// An object's entries. On error, `err` is set and a partial map returned.
    fn map(&mut self, depth: usize) -> Map {
        // Each entry is at least a key length and a tag.
        let n = match self.count(2) {
            Ok(n) => n,
            Err(e) => {
                self.fail(e);
                return Map::new();
            }
        };
        let mut m = Map::with_capacity(n.min(MAX_PREALLOC));
        for i in 0..n {
            let k = match self.key(i, depth) {
                Ok(k) => k,
                Err(e) => {
                    self.fail(e);
                    break;
                }
            };
            // Keys of an encoded map came from a `Map`, so they are unique.
            self.value_into(depth, |v| m.push_unchecked(k, v));
            if self.err.is_some() {
                break;
            }
        }
        m
    }

    /// One tagged value; on error, `err` is set and `Null` returned.
    #[inline(always)]
    fn value(&mut self, depth: usize) -> Value {
        let mut out = Value::Null;
        self.value_into(depth, |v| out = v);
        out
    }

    /// Decodes one tagged value and hands it to `sink` (not called on error, when `err` is
    /// set). Scalars are decoded inline and each arm calls `sink` itself, so the value is built
    /// where `sink` stores it rather than in a temporary that is then copied (which costs a
    /// store-forwarding stall per value); containers go through [`Reader::container`].
    #[inline(always)]
    fn value_into(&mut self, depth: usize, sink: impl FnOnce(Value)) {
        let Some(&tag) = self.buf.get(self.pos) else {
            self.fail(CodecError::UnexpectedEnd);
            return;
        };
        self.pos += 1;
        let r = match tag {
            TAG_NULL | TAG_FALSE | TAG_TRUE => {
                sink(match tag {
                    TAG_NULL => Value::Null,
                    t => Value::Bool(t == TAG_TRUE),
                });
                Ok(())
            }
            TAG_INT => self.varint().map(|n| sink(Value::Int(unzigzag(n)))),
            TAG_FLOAT => self
                .take(8)
                .map(|b| sink(Value::Float(f64::from_bits(u64::from_le_bytes(b.try_into().expect("8 bytes")))))),
            TAG_STRING => self.string().map(|s| sink(Value::String(s))),
            TAG_TIMESTAMP => self.varint().map(|n| sink(Value::Timestamp(unzigzag(n)))),
            tag => {
                let v = self.container(tag, depth);
                if self.err.is_none() {
                    sink(v);
                }
                return;
            }
        };
        if let Err(e) = r {
            self.fail(e);
        }
    }

    #[inline(never)]
    fn container(&mut self, tag: u8, depth: usize) -> Value {
        if tag > TAG_OBJECT {
            return self.fail(CodecError::UnknownTag(tag));
        }
        if depth >= MAX_DEPTH {
            return self.fail(CodecError::TooDeep);
        }
        if tag == TAG_OBJECT {
            return Value::Object(self.map(depth + 1));
        }
        let n = match self.count(1) {
            Ok(n) => n,
            Err(e) => return self.fail(e),
        };
        let mut a = Vec::with_capacity(n.min(MAX_PREALLOC));
        for _ in 0..n {
            self.value_into(depth + 1, |v| a.push(v));
            if self.err.is_some() {
                break;
            }
        }
        Value::Array(a)
    }
}

/// Runs `f` over `input` and advances `input` past what it consumed (on success only).
#[inline(always)]
fn read<T>(input: &mut &[u8], keys: &mut [Str], f: impl FnOnce(&mut Reader<'_, '_>) -> T) -> Result<T, CodecError> {
    let mut r = Reader::new(input, keys);
    let v = f(&mut r);
    let v = r.finish(v)?;
    *input = &input[r.pos..];
    Ok(v)
}

/// How many root keys a decoder remembers.
const KEY_CACHE: usize = 32;

fn key_cache() -> [Str; KEY_CACHE] {
    std::array::from_fn(|_| Str::default())
}

/// A decoder that keeps state between events: the root keys of the last event decoded, which
/// the next event from the same source usually repeats in the same order. Decoding a stream of
/// single-event frames with one `EventDecoder` skips re-validating and rebuilding those keys.
/// Holds no allocation of its own (keys longer than 24 bytes are not remembered).
pub struct EventDecoder {
    keys: [Str; KEY_CACHE],
}

impl Default for EventDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl EventDecoder {
    pub fn new() -> Self {
        EventDecoder { keys: key_cache() }
    }

    /// [`decode_event`] with this decoder's key memory.
    pub fn decode_event(&mut self, input: &mut &[u8]) -> Result<Event, CodecError> {
        read(input, &mut self.keys, |r| r.map(0)).map(Event::new)
    }

    /// [`decode_event_body`] with this decoder's key memory.
    pub fn decode_event_body(&mut self, mut body: &[u8]) -> Result<Event, CodecError> {
        let e = self.decode_event(&mut body)?;
        if body.is_empty() { Ok(e) } else { Err(CodecError::TrailingBytes(body.len())) }
    }

    /// Decodes a frame body, as [`EventDecoder::decode_event_body`] does, and pushes the event
    /// onto `out`. When `body` lies in `text`, string values longer than the inline limit point
    /// into `text` instead of being copied (see [`SharedText`]); a body from anywhere else is
    /// decoded with copies.
    ///
    /// Why it pushes rather than returns: returned through `Result`s, an event is copied a few
    /// times on its way into the caller's vector, and those copies of an enum with a niche
    /// compile to overlapping stores that stall loads; a reader decoding a window of frames
    /// spent more time there than in the rest of its loop.
    pub fn decode_event_body_into<'a>(
        &mut self,
        body: &'a [u8],
        text: Option<&'a SharedText>,
        out: &mut Vec<Event>,
    ) -> Result<(), CodecError> {
        let mut r = Reader::new(body, &mut self.keys);
        r.shared = text;
        let fields = r.map(0);
        if let Some(e) = r.err.take() {
            return Err(e);
        }
        if r.pos != body.len() {
            return Err(CodecError::TrailingBytes(body.len() - r.pos));
        }
        out.push(Event::new(fields));
        Ok(())
    }

    /// [`decode_batch_into`] with this decoder's key memory.
    pub fn decode_batch_into(&mut self, input: &mut &[u8], out: &mut Vec<Event>) -> Result<usize, CodecError> {
        batch_into(input, &mut self.keys, out)
    }
}

/// Decodes one event from the front of `input` and advances `input` past it.
pub fn decode_event(input: &mut &[u8]) -> Result<Event, CodecError> {
    read(input, &mut [], |r| r.map(0)).map(Event::new)
}

/// Decodes a frame body holding exactly one event (codec [`CODEC_EVENT`](crate::format::CODEC_EVENT)).
pub fn decode_event_body(mut body: &[u8]) -> Result<Event, CodecError> {
    let e = decode_event(&mut body)?;
    if body.is_empty() { Ok(e) } else { Err(CodecError::TrailingBytes(body.len())) }
}

/// Decodes a batch from the front of `input`, appending its events to `out`; returns how many.
/// On error `out` keeps the events it had before the call and `input` is not advanced.
pub fn decode_batch_into(input: &mut &[u8], out: &mut Vec<Event>) -> Result<usize, CodecError> {
    batch_into(input, &mut key_cache(), out)
}

fn batch_into(input: &mut &[u8], keys: &mut [Str], out: &mut Vec<Event>) -> Result<usize, CodecError> {
    let before = out.len();
    let r = read(input, keys, |r| {
        let n = match r.count(1) {
            Ok(n) => n,
            Err(e) => {
                r.fail(e);
                return 0;
            }
        };
        out.reserve(n.min(MAX_PREALLOC));
        for _ in 0..n {
            let fields = r.map(0);
            if r.err.is_some() {
                break;
            }
            out.push(Event::new(fields));
        }
        n
    });
    if r.is_err() {
        out.truncate(before);
    }
    r
}

/// Decodes a frame body holding exactly one batch (codec [`CODEC_BATCH`](crate::format::CODEC_BATCH)).
pub fn decode_batch_body(mut body: &[u8]) -> Result<Vec<Event>, CodecError> {
    let mut out = Vec::new();
    decode_batch_into(&mut body, &mut out)?;
    if body.is_empty() { Ok(out) } else { Err(CodecError::TrailingBytes(body.len())) }
}

/// Decodes one tagged value from the front of `input` and advances `input` past it.
pub fn decode_value(input: &mut &[u8]) -> Result<Value, CodecError> {
    read(input, &mut [], |r| r.value(0))
}

/// Decodes an unsigned LEB128 varint from the front of `input` and advances `input` past it.
pub fn get_varint(input: &mut &[u8]) -> Result<u64, CodecError> {
    let mut r = Reader::new(input, &mut []);
    let v = r.varint()?;
    *input = &input[r.pos..];
    Ok(v)
}
