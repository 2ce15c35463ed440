//! The segment format of the persisted queue and the dead letter queue: the 64-byte header,
//! the checksummed frames (scanned as recovery and `sluice queue verify` scan them) and the
//! binary event codec of the frame bodies.

use sluice_core::{Event, SharedText};
use sluice_segment::{
    DEFAULT_MAX_FRAME_LEN, EventDecoder, FRAME_OVERHEAD, FrameRef, FrameResult, SEGMENT_HEADER_LEN, SegmentHeader,
    append_frame, decode_batch_body, decode_event_body, decode_value, encode_batch, encode_event, encode_value,
    frame_ending_at, frame_size, scan_frames,
};

use crate::checksums::fix_segment;

/// Reads `data` as a segment header, as a run of frames (from offset 0, and from the end of a
/// header as a segment file, once as given and once with its checksums made to hold), and as
/// event, batch and value bodies.
pub fn segment_codec(data: &[u8]) {
    if let Ok(header) = SegmentHeader::decode(data) {
        assert_eq!(SegmentHeader::decode(&header.encode()), Ok(header), "a decoded header encodes to itself");
    }
    check_frames(data, 0);
    if data.len() >= SEGMENT_HEADER_LEN {
        check_frames(data, SEGMENT_HEADER_LEN);
        // The same bytes with every checksum made to hold: damaged contents behind valid CRCs.
        let fixed = fix_segment(data);
        if fixed != data {
            if let Ok(header) = SegmentHeader::decode(&fixed) {
                assert_eq!(SegmentHeader::decode(&header.encode()), Ok(header), "a decoded header encodes to itself");
            }
            check_frames(&fixed, SEGMENT_HEADER_LEN);
        }
    }
    check_body(data, &mut EventDecoder::new());
    let mut rest = data;
    if let Ok(value) = decode_value(&mut rest) {
        let mut encoded = Vec::new();
        encode_value(&value, &mut encoded).expect("a decoded value encodes");
        let mut again = encoded.as_slice();
        let decoded = decode_value(&mut again).expect("an encoded value decodes");
        assert!(again.is_empty(), "decoding an encoded value leaves bytes over");
        let mut reencoded = Vec::new();
        encode_value(&decoded, &mut reencoded).expect("a decoded value encodes");
        assert_eq!(encoded, reencoded, "a value changes across a round trip");
    }
}

/// Scans `buf` from `start` and checks each item against the guarantees of `FrameCursor`.
fn check_frames(buf: &[u8], start: usize) {
    let mut decoder = EventDecoder::new();
    let mut frames: Vec<(u64, &[u8])> = Vec::new();
    let mut pos = start;
    let mut after_garbage = false;
    let mut ended = false;
    for item in scan_frames(buf, start) {
        assert!(!ended, "an item after the final Torn: {item:?}");
        match item {
            FrameResult::Frame { offset, seq, body } => {
                assert_eq!(offset, pos, "a frame not where the previous item ended");
                let end = offset + frame_size(body.len());
                assert!(end <= buf.len(), "a frame past the end of the buffer");
                assert_eq!(
                    frame_ending_at(buf, end, DEFAULT_MAX_FRAME_LEN),
                    Some(FrameRef { offset, seq, body }),
                    "walking back from the end of a frame finds another"
                );
                frames.push((seq, body));
                check_body(body, &mut decoder);
                pos = end;
            }
            FrameResult::Corrupt { offset, len, .. } => {
                assert!(!after_garbage, "Garbage not followed by the frame it announced");
                assert_eq!(offset, pos, "a corrupt frame not where the previous item ended");
                pos = offset + FRAME_OVERHEAD + len as usize;
                assert!(pos <= buf.len(), "a corrupt frame past the end of the buffer");
            }
            FrameResult::Garbage { offset, len, .. } => {
                assert!(!after_garbage, "Garbage not followed by the frame it announced");
                assert_eq!(offset, pos, "garbage not where the previous item ended");
                assert!(len > 0 && offset + len < buf.len(), "garbage of {len} bytes at {offset}");
                pos = offset + len;
            }
            FrameResult::Torn { offset } => {
                assert!(!after_garbage, "Garbage not followed by the frame it announced");
                assert_eq!(offset, pos, "a torn tail not where the previous item ended");
                ended = true;
            }
            FrameResult::End => panic!("the iterator yielded End instead of finishing"),
        }
        after_garbage = matches!(item, FrameResult::Garbage { .. });
    }
    assert!(!after_garbage, "Garbage was the last item");
    if !ended {
        assert_eq!(pos, buf.len(), "the scan finished before the end of the buffer without a torn tail");
    }

    // The frames found, written again, read back as exactly those frames and nothing else.
    let mut rewritten = Vec::new();
    for (seq, body) in &frames {
        append_frame(&mut rewritten, *seq, |out: &mut Vec<u8>| out.extend_from_slice(body)).expect("a frame read fits");
    }
    let reread: Vec<(u64, &[u8])> = scan_frames(&rewritten, 0)
        .map(|item| match item {
            FrameResult::Frame { seq, body, .. } => (seq, body),
            other => panic!("rewritten frames read back as {other:?}"),
        })
        .collect();
    assert_eq!(reread, frames, "rewritten frames read back differently");
}

/// Decodes `body` as one event and as a batch, with `decoder` (which remembers keys across
/// bodies), with a fresh decoder and borrowing from shared text: all must agree, and what
/// decodes must survive a round trip through the encoder.
fn check_body(body: &[u8], decoder: &mut EventDecoder) {
    let fresh = decode_event_body(body);
    let remembered = decoder.decode_event_body(body);
    let text = SharedText::new(body.to_vec());
    let mut borrowed = Vec::new();
    let borrowed = EventDecoder::new().decode_event_body_into(text.as_bytes(), Some(&text), &mut borrowed).map(|()| {
        assert_eq!(borrowed.len(), 1, "decode_event_body_into pushed {} events", borrowed.len());
        borrowed.pop().expect("one event")
    });
    let fresh_bytes = fresh.as_ref().map(|e| event_bytes(std::slice::from_ref(e), false)).map_err(Clone::clone);
    for (how, other) in [("a decoder with key memory", &remembered), ("a decoder borrowing shared text", &borrowed)] {
        let other = other.as_ref().map(|e| event_bytes(std::slice::from_ref(e), false)).map_err(Clone::clone);
        assert_eq!(fresh_bytes, other, "{how} decodes differently from a fresh one");
    }
    if let Ok(event) = &fresh {
        round_trip(std::slice::from_ref(event), false);
    }
    if let Ok(events) = decode_batch_body(body) {
        round_trip(&events, true);
        let mut again = body;
        let mut out = Vec::new();
        let n = decoder
            .decode_batch_into(&mut again, &mut out)
            .expect("a batch that decodes fresh decodes with key memory");
        assert!(again.is_empty() && n == events.len(), "a decoder with key memory reads a batch differently");
        assert_eq!(event_bytes(&out, true), event_bytes(&events, true), "key memory changes a batch");
    }
}

fn event_bytes(events: &[Event], batch: bool) -> Vec<u8> {
    let mut out = Vec::new();
    if batch {
        encode_batch(events, &mut out).expect("decoded events encode");
    } else {
        for e in events {
            encode_event(e, &mut out).expect("a decoded event encodes");
        }
    }
    out
}

/// Encodes decoded events, decodes that, and encodes again: the two encodings are the same.
fn round_trip(events: &[Event], batch: bool) {
    let encoded = event_bytes(events, batch);
    let decoded = if batch {
        decode_batch_body(&encoded).expect("an encoded batch decodes")
    } else {
        vec![decode_event_body(&encoded).expect("an encoded event decodes")]
    };
    assert_eq!(decoded.len(), events.len(), "a round trip changes the number of events");
    assert_eq!(event_bytes(&decoded, batch), encoded, "events change across a round trip");
}
