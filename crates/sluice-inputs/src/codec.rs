//! How a line becomes an event: as text in `message`, or as a JSON object.
//!
//! Nothing read is dropped: invalid UTF-8 becomes U+FFFD in both codecs (a JSON line is parsed
//! after the replacement), and a line that is not a JSON object is kept as text and tagged.

use serde::Deserialize;
use sluice_core::{Event, Map, SharedText, Str, Value};

pub const TAG_JSON_FAILURE: &str = "_jsonparsefailure";
pub const TAG_TRUNCATED: &str = "_line_truncated";
/// Tag of an event whose `@timestamp` was not an RFC 3339 date (kept in `_@timestamp`).
pub const TAG_TIMESTAMP_FAILURE: &str = "_timestampparsefailure";

/// `@timestamp` as the inputs that carry other systems' events read it (Beats, Kafka records a
/// Logstash or a Beat wrote): RFC 3339 text, or already a timestamp. `None` for anything else.
pub fn parse_timestamp(value: &Value) -> Option<i64> {
    match value {
        Value::String(s) => chrono::DateTime::parse_from_rfc3339(s).ok().and_then(|d| d.timestamp_nanos_opt()),
        Value::Timestamp(ns) => Some(*ns),
        _ => None,
    }
}

/// Makes an event's own `@timestamp` a timestamp. One that is not a date is kept as
/// `_@timestamp`, the event is stamped `now` and tagged [`TAG_TIMESTAMP_FAILURE`], as Logstash
/// does, so that a time-based index or a `date` condition never sees text where a time belongs.
pub fn read_own_timestamp(event: &mut Event, now: i64) {
    let parsed = match event.fields.get_mut(sluice_core::event::TIMESTAMP) {
        // None: stamped at decoding. A timestamp already: nothing to read.
        None | Some(Value::Timestamp(_)) => return,
        Some(value) => parse_timestamp(value).map(|ns| *value = Value::Timestamp(ns)),
    };
    if parsed.is_none() {
        if let Some(original) = event.fields.remove(sluice_core::event::TIMESTAMP) {
            event.fields.insert("_@timestamp", original);
        }
        event.set_timestamp_nanos(now);
        event.add_tag(TAG_TIMESTAMP_FAILURE);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Codec {
    /// Each line is the `message` of an event.
    #[default]
    Lines,
    /// Each line is a JSON object whose fields become the event; invalid UTF-8 is replaced
    /// (U+FFFD) before parsing. A line that is not a JSON object is kept in `message` and
    /// tagged `_jsonparsefailure`.
    JsonLines,
}

/// The outcome of decoding one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoded {
    Ok,
    /// The line could not be decoded and was kept as text with a tag.
    Failed,
}

impl Codec {
    pub fn decode(self, line: &[u8], truncated: bool, timestamp: i64) -> (Event, Decoded) {
        self.decode_with(line, None, truncated, timestamp)
    }

    /// As [`Codec::decode`] for a `line` cut out of `text`: a text line's `message` then points
    /// into `text` instead of being copied (see [`SharedText`]). A line from elsewhere (one
    /// assembled across two reads), invalid UTF-8 and JSON lines are decoded as usual.
    #[inline]
    pub fn decode_in(self, text: &SharedText, line: &[u8], truncated: bool, timestamp: i64) -> (Event, Decoded) {
        let shared = match self {
            Codec::Lines => text.range_of(line).and_then(|range| text.slice(range).ok()),
            Codec::JsonLines => None,
        };
        self.decode_with(line, shared, truncated, timestamp)
    }

    /// Decodes `line`; a text line's message is `message` when given (the line as a string).
    #[inline]
    fn decode_with(self, line: &[u8], message: Option<Str>, truncated: bool, timestamp: i64) -> (Event, Decoded) {
        let mut decoded = Decoded::Ok;
        let mut event = match self {
            Codec::Lines => Event::from_message_at(message.unwrap_or_else(|| text(line)), timestamp),
            Codec::JsonLines => match (!truncated).then(|| json_object(line)).flatten() {
                Some(map) => Event::from_object_at(map, timestamp),
                None => {
                    decoded = Decoded::Failed;
                    let mut e = Event::from_message_at(text(line), timestamp);
                    e.add_tag(TAG_JSON_FAILURE);
                    e
                }
            },
        };
        if truncated {
            event.add_tag(TAG_TRUNCATED);
        }
        (event, decoded)
    }
}

/// A line as a JSON object, or `None` when it is not one. Invalid UTF-8 is replaced by U+FFFD
/// first, as for a text line, so a log line with one bad byte in a string still parses; the
/// replacement is tried only after a failed parse, so valid lines are read once.
pub(crate) fn json_object(line: &[u8]) -> Option<Map> {
    match serde_json::from_slice::<Map>(line) {
        Ok(map) => Some(map),
        Err(_) if simdutf8::basic::from_utf8(line).is_err() => {
            serde_json::from_str::<Map>(&String::from_utf8_lossy(line)).ok()
        }
        Err(_) => None,
    }
}

/// Bytes as text; invalid UTF-8 is replaced rather than refused, so nothing is dropped.
/// (The check is `simdutf8`'s: on the ASCII-heavy lines of logs it is several times the speed
/// of the standard library's, and it runs once per line of every text input.)
pub fn text(bytes: &[u8]) -> Str {
    match simdutf8::basic::from_utf8(bytes) {
        Ok(s) => Str::new(s),
        Err(_) => Str::from(String::from_utf8_lossy(bytes).into_owned()),
    }
}

/// A JSON value that arrived whole (an HTTP body element) as an event.
pub fn event_from_value(value: Value, timestamp: i64) -> Event {
    match value {
        Value::Object(map) => Event::from_object_at(map, timestamp),
        Value::String(s) => Event::from_message_at(s, timestamp),
        other => Event::from_message_at(other.to_text(), timestamp),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines() {
        let (e, d) = Codec::JsonLines.decode(br#"{"a":1,"message":"m"}"#, false, 0);
        assert_eq!(d, Decoded::Ok);
        assert_eq!(e.message(), Some("m"));
        assert_eq!(e.timestamp_nanos(), Some(0));
        let (e, d) = Codec::JsonLines.decode(b"{broken", false, 0);
        assert_eq!(d, Decoded::Failed);
        assert!(e.has_tag(TAG_JSON_FAILURE));
        assert_eq!(e.message(), Some("{broken"));
        let (_, d) = Codec::JsonLines.decode(b"[1,2]", false, 0);
        assert_eq!(d, Decoded::Failed);
    }

    #[test]
    fn json_line_with_invalid_utf8_is_replaced_then_parsed() {
        let (e, d) = Codec::JsonLines.decode(b"{\"msg\":\"caf\xe9 \xff\",\"n\":1}", false, 7);
        assert_eq!(d, Decoded::Ok);
        assert!(!e.has_tag(TAG_JSON_FAILURE));
        assert_eq!(e.fields.get("msg"), Some(&Value::from("caf\u{fffd} \u{fffd}")));
        assert_eq!(e.fields.get("n"), Some(&Value::Int(1)));
        assert_eq!(e.timestamp_nanos(), Some(7));

        // The same through `decode_in`, as the tcp and stdin inputs call it.
        let text = SharedText::new(b"{\"k\xc3\":\"v\"}".to_vec());
        let line = text.as_bytes();
        let (e, d) = Codec::JsonLines.decode_in(&text, line, false, 0);
        assert_eq!(d, Decoded::Ok);
        assert_eq!(e.fields.get("k\u{fffd}"), Some(&Value::from("v")));
    }

    #[test]
    fn json_line_with_invalid_utf8_that_is_still_not_json_is_kept_and_tagged() {
        let (e, d) = Codec::JsonLines.decode(b"{\"a\":\xff", false, 0);
        assert_eq!(d, Decoded::Failed);
        assert!(e.has_tag(TAG_JSON_FAILURE));
        assert_eq!(e.message(), Some("{\"a\":\u{fffd}"));
        // A JSON value that is not an object stays a failure after the replacement too.
        let (e, d) = Codec::JsonLines.decode(b"[\"\xff\"]", false, 0);
        assert_eq!(d, Decoded::Failed);
        assert_eq!(e.message(), Some("[\"\u{fffd}\"]"));
        // A truncated line is never parsed, valid UTF-8 or not.
        let (e, d) = Codec::JsonLines.decode(b"{\"a\":\"\xff\"}", true, 0);
        assert_eq!(d, Decoded::Failed);
        assert!(e.has_tag(TAG_TRUNCATED) && e.has_tag(TAG_JSON_FAILURE));
    }

    #[test]
    fn invalid_utf8_is_replaced() {
        let (e, _) = Codec::Lines.decode(b"a\xffb", true, 0);
        assert_eq!(e.message(), Some("a\u{fffd}b"));
        assert!(e.has_tag(TAG_TRUNCATED));
    }
}
