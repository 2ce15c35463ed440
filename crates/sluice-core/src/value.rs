//! A JSON-like value tuned for log events.
//!
//! Objects are insertion-ordered vectors of `(key, value)`: events carry about a dozen fields,
//! for which a linear scan over inline keys is faster than hashing or a tree, and output keeps
//! the order the fields arrived in. Strings are [`Str`]s, so keys and short values up to 24
//! bytes never touch the allocator, and long ones can share the buffer they were read into.
//! Timestamps are a variant of their own (nanoseconds since the Unix epoch) so that stamping
//! an event costs no formatting; they serialize as RFC 3339 text.

use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, SecondsFormat, Utc};
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

pub use crate::text::Str;

#[derive(Clone, Debug, Default, PartialEq)]
pub enum Value {
    #[default]
    Null,
    Bool(bool),
    Int(i64),
    Float(f64),
    String(Str),
    /// Nanoseconds since the Unix epoch, UTC.
    Timestamp(i64),
    Array(Vec<Value>),
    Object(Map),
}

/// What the allocator keeps beside each allocation, as counted by memory estimates.
pub const ALLOCATION_OVERHEAD: usize = 16;

impl Value {
    /// Heap bytes this value owns beyond its own 32 bytes (see [`crate::Event::memory_size`]).
    pub fn heap_bytes(&self) -> usize {
        match self {
            Value::String(s) => s.heap_bytes(),
            Value::Array(a) => {
                let own = if a.capacity() == 0 { 0 } else { a.capacity() * size_of::<Value>() + ALLOCATION_OVERHEAD };
                own + a.iter().map(Value::heap_bytes).sum::<usize>()
            }
            Value::Object(m) => m.heap_bytes(),
            _ => 0,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s.as_str()),
            _ => None,
        }
    }

    pub fn as_object(&self) -> Option<&Map> {
        match self {
            Value::Object(m) => Some(m),
            _ => None,
        }
    }

    pub fn as_object_mut(&mut self) -> Option<&mut Map> {
        match self {
            Value::Object(m) => Some(m),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Vec<Value>> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A number as `f64`, for comparisons across `Int` and `Float`.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(i) => Some(*i as f64),
            Value::Float(f) => Some(*f),
            _ => None,
        }
    }

    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// Truthiness as conditions see it: null, false, 0, "" and empty containers are false.
    pub fn is_truthy(&self) -> bool {
        match self {
            Value::Null => false,
            Value::Bool(b) => *b,
            Value::Int(i) => *i != 0,
            Value::Float(f) => *f != 0.0,
            Value::String(s) => !s.is_empty(),
            Value::Timestamp(_) => true,
            Value::Array(a) => !a.is_empty(),
            Value::Object(m) => !m.is_empty(),
        }
    }

    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "bool",
            Value::Int(_) => "integer",
            Value::Float(_) => "float",
            Value::String(_) => "string",
            Value::Timestamp(_) => "timestamp",
            Value::Array(_) => "array",
            Value::Object(_) => "object",
        }
    }

    /// Appends the value as text: strings without quotes, everything else as compact JSON.
    /// This is what templates and string conversion print.
    pub fn write_text(&self, out: &mut String) {
        use std::fmt::Write;
        match self {
            Value::Null => {}
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Value::Int(i) => {
                let _ = write!(out, "{i}");
            }
            Value::Float(f) => write_float(*f, out),
            Value::String(s) => out.push_str(s),
            Value::Timestamp(ns) => out.push_str(&format_timestamp(*ns)),
            Value::Array(_) | Value::Object(_) => {
                if let Ok(s) = serde_json::to_string(self) {
                    out.push_str(&s);
                }
            }
        }
    }

    pub fn to_text(&self) -> String {
        let mut s = String::new();
        self.write_text(&mut s);
        s
    }

    /// Parses JSON text into a value.
    pub fn from_json_slice(bytes: &[u8]) -> Result<Value, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

fn write_float(f: f64, out: &mut String) {
    use std::fmt::Write;
    if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e16 {
        let _ = write!(out, "{f:.1}");
    } else {
        let _ = write!(out, "{f}");
    }
}

/// RFC 3339 with millisecond precision when the sub-second part fits, like Logstash prints it.
pub fn format_timestamp(ns: i64) -> String {
    let dt = timestamp_to_datetime(ns);
    if ns.rem_euclid(1_000_000) == 0 {
        dt.to_rfc3339_opts(SecondsFormat::Millis, true)
    } else {
        dt.to_rfc3339_opts(SecondsFormat::AutoSi, true)
    }
}

pub fn timestamp_to_datetime(ns: i64) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp(ns.div_euclid(1_000_000_000), ns.rem_euclid(1_000_000_000) as u32)
        .unwrap_or_default()
}

/// Nanoseconds since the epoch, now. Callers stamp a whole batch with one reading.
pub fn now_nanos() -> i64 {
    Utc::now().timestamp_nanos_opt().unwrap_or(0)
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::String(Str::new(s))
    }
}
impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::String(Str::from(s))
    }
}
impl From<Str> for Value {
    fn from(s: Str) -> Self {
        Value::String(s)
    }
}
impl From<i64> for Value {
    fn from(i: i64) -> Self {
        Value::Int(i)
    }
}
impl From<f64> for Value {
    fn from(f: f64) -> Self {
        Value::Float(f)
    }
}
impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}
impl From<Map> for Value {
    fn from(m: Map) -> Self {
        Value::Object(m)
    }
}
impl From<Vec<Value>> for Value {
    fn from(a: Vec<Value>) -> Self {
        Value::Array(a)
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}

/// An insertion-ordered object. Keys are unique: `insert` replaces in place.
///
/// A map can be made [shared](Map::shared): then clones share one copy (a reference count,
/// no allocation) and the first change makes the changed clone its own copy. Inputs use it for
/// metadata objects that every event of a source carries unchanged (a file's `log.file`, the
/// `host` object), which would otherwise cost an allocation, and a free on another thread,
/// per event and object.
#[derive(Clone, Default)]
pub struct Map {
    entries: Entries,
}

#[derive(Clone)]
enum Entries {
    Owned(Vec<(Str, Value)>),
    Shared(Arc<Vec<(Str, Value)>>),
}

impl Default for Entries {
    fn default() -> Self {
        Entries::Owned(Vec::new())
    }
}

impl Map {
    /// Heap bytes this map owns. A shared map (see [`Map::shared`]) counts nothing: its one copy
    /// serves every event holding it.
    pub fn heap_bytes(&self) -> usize {
        match &self.entries {
            Entries::Owned(v) => {
                let own =
                    if v.capacity() == 0 { 0 } else { v.capacity() * size_of::<(Str, Value)>() + ALLOCATION_OVERHEAD };
                own + v.iter().map(|(k, v)| k.heap_bytes() + v.heap_bytes()).sum::<usize>()
            }
            Entries::Shared(_) => 0,
        }
    }

    pub fn new() -> Self {
        Map { entries: Entries::Owned(Vec::new()) }
    }

    pub fn with_capacity(n: usize) -> Self {
        Map { entries: Entries::Owned(Vec::with_capacity(n)) }
    }

    /// This map as one that clones share until one of them changes (see [`Map`]).
    pub fn shared(self) -> Self {
        match self.entries {
            Entries::Owned(v) => Map { entries: Entries::Shared(Arc::new(v)) },
            shared => Map { entries: shared },
        }
    }

    /// A copy in which this map and every shared map inside it are shared anew, on reference
    /// counts of their own. Why: the clones of one shared map made and dropped on several
    /// threads at once fight over its count's cache line (it was half the cost of dropping
    /// a file event); a builder that reshares the metadata for each chunk of events keeps
    /// that count on the threads handling the chunk.
    pub fn reshared(&self) -> Map {
        fn copy(entries: &[(Str, Value)]) -> Vec<(Str, Value)> {
            entries
                .iter()
                .map(|(k, v)| match v {
                    Value::Object(m) => (k.clone(), Value::Object(m.reshared())),
                    v => (k.clone(), v.clone()),
                })
                .collect()
        }
        match &self.entries {
            Entries::Owned(v) => Map { entries: Entries::Owned(copy(v)) },
            Entries::Shared(v) => Map { entries: Entries::Shared(Arc::new(copy(v))) },
        }
    }

    #[inline]
    fn slice(&self) -> &[(Str, Value)] {
        match &self.entries {
            Entries::Owned(v) => v,
            Entries::Shared(v) => v,
        }
    }

    /// The entries to change: a shared map becomes this clone's own copy first.
    #[inline]
    fn owned(&mut self) -> &mut Vec<(Str, Value)> {
        if let Entries::Shared(_) = self.entries {
            self.unshare();
        }
        match &mut self.entries {
            Entries::Owned(v) => v,
            Entries::Shared(_) => unreachable!("made owned above"),
        }
    }

    #[cold]
    #[inline(never)]
    fn unshare(&mut self) {
        if let Entries::Shared(shared) = std::mem::take(&mut self.entries) {
            self.entries = Entries::Owned(Arc::unwrap_or_clone(shared));
        }
    }

    pub fn len(&self) -> usize {
        self.slice().len()
    }

    pub fn is_empty(&self) -> bool {
        self.slice().is_empty()
    }

    fn position(&self, key: &str) -> Option<usize> {
        self.slice().iter().position(|(k, _)| k.as_str() == key)
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.slice().iter().find(|(k, _)| k.as_str() == key).map(|(_, v)| v)
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut Value> {
        let i = self.position(key)?;
        Some(&mut self.owned()[i].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.position(key).is_some()
    }

    /// Inserts or replaces; returns the previous value.
    pub fn insert(&mut self, key: impl Into<Str>, value: Value) -> Option<Value> {
        let key = key.into();
        let at = self.position(&key);
        let entries = self.owned();
        match at {
            Some(i) => Some(std::mem::replace(&mut entries[i].1, value)),
            None => {
                entries.push((key, value));
                None
            }
        }
    }

    /// Inserts, or when `key` is there already, keeps both: the values under a key that comes
    /// more than once (a repeated header, a repeated syslog SD-ID or SD-PARAM) become an array,
    /// in the order they came. For values that are never arrays themselves.
    pub fn insert_gathering(&mut self, key: impl Into<Str>, value: Value) {
        let key = key.into();
        match self.get_mut(&key) {
            None => self.push_unchecked(key, value),
            Some(Value::Array(values)) => values.push(value),
            Some(existing) => {
                let first = std::mem::take(existing);
                *existing = Value::Array(vec![first, value]);
            }
        }
    }

    /// Appends without checking for an existing key. For builders that know the key is new
    /// (a parser that has already rejected duplicates, an input stamping a fresh event).
    #[inline]
    pub fn push_unchecked(&mut self, key: impl Into<Str>, value: Value) {
        self.owned().push((key.into(), value));
    }

    /// Makes room for `additional` more entries in one allocation.
    pub fn reserve(&mut self, additional: usize) {
        self.owned().reserve(additional);
    }

    /// Returns the value under `key`, inserting the result of `default` first if absent.
    pub fn entry_or_insert_with(&mut self, key: &str, default: impl FnOnce() -> Value) -> &mut Value {
        let at = self.position(key);
        let entries = self.owned();
        let i = match at {
            Some(i) => i,
            None => {
                entries.push((Str::new(key), default()));
                entries.len() - 1
            }
        };
        &mut entries[i].1
    }

    pub fn remove(&mut self, key: &str) -> Option<Value> {
        let i = self.position(key)?;
        Some(self.owned().remove(i).1)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Str, &Value)> {
        self.slice().iter().map(|(k, v)| (k, v))
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = (&Str, &mut Value)> {
        self.owned().iter_mut().map(|(k, v)| (&*k, v))
    }

    pub fn keys(&self) -> impl Iterator<Item = &Str> {
        self.slice().iter().map(|(k, _)| k)
    }

    /// Moves every entry of `other` into `self`, replacing on equal keys.
    pub fn extend(&mut self, other: Map) {
        for (k, v) in other {
            self.insert(k, v);
        }
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&str, &mut Value) -> bool) {
        self.owned().retain_mut(|(k, v)| keep(k, v));
    }
}

impl PartialEq for Map {
    fn eq(&self, other: &Map) -> bool {
        self.slice() == other.slice()
    }
}

impl fmt::Debug for Map {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Map").field("entries", &self.slice()).finish()
    }
}

impl FromIterator<(Str, Value)> for Map {
    fn from_iter<I: IntoIterator<Item = (Str, Value)>>(iter: I) -> Self {
        let mut m = Map::new();
        for (k, v) in iter {
            m.insert(k, v);
        }
        m
    }
}

impl IntoIterator for Map {
    type Item = (Str, Value);
    type IntoIter = std::vec::IntoIter<(Str, Value)>;
    fn into_iter(self) -> Self::IntoIter {
        match self.entries {
            Entries::Owned(v) => v.into_iter(),
            Entries::Shared(v) => Arc::unwrap_or_clone(v).into_iter(),
        }
    }
}

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Null => s.serialize_unit(),
            Value::Bool(b) => s.serialize_bool(*b),
            Value::Int(i) => s.serialize_i64(*i),
            Value::Float(f) => s.serialize_f64(*f),
            Value::String(v) => s.serialize_str(v),
            Value::Timestamp(ns) => s.serialize_str(&format_timestamp(*ns)),
            Value::Array(a) => {
                let mut seq = s.serialize_seq(Some(a.len()))?;
                for v in a {
                    seq.serialize_element(v)?;
                }
                seq.end()
            }
            Value::Object(m) => m.serialize(s),
        }
    }
}

impl Serialize for Map {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.len()))?;
        for (k, v) in self.slice() {
            map.serialize_entry(k.as_str(), v)?;
        }
        map.end()
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(i64::try_from(v).map(Value::Int).unwrap_or(Value::Float(v as f64)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(Str::new(v)))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(Str::from(v)))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Deserialize::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(v) = seq.next_element()? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        Ok(Value::Object(MapVisitor.visit_map(&mut access)?))
    }
}

struct MapVisitor;

impl MapVisitor {
    fn visit_map<'de, A: MapAccess<'de>>(self, access: &mut A) -> Result<Map, A::Error> {
        let mut map = Map::with_capacity(access.size_hint().unwrap_or(8).min(64));
        while let Some(key) = access.next_key::<KeyStr>()? {
            let value: Value = access.next_value()?;
            // Duplicate keys in one JSON object: the last one wins, as in most parsers.
            map.insert(key.0, value);
        }
        Ok(map)
    }
}

struct KeyStr(Str);

impl<'de> Deserialize<'de> for KeyStr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = KeyStr;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyStr, E> {
                Ok(KeyStr(Str::new(v)))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<KeyStr, E> {
                Ok(KeyStr(Str::from(v)))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

impl<'de> Deserialize<'de> for Map {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Map, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Map;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Map, A::Error> {
                MapVisitor.visit_map(&mut access)
            }
        }
        d.deserialize_map(V)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn values_stay_small() {
        // A shared map must not make every value bigger.
        assert_eq!(std::mem::size_of::<Map>(), 24);
        assert_eq!(std::mem::size_of::<Value>(), 32);
    }

    #[test]
    fn a_shared_map_is_copied_on_its_first_change_only() {
        let mut inner = Map::new();
        inner.insert("path", Value::from("/var/log/app.log"));
        let shared = inner.shared();
        let mut a = shared.clone();
        let b = shared.clone();
        assert_eq!(a, b);
        a.insert("path", Value::from("changed"));
        a.push_unchecked("more", Value::Int(1));
        assert_eq!(b.get("path"), Some(&Value::from("/var/log/app.log")), "the other clones keep theirs");
        assert_eq!(a.get("path"), Some(&Value::from("changed")));
        assert_eq!(a.len(), 2);
        assert_eq!(serde_json::to_string(&b).unwrap(), r#"{"path":"/var/log/app.log"}"#);
        assert_eq!(b.clone().into_iter().count(), 1);
        let mut c = shared.clone();
        c.retain(|_, _| false);
        assert!(c.is_empty());
        assert_eq!(shared.len(), 1);
    }

    use super::*;

    #[test]
    fn a_reshared_copy_counts_its_shared_maps_apart() {
        fn arc(m: &Map) -> &Arc<Vec<(Str, Value)>> {
            match &m.entries {
                Entries::Shared(a) => a,
                Entries::Owned(_) => panic!("not shared"),
            }
        }
        let mut file = Map::new();
        file.insert("path", Value::from("/var/log/app.log"));
        let mut log = Map::new();
        log.insert("file", Value::Object(file.shared()));
        log.insert("offset", Value::Int(0));
        let copy = log.reshared();
        assert_eq!(copy, log);
        let inner = |m: &Map| arc(m.get("file").and_then(Value::as_object).unwrap()).clone();
        assert!(!Arc::ptr_eq(&inner(&copy), &inner(&log)), "a count of its own");
        assert!(matches!(copy.entries, Entries::Owned(_)), "an owned map stays owned");
        let whole = log.clone().shared();
        assert!(!Arc::ptr_eq(arc(&whole.reshared()), arc(&whole)));
    }

    #[test]
    fn parse_keeps_order_and_types() {
        let v = Value::from_json_slice(br#"{"b":1,"a":"x","c":[true,null,1.5],"d":{"e":-2}}"#).unwrap();
        let m = v.as_object().unwrap();
        assert_eq!(m.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["b", "a", "c", "d"]);
        assert_eq!(m.get("b"), Some(&Value::Int(1)));
        assert_eq!(m.get("a").and_then(Value::as_str), Some("x"));
        assert_eq!(serde_json::to_string(&v).unwrap(), r#"{"b":1,"a":"x","c":[true,null,1.5],"d":{"e":-2}}"#);
    }

    #[test]
    fn duplicate_keys_last_wins() {
        let v = Value::from_json_slice(br#"{"a":1,"a":2}"#).unwrap();
        assert_eq!(v.as_object().unwrap().len(), 1);
        assert_eq!(v.as_object().unwrap().get("a"), Some(&Value::Int(2)));
    }

    #[test]
    fn timestamp_serializes_as_rfc3339() {
        let v = Value::Timestamp(1_700_000_000_123_000_000);
        assert_eq!(serde_json::to_string(&v).unwrap(), "\"2023-11-14T22:13:20.123Z\"");
        assert_eq!(Value::Timestamp(1_700_000_000_000_000_001).to_text(), "2023-11-14T22:13:20.000000001Z");
    }

    #[test]
    fn text_rendering() {
        assert_eq!(Value::Float(3.0).to_text(), "3.0");
        assert_eq!(Value::Float(2.5).to_text(), "2.5");
        assert_eq!(Value::Null.to_text(), "");
        assert_eq!(Value::from("x").to_text(), "x");
    }

    #[test]
    fn truthiness() {
        assert!(!Value::Null.is_truthy());
        assert!(!Value::from("").is_truthy());
        assert!(Value::Int(3).is_truthy());
    }
}
