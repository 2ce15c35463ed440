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

use sluice_core::{Event, Map, Str, Value};

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
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
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
fn put_str(out: &mut Vec<u8>, s: &str) {
    put_varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

fn put_map(out: &mut Vec<u8>, m: &Map, depth: usize) -> Result<(), CodecError> {
    put_varint(out, m.len() as u64);
    for (k, v) in m.iter() {
        put_str(out, k);
        put_value(out, v, depth)?;
    }
    Ok(())
}

fn put_value(out: &mut Vec<u8>, v: &Value, depth: usize) -> Result<(), CodecError> {
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
fn atomically(out: &mut Vec<u8>, f: impl FnOnce(&mut Vec<u8>) -> Result<(), CodecError>) -> Result<(), CodecError> {
    let start = out.len();
    let r = f(out);
    if r.is_err() {
        out.truncate(start);
    }
    r
}

/// Appends one event. Fails only with [`CodecError::TooDeep`], leaving `out` as it was.
pub fn encode_event(event: &Event, out: &mut Vec<u8>) -> Result<(), CodecError> {
    atomically(out, |out| put_map(out, &event.fields, 0))
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

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    #[inline(always)]
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    #[inline(always)]
    fn byte(&mut self) -> Result<u8, CodecError> {
        let b = *self.buf.get(self.pos).ok_or(CodecError::UnexpectedEnd)?;
        self.pos += 1;
        Ok(b)
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

    #[inline(always)]
    fn str(&mut self) -> Result<&'a str, CodecError> {
        let n = self.count(1)?;
        let bytes = self.take(n)?;
        str::from_utf8(bytes).map_err(|_| CodecError::InvalidUtf8)
    }

    fn map(&mut self, depth: usize) -> Result<Map, CodecError> {
        // Each entry is at least a key length and a tag.
        let n = self.count(2)?;
        let mut m = Map::with_capacity(n.min(MAX_PREALLOC));
        for _ in 0..n {
            let k = self.str()?;
            let v = self.value(depth)?;
            // Keys of an encoded map came from a `Map`, so they are unique.
            m.push_unchecked(Str::from(k), v);
        }
        Ok(m)
    }

    fn value(&mut self, depth: usize) -> Result<Value, CodecError> {
        Ok(match self.byte()? {
            TAG_NULL => Value::Null,
            TAG_FALSE => Value::Bool(false),
            TAG_TRUE => Value::Bool(true),
            TAG_INT => Value::Int(unzigzag(self.varint()?)),
            TAG_FLOAT => {
                let b = self.take(8)?;
                Value::Float(f64::from_bits(u64::from_le_bytes(b.try_into().expect("8 bytes"))))
            }
            TAG_STRING => Value::String(Str::from(self.str()?)),
            TAG_TIMESTAMP => Value::Timestamp(unzigzag(self.varint()?)),
            TAG_ARRAY => {
                if depth >= MAX_DEPTH {
                    return Err(CodecError::TooDeep);
                }
                let n = self.count(1)?;
                let mut a = Vec::with_capacity(n.min(MAX_PREALLOC));
                for _ in 0..n {
                    a.push(self.value(depth + 1)?);
                }
                Value::Array(a)
            }
            TAG_OBJECT => {
                if depth >= MAX_DEPTH {
                    return Err(CodecError::TooDeep);
                }
                Value::Object(self.map(depth + 1)?)
            }
            tag => return Err(CodecError::UnknownTag(tag)),
        })
    }
}

/// Runs `f` over `input` and advances `input` past what it consumed (on success only).
#[inline(always)]
fn read<T>(input: &mut &[u8], f: impl FnOnce(&mut Reader<'_>) -> Result<T, CodecError>) -> Result<T, CodecError> {
    let mut r = Reader { buf: input, pos: 0 };
    let v = f(&mut r)?;
    *input = &input[r.pos..];
    Ok(v)
}

/// Decodes one event from the front of `input` and advances `input` past it.
pub fn decode_event(input: &mut &[u8]) -> Result<Event, CodecError> {
    read(input, |r| r.map(0)).map(Event::new)
}

/// Decodes a frame body holding exactly one event (codec [`CODEC_EVENT`](crate::format::CODEC_EVENT)).
pub fn decode_event_body(mut body: &[u8]) -> Result<Event, CodecError> {
    let e = decode_event(&mut body)?;
    if body.is_empty() { Ok(e) } else { Err(CodecError::TrailingBytes(body.len())) }
}

/// Decodes a batch from the front of `input`, appending its events to `out`; returns how many.
/// On error `out` keeps the events it had before the call and `input` is not advanced.
pub fn decode_batch_into(input: &mut &[u8], out: &mut Vec<Event>) -> Result<usize, CodecError> {
    let before = out.len();
    let r = read(input, |r| {
        let n = r.count(1)?;
        out.reserve(n.min(MAX_PREALLOC));
        for _ in 0..n {
            out.push(Event::new(r.map(0)?));
        }
        Ok(n)
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
    read(input, |r| r.value(0))
}

/// Decodes an unsigned LEB128 varint from the front of `input` and advances `input` past it.
pub fn get_varint(input: &mut &[u8]) -> Result<u64, CodecError> {
    read(input, |r| r.varint())
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
            any::<String>().prop_map(Value::from),
            "[a-z]{0,40}".prop_map(Value::from),
            any::<i64>().prop_map(Value::Timestamp),
        ];
        leaf.prop_recursive(5, 96, 10, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..10).prop_map(Value::Array),
                prop::collection::vec((any::<String>(), inner), 0..10).prop_map(|kv| Value::Object(map_of(kv))),
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
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut rand = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
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

    proptest! {
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
        fn any_batch_round_trips(events in prop::collection::vec(arb_event(), 0..6)) {
            let mut out = Vec::new();
            encode_batch(&events, &mut out).unwrap();
            let back = decode_batch_body(&out).unwrap();
            prop_assert_eq!(back.len(), events.len());
            for (a, b) in events.iter().zip(&back) {
                prop_assert!(same_map(&a.fields, &b.fields));
            }
        }

        #[test]
        fn any_bytes_decode_or_fail_cleanly(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_batch_body(&bytes);
            let _ = decode_event_body(&bytes);
            let _ = decode_value(&mut &bytes[..]);
        }
    }
}
