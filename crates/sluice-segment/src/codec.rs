//! A compact binary encoding of events (codec ids [`CODEC_EVENT`](crate::format::CODEC_EVENT)
//! and [`CODEC_BATCH`](crate::format::CODEC_BATCH), version 1).
//!
//! Grammar (`varint` is unsigned LEB128, at most 10 bytes; `zigzag` maps `i64` to `u64` as
//! `(n << 1) ^ (n >> 63)`):
//!
//! ```text
//! batch  = varint(count) event{count}
//! event  = map                                  the root object, without a tag
//! map    = varint(count) (string value){count}  keys in insertion order, unique
//! string = varint(byte length) UTF-8 bytes
//! value  = 0x00                                 null
//!        | 0x01 | 0x02                          false | true
//!        | 0x03 varint(zigzag(i64))             integer
//!        | 0x04 f64 as 8 bytes LE               float (bit pattern kept, NaN included)
//!        | 0x05 string                          string
//!        | 0x06 varint(zigzag(i64))             timestamp, nanoseconds since the Unix epoch
//!        | 0x07 varint(count) value{count}      array
//!        | 0x08 map                             object
//! ```
//!
//! Containers nest at most [`MAX_DEPTH`] levels below the root object; the encoder refuses what
//! the decoder would refuse, so whatever is written can be read back. Decoding checks every
//! length against the bytes that remain before allocating, validates UTF-8, and never panics.

use std::str;

use sluice_core::{Event, Map, SharedText, Str, Value};

use crate::buf::ByteBuf;

/// Deepest container nesting below an event's root object (the root itself is level 0).
pub const MAX_DEPTH: usize = 128;

/// Upper bound on what a decoded count preallocates; longer containers grow as they fill.
const MAX_PREALLOC: usize = 1024;

const TAG_NULL: u8 = 0;
const TAG_FALSE: u8 = 1;
const TAG_TRUE: u8 = 2;
const TAG_INT: u8 = 3;
const TAG_FLOAT: u8 = 4;
const TAG_STRING: u8 = 5;
const TAG_TIMESTAMP: u8 = 6;
const TAG_ARRAY: u8 = 7;
const TAG_OBJECT: u8 = 8;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("encoded event ends early")]
    UnexpectedEnd,
    #[error("varint longer than 64 bits")]
    VarintOverflow,
    #[error("length or count {0} exceeds the bytes that remain")]
    LengthOutOfBounds(u64),
    #[error("unknown value tag {0:#04x}")]
    UnknownTag(u8),
    #[error("string is not valid UTF-8")]
    InvalidUtf8,
    #[error("values nest deeper than {MAX_DEPTH} levels")]
    TooDeep,
    #[error("{0} bytes left over after the encoded data")]
    TrailingBytes(usize),
}

// ---------------------------------------------------------------------------------------------
// Encoding

#[inline(always)]
fn zigzag(n: i64) -> u64 {
    ((n << 1) ^ (n >> 63)) as u64
}

#[inline(always)]
fn unzigzag(n: u64) -> i64 {
    ((n >> 1) as i64) ^ -((n & 1) as i64)
}

/// Appends `v` as unsigned LEB128.
#[inline(always)]
pub fn put_varint<B: ByteBuf>(out: &mut B, mut v: u64) {
    if v < 0x80 {
        out.push(v as u8);
        return;
    }
    let mut buf = [0u8; 10];
    let mut i = 0;
    while v >= 0x80 {
        buf[i] = v as u8 | 0x80;
        v >>= 7;
        i += 1;
    }
    buf[i] = v as u8;
    out.extend_from_slice(&buf[..=i]);
}

#[inline(always)]
fn put_str<B: ByteBuf>(out: &mut B, s: &str) {
    put_varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn put_map<B: ByteBuf>(out: &mut B, m: &Map, depth: usize) -> Result<(), CodecError> {
    put_varint(out, m.len() as u64);
    for (k, v) in m.iter() {
        put_str(out, k);
        put_value(out, v, depth)?;
    }
    Ok(())
}

fn put_value<B: ByteBuf>(out: &mut B, v: &Value, depth: usize) -> Result<(), CodecError> {
    match v {
        Value::Null => out.push(TAG_NULL),
        Value::Bool(false) => out.push(TAG_FALSE),
        Value::Bool(true) => out.push(TAG_TRUE),
        Value::Int(i) => {
            out.push(TAG_INT);
            put_varint(out, zigzag(*i));
        }
        Value::Float(f) => {
            let mut b = [TAG_FLOAT; 9];
            b[1..].copy_from_slice(&f.to_bits().to_le_bytes());
            out.extend_from_slice(&b);
        }
        Value::String(s) => {
            out.push(TAG_STRING);
            put_str(out, s);
        }
        Value::Timestamp(ns) => {
            out.push(TAG_TIMESTAMP);
            put_varint(out, zigzag(*ns));
        }
        Value::Array(a) => {
            if depth >= MAX_DEPTH {
                return Err(CodecError::TooDeep);
            }
            out.push(TAG_ARRAY);
            put_varint(out, a.len() as u64);
            for v in a {
                put_value(out, v, depth + 1)?;
            }
        }
        Value::Object(m) => {
            if depth >= MAX_DEPTH {
                return Err(CodecError::TooDeep);
            }
            out.push(TAG_OBJECT);
            put_map(out, m, depth + 1)?;
        }
    }
    Ok(())
}

/// Runs `f`, and on error truncates `out` back to where it was.
#[inline(always)]
fn atomically<B: ByteBuf>(out: &mut B, f: impl FnOnce(&mut B) -> Result<(), CodecError>) -> Result<(), CodecError> {
    let start = out.len();
    let r = f(out);
    if r.is_err() {
        out.truncate(start);
    }
    r
}

/// Appends one event. Fails only with [`CodecError::TooDeep`], leaving `out` as it was.
pub fn encode_event<B: ByteBuf>(event: &Event, out: &mut B) -> Result<(), CodecError> {
    if let Some(bound) = flat::bound(&event.fields) {
        flat::put_map(out, &event.fields, bound);
        return Ok(());
    }
    atomically(out, |out| put_map(out, &event.fields, 0))
}

/// The encoding of a map whose values are all scalars or strings (most events), written
/// with one reservation and without the per-piece capacity checks and copy calls of the
/// general path. It writes the same bytes.
///
/// Why: with a CRC and a copy of its text, encoding such an event was about 100 ns, most of it
/// spent on a dozen small appends (each a capacity check and a length update through memory,
/// the short ones a call to `memcpy`), not on its bytes.
mod flat {
    use std::ptr;

    use sluice_core::{Map, Value};

    use super::ByteBuf;
    use super::{TAG_FALSE, TAG_FLOAT, TAG_INT, TAG_NULL, TAG_STRING, TAG_TIMESTAMP, TAG_TRUE, zigzag};

    /// The most bytes a varint takes.
    const VARINT_MAX: usize = 10;

    /// An upper bound on the encoding of `m`, or `None` if a value is a container.
    #[inline]
    pub fn bound(m: &Map) -> Option<usize> {
        let mut bytes = VARINT_MAX;
        for (k, v) in m.iter() {
            bytes += VARINT_MAX + k.len() + 1;
            bytes += match v {
                Value::Null | Value::Bool(_) => 0,
                Value::Int(_) | Value::Timestamp(_) => VARINT_MAX,
                Value::Float(_) => 8,
                Value::String(s) => VARINT_MAX + s.len(),
                Value::Array(_) | Value::Object(_) => return None,
            };
        }
        Some(bytes)
    }

    /// Appends `m`, which [`bound`] found flat and at most `bound` bytes long.
    pub fn put_map<B: ByteBuf>(out: &mut B, m: &Map, bound: usize) {
        out.reserve(bound);
        let start = out.len();
        // SAFETY: `bound` bytes of spare capacity were just reserved, and `bound` covers every
        // byte written below (each piece is counted at its largest); the length is set only
        // over bytes written.
        unsafe {
            let base = out.as_mut_ptr().add(start);
            let mut at = base;
            at = varint(at, m.len() as u64);
            for (k, v) in m.iter() {
                at = string(at, k.as_bytes());
                match v {
                    Value::Null => at = byte(at, TAG_NULL),
                    Value::Bool(false) => at = byte(at, TAG_FALSE),
                    Value::Bool(true) => at = byte(at, TAG_TRUE),
                    Value::Int(i) => at = varint(byte(at, TAG_INT), zigzag(*i)),
                    Value::Float(f) => {
                        at = byte(at, TAG_FLOAT);
                        ptr::write_unaligned(at.cast::<[u8; 8]>(), f.to_bits().to_le_bytes());
                        at = at.add(8);
                    }
                    Value::String(s) => at = string(byte(at, TAG_STRING), s.as_bytes()),
                    Value::Timestamp(ns) => at = varint(byte(at, TAG_TIMESTAMP), zigzag(*ns)),
                    Value::Array(_) | Value::Object(_) => unreachable!("bound() refuses containers"),
                }
            }
            let written = at.offset_from(base) as usize;
            debug_assert!(written <= bound);
            out.set_len(start + written);
        }
    }

    #[inline(always)]
    unsafe fn byte(at: *mut u8, b: u8) -> *mut u8 {
        // SAFETY: the caller has room for one byte at `at`.
        unsafe {
            at.write(b);
            at.add(1)
        }
    }

    #[inline(always)]
    unsafe fn varint(mut at: *mut u8, mut v: u64) -> *mut u8 {
        // SAFETY: the caller has room for `VARINT_MAX` bytes at `at`.
        unsafe {
            while v >= 0x80 {
                at = byte(at, v as u8 | 0x80);
                v >>= 7;
            }
            byte(at, v as u8)
        }
    }

    #[inline(always)]
    unsafe fn string(at: *mut u8, bytes: &[u8]) -> *mut u8 {
        // SAFETY: the caller has room for a varint and `bytes` at `at`.
        unsafe {
            let at = varint(at, bytes.len() as u64);
            copy(bytes, at);
            at.add(bytes.len())
        }
    }

    /// Copies `src` to `dst`; short ones (keys, mostly) with a few overlapping loads and
    /// stores inside both ranges rather than a call.
    #[inline(always)]
    unsafe fn copy(src: &[u8], dst: *mut u8) {
        let (s, n) = (src.as_ptr(), src.len());
        // SAFETY: every access is within `src` (`n` bytes) and within the `n` bytes the
        // caller has at `dst`; the two never overlap (`dst` is in a vector `src` is not in).
        unsafe {
            if n > 16 {
                ptr::copy_nonoverlapping(s, dst, n);
            } else if n >= 8 {
                let (a, b) = (s.cast::<u64>().read_unaligned(), s.add(n - 8).cast::<u64>().read_unaligned());
                dst.cast::<u64>().write_unaligned(a);
                dst.add(n - 8).cast::<u64>().write_unaligned(b);
            } else if n >= 4 {
                let (a, b) = (s.cast::<u32>().read_unaligned(), s.add(n - 4).cast::<u32>().read_unaligned());
                dst.cast::<u32>().write_unaligned(a);
                dst.add(n - 4).cast::<u32>().write_unaligned(b);
            } else if n > 0 {
                *dst = *s;
                *dst.add(n / 2) = *s.add(n / 2);
                *dst.add(n - 1) = *s.add(n - 1);
            }
        }
    }
}

/// Appends a batch: a varint count, then each event. Accepts `&[Event]`, `&Vec<Event>`, or
/// `refs.iter().copied()` for a `&[&Event]`. On error `out` is left as it was.
pub fn encode_batch<'e, I>(events: I, out: &mut Vec<u8>) -> Result<(), CodecError>
where
    I: IntoIterator<Item = &'e Event>,
    I::IntoIter: ExactSizeIterator,
{
    let events = events.into_iter();
    atomically(out, |out| {
        put_varint(out, events.len() as u64);
        for e in events {
            put_map(out, &e.fields, 0)?;
        }
        Ok(())
    })
}

/// Appends one tagged value (for records that carry values outside an event, like DLQ entries).
pub fn encode_value(value: &Value, out: &mut Vec<u8>) -> Result<(), CodecError> {
    atomically(out, |out| put_value(out, value, 0))
}

// ---------------------------------------------------------------------------------------------
// Decoding

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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Equality that compares floats by bit pattern, so NaN equals itself.
    fn same(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Float(x), Value::Float(y)) => x.to_bits() == y.to_bits(),
            (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b)),
            (Value::Object(x), Value::Object(y)) => same_map(x, y),
            _ => a == b,
        }
    }

    fn same_map(x: &Map, y: &Map) -> bool {
        x.len() == y.len() && x.iter().zip(y.iter()).all(|((ka, va), (kb, vb))| ka == kb && same(va, vb))
    }

    fn map_of(entries: Vec<(String, Value)>) -> Map {
        let mut m = Map::with_capacity(entries.len());
        for (k, v) in entries {
            m.insert(k, v);
        }
        m
    }

    fn arb_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::Int),
            any::<f64>().prop_map(Value::Float),
            any::<u64>().prop_map(|bits| Value::Float(f64::from_bits(bits))),
            Just(Value::Float(f64::NAN)),
            "\\PC{0,60}".prop_map(Value::from),
            "[a-z]{0,40}".prop_map(Value::from),
            any::<i64>().prop_map(Value::Timestamp),
        ];
        leaf.prop_recursive(4, 48, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                prop::collection::vec(("\\PC{0,16}", inner), 0..8).prop_map(|kv| Value::Object(map_of(kv))),
            ]
        })
    }

    fn arb_event() -> impl Strategy<Value = Event> {
        prop::collection::vec(("[@a-z_]{1,12}|.{0,30}", arb_value()), 0..16).prop_map(|kv| Event::new(map_of(kv)))
    }

    fn sample_event() -> Event {
        let mut inner = Map::new();
        inner.insert("code", Value::Int(-7));
        inner.insert("tags", Value::Array(vec![Value::from("a"), Value::Null, Value::Bool(true)]));
        let mut e = Event::from_message_at("GET /index.html 200 — ünïcødé", 1_700_000_000_123_456_789);
        e.fields.insert("bytes", Value::Int(i64::MAX));
        e.fields.insert("min", Value::Int(i64::MIN));
        e.fields.insert("ratio", Value::Float(-0.0));
        e.fields.insert("nan", Value::Float(f64::NAN));
        e.fields.insert("off", Value::Bool(false));
        e.fields.insert("before_epoch", Value::Timestamp(-1));
        e.fields.insert("detail", Value::Object(inner));
        e.fields.insert("long", Value::from("x".repeat(300)));
        e
    }

    #[test]
    fn exact_bytes_of_a_small_event() {
        let mut m = Map::new();
        m.push_unchecked("a", Value::Int(-1));
        m.push_unchecked("b", Value::Array(vec![Value::Null, Value::Bool(true), Value::from("hi")]));
        m.push_unchecked("t", Value::Timestamp(64));
        let mut out = Vec::new();
        encode_event(&Event::new(m), &mut out).unwrap();
        assert_eq!(
            out,
            [
                3,
                1,
                b'a',
                TAG_INT,
                1,
                1,
                b'b',
                TAG_ARRAY,
                3,
                TAG_NULL,
                TAG_TRUE,
                TAG_STRING,
                2,
                b'h',
                b'i',
                1,
                b't',
                TAG_TIMESTAMP,
                0x80,
                1
            ]
        );
    }

    #[test]
    fn round_trips_a_sample_event() {
        let e = sample_event();
        let mut out = Vec::new();
        encode_event(&e, &mut out).unwrap();
        let back = decode_event_body(&out).unwrap();
        assert!(same_map(&e.fields, &back.fields));
        let mut with_tail = out.clone();
        with_tail.push(0);
        assert_eq!(decode_event_body(&with_tail), Err(CodecError::TrailingBytes(1)));
        let mut input = &with_tail[..];
        assert!(decode_event(&mut input).is_ok());
        assert_eq!(input, [0]);
    }

    #[test]
    fn batches_round_trip_and_append() {
        let events = vec![sample_event(), Event::from_message_at("b", 2), Event::new(Map::new())];
        let mut body = Vec::new();
        encode_batch(&events, &mut body).unwrap();
        let refs: Vec<&Event> = events.iter().collect();
        let mut body2 = Vec::new();
        encode_batch(refs.iter().copied(), &mut body2).unwrap();
        assert_eq!(body, body2);
        let back = decode_batch_body(&body).unwrap();
        assert_eq!(back.len(), 3);
        for (a, b) in events.iter().zip(&back) {
            assert!(same_map(&a.fields, &b.fields));
        }
        let mut out = vec![Event::from_message_at("already", 0)];
        let mut input = &body[..];
        assert_eq!(decode_batch_into(&mut input, &mut out), Ok(3));
        assert_eq!(out.len(), 4);
        assert!(input.is_empty());
        // A failed batch leaves `out` and the input as they were.
        let mut input = &body[..body.len() - 1];
        assert!(decode_batch_into(&mut input, &mut out).is_err());
        assert_eq!(out.len(), 4);
        assert_eq!(input.len(), body.len() - 1);
    }

    #[test]
    fn a_reused_decoder_follows_changing_keys() {
        let long = "k".repeat(40);
        let shapes: [&[&str]; 5] = [
            &["message", "@timestamp", "host"],
            &["message", "@timestamp", "host"],
            &["message", "host", "@timestamp", "extra"],
            &["", long.as_str(), "messagf"],
            &["", long.as_str(), "message", "@timestamp"],
        ];
        let mut dec = EventDecoder::new();
        for (i, keys) in shapes.iter().cycle().take(20).enumerate() {
            let mut m = Map::new();
            for (j, k) in keys.iter().enumerate() {
                m.push_unchecked(*k, Value::Int((i * 10 + j) as i64));
            }
            let e = Event::new(m);
            let mut body = Vec::new();
            encode_event(&e, &mut body).unwrap();
            assert_eq!(dec.decode_event_body(&body).unwrap(), e);
            // A cached key must never stand in for bytes that are not valid UTF-8.
            let mut bad = body.clone();
            if let Some(at) = bad.windows(7).position(|w| w == b"message") {
                bad[at + 1] = 0xff;
                assert_eq!(dec.decode_event_body(&bad), Err(CodecError::InvalidUtf8));
            }
        }
        let mut batch = Vec::new();
        let events: Vec<Event> = (0..40).map(|i| Event::from_message_at(format!("m{i}"), i)).collect();
        encode_batch(&events, &mut batch).unwrap();
        let mut out = Vec::new();
        assert_eq!(dec.decode_batch_into(&mut &batch[..], &mut out), Ok(40));
        assert_eq!(out, events);
    }

    #[test]
    fn varints_at_the_edges() {
        for v in [0, 1, 127, 128, 16_383, 16_384, u32::MAX as u64, u64::MAX - 1, u64::MAX] {
            let mut out = Vec::new();
            put_varint(&mut out, v);
            let mut input = &out[..];
            assert_eq!(get_varint(&mut input), Ok(v));
            assert!(input.is_empty());
        }
        for n in [0, 1, -1, 63, -64, 64, i64::MAX, i64::MIN] {
            assert_eq!(unzigzag(zigzag(n)), n);
        }
        let mut input = &[0xff; 10][..];
        assert_eq!(get_varint(&mut input), Err(CodecError::VarintOverflow));
        let mut input = &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02][..];
        assert_eq!(get_varint(&mut input), Err(CodecError::VarintOverflow));
        let mut input = &[0x80, 0x80][..];
        assert_eq!(get_varint(&mut input), Err(CodecError::UnexpectedEnd));
    }

    #[test]
    fn hostile_input_is_an_error_not_an_allocation() {
        // A count of 2^63 entries, a string of 2^40 bytes, an array of 10^12 values.
        let mut huge_map = Vec::new();
        put_varint(&mut huge_map, 1 << 63);
        assert_eq!(decode_event(&mut &huge_map[..]), Err(CodecError::LengthOutOfBounds(1 << 63)));
        let mut huge_str = vec![1, 1, b'k', TAG_STRING];
        put_varint(&mut huge_str, 1 << 40);
        assert_eq!(decode_event(&mut &huge_str[..]), Err(CodecError::LengthOutOfBounds(1 << 40)));
        let mut huge_array = vec![TAG_ARRAY];
        put_varint(&mut huge_array, 1_000_000_000_000);
        assert_eq!(decode_value(&mut &huge_array[..]), Err(CodecError::LengthOutOfBounds(1_000_000_000_000)));
        assert_eq!(decode_value(&mut &[0x09][..]), Err(CodecError::UnknownTag(9)));
        assert_eq!(decode_value(&mut &[TAG_STRING, 2, 0xc3, 0x28][..]), Err(CodecError::InvalidUtf8));
        assert_eq!(decode_event(&mut &[1, 2, 0xff, 0xfe, TAG_NULL][..]), Err(CodecError::InvalidUtf8));
        assert_eq!(decode_batch_body(&[5, 0]), Err(CodecError::LengthOutOfBounds(5)));
    }

    #[test]
    fn nesting_is_limited_both_ways() {
        fn nested(levels: usize) -> Value {
            let mut v = Value::Int(1);
            for i in 0..levels {
                v = if i % 2 == 0 { Value::Array(vec![v]) } else { Value::Object(map_of(vec![("k".into(), v)])) };
            }
            v
        }
        let mut out = Vec::new();
        let ok = Event::new(map_of(vec![("deep".into(), nested(MAX_DEPTH))]));
        encode_event(&ok, &mut out).unwrap();
        assert!(same_map(&decode_event_body(&out).unwrap().fields, &ok.fields));
        let too_deep = Event::new(map_of(vec![("deep".into(), nested(MAX_DEPTH + 1))]));
        let mut out = b"keep".to_vec();
        assert_eq!(encode_event(&too_deep, &mut out), Err(CodecError::TooDeep));
        assert_eq!(out, b"keep");
        // Hand-made bytes: one level too many, then a million levels (no stack overflow).
        for levels in [MAX_DEPTH + 1, 1_000_000] {
            let mut bytes = vec![1, 1, b'k'];
            bytes.extend(std::iter::repeat_n([TAG_ARRAY, 1], levels).flatten());
            bytes.push(TAG_NULL);
            assert_eq!(decode_event(&mut &bytes[..]), Err(CodecError::TooDeep));
        }
    }

    #[test]
    fn truncated_and_garbled_bodies_never_panic() {
        let events = vec![sample_event(), Event::from_message_at("short", 5), sample_event()];
        let mut body = Vec::new();
        encode_batch(&events, &mut body).unwrap();
        for cut in 0..body.len() {
            assert!(decode_batch_body(&body[..cut]).is_err(), "prefix of {cut} bytes decoded");
        }
        let mut single = Vec::new();
        encode_event(&events[0], &mut single).unwrap();
        for cut in 0..single.len() {
            assert!(decode_event(&mut &single[..cut]).is_err(), "prefix of {cut} bytes decoded");
        }
        let mut rng = sluice_testkit::Rng::from_env();
        let mut rand = move || rng.next_u64();
        for _ in 0..20_000 {
            let mut bad = body.clone();
            for _ in 0..1 + rand() % 3 {
                let at = (rand() % bad.len() as u64) as usize;
                bad[at] = rand() as u8;
            }
            let _ = decode_batch_body(&bad);
            let _ = decode_event(&mut &bad[1..]);
            let _ = decode_value(&mut &bad[..]);
        }
        for _ in 0..20_000 {
            let len = (rand() % 64) as usize;
            let junk: Vec<u8> = (0..len).map(|_| (rand() % 12) as u8).collect();
            let _ = decode_batch_body(&junk);
            let _ = decode_event(&mut &junk[..]);
            let _ = decode_value(&mut &junk[..]);
        }
    }

    /// One event decoded from `body`, with strings pointing into `text` where they can.
    fn decode_in(dec: &mut EventDecoder, body: &[u8], text: &SharedText) -> Result<Event, CodecError> {
        let mut out = Vec::with_capacity(1);
        dec.decode_event_body_into(body, Some(text), &mut out)?;
        Ok(out.pop().expect("one event pushed"))
    }

    #[test]
    fn long_strings_decoded_in_a_shared_buffer_point_into_it() {
        let long = "GET /index.html HTTP/1.1 200 2326 Mozilla/5.0 (X11; Linux x86_64)";
        let mut e = Event::from_message_at(long, 7);
        e.fields.insert("level", Value::from("info"));
        let mut bytes = vec![0xFF, 0xFE]; // not text: the buffer is checked per string
        encode_event(&e, &mut bytes).unwrap();
        let text = SharedText::new(bytes);
        let back = decode_in(&mut EventDecoder::new(), &text.as_bytes()[2..], &text).unwrap();
        assert!(same_map(&e.fields, &back.fields));
        let Some(Value::String(message)) = back.fields.get("message") else { panic!("no message") };
        assert!(message.is_shared(), "a long string is a slice of the buffer");
        let Some(Value::String(level)) = back.fields.get("level") else { panic!("no level") };
        assert!(!level.is_shared(), "a short string is inline");

        // The same body elsewhere decodes by copying.
        let copy = text.as_bytes()[2..].to_vec();
        let back = decode_in(&mut EventDecoder::new(), &copy, &text).unwrap();
        let Some(Value::String(message)) = back.fields.get("message") else { panic!("no message") };
        assert!(!message.is_shared());
    }

    #[test]
    fn decoding_into_a_vector_pushes_whole_events_only() {
        let mut body = Vec::new();
        encode_event(&Event::from_message_at("a message long enough not to be stored inline", 3), &mut body).unwrap();
        let mut dec = EventDecoder::new();
        let mut out = Vec::new();
        dec.decode_event_body_into(&body, None, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        let mut trailing = body.clone();
        trailing.push(0);
        let err = dec.decode_event_body_into(&trailing, None, &mut out).unwrap_err();
        assert!(matches!(err, CodecError::TrailingBytes(1)), "{err:?}");
        let err = dec.decode_event_body_into(&body[..body.len() - 5], None, &mut out).unwrap_err();
        assert!(matches!(err, CodecError::UnexpectedEnd | CodecError::LengthOutOfBounds(_)), "{err:?}");
        assert_eq!(out.len(), 1, "a refused body pushes nothing");
        assert!(same_map(&out[0].fields, &decode_event_body(&body).unwrap().fields));
    }

    #[test]
    fn invalid_utf8_in_a_shared_buffer_is_refused() {
        let long = "a message long enough not to be inline, with a byte to spoil";
        let mut bytes = Vec::new();
        encode_event(&Event::from_message_at(long, 1), &mut bytes).unwrap();
        let at = bytes.windows(5).position(|w| w == b"spoil").unwrap();
        bytes[at] = 0xC3; // a lead byte followed by ASCII
        let text = SharedText::new(bytes);
        let err = decode_in(&mut EventDecoder::new(), text.as_bytes(), &text).unwrap_err();
        assert!(matches!(err, CodecError::InvalidUtf8), "{err:?}");
    }

    fn arb_flat_value() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::Int),
            any::<u64>().prop_map(|bits| Value::Float(f64::from_bits(bits))),
            "\\PC{0,40}".prop_map(Value::from),
            "[a-z]{0,300}".prop_map(Value::from),
            any::<i64>().prop_map(Value::Timestamp),
        ]
    }

    proptest! {
        #[test]
        fn the_flat_path_writes_what_the_general_one_does(
            kv in prop::collection::vec(("[@a-z_]{0,20}|.{0,30}", arb_flat_value()), 0..20),
            prefix in prop::collection::vec(any::<u8>(), 0..8),
        ) {
            let e = Event::new(map_of(kv));
            let bound = flat::bound(&e.fields).expect("no containers");
            let mut fast = prefix.clone();
            flat::put_map(&mut fast, &e.fields, bound);
            let mut general = prefix.clone();
            put_map(&mut general, &e.fields, 0).unwrap();
            prop_assert_eq!(&fast, &general);
            prop_assert!(fast.len() - prefix.len() <= bound);
        }

        #[test]
        fn any_event_round_trips(e in arb_event()) {
            let mut out = vec![0xAB];
            encode_event(&e, &mut out).unwrap();
            let back = decode_event_body(&out[1..]).unwrap();
            prop_assert!(same_map(&e.fields, &back.fields), "{:?} != {:?}", e, back);
        }

        #[test]
        fn any_value_round_trips(v in arb_value()) {
            let mut out = Vec::new();
            encode_value(&v, &mut out).unwrap();
            let mut input = &out[..];
            let back = decode_value(&mut input).unwrap();
            prop_assert!(input.is_empty());
            prop_assert!(same(&v, &back), "{:?} != {:?}", v, back);
        }

        #[test]
        fn any_bytes_decode_or_fail_cleanly(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_batch_body(&bytes);
            let _ = decode_event_body(&bytes);
            let _ = decode_value(&mut &bytes[..]);
        }
    }

    proptest! {
        // Each case encodes and decodes several events: fewer cases keep the debug build quick.
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn any_batch_round_trips(events in prop::collection::vec(arb_event(), 0..4)) {
            let mut out = Vec::new();
            encode_batch(&events, &mut out).unwrap();
            let back = decode_batch_body(&out).unwrap();
            prop_assert_eq!(back.len(), events.len());
            for (a, b) in events.iter().zip(&back) {
                prop_assert!(same_map(&a.fields, &b.fields));
            }
        }

        #[test]
        fn events_decoded_in_a_shared_buffer_equal_their_copies(events in prop::collection::vec(arb_event(), 1..5)) {
            // Bodies back to back behind a binary header, as frames sit in a segment read back.
            let mut bytes = vec![0xFF, 0x00, 0x80];
            let mut bodies = Vec::new();
            for e in &events {
                let start = bytes.len();
                encode_event(e, &mut bytes).unwrap();
                bodies.push(start..bytes.len());
            }
            let text = SharedText::new(bytes);
            let mut dec = EventDecoder::new();
            let (mut shared, mut copied) = (Vec::new(), Vec::new());
            for (e, range) in events.iter().zip(bodies) {
                let body = &text.as_bytes()[range];
                let back = decode_in(&mut dec, body, &text).unwrap();
                prop_assert!(same_map(&e.fields, &back.fields), "{:?} != {:?}", e, back);
                dec.decode_event_body_into(body, Some(&text), &mut shared).unwrap();
                dec.decode_event_body_into(body, None, &mut copied).unwrap();
            }
            prop_assert_eq!(shared.len(), events.len());
            prop_assert_eq!(copied.len(), events.len());
            for ((e, a), b) in events.iter().zip(&shared).zip(&copied) {
                prop_assert!(same_map(&e.fields, &a.fields) && same_map(&e.fields, &b.fields));
            }
        }

        #[test]
        fn a_reused_decoder_round_trips_any_sequence(events in prop::collection::vec(arb_event(), 1..5)) {
            let mut dec = EventDecoder::new();
            for e in events.iter().chain(events.iter().rev()) {
                let mut out = Vec::new();
                encode_event(e, &mut out).unwrap();
                let back = dec.decode_event_body(&out).unwrap();
                prop_assert!(same_map(&e.fields, &back.fields), "{:?} != {:?}", e, back);
            }
        }
    }
}
