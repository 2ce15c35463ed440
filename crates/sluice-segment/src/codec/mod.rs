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

//!
//! One file per job: [`encode`] (the general encoder), `flat` (the fast path for events whose
//! values are all scalars or strings, the one place with `unsafe` writes), [`decode`].

pub mod decode;
pub mod encode;
mod flat;
#[cfg(test)]
mod tests;

pub use decode::{
    EventDecoder, decode_batch_body, decode_batch_into, decode_event, decode_event_body, decode_value, get_varint,
};
pub use encode::{encode_batch, encode_event, encode_value, put_varint};

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

#[inline(always)]
pub(crate) fn zigzag(n: i64) -> u64 {
    ((n << 1) ^ (n >> 63)) as u64
}

#[inline(always)]
pub(crate) fn unzigzag(n: u64) -> i64 {
    ((n >> 1) as i64) ^ -((n & 1) as i64)
}
