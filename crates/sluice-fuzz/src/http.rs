//! The http input's request body path: optional gzip decoding under a size limit, then the
//! body read as one JSON array of events or as a stream of JSON values (NDJSON or
//! concatenated), through `serde_json` into `sluice_core::Value`.
//!
//! The body parser of the http input is private to it; until it is exposed for fuzzing this
//! target runs the same steps with the same crates and the same rules (a leading byte order
//! mark skipped, blank bodies empty, `[` opening an array, anything else a stream of values,
//! every element an event through `sluice_inputs::codec::event_from_value`).

use std::io::Read;

use sluice_core::{Event, Value};
use sluice_inputs::codec::event_from_value;

/// The decompressed size past which a gzip body is refused (413), as `max_body_bytes` does.
const MAX_BODY: usize = 1 << 20;

/// Input: one flags byte (bit 0: the body is gzip-compressed), then the body.
pub fn http_body(data: &[u8]) {
    let Some((&flags, raw)) = data.split_first() else { return };
    let body = if flags & 1 != 0 {
        match gunzip(raw, MAX_BODY) {
            Ok(body) => body,
            Err(reason) => {
                assert!(!reason.is_empty(), "a gzip error without a reason");
                return;
            }
        }
    } else {
        raw.to_vec()
    };
    assert!(body.len() <= MAX_BODY, "a gzip body past the limit was accepted");
    match parse_body(&body, 7) {
        Ok(events) => {
            let text = body.strip_prefix("\u{feff}".as_bytes()).unwrap_or(&body);
            if let Ok(serde_json::Value::Array(items)) = serde_json::from_slice::<serde_json::Value>(text) {
                assert_eq!(events.len(), items.len(), "an array body gives another number of events than elements");
            }
        }
        Err(reason) => assert!(!reason.is_empty(), "a refused body without a reason"),
    }
}

/// As the http input decodes `Content-Encoding: gzip`: every member, at most `limit` bytes.
fn gunzip(raw: &[u8], limit: usize) -> Result<Vec<u8>, String> {
    let mut out = Vec::with_capacity((raw.len() * 4).min(limit));
    flate2::read::MultiGzDecoder::new(raw)
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| format!("invalid gzip body: {e}"))?;
    if out.len() > limit {
        return Err(format!("the body is larger than max_body_bytes ({limit})"));
    }
    Ok(out)
}

/// The body's events, or why the request is refused (400).
fn parse_body(body: &[u8], timestamp: i64) -> Result<Vec<Event>, String> {
    let body = body.strip_prefix("\u{feff}".as_bytes()).unwrap_or(body);
    let Some(start) = body.iter().position(|b| !b.is_ascii_whitespace()) else {
        return Ok(Vec::new());
    };
    if body[start] == b'[' {
        let values: Vec<Value> =
            serde_json::from_slice(body).map_err(|e| format!("invalid JSON in the array body: {e}"))?;
        Ok(values.into_iter().map(|v| event_from_value(v, timestamp)).collect())
    } else {
        let mut events = Vec::new();
        for (i, value) in serde_json::Deserializer::from_slice(body).into_iter::<Value>().enumerate() {
            let v =
                value.map_err(|e| format!("invalid JSON on line {} (value {i}, counting from 0): {e}", e.line()))?;
            events.push(event_from_value(v, timestamp));
        }
        Ok(events)
    }
}
