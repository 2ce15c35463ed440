//! The general encoder: any event, any nesting up to [`MAX_DEPTH`]; what it refuses the decoder
//! would refuse too, and on error the output is left as it was.

use sluice_core::{Event, Map, Value};

use super::flat;
use super::*;
use crate::buf::ByteBuf;

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

pub(super) fn put_map<B: ByteBuf>(out: &mut B, m: &Map, depth: usize) -> Result<(), CodecError> {
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
