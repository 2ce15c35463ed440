//! How a Kafka record becomes an event: its value through the codec, and where its topic,
//! partition, offset, key, timestamp and headers go.
//!
//! The consumer thread copies what it needs out of librdkafka's message into a [`Record`] (the
//! key and headers only when a field is configured for them); the task that sends batches turns
//! records into events. Nothing is dropped: invalid UTF-8 becomes U+FFFD, a value that is not a
//! JSON object with `codec: json` is kept as text in `message` and tagged `_jsonparsefailure`,
//! and a null value (a tombstone) is an empty message.

use std::sync::Arc;

use rdkafka::Message;
use rdkafka::message::{BorrowedMessage, Headers};
use sluice_core::{Event, FieldPath, Map, Str, Value};

use crate::admission;
use crate::codec::{Codec, Decoded, text};

/// One record, copied out of librdkafka.
#[derive(Debug, Clone)]
pub(super) struct Record {
    pub topic: Arc<str>,
    pub partition: i32,
    pub offset: i64,
    /// The partition's assignment epoch when the record was polled.
    pub epoch: u64,
    pub timestamp_ms: Option<i64>,
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

/// Where the record's facts go; `None` leaves one out.
#[derive(Debug, Clone)]
pub(super) struct Fields {
    pub topic: Option<FieldPath>,
    pub partition: Option<FieldPath>,
    pub offset: Option<FieldPath>,
    pub key: Option<FieldPath>,
    pub timestamp: Option<FieldPath>,
    pub headers: Option<FieldPath>,
}

/// What the facts of one record add to its event, roughly, for the estimate made before
/// decoding (the charge is trued up to the real size after).
const FACTS_BYTES: usize = 320;

impl Fields {
    /// Copies `m` into a record.
    pub(super) fn record(&self, m: &BorrowedMessage<'_>, topic: Arc<str>, epoch: u64) -> Record {
        let headers = match (&self.headers, m.headers()) {
            (Some(_), Some(h)) => {
                h.iter().map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec))).collect::<Vec<_>>()
            }
            _ => Vec::new(),
        };
        Record {
            topic,
            partition: m.partition(),
            offset: m.offset(),
            epoch,
            timestamp_ms: self.timestamp.as_ref().and(m.timestamp().to_millis()),
            key: self.key.as_ref().and(m.key()).map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec).unwrap_or_default(),
            headers,
        }
    }

    fn any(&self) -> bool {
        self.topic.is_some()
            || self.partition.is_some()
            || self.offset.is_some()
            || self.key.is_some()
            || self.timestamp.is_some()
            || self.headers.is_some()
    }

    /// What to reserve in the memory budget before decoding `records` holding `bytes`.
    pub(super) fn estimate(&self, codec: Codec, records: usize, bytes: usize) -> usize {
        admission::estimate(codec, bytes, records) + if self.any() { records * FACTS_BYTES } else { 0 }
    }

    /// The event of `record`, stamped `now`.
    pub(super) fn decode(&self, codec: Codec, record: &Record, now: i64) -> (Event, Decoded) {
        let (mut event, decoded) = codec.decode(&record.value, false, now);
        if codec == Codec::JsonLines && decoded == Decoded::Ok {
            // A record a Logstash or a Beat wrote carries its time as RFC 3339 text.
            crate::codec::read_own_timestamp(&mut event, now);
        }
        let mut put = |path: &Option<FieldPath>, value: Value| {
            if let Some(path) = path {
                // A field the value already holds as a scalar where an object is needed is
                // left as it is: the event is kept either way.
                let _ = event.insert(path, value);
            }
        };
        put(&self.topic, Value::String(Str::from(&*record.topic)));
        put(&self.partition, Value::Int(i64::from(record.partition)));
        put(&self.offset, Value::Int(record.offset));
        if let Some(key) = &record.key {
            put(&self.key, Value::String(text(key)));
        }
        if let Some(ms) = record.timestamp_ms {
            put(&self.timestamp, Value::Timestamp(ms.saturating_mul(1_000_000)));
        }
        if !record.headers.is_empty() {
            put(&self.headers, Value::Object(headers(&record.headers)));
        }
        (event, decoded)
    }
}

/// Headers by name; a value that is not UTF-8 has U+FFFD in place of its bad bytes, a null value
/// is null, and a name that appears more than once holds its values in order, as an array.
fn headers(list: &[(String, Option<Vec<u8>>)]) -> Map {
    let mut map = Map::with_capacity(list.len());
    for (name, value) in list {
        let value = value.as_deref().map_or(Value::Null, |v| Value::String(text(v)));
        map.insert_gathering(Str::from(name.as_str()), value);
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> Fields {
        let f = |p: &str| FieldPath::parse(p).ok();
        Fields {
            topic: f("/@metadata/kafka/topic"),
            partition: f("/@metadata/kafka/partition"),
            offset: f("/@metadata/kafka/offset"),
            key: f("/@metadata/kafka/key"),
            timestamp: f("/@metadata/kafka/timestamp"),
            headers: f("/@metadata/kafka/headers"),
        }
    }

    fn record(value: &[u8]) -> Record {
        Record {
            topic: Arc::from("logs"),
            partition: 2,
            offset: 41,
            epoch: 1,
            timestamp_ms: Some(1_700_000_000_123),
            key: Some(b"user-\xff".to_vec()),
            value: value.to_vec(),
            headers: vec![
                ("trace".into(), Some(b"abc".to_vec())),
                ("none".into(), None),
                ("hop".into(), Some(b"1".to_vec())),
                ("hop".into(), Some(b"2".to_vec())),
            ],
        }
    }

    fn get(e: &Event, path: &str) -> Option<Value> {
        e.get(&FieldPath::parse(path).unwrap()).cloned()
    }

    #[test]
    fn facts_go_under_metadata_by_default() {
        let (e, d) = defaults().decode(Codec::JsonLines, &record(br#"{"level":"info","n":1}"#), 7);
        assert_eq!(d, Decoded::Ok);
        assert_eq!(get(&e, "/level"), Some(Value::from("info")));
        assert_eq!(get(&e, "/@metadata/kafka/topic"), Some(Value::from("logs")));
        assert_eq!(get(&e, "/@metadata/kafka/partition"), Some(Value::Int(2)));
        assert_eq!(get(&e, "/@metadata/kafka/offset"), Some(Value::Int(41)));
        assert_eq!(get(&e, "/@metadata/kafka/key"), Some(Value::from("user-\u{fffd}")));
        assert_eq!(get(&e, "/@metadata/kafka/timestamp"), Some(Value::Timestamp(1_700_000_000_123_000_000)));
        assert_eq!(get(&e, "/@metadata/kafka/headers/trace"), Some(Value::from("abc")));
        assert_eq!(get(&e, "/@metadata/kafka/headers/none"), Some(Value::Null));
        assert_eq!(
            get(&e, "/@metadata/kafka/headers/hop"),
            Some(Value::Array(vec![Value::from("1"), Value::from("2")]))
        );
        assert_eq!(e.timestamp_nanos(), Some(7), "@timestamp is the time read");
        // Outputs never write @metadata.
        assert!(!e.to_json_string().contains("kafka"), "{}", e.to_json_string());
    }

    #[test]
    fn fields_can_be_moved_or_left_out() {
        let fields = Fields {
            topic: FieldPath::parse("/kafka_topic").ok(),
            partition: None,
            offset: None,
            key: None,
            timestamp: None,
            headers: None,
        };
        let (e, _) = fields.decode(Codec::Lines, &record(b"plain line"), 0);
        assert_eq!(e.message(), Some("plain line"));
        assert_eq!(get(&e, "/kafka_topic"), Some(Value::from("logs")));
        assert_eq!(get(&e, "/@metadata"), None);
        assert_eq!(fields.estimate(Codec::Lines, 10, 100), admission::estimate(Codec::Lines, 100, 10) + 3200);
    }

    #[test]
    fn a_records_own_timestamp_is_read_and_one_that_is_not_a_date_is_kept_and_tagged() {
        let tag = crate::codec::TAG_TIMESTAMP_FAILURE;
        let (e, _) =
            defaults().decode(Codec::JsonLines, &record(br#"{"@timestamp":"2024-05-06T07:08:09.5Z","n":1}"#), 7);
        assert_eq!(e.timestamp_nanos(), Some(1_714_979_289_500_000_000), "{}", e.to_json_string());
        assert!(!e.has_tag(tag));
        let (e, _) = defaults().decode(Codec::JsonLines, &record(br#"{"@timestamp":"yesterday","n":1}"#), 7);
        assert_eq!(e.timestamp_nanos(), Some(7), "stamped with the time read");
        assert_eq!(get(&e, "/_@timestamp"), Some(Value::from("yesterday")));
        assert!(e.has_tag(tag), "{}", e.to_json_string());
        let (e, _) = defaults().decode(Codec::JsonLines, &record(br#"{"@timestamp":12,"n":1}"#), 7);
        assert_eq!((e.timestamp_nanos(), get(&e, "/_@timestamp")), (Some(7), Some(Value::Int(12))));
        // Text is text: a `message` that looks like JSON with a bad time is not looked into.
        let (e, _) = defaults().decode(Codec::Lines, &record(br#"{"@timestamp":"yesterday"}"#), 7);
        assert!(!e.has_tag(tag));
    }

    #[test]
    fn broken_json_and_tombstones_are_kept() {
        let (e, d) = defaults().decode(Codec::JsonLines, &record(b"{not json"), 0);
        assert_eq!(d, Decoded::Failed);
        assert!(e.has_tag(crate::codec::TAG_JSON_FAILURE));
        assert_eq!(e.message(), Some("{not json"));
        let (e, d) = defaults().decode(Codec::Lines, &record(b""), 0);
        assert_eq!(d, Decoded::Ok);
        assert_eq!(e.message(), Some(""));
    }
}
