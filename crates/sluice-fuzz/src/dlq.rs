//! One dead letter entry's frame body, as the DLQ reader, `sluice dlq` and the
//! `dead_letter_queue` input decode it.

use sluice_dlq::{decode_entry, encode_entry, entry_time};

/// Decodes `data` as an entry body; what decodes must encode and decode to the same bytes, and
/// its time must be what `entry_time` reads without decoding the rest.
pub fn dlq_entry(data: &[u8]) {
    let time = entry_time(data);
    let Ok(entry) = decode_entry(data) else {
        return;
    };
    assert_eq!(time, Some(entry.time), "entry_time disagrees with the decoded entry");
    let mut encoded = Vec::new();
    encode_entry(&entry, &mut encoded).expect("a decoded entry encodes");
    let decoded = decode_entry(&encoded).expect("an encoded entry decodes");
    assert_eq!(
        (&decoded.reason, &decoded.plugin_id, &decoded.plugin_type, &decoded.pipeline, decoded.time, decoded.attempts),
        (&entry.reason, &entry.plugin_id, &entry.plugin_type, &entry.pipeline, entry.time, entry.attempts),
        "an entry's metadata changes across a round trip"
    );
    let mut reencoded = Vec::new();
    encode_entry(&decoded, &mut reencoded).expect("a decoded entry encodes");
    assert_eq!(reencoded, encoded, "an entry changes across a round trip");
}
