//! Identification keys: the values of a few fields that say which group an event belongs to.
//!
//! Stateful processors (`aggregate`) group events by them, and cluster mode routes every event
//! with the same values to the one node that owns them, so both must agree on what "the same
//! values" means. A key tuple is encoded without ambiguity — each value with a type tag and,
//! for strings and containers, a length prefix — so that `["a,b", "c"]` and `["a", "b,c"]`
//! (which a comma-joined key confuses) encode differently, and `1`, `"1"` and `1.0` are three
//! keys. A field the event lacks is encoded as its own tag, distinct from `null`: events missing
//! the same keys form one group (and go to one node). The encoding is hashed with XXH3-64,
//! which is fast and the same on every platform and build, so every node computes the same hash.

use crate::event::Event;
use crate::path::FieldPath;
use crate::value::{Map, Value};

const MISSING: u8 = 0;
const NULL: u8 = 1;
const FALSE: u8 = 2;
const TRUE: u8 = 3;
const INT: u8 = 4;
const FLOAT: u8 = 5;
const STRING: u8 = 6;
const TIMESTAMP: u8 = 7;
const ARRAY: u8 = 8;
const OBJECT: u8 = 9;

/// Strings up to this long take the stack path of [`KeySpec::hash`] (their length is one byte).
const SHORT_STRING: usize = 30;

/// The identification keys of a stateful processor, parsed once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySpec {
    paths: Vec<FieldPath>,
}

/// An event's key tuple, encoded, with its hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyHash {
    pub hash: u64,
    /// How many of the keys the event lacks.
    pub missing: u32,
}

impl KeySpec {
    pub fn new(paths: Vec<FieldPath>) -> KeySpec {
        KeySpec { paths }
    }

    pub fn paths(&self) -> &[FieldPath] {
        &self.paths
    }

    /// Writes the event's key tuple into `out` (cleared first); returns how many keys it lacks.
    pub fn encode(&self, event: &Event, out: &mut Vec<u8>) -> u32 {
        out.clear();
        let mut missing = 0;
        for path in &self.paths {
            match event.get(path) {
                Some(v) => encode_value(v, out),
                None => {
                    missing += 1;
                    out.push(MISSING);
                }
            }
        }
        missing
    }

    /// The hash of the event's key tuple; `scratch` is reused between calls.
    #[inline]
    pub fn hash(&self, event: &Event, scratch: &mut Vec<u8>) -> KeyHash {
        // The common case, one short string key: the same bytes as `encode` writes, built on
        // the stack (no vector to grow, and one contiguous write before the hash reads it).
        if let [path] = self.paths.as_slice()
            && let Some(Value::String(s)) = event.get(path)
            && s.len() <= SHORT_STRING
        {
            let bytes = s.as_bytes();
            let mut buf = [0u8; SHORT_STRING + 2];
            buf[0] = STRING;
            buf[1] = bytes.len() as u8;
            buf[2..2 + bytes.len()].copy_from_slice(bytes);
            return KeyHash { hash: hash_key(&buf[..2 + bytes.len()]), missing: 0 };
        }
        let missing = self.encode(event, scratch);
        KeyHash { hash: hash_key(scratch), missing }
    }
}

/// The hash of an encoded key tuple.
#[inline]
pub fn hash_key(encoded: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(encoded)
}

fn put_len(out: &mut Vec<u8>, mut n: usize) {
    // LEB128: short lengths take one byte.
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn encode_value(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Null => out.push(NULL),
        Value::Bool(false) => out.push(FALSE),
        Value::Bool(true) => out.push(TRUE),
        Value::Int(i) => {
            out.push(INT);
            out.extend_from_slice(&i.to_le_bytes());
        }
        Value::Float(f) => {
            out.push(FLOAT);
            // -0.0 and 0.0 are one key; every NaN is one key.
            let f = if *f == 0.0 {
                0.0
            } else if f.is_nan() {
                f64::NAN
            } else {
                *f
            };
            out.extend_from_slice(&f.to_bits().to_le_bytes());
        }
        Value::String(s) => {
            out.push(STRING);
            put_len(out, s.len());
            out.extend_from_slice(s.as_bytes());
        }
        Value::Timestamp(ns) => {
            out.push(TIMESTAMP);
            out.extend_from_slice(&ns.to_le_bytes());
        }
        Value::Array(items) => {
            out.push(ARRAY);
            put_len(out, items.len());
            for item in items {
                encode_value(item, out);
            }
        }
        Value::Object(map) => encode_map(map, out),
    }
}

fn encode_map(map: &Map, out: &mut Vec<u8>) {
    out.push(OBJECT);
    put_len(out, map.len());
    for (k, v) in map.iter() {
        put_len(out, k.len());
        out.extend_from_slice(k.as_bytes());
        encode_value(v, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(paths: &[&str]) -> KeySpec {
        KeySpec::new(paths.iter().map(|p| FieldPath::parse(p).unwrap()).collect())
    }

    fn event(pairs: &[(&str, Value)]) -> Event {
        let mut e = Event::from_message_at("", 0);
        for (k, v) in pairs {
            e.fields.insert(*k, v.clone());
        }
        e
    }

    #[test]
    fn comma_joined_tuples_differ() {
        let s = spec(&["/a", "/b"]);
        let mut x = Vec::new();
        let mut y = Vec::new();
        s.encode(&event(&[("a", Value::from("a,b")), ("b", Value::from("c"))]), &mut x);
        s.encode(&event(&[("a", Value::from("a")), ("b", Value::from("b,c"))]), &mut y);
        assert_ne!(x, y);
    }

    #[test]
    fn types_missing_and_null_differ() {
        let s = spec(&["/a"]);
        let keys: Vec<Vec<u8>> = [
            event(&[("a", Value::Int(1))]),
            event(&[("a", Value::from("1"))]),
            event(&[("a", Value::Float(1.0))]),
            event(&[("a", Value::Null)]),
            event(&[]),
        ]
        .iter()
        .map(|e| {
            let mut out = Vec::new();
            s.encode(e, &mut out);
            out
        })
        .collect();
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b);
            }
        }
        let mut out = Vec::new();
        assert_eq!(s.encode(&event(&[]), &mut out), 1);
    }

    #[test]
    fn the_short_string_path_hashes_what_encode_writes() {
        let s = spec(&["/user"]);
        for len in [0, 1, 13, 14, 15, 16, 29, 30, 31, 127, 128, 300] {
            let e = event(&[("user", Value::from("x".repeat(len).as_str()))]);
            let mut bytes = Vec::new();
            s.encode(&e, &mut bytes);
            assert_eq!(s.hash(&e, &mut Vec::new()).hash, hash_key(&bytes), "length {len}");
        }
    }

    #[test]
    fn the_hash_is_stable_across_builds() {
        // Nodes of different builds must route alike: this value may never change.
        let s = spec(&["/user"]);
        let h = s.hash(&event(&[("user", Value::from("alice"))]), &mut Vec::new());
        assert_eq!(
            h,
            KeyHash { hash: xxhash_rust::xxh3::xxh3_64(&[STRING, 5, b'a', b'l', b'i', b'c', b'e']), missing: 0 }
        );
    }
}
