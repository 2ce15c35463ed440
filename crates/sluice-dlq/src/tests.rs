//! Behaviour of the writer, the readers and recovery, on real files.

use std::fs;
use std::path::Path;

use std::time::Duration;

use sluice_core::{Event, Value};

use crate::naming::{self, Name};
use crate::*;

fn letter(i: u64, time: i64) -> DeadLetter {
    let mut event = Event::from_message_at(format!("event number {i} {}", "x".repeat(40)), time);
    event.fields.insert("n", Value::Int(i as i64));
    DeadLetter {
        event,
        reason: format!("400 mapper_parsing_exception #{i}"),
        plugin_id: "es-out".into(),
        plugin_type: "http".into(),
        pipeline: "main".into(),
        time,
        attempts: 1 + (i % 3) as u32,
    }
}

fn letters(range: std::ops::Range<u64>) -> Vec<DeadLetter> {
    range.map(|i| letter(i, 1_000_000 + i as i64)).collect()
}

/// Bytes one `letter(i, ..)` takes on disk (for i of the same digit count).
fn frame_bytes(i: u64) -> u64 {
    let mut body = Vec::new();
    encode_entry(&letter(i, 1_000_000 + i as i64), &mut body).unwrap();
    sluice_segment::frame_size(body.len()) as u64
}

fn opts() -> DlqOptions {
    DlqOptions { sync: DlqSync::None, seal_idle: Duration::from_secs(3600), ..Default::default() }
}

async fn read_all(dir: &Path, from: ReadFrom) -> Vec<(DeadLetter, Position)> {
    let mut r = DlqReader::open(dir, from).unwrap();
    let mut out = Vec::new();
    loop {
        let batch = r.next_batch(7, false).await.unwrap();
        if batch.is_empty() {
            return out;
        }
        out.extend(batch);
    }
}

fn ns(out: &[(DeadLetter, Position)]) -> Vec<i64> {
    out.iter()
        .map(|(e, _)| match e.event.fields.get("n") {
            Some(Value::Int(n)) => *n,
            other => panic!("no n: {other:?}"),
        })
        .collect()
}

fn segment_files(dir: &Path) -> Vec<(u64, bool)> {
    let mut v: Vec<(u64, bool)> = fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| match naming::parse(e.unwrap().file_name().to_str().unwrap()) {
            Some(Name::Open(id)) => Some((id, false)),
            Some(Name::Sealed(id, _)) => Some((id, true)),
            None => None,
        })
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn round_trip_keeps_metadata_and_event() {
    let dir = tempfile::tempdir().unwrap();
    let q = DeadLetterQueue::open(dir.path(), DlqOptions { sync: DlqSync::Commit, ..opts() }).unwrap();
    let written = letters(0..25);
    let outcome = q.write(written.clone()).await.unwrap();
    assert_eq!(outcome, WriteOutcome { written: 25, dropped: 0 });
    let got = read_all(dir.path(), ReadFrom::Beginning).await;
    assert_eq!(got.iter().map(|(e, _)| e.clone()).collect::<Vec<_>>(), written);
    let s = q.stats();
    assert_eq!((s.entries, s.written, s.segments), (25, 25, 1));
    assert_eq!((s.oldest_entry_time, s.newest_entry_time), (Some(1_000_000), Some(1_000_024)));
    q.close().unwrap();
    q.close().unwrap();
    assert!(matches!(q.write(letters(0..1)).await, Err(DlqError::Closed(_))));
    // Offline, after close: the same entries, from a sealed segment.
    assert_eq!(segment_files(dir.path()), vec![(1, true)]);
    let got = read_all(dir.path(), ReadFrom::Beginning).await;
    assert_eq!(got.into_iter().map(|(e, _)| e).collect::<Vec<_>>(), written);
}
