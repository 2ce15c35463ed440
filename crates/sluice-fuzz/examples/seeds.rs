//! Writes the seed inputs of every fuzz target into `corpus/<target>/seed-*`, built with the
//! crates' own encoders and writers (segments, DLQ entries, a real registry's files) so that
//! fuzzing starts from inputs that pass the checksums. Run it again after a format changes:
//!
//! ```sh
//! cargo run -p sluice-fuzz --example seeds
//! ```

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sluice_core::{Event, Map, Value};
use sluice_dlq::{DeadLetter, encode_entry};
use sluice_fuzz::split::join;
use sluice_registry::{Registry, RegistryOptions};
use sluice_segment::{CODEC_BATCH, CODEC_EVENT, SegmentHeader, append_frame, encode_batch, encode_event, encode_value};

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let mut written = 0;
    let mut put = |target: &str, name: &str, bytes: &[u8]| {
        let dir = root.join(target);
        fs::create_dir_all(&dir).expect("corpus directory");
        fs::write(dir.join(format!("seed-{name}")), bytes).expect("seed file");
        written += 1;
    };

    let events = sample_events();
    let mut one = Vec::new();
    encode_event(&events[0], &mut one).unwrap();
    let mut batch = Vec::new();
    encode_batch(&events, &mut batch).unwrap();
    let mut value = Vec::new();
    encode_value(&Value::Array(vec![Value::Int(-1), Value::Float(0.5), Value::from("é")]), &mut value).unwrap();
    let batch_segment = segment(CODEC_BATCH, 100, &[batch.clone(), batch[..1].to_vec(), batch.clone()]);
    let event_segment = segment(CODEC_EVENT, 7, &events.iter().map(body).collect::<Vec<_>>());
    put("segment_codec", "event-body", &one);
    put("segment_codec", "batch-body", &batch);
    put("segment_codec", "value", &value);
    put("segment_codec", "batch-segment", &batch_segment);
    put("segment_codec", "event-segment", &event_segment);
    put("segment_codec", "torn-segment", &event_segment[..event_segment.len() - 5]);
    let mut corrupt = event_segment.clone();
    corrupt[64 + 20] ^= 0x40;
    put("segment_codec", "corrupt-frame", &corrupt);
    let mut garbage = event_segment.clone();
    garbage[64] ^= 0x7f;
    put("segment_codec", "bad-length", &garbage);

    let second = segment(CODEC_EVENT, 7 + events.len() as u64, &events.iter().map(body).collect::<Vec<_>>());
    let frame_end = 64 + 12 + 8 + body(&events[0]).len() as u64;
    put("queue_dir", "acked-first-frame", &join(&[&checkpoint(7, frame_end), &event_segment, &second]));
    put("queue_dir", "no-checkpoint", &join(&[b"", &event_segment, &second]));
    put("queue_dir", "checkpoint-past-end", &join(&[&checkpoint(7, 1 << 20), &event_segment, b""]));
    put("queue_dir", "damaged", &join(&[&checkpoint(9, 64)[..20], &corrupt, &event_segment[..80]]));
    let slots = checkpoint_slots(&[(4, 7, frame_end), (5, 7 + events.len() as u64, 64)]);
    put("queue_dir", "slots", &join(&[&slots, &event_segment, &second]));
    let mut torn_slot = slots.clone();
    torn_slot[4096 + 20] ^= 1;
    put("queue_dir", "slots-one-torn", &join(&[&torn_slot, &event_segment, &second]));

    for (name, compact) in [("log", u64::MAX), ("compacted", 1)] {
        let (snapshot, log) = registry_files(compact);
        let files = join(&[&snapshot, &log]);
        put("registry_files", name, &[&[3u8][..], &files].concat());
        put("registry_files", &format!("{name}-fix-checksums"), &[&[7u8][..], &files].concat());
    }

    for (i, e) in events.iter().enumerate() {
        let entry = DeadLetter {
            event: e.clone(),
            reason: "400 Bad Request: mapper_parsing_exception".into(),
            plugin_id: format!("out-{i}"),
            plugin_type: "http".into(),
            pipeline: "main".into(),
            time: 1_700_000_000_000_000_000 + i as i64,
            attempts: i as u32,
        };
        let mut out = Vec::new();
        encode_entry(&entry, &mut out).unwrap();
        put("dlq_entry", &format!("entry-{i}"), &out);
    }

    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    for file in sorted_files(&examples) {
        let name = file.file_stem().unwrap().to_string_lossy().into_owned();
        put("config", &format!("example-{name}"), &fs::read(&file).unwrap());
    }
    put(
        "config",
        "env",
        b"data_dir: ${DIR}\npipelines:\n  main:\n    inputs:\n      - type: tcp\n        address: 127.0.0.1:${PORT}\n        codec: ${CODEC:-json_lines}\n    outputs:\n      - {type: stdout, if: '/a == \"$${NOT}\"'}\n",
    );
    put("config", "errors", b"pipelines:\n  p:\n    workers: many\n    queue: {type: persisted, max_bytes: 1XB}\n    inputs: [{type: nope}]\n    outputs: []\nunknown: ${MISSING}\n");
    put(
        "config",
        "anchors",
        b"x: &a {type: stdout}\npipelines:\n  p:\n    inputs: [{type: stdin}]\n    outputs: [*a, *a]\n",
    );

    let json =
        br#"{"status":503,"level":"error","user":{"id":7,"name":"ann"},"tags":["a","b"],"ratio":0.25,"path":"/x/y"}"#;
    let ts = 1_700_000_000_000_000_000i64.to_le_bytes();
    let event_part = [&ts[..], json].concat();
    for (i, (cond, template)) in [
        (r#"/status >= 500 and /level in ["warn", "error"]"#, "/var/log/%{/user/name}-%{+YYYY.MM.dd}.log"),
        (r#"not exists(/missing) or /user/id != 7"#, "%{/status}"),
        (r#"/path =~ "^/x/\d*" && !(/ratio < 0.5e0)"#, "%{+%Y-%m-%dT%H:%M:%S%.3f%z} %{/tags}"),
        (r#""b" in /tags || /level not in ['debug', 1, 2.5, true, null]"#, "%{+yyyy-MM-dd'T'HH:mm:ss.SSS} literal %"),
        (r#"/@timestamp > "2023-01-01T00:00:00Z" and /a~1b"#, "plain text"),
    ]
    .into_iter()
    .enumerate()
    {
        put("expr", &format!("{i}"), &join(&[cond.as_bytes(), template.as_bytes(), &event_part]));
    }

    let stream = b"plain line\r\n{\"a\":1,\"b\":[true,null]}\n{\"msg\":\"caf\xe9\"}\n{broken\n\n\xff\xfe\n[1,2]\n{\"long\":\"0123456789012345678901234567890123456789\"}\nno newline at the end";
    put("line_codecs", "default-max", &join(&[&[200], stream]));
    put("line_codecs", "small-max-chunked", &join(&[&[15, 3, 0, 7, 1, 30], stream]));
    put("line_codecs", "cr-at-limit", &join(&[&[3, 3, 0], b"abcd\r\nabcd\r\r\nab"]));

    let ndjson = b"{\"a\":1}\n{\"b\":\"two\"}\n\"text\"\n5\n[1,2]\n";
    let array = b"\xef\xbb\xbf[{\"a\":1}, \"text\", 5, [1], null]";
    put("http_body", "ndjson", &[&[0u8][..], ndjson].concat());
    put("http_body", "array", &[&[0u8][..], array].concat());
    put("http_body", "bad-json", &[&[0u8][..], b"{\"a\":1}\n{\"a\":"].concat());
    put("http_body", "ndjson-gzip", &[&[1u8][..], &gzip(ndjson)].concat());
    put("http_body", "array-gzip-twice", &[&[1u8][..], &gzip(array), &gzip(b"")].concat());

    println!("wrote {written} seeds under {}", root.display());
}

fn sample_events() -> Vec<Event> {
    let mut nested = Map::new();
    nested.insert("id", Value::Int(i64::MIN));
    nested.insert("name", Value::from("a name long enough not to be stored inline"));
    let mut a = Event::from_message_at("GET /index.html 404", 1_700_000_000_000_000_000);
    a.fields.insert("status", Value::Int(404));
    a.fields.insert("user", Value::Object(nested));
    let mut b = Event::from_message_at("second", -1);
    b.fields.insert("status", Value::Int(200));
    b.fields.insert("ratio", Value::Float(f64::NAN));
    b.fields.insert("tags", Value::Array(vec![Value::Null, Value::Bool(false), Value::Bool(true), Value::from("ü")]));
    b.fields.insert("at", Value::Timestamp(i64::MAX));
    vec![a, b, Event::new(Map::new())]
}

fn body(e: &Event) -> Vec<u8> {
    let mut out = Vec::new();
    encode_event(e, &mut out).unwrap();
    out
}

fn segment(codec: u8, first_seq: u64, bodies: &[Vec<u8>]) -> Vec<u8> {
    let header = SegmentHeader {
        codec,
        shard: 0,
        first_seq,
        created_unix_nanos: 1_700_000_000_000_000_000,
        ..Default::default()
    };
    let mut out = header.encode().to_vec();
    for (i, b) in bodies.iter().enumerate() {
        append_frame(&mut out, first_seq + i as u64, |o: &mut Vec<u8>| o.extend_from_slice(b)).unwrap();
    }
    out
}

/// A queue checkpoint as format version 1 wrote it (still read).
fn checkpoint(segment: u64, offset: u64) -> Vec<u8> {
    let mut b = b"SLQCKPT1".to_vec();
    b.extend_from_slice(&segment.to_le_bytes());
    b.extend_from_slice(&offset.to_le_bytes());
    let crc = crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// A queue checkpoint file as format version 2 writes it: two 4 KiB slots, each `SLQCKPT2`,
/// a slot sequence number, the segment and the offset (u64 LE), then CRC32C of those 32 bytes.
fn checkpoint_slots(slots: &[(u64, u64, u64)]) -> Vec<u8> {
    let mut file = vec![0u8; 2 * 4096];
    for (i, &(seq, segment, offset)) in slots.iter().enumerate() {
        let mut b = b"SLQCKPT2".to_vec();
        for n in [seq, segment, offset] {
            b.extend_from_slice(&n.to_le_bytes());
        }
        let crc = crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        file[i * 4096..i * 4096 + b.len()].copy_from_slice(&b);
    }
    file
}

fn crc32c(bytes: &[u8]) -> u32 {
    sluice_segment::crc::crc32c(bytes)
}

/// The snapshot and op log a real registry leaves after a few commits.
fn registry_files(compact_after_bytes: u64) -> (Vec<u8>, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let registry =
        Registry::open(dir.path(), RegistryOptions { flush_interval: Duration::from_secs(3600), compact_after_bytes })
            .unwrap();
    let a = registry.cursor("file:/var/log/app.log");
    a.set_meta(serde_json::json!({"path": "/var/log/app.log", "inode": 12, "device": 2049}));
    a.commit(100);
    registry.cursor("dlq:main").commit(7);
    registry.flush().unwrap();
    a.commit(250);
    registry.cursor("gone").commit(1);
    registry.flush().unwrap();
    registry.remove("gone");
    registry.flush().unwrap();
    registry.close().unwrap();
    let read = |name: &str| fs::read(dir.path().join(name)).unwrap_or_default();
    (read("snapshot"), read("log"))
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn sorted_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.retain(|p| p.extension().is_some_and(|x| x == "yml"));
    files.sort();
    files
}
