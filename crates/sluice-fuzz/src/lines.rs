//! Newline framing and the `lines` / `json_lines` codecs, as the tcp and stdin inputs run
//! them: a stream cut into reads, lines capped at `max_line_bytes`, each line decoded.

use sluice_core::{Event, Map, SharedText};
use sluice_inputs::codec::{Codec, Decoded, TAG_JSON_FAILURE, TAG_TRUNCATED, text};
use sluice_inputs::framing::LineFramer;

use crate::split::split;

/// Input: `[control, stream]` cut by [`split`](crate::split). The control part's first byte
/// sets `max_line_bytes` (1 to 64, or 4096 from 64 on); its other bytes are the sizes of the
/// reads the stream arrives in (1 to 256 bytes each, the rest in one read).
pub fn line_codecs(data: &[u8]) {
    let parts = split(data, 2);
    let (control, stream) = (parts[0], parts[1]);
    let max = match control.first() {
        Some(&b) if b < 64 => usize::from(b) + 1,
        _ => 4096,
    };

    // The lines do not depend on how the stream was cut into reads.
    let mut whole = Vec::new();
    let mut framer = LineFramer::new(max);
    framer.feed(stream, |l| whole.push((l.bytes.to_vec(), l.truncated)));
    framer.finish(|l| whole.push((l.bytes.to_vec(), l.truncated)));

    let mut framer = LineFramer::new(max);
    let mut pieces = Vec::new();
    let mut rest = stream;
    for &size in control.iter().skip(1) {
        if rest.is_empty() {
            break;
        }
        let (read, tail) = rest.split_at((usize::from(size) + 1).min(rest.len()));
        pieces.push(read);
        rest = tail;
    }
    if !rest.is_empty() {
        pieces.push(rest);
    }
    let mut chunked = Vec::new();
    for piece in pieces {
        // Each read arrives in a buffer of its own, as the inputs read, so that decode_in can
        // borrow from it.
        let read = SharedText::new(piece.to_vec());
        framer.feed(read.as_bytes(), |l| {
            check_line(l.bytes, l.truncated, Some(&read), max);
            chunked.push((l.bytes.to_vec(), l.truncated));
        });
        assert!(framer.pending() <= max + 1, "the framer holds {} bytes for one line", framer.pending());
    }
    framer.finish(|l| {
        check_line(l.bytes, l.truncated, None, max);
        chunked.push((l.bytes.to_vec(), l.truncated));
    });
    assert_eq!(chunked, whole, "the lines depend on how the stream was cut into reads");
}

fn check_line(line: &[u8], truncated: bool, read: Option<&SharedText>, max: usize) {
    assert!(line.len() <= max, "a line of {} bytes passed max_line_bytes {max}", line.len());
    assert!(!line.contains(&b'\n'), "a line holds a newline");
    let lossy = String::from_utf8_lossy(line);
    for codec in [Codec::Lines, Codec::JsonLines] {
        let (event, decoded) = codec.decode(line, truncated, 42);
        if let Some(read) = read {
            let (borrowed, borrowed_decoded) = codec.decode_in(read, line, truncated, 42);
            assert_eq!((&borrowed, borrowed_decoded), (&event, decoded), "decode_in and decode differ");
        }
        assert_eq!(event.has_tag(TAG_TRUNCATED), truncated, "the truncation tag is wrong");
        match (codec, decoded) {
            (Codec::Lines, Decoded::Ok) => assert_eq!(event.message(), Some(&*lossy), "a text line changed"),
            (Codec::Lines, Decoded::Failed) => panic!("a text line failed to decode"),
            (Codec::JsonLines, Decoded::Ok) => {
                assert!(!truncated, "a truncated line was parsed as JSON");
                let expected = Event::from_object_at(
                    serde_json::from_str::<Map>(&lossy)
                        .expect("a line decoded as JSON is a JSON object once its invalid UTF-8 is replaced"),
                    42,
                );
                assert_eq!(event, expected, "a JSON line's fields are not the object's");
            }
            (Codec::JsonLines, Decoded::Failed) => {
                assert!(
                    truncated || serde_json::from_str::<Map>(&lossy).is_err(),
                    "a JSON object line (invalid UTF-8 replaced) was not parsed: {lossy:?}"
                );
                assert!(event.has_tag(TAG_JSON_FAILURE));
                assert_eq!(event.message(), Some(text(line).as_str()), "an unparsable line is not kept as text");
            }
        }
    }
}
