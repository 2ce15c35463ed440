//! The http input's request body path: optional gzip decoding under a size limit, then the
//! body parsed into events by the input's own parser, through
//! `sluice_inputs::parse_body_for_fuzzing`, which runs the chunked parse the input uses and a
//! whole-body parse, and checks that they and serde_json agree on the number of events.
//!
//! The input inflates gzip a step at a time against its memory budget (an async path); this
//! target inflates the same way (`MultiGzDecoder`, every member, refused past the limit) in
//! one go, which is what reaches the parser.

use std::io::Read;

use sluice_inputs::parse_body_for_fuzzing;

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
    match parse_body_for_fuzzing(&body) {
        Ok(events) => {
            let text = body.strip_prefix("\u{feff}".as_bytes()).unwrap_or(&body);
            if let Ok(serde_json::Value::Array(items)) = serde_json::from_slice::<serde_json::Value>(text) {
                assert_eq!(events, items.len(), "an array body gives another number of events than elements");
            }
        }
        Err(reason) => assert!(!reason.is_empty(), "a refused body without a reason"),
    }
}

/// Every gzip member, at most `limit` bytes of output.
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
