//! One record moving through a pipeline.
//!
//! An event is its root [`Map`]. Two keys are special, as in Logstash: `@timestamp` (a
//! [`Value::Timestamp`]) and `@metadata`, an object that processors and conditions can use and
//! that outputs never write out. Tags live in the `tags` array.

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

use crate::path::FieldPath;
use crate::value::{Map, Str, Value};

pub const TIMESTAMP: &str = "@timestamp";
pub const METADATA: &str = "@metadata";
pub const MESSAGE: &str = "message";
pub const TAGS: &str = "tags";

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Event {
    pub fields: Map,
}

impl Event {
    pub fn new(fields: Map) -> Event {
        Event { fields }
    }

    /// An event holding one line of text, stamped now. Inputs that make many events at once
    /// use [`Event::from_message_at`] with one clock reading for the whole batch.
    pub fn from_message(message: impl Into<Str>) -> Event {
        Event::from_message_at(message, crate::value::now_nanos())
    }

    pub fn from_message_at(message: impl Into<Str>, timestamp_nanos: i64) -> Event {
        let mut fields = Map::with_capacity(4);
        fields.push_unchecked(MESSAGE, Value::String(message.into()));
        fields.push_unchecked(TIMESTAMP, Value::Timestamp(timestamp_nanos));
        Event { fields }
    }

    /// An event from a decoded JSON object; `@timestamp` is added when the object has none.
    pub fn from_object_at(mut fields: Map, timestamp_nanos: i64) -> Event {
        if !fields.contains_key(TIMESTAMP) {
            fields.push_unchecked(TIMESTAMP, Value::Timestamp(timestamp_nanos));
        }
        Event { fields }
    }

    pub fn get(&self, path: &FieldPath) -> Option<&Value> {
        path.get(&self.fields)
    }

    pub fn get_mut(&mut self, path: &FieldPath) -> Option<&mut Value> {
        path.get_mut(&mut self.fields)
    }

    pub fn insert(&mut self, path: &FieldPath, value: Value) -> Result<Option<Value>, Value> {
        path.insert(&mut self.fields, value)
    }

    pub fn remove(&mut self, path: &FieldPath) -> Option<Value> {
        path.remove(&mut self.fields)
    }

    pub fn message(&self) -> Option<&str> {
        self.fields.get(MESSAGE).and_then(Value::as_str)
    }

    pub fn timestamp_nanos(&self) -> Option<i64> {
        match self.fields.get(TIMESTAMP) {
            Some(Value::Timestamp(ns)) => Some(*ns),
            _ => None,
        }
    }

    pub fn set_timestamp_nanos(&mut self, ns: i64) {
        self.fields.insert(TIMESTAMP, Value::Timestamp(ns));
    }

    /// Adds a tag once; `tags` becomes an array if it was missing or a scalar.
    pub fn add_tag(&mut self, tag: &str) {
        let tags = self.fields.entry_or_insert_with(TAGS, || Value::Array(Vec::new()));
        if !matches!(tags, Value::Array(_)) {
            let old = std::mem::take(tags);
            *tags = Value::Array(if old.is_null() { vec![] } else { vec![old] });
        }
        if let Value::Array(a) = tags
            && !a.iter().any(|t| t.as_str() == Some(tag))
        {
            a.push(Value::from(tag));
        }
    }

    pub fn has_tag(&self, tag: &str) -> bool {
        match self.fields.get(TAGS) {
            Some(Value::Array(a)) => a.iter().any(|t| t.as_str() == Some(tag)),
            Some(Value::String(s)) => s == tag,
            _ => false,
        }
    }

    /// The `@metadata` object, created on first use.
    pub fn metadata_mut(&mut self) -> &mut Map {
        let v = self.fields.entry_or_insert_with(METADATA, || Value::Object(Map::new()));
        if !matches!(v, Value::Object(_)) {
            *v = Value::Object(Map::new());
        }
        v.as_object_mut().expect("just made an object")
    }

    /// Appends the event as one line of JSON (without `@metadata`) and no newline.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        // Writing into a Vec cannot fail, and every value is representable in JSON.
        let _ = serde_json::to_writer(&mut *out, &Wire(self));
    }

    pub fn to_json_string(&self) -> String {
        let mut out = Vec::with_capacity(256);
        self.write_json(&mut out);
        String::from_utf8(out).unwrap_or_default()
    }

    /// What the event costs in memory, in bytes: its own struct, its maps, arrays and owned
    /// strings, with the allocator's overhead per allocation. Slices of shared buffers count
    /// nothing (the input that made the buffer charges it once), nor do shared maps. This is
    /// what the node's [`crate::MemoryBudget`] is charged for decoded events.
    pub fn memory_size(&self) -> usize {
        size_of::<Event>() + self.fields.heap_bytes()
    }

    /// A rough size in bytes, for queue accounting when no raw size is known.
    pub fn estimated_bytes(&self) -> usize {
        fn est(v: &Value) -> usize {
            match v {
                Value::String(s) => s.len() + 8,
                Value::Array(a) => a.iter().map(est).sum::<usize>() + 8,
                Value::Object(m) => m.iter().map(|(k, v)| k.len() + est(v)).sum::<usize>() + 8,
                _ => 8,
            }
        }
        self.fields.iter().map(|(k, v)| k.len() + est(v)).sum()
    }
}

/// The event as outputs write it: every field but `@metadata`.
struct Wire<'a>(&'a Event);

impl Serialize for Wire<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let fields = &self.0.fields;
        let n = fields.len() - usize::from(fields.contains_key(METADATA));
        let mut map = s.serialize_map(Some(n))?;
        for (k, v) in fields.iter() {
            if k != METADATA {
                map.serialize_entry(k.as_str(), v)?;
            }
        }
        map.end()
    }
}

impl Serialize for Event {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Wire(self).serialize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_size_counts_what_the_event_holds() {
        let small = Event::from_message_at("hi", 0);
        // The struct and one allocation of four entries; inline strings cost nothing more.
        assert_eq!(small.memory_size(), size_of::<Event>() + 4 * 56 + 16);
        let long = "x".repeat(1000);
        let big = Event::from_message_at(long.as_str(), 0);
        assert!(big.memory_size() >= small.memory_size() + 1000);
        let shared = crate::SharedText::new(format!("{long}\n").into_bytes());
        let slice = Event::from_message_at(shared.slice(0..1000).unwrap(), 0);
        assert_eq!(slice.memory_size(), small.memory_size(), "a shared buffer is counted by its maker");
        let mut nested = Map::new();
        nested.insert("a", Value::Array(vec![Value::Int(1); 10]));
        let e = Event::new(nested);
        assert!(e.memory_size() >= 10 * 32 + 56);
    }

    #[test]
    fn metadata_is_not_written() {
        let mut e = Event::from_message_at("hi", 0);
        e.metadata_mut().insert("secret", Value::Int(1));
        assert_eq!(e.to_json_string(), r#"{"message":"hi","@timestamp":"1970-01-01T00:00:00.000Z"}"#);
        assert_eq!(e.get(&FieldPath::parse("/@metadata/secret").unwrap()), Some(&Value::Int(1)));
    }

    #[test]
    fn tags_are_unique_and_promote_scalars() {
        let mut e = Event::from_message_at("hi", 0);
        e.add_tag("a");
        e.add_tag("a");
        assert_eq!(e.fields.get(TAGS), Some(&Value::Array(vec![Value::from("a")])));
        e.fields.insert(TAGS, Value::from("x"));
        e.add_tag("b");
        assert!(e.has_tag("x") && e.has_tag("b"));
    }
}
