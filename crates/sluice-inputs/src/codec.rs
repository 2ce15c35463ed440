//! How a line becomes an event: as text in `message`, or as a JSON object.

use serde::Deserialize;
use sluice_core::{Event, Map, SharedText, Str, Value};

pub const TAG_JSON_FAILURE: &str = "_jsonparsefailure";
pub const TAG_TRUNCATED: &str = "_line_truncated";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Codec {
    /// Each line is the `message` of an event.
    #[default]
    Lines,
    /// Each line is a JSON object whose fields become the event; a line that is not a JSON
    /// object is kept in `message` and tagged `_jsonparsefailure`.
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
            Codec::JsonLines => match serde_json::from_slice::<Map>(line) {
                Ok(map) if !truncated => Event::from_object_at(map, timestamp),
                _ => {
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
    fn invalid_utf8_is_replaced() {
        let (e, _) = Codec::Lines.decode(b"a\xffb", true, 0);
        assert_eq!(e.message(), Some("a\u{fffd}b"));
        assert!(e.has_tag(TAG_TRUNCATED));
    }
}
