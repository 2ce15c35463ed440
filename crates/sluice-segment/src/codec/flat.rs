//! The encoding of a map whose values are all scalars or strings (most events), written
//! with one reservation and without the per-piece capacity checks and copy calls of the
//! general path. It writes the same bytes.
//!
//! Why: with a CRC and a copy of its text, encoding such an event was about 100 ns, most of it
//! spent on a dozen small appends (each a capacity check and a length update through memory,
//! the short ones a call to `memcpy`), not on its bytes.

use std::ptr;

use sluice_core::{Map, Value};

use super::{TAG_FALSE, TAG_FLOAT, TAG_INT, TAG_NULL, TAG_STRING, TAG_TIMESTAMP, TAG_TRUE, zigzag};
use crate::buf::ByteBuf;

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
