//! The frame body of one dead letter entry (layout in the crate docs): fixed-width time first, so
//! recovery reads it without decoding the rest; then the metadata; then the event.

use sluice_segment::codec::{get_varint, put_varint};
use sluice_segment::{CodecError, EventDecoder, encode_event};

use crate::DeadLetter;

/// Appends the body of `entry` to `out`. On error `out` may hold a partial body: callers
/// encode inside [`sluice_segment::try_append_frame`], which rolls it back.
pub fn encode_entry(entry: &DeadLetter, out: &mut Vec<u8>) -> Result<(), CodecError> {
    out.extend_from_slice(&entry.time.to_le_bytes());
    put_varint(out, entry.attempts as u64);
    for s in [&entry.reason, &entry.plugin_id, &entry.plugin_type, &entry.pipeline] {
        put_varint(out, s.len() as u64);
        out.extend_from_slice(s.as_bytes());
    }
    encode_event(&entry.event, out)
}

/// The entry time of a body, read without decoding the rest.
pub fn entry_time(body: &[u8]) -> Option<i64> {
    body.first_chunk::<8>().map(|b| i64::from_le_bytes(*b))
}

/// Decodes a whole body. Never panics; any malformed input is an error.
pub fn decode_entry(body: &[u8]) -> Result<DeadLetter, CodecError> {
    decode_entry_with(body, &mut EventDecoder::new())
}

pub(crate) fn decode_entry_with(body: &[u8], decoder: &mut EventDecoder) -> Result<DeadLetter, CodecError> {
    let time = entry_time(body).ok_or(CodecError::UnexpectedEnd)?;
    let mut rest = &body[8..];
    let attempts = get_varint(&mut rest)?;
    let attempts = u32::try_from(attempts).map_err(|_| CodecError::LengthOutOfBounds(attempts))?;
    let mut strings: [String; 4] = Default::default();
    for s in &mut strings {
        let len = get_varint(&mut rest)?;
        if len > rest.len() as u64 {
            return Err(CodecError::LengthOutOfBounds(len));
        }
        let (bytes, tail) = rest.split_at(len as usize);
        *s = std::str::from_utf8(bytes).map_err(|_| CodecError::InvalidUtf8)?.to_owned();
        rest = tail;
    }
    let event = decoder.decode_event_body(rest)?;
    let [reason, plugin_id, plugin_type, pipeline] = strings;
    Ok(DeadLetter { event, reason, plugin_id, plugin_type, pipeline, time, attempts })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::{Event, Value};

    fn sample() -> DeadLetter {
        let mut event = Event::from_message_at("GET /index.html 404", 1_700_000_000_000_000_000);
        event.fields.insert("status", Value::Int(404));
        DeadLetter {
            event,
            reason: "400 Bad Request: mapper_parsing_exception".into(),
            plugin_id: "es-out".into(),
            plugin_type: "http".into(),
            pipeline: "main".into(),
            time: -5,
            attempts: 3,
        }
    }

    #[test]
    fn round_trips() {
        let e = sample();
        let mut body = Vec::new();
        encode_entry(&e, &mut body).unwrap();
        assert_eq!(entry_time(&body), Some(-5));
        assert_eq!(decode_entry(&body).unwrap(), e);
    }

    #[test]
    fn every_truncation_and_flip_is_an_error_or_a_value_never_a_panic() {
        let mut body = Vec::new();
        encode_entry(&sample(), &mut body).unwrap();
        for cut in 0..body.len() {
            assert!(decode_entry(&body[..cut]).is_err(), "cut at {cut}");
        }
        for at in 0..body.len() {
            for bit in 0..8 {
                let mut bad = body.clone();
                bad[at] ^= 1 << bit;
                let _ = decode_entry(&bad);
            }
        }
        let mut extra = body.clone();
        extra.push(0);
        assert_eq!(decode_entry(&extra), Err(CodecError::TrailingBytes(1)));
    }
}
