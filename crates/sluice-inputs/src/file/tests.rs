//! Unit tests of the `file` input's line framing and event making.

use super::events::*;
use super::framing::*;
use super::reader::*;
use std::fs::File;
use std::sync::Arc;
use std::time::Instant;

use super::acks::AckTracker;
use super::identity::FileId;
use crate::codec::Codec;
use crate::file::decode::TextEncoding;
use sluice_core::Map;
use sluice_core::{FieldPath, SharedText, Str, Value};

fn split(delim: &str, enc: &str, max: usize, chunks: &[&[u8]]) -> Vec<(Vec<u8>, u64, u64, bool)> {
    let f = Framing::new(delim, TextEncoding::for_label(enc).unwrap(), max);
    let mut p = Partial::default();
    let mut out = Vec::new();
    let mut at = 0;
    for c in chunks {
        p.feed(&f, c, at, &mut |l| out.push((l.bytes.to_vec(), l.start, l.end, l.truncated)));
        at += c.len() as u64;
    }
    p.finish(&f, at, &mut |l| out.push((l.bytes.to_vec(), l.start, l.end, l.truncated)));
    out
}

fn shape(path: &str, offset: &str, host: &str) -> Shape {
    let utf8 = TextEncoding::for_label("utf-8").unwrap();
    let field = |p: &str| Some(FieldPath::parse(p).unwrap());
    Shape {
        framing: Framing::new("\n", utf8, 1024),
        codec: Codec::Lines,
        encoding: utf8,
        multiline: None,
        path_field: field(path),
        offset_field: field(offset),
        host_field: field(host),
        host: Str::new("box"),
        meta_overlaps_text: false,
    }
}

#[test]
fn built_events_carry_their_own_offsets_under_any_field_names() {
    for (path, offset, host) in
        [("/log/file/path", "/log/offset", "/host/name"), ("/src/path", "/src/pos", "/h"), ("/p", "/o", "/x/y/z")]
    {
        let shape = shape(path, offset, host);
        let template = shape.template(std::path::Path::new("/var/log/app.log"));
        let long = "a line long enough to be shared with its chunk, not copied";
        let mut lines = Lines::default();
        for (i, line) in ["short", long, "", long].iter().enumerate() {
            lines.push_copy(line.as_bytes(), 100 * i as u64);
        }
        let (text, spans) = (lines.text, lines.spans);
        let tracker = AckTracker::new(|_| {});
        let group = |count| Group { tracker: tracker.clone(), template: template.clone(), timestamp: 7, count, end: 0 };
        let text = SharedText::new(text);
        let events = build_events(&shape, &text, &spans, &[group(1), group(3)], &mut 0);
        assert_eq!(events.len(), 4);
        for (i, e) in events.iter().enumerate() {
            let get = |p: &str| e.get(&FieldPath::parse(p).unwrap()).cloned();
            assert_eq!(get(offset), Some(Value::Int(100 * i as i64)), "{offset}");
            assert_eq!(get(path), Some(Value::from("/var/log/app.log")), "{path}");
            assert_eq!(get(host), Some(Value::from("box")), "{host}");
            assert_eq!(e.timestamp_nanos(), Some(7));
        }
        assert_eq!(events[1].message(), Some(long));
        assert_eq!(events[2].message(), Some(""));
        // The template keeps its placeholder.
        assert_eq!(shape.offset_field.as_ref().unwrap().get(&template), Some(&Value::Int(0)));
    }
}

/// Reads a whole file as the builder-thread path does (lines kept in place in the chunk's
/// text), `read` bytes per turn; returns each line with its offset and whether it was cut.
fn read_deferred(content: &[u8], framing: Framing, encoding: TextEncoding, read: usize) -> Vec<(Vec<u8>, u64, bool)> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.log");
    std::fs::write(&path, content).unwrap();
    let mut shape = shape("/p", "/o", "/h");
    (shape.framing, shape.encoding) = (framing, encoding);
    let now = Instant::now();
    let mut t = Tracked::new(FileId { dev: 0, ino: 0 }, "k".into(), path.clone(), Arc::new(Map::new()), now);
    t.source = Some(Source::Plain(File::open(&path).unwrap()));
    t.tracker = Some(AckTracker::new(|_| {}));
    let mut out = BatchBuilder { deferred: true, ..BatchBuilder::default() };
    let mut buf = vec![0u8; read];
    while read_turn(&mut t, &shape, &mut buf, &mut out, now, 0).unwrap() != Turn::End {}
    out.lines.spans.iter().map(|s| (out.lines.text[s.start..s.end].to_vec(), s.offset, s.truncated)).collect()
}

#[test]
fn lines_read_in_place_match_the_framer_at_every_read_size() {
    let utf8 = TextEncoding::for_label("utf-8").unwrap();
    let text = b"\xef\xbb\xbffirst\r\nsecond line\n\nthird, a little longer than the others\nx\n".to_vec();
    // (From 3 bytes: the byte order mark is looked for in the first read only, which is at
    // least 4 KiB in use.)
    for read in [3, 4, 5, 7, 16, 64, 4096] {
        let got = read_deferred(&text, Framing::new("\n", utf8, 100), utf8, read);
        assert_eq!(
            got,
            [
                (b"first".to_vec(), 3, false),
                (b"second line".to_vec(), 10, false),
                (b"".to_vec(), 22, false),
                (b"third, a little longer than the others".to_vec(), 23, false),
                (b"x".to_vec(), 62, false)
            ],
            "read size {read}"
        );
    }
    // A two-byte delimiter split between reads, and lines cut at max_line_bytes.
    for read in [1, 2, 3, 4, 9, 4096] {
        let got = read_deferred(b"ab||cdefghij||k||", Framing::new("||", utf8, 5), utf8, read);
        let want = [(b"ab".to_vec(), 0, false), (b"cdefg".to_vec(), 4, true), (b"k".to_vec(), 14, false)];
        assert_eq!(got, want, "read size {read}");
    }
    // UTF-16: a newline byte at an odd position is not a line end.
    let utf16 = TextEncoding::for_label("utf-16le").unwrap();
    let text: Vec<u8> = "\u{0A41}\u{0100}\nx\n".encode_utf16().flat_map(u16::to_le_bytes).collect();
    for read in [1, 3, 4, 64] {
        let got = read_deferred(&text, Framing::new("\n", utf16, 100), utf16, read);
        assert_eq!(got.iter().map(|l| l.1).collect::<Vec<_>>(), [0, 6], "read size {read}");
        assert_eq!(utf16.decode(&got[0].0).as_str(), "\u{0A41}\u{0100}");
    }
}

#[test]
fn a_failed_read_in_place_leaves_the_chunk_and_the_unfinished_line_as_they_were() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.log");
    std::fs::write(&path, "one\ntwo is unfin").unwrap();
    let shape = shape("/p", "/o", "/h");
    let now = Instant::now();
    let mut t = Tracked::new(FileId { dev: 0, ino: 0 }, "k".into(), path.clone(), Arc::new(Map::new()), now);
    t.source = Some(Source::Plain(File::open(&path).unwrap()));
    t.tracker = Some(AckTracker::new(|_| {}));
    let mut out = BatchBuilder { deferred: true, ..BatchBuilder::default() };
    let mut buf = vec![0u8; 4096];
    assert_eq!(read_turn(&mut t, &shape, &mut buf, &mut out, now, 0).unwrap(), Turn::Data(16));
    let (text, spans) = (out.lines.text.clone(), out.lines.spans.clone());
    // The file's handle now refuses reads (opened for writing only): the read fails.
    std::io::Write::write_all(&mut std::fs::OpenOptions::new().append(true).open(&path).unwrap(), b"ished\n").unwrap();
    t.source = Some(Source::Plain(std::fs::OpenOptions::new().write(true).open(&path).unwrap()));
    assert!(read_turn(&mut t, &shape, &mut buf, &mut out, now, 0).is_err());
    assert_eq!((&out.lines.text, &out.lines.spans, t.pos), (&text, &spans, 16), "nothing changed");
    // Readable again: the unfinished line is completed whole, at its own offset.
    t.source = Some(Source::Plain(File::open(&path).unwrap()));
    assert_eq!(read_turn(&mut t, &shape, &mut buf, &mut out, now, 0).unwrap(), Turn::Data(6));
    let last = out.lines.spans.last().unwrap();
    assert_eq!((&out.lines.text[last.start..last.end], last.offset), (&b"two is unfinished"[..], 4));
}

#[test]
fn offsets_are_exact_across_chunks() {
    let out = split("\n", "utf-8", 100, &[b"ab", b"c\r\nde", b"f\n\ng"]);
    assert_eq!(
        out,
        [
            (b"abc".to_vec(), 0, 5, false),
            (b"def".to_vec(), 5, 9, false),
            (b"".to_vec(), 9, 10, false),
            (b"g".to_vec(), 10, 11, false)
        ]
    );
}

#[test]
fn long_lines_are_cut_and_offsets_skip_the_rest() {
    let out = split("\n", "utf-8", 4, &[b"0123456789\nok\n"]);
    assert_eq!(out, [(b"0123".to_vec(), 0, 11, true), (b"ok".to_vec(), 11, 14, false)]);
    let out = split("\n", "utf-8", 4, &[b"01", b"2345", b"6789", b"\nok\n"]);
    assert_eq!(out, [(b"0123".to_vec(), 0, 11, true), (b"ok".to_vec(), 11, 14, false)]);
}

#[test]
fn multibyte_delimiter_and_utf16_alignment() {
    let out = split("||", "utf-8", 100, &[b"a|b||c|", b"|d"]);
    assert_eq!(out.iter().map(|o| o.0.clone()).collect::<Vec<_>>(), [b"a|b".to_vec(), b"c".to_vec(), b"d".to_vec()]);
    // U+0A41 then U+0100 in UTF-16LE contains the bytes 0A 00 at an odd position.
    let text: Vec<u8> = "\u{0A41}\u{0100}\nx\n".encode_utf16().flat_map(u16::to_le_bytes).collect();
    let out = split("\n", "utf-16le", 100, &[&text[..3], &text[3..]]);
    assert_eq!(out.len(), 2);
    assert_eq!(TextEncoding::for_label("utf-16le").unwrap().decode(&out[0].0).as_str(), "\u{0A41}\u{0100}");
    assert_eq!((out[1].1, out[1].2), (6, 10));
}
