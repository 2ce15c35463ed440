//! Behaviour of the writer, the readers and recovery, on real files.

use std::fs;
use std::path::Path;
use std::sync::Arc;

use std::time::Duration;

use sluice_core::{Event, Value};
use sluice_testkit::SmallTmpfs;

use crate::inspect::{self, Item};
use crate::naming::{self, Name};
use crate::*;

fn letter(i: u64, time: i64) -> DeadLetter {
    let mut event = Event::from_message_at(format!("event number {i} {}", "x".repeat(300)), time);
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

/// Options where a segment holds exactly three `letter`s (for i in 10..64) and `max_bytes`
/// exactly two full segments.
fn tiny(policy: StoragePolicy) -> DlqOptions {
    let segment = 64 + 3 * frame_bytes(10);
    DlqOptions { segment_bytes: segment, max_bytes: 2 * segment, storage_policy: policy, ..opts() }
}

#[test]
fn tiny_letters_have_one_size_and_fill_segments_exactly() {
    assert!((10..64).all(|i| frame_bytes(i) == frame_bytes(10)));
    assert!(tiny(StoragePolicy::DropNewer).segment_bytes >= MIN_SEGMENT_BYTES);
}

#[tokio::test]
async fn segments_seal_on_size() {
    let dir = tempfile::tempdir().unwrap();
    let q =
        DeadLetterQueue::open(dir.path(), DlqOptions { max_bytes: 1 << 20, ..tiny(StoragePolicy::DropNewer) }).unwrap();
    for i in 10..20 {
        q.write(letters(i..i + 1)).await.unwrap();
    }
    // 3 + 3 + 3 sealed, the tenth in the open segment.
    assert_eq!(segment_files(dir.path()), vec![(1, true), (2, true), (3, true), (4, false)]);
    let s = q.stats();
    assert_eq!((s.segments, s.entries, s.bytes), (4, 10, 4 * 64 + 10 * frame_bytes(10)));
    for g in inspect::segments(dir.path()).unwrap() {
        assert_eq!(g.bytes, fs::metadata(&g.path).unwrap().len(), "{g:?}");
        assert_eq!(g.entries, if g.id == 4 { 1 } else { 3 });
    }
    let first = &inspect::segments(dir.path()).unwrap()[0];
    assert_eq!((first.oldest_entry_time, first.newest_entry_time), (Some(1_000_010), Some(1_000_012)));
    assert_eq!(ns(&read_all(dir.path(), ReadFrom::Beginning).await), (10..20).collect::<Vec<_>>());
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn segments_seal_when_idle() {
    let dir = tempfile::tempdir().unwrap();
    let q = DeadLetterQueue::open(dir.path(), DlqOptions { seal_idle: Duration::from_millis(50), ..opts() }).unwrap();
    q.write(letters(10..12)).await.unwrap();
    wait_until("the idle seal", || segment_files(dir.path()) == vec![(1, true)]).await;
    q.write(letters(12..13)).await.unwrap();
    assert_eq!(segment_files(dir.path()), vec![(1, true), (2, false)]);
    wait_until("the second idle seal", || segment_files(dir.path()) == vec![(1, true), (2, true)]).await;
    assert_eq!(q.stats().segments, 2);
    assert_eq!(ns(&read_all(dir.path(), ReadFrom::Beginning).await), vec![10, 11, 12]);
}

#[tokio::test]
async fn drop_newer_rejects_exactly_what_does_not_fit() {
    let dir = tempfile::tempdir().unwrap();
    let q = DeadLetterQueue::open(dir.path(), tiny(StoragePolicy::DropNewer)).unwrap();
    let outcome = q.write(letters(10..20)).await.unwrap();
    assert_eq!(outcome, WriteOutcome { written: 6, dropped: 4 });
    let s = q.stats();
    assert_eq!((s.entries, s.written, s.dropped_newer, s.dropped_older), (6, 6, 4, 0));
    assert_eq!(s.bytes, tiny(StoragePolicy::DropNewer).max_bytes);
    assert_eq!(q.write(letters(20..21)).await.unwrap(), WriteOutcome { written: 0, dropped: 1 });
    assert_eq!(q.stats().dropped_newer, 5);
    assert_eq!(ns(&read_all(dir.path(), ReadFrom::Beginning).await), (10..16).collect::<Vec<_>>());
}

#[tokio::test]
async fn drop_older_evicts_whole_oldest_segments() {
    let dir = tempfile::tempdir().unwrap();
    let q = DeadLetterQueue::open(dir.path(), tiny(StoragePolicy::DropOlder)).unwrap();
    let outcome = q.write(letters(10..20)).await.unwrap();
    assert_eq!(outcome, WriteOutcome { written: 10, dropped: 0 });
    let s = q.stats();
    assert_eq!((s.entries, s.written, s.dropped_newer, s.dropped_older), (4, 10, 0, 6));
    assert_eq!(segment_files(dir.path()), vec![(3, true), (4, false)]);
    assert_eq!(ns(&read_all(dir.path(), ReadFrom::Beginning).await), (16..20).collect::<Vec<_>>());
    // An entry larger than max_bytes alone is refused, not a reason to evict everything.
    let mut huge = letter(10, 0);
    huge.reason = "r".repeat(4096);
    assert_eq!(q.write(vec![huge]).await.unwrap(), WriteOutcome { written: 0, dropped: 1 });
    let s = q.stats();
    assert_eq!((s.entries, s.dropped_newer, s.dropped_older), (4, 1, 6));
}

#[tokio::test]
async fn retain_age_deletes_segments_whose_newest_entry_is_older() {
    let dir = tempfile::tempdir().unwrap();
    let q = DeadLetterQueue::open(
        dir.path(),
        DlqOptions { retain_age: Some(Duration::from_secs(3600)), seal_idle: Duration::from_millis(20), ..opts() },
    )
    .unwrap();
    let now = sluice_core::value::now_nanos();
    let two_hours = 2 * 3600 * 1_000_000_000;
    q.write((10..13).map(|i| letter(i, now - two_hours)).collect()).await.unwrap();
    wait_until("the idle seal", || segment_files(dir.path()) == vec![(1, true)]).await;
    q.write((13..15).map(|i| letter(i, now)).collect()).await.unwrap();
    wait_until("the expiry", || q.stats().expired == 3).await;
    let s = q.stats();
    assert_eq!((s.entries, s.segments), (2, 1));
    assert_eq!(s.bytes, inspect::stats(dir.path()).unwrap().bytes);
    assert_eq!(s.oldest_entry_time, Some(now));
    assert_eq!(ns(&read_all(dir.path(), ReadFrom::Beginning).await), vec![13, 14]);
}

#[tokio::test]
async fn reader_follows_new_entries_across_seals() {
    let dir = tempfile::tempdir().unwrap();
    let q =
        DeadLetterQueue::open(dir.path(), DlqOptions { max_bytes: 1 << 20, ..tiny(StoragePolicy::DropNewer) }).unwrap();
    let mut reader = DlqReader::open(dir.path(), ReadFrom::Beginning).unwrap();
    assert!(reader.next_batch(10, false).await.unwrap().is_empty());
    let follower = tokio::spawn(async move {
        let mut got = Vec::new();
        while got.len() < 8 {
            got.extend(reader.next_batch(100, true).await.unwrap());
        }
        got
    });
    for i in 10..18 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        q.write(letters(i..i + 1)).await.unwrap();
    }
    let got = tokio::time::timeout(Duration::from_secs(20), follower).await.unwrap().unwrap();
    assert_eq!(ns(&got), (10..18).collect::<Vec<_>>());
    assert_eq!(got.last().unwrap().1.segment, 3);
}

#[tokio::test]
async fn positions_resume_exactly_across_segments_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let o = DlqOptions { max_bytes: 1 << 20, ..tiny(StoragePolicy::DropNewer) };
    let q = DeadLetterQueue::open(dir.path(), o.clone()).unwrap();
    q.write(letters(10..20)).await.unwrap();
    let all = read_all(dir.path(), ReadFrom::Beginning).await;
    assert_eq!(all.len(), 10);
    for (k, (_, pos)) in all.iter().enumerate() {
        let packed = pos.to_u64().unwrap();
        assert_eq!(Position::from_u64(packed), *pos);
        let rest = read_all(dir.path(), ReadFrom::Position(Position::from_u64(packed))).await;
        assert_eq!(ns(&rest), (11 + k as i64..20).collect::<Vec<_>>(), "after entry {k}");
    }
    assert!(all.windows(2).all(|w| w[0].1 < w[1].1));
    // The end of a sealed segment resumes at the next segment's first entry.
    assert_eq!(all[2].1, Position { segment: 1, offset: o.segment_bytes });
    // After a restart, and with the earlier segments deleted, positions still hold.
    q.close().unwrap();
    drop(q);
    let q = DeadLetterQueue::open(dir.path(), o).unwrap();
    q.write(letters(20..22)).await.unwrap();
    let reader = DlqReader::open(dir.path(), ReadFrom::Position(all[4].1)).unwrap();
    assert_eq!(reader.delete_consumed(all[4].1).unwrap(), 1);
    let rest = read_all(dir.path(), ReadFrom::Position(all[4].1)).await;
    assert_eq!(ns(&rest), (15..22).collect::<Vec<_>>());
    // A position in a deleted segment resumes at the next segment's start.
    let rest = read_all(dir.path(), ReadFrom::Position(all[0].1)).await;
    assert_eq!(ns(&rest), (13..22).collect::<Vec<_>>());
    assert_eq!(Position { segment: 1 << 32, offset: 0 }.to_u64(), None);
    assert_eq!(Position { segment: 0, offset: 1 << 32 }.to_u64(), None);
}

#[tokio::test]
async fn read_from_time_starts_at_the_first_entry_at_or_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let q =
        DeadLetterQueue::open(dir.path(), DlqOptions { max_bytes: 1 << 20, ..tiny(StoragePolicy::DropNewer) }).unwrap();
    q.write(letters(10..20)).await.unwrap();
    for (t, first) in [(0, 10), (1_000_010, 10), (1_000_017, 17), (1_000_013, 13)] {
        assert_eq!(ns(&read_all(dir.path(), ReadFrom::Time(t)).await), (first..20).collect::<Vec<_>>(), "{t}");
    }
    assert!(read_all(dir.path(), ReadFrom::Time(2_000_000)).await.is_empty());
    // Offline, through the names of the sealed segments.
    q.close().unwrap();
    assert_eq!(ns(&read_all(dir.path(), ReadFrom::Time(1_000_016)).await), (16..20).collect::<Vec<_>>());
}

#[tokio::test]
async fn delete_consumed_updates_the_writer_without_a_rescan() {
    let dir = tempfile::tempdir().unwrap();
    let q = DeadLetterQueue::open(dir.path(), tiny(StoragePolicy::DropNewer)).unwrap();
    assert_eq!(q.write(letters(10..16)).await.unwrap().written, 6);
    // Full: the next one is dropped.
    assert_eq!(q.write(letters(16..17)).await.unwrap().dropped, 1);
    let mut reader = DlqReader::open(dir.path(), ReadFrom::Beginning).unwrap();
    let batch = reader.next_batch(4, false).await.unwrap();
    let up_to = batch.last().unwrap().1;
    assert_eq!(up_to.segment, 2);
    // Segment 1 is wholly consumed, segment 2 only partly.
    assert_eq!(reader.delete_consumed(up_to).unwrap(), 1);
    let s = q.stats();
    assert_eq!((s.segments, s.entries, s.bytes, s.consumed_segments), (1, 3, 64 + 3 * frame_bytes(10), 1));
    assert_eq!(segment_files(dir.path()), vec![(2, true)]);
    // Room again: three entries fit.
    assert_eq!(q.write(letters(20..24)).await.unwrap(), WriteOutcome { written: 3, dropped: 1 });
    let rest = reader.next_batch(100, false).await.unwrap();
    assert_eq!(ns(&rest), vec![14, 15, 20, 21, 22]);
    // Nothing consumed is ever the open segment.
    // Segment 3 was sealed when the entry after it did not fit: both are consumed.
    assert_eq!(reader.delete_consumed(rest.last().unwrap().1).unwrap(), 2);
    assert_eq!((q.stats().segments, q.stats().bytes, q.stats().entries), (0, 0, 0));
    q.write(letters(30..31)).await.unwrap();
    assert_eq!(ns(&reader.next_batch(100, false).await.unwrap()), vec![30]);
    assert_eq!(reader.delete_consumed(Position { segment: 4, offset: u64::MAX }).unwrap(), 0);
    assert_eq!(segment_files(dir.path()), vec![(4, false)]);
    assert_eq!(q.stats().consumed_segments, 3);
}

#[tokio::test]
async fn a_segment_deleted_by_hand_does_not_keep_the_writer_full() {
    let dir = tempfile::tempdir().unwrap();
    let q = DeadLetterQueue::open(dir.path(), tiny(StoragePolicy::DropNewer)).unwrap();
    q.write(letters(10..17)).await.unwrap();
    assert_eq!(q.stats().dropped_newer, 1);
    let first = inspect::segments(dir.path()).unwrap()[0].path.clone();
    fs::remove_file(first).unwrap();
    wait_until("the writer to notice", || q.stats().segments == 1).await;
    assert_eq!(q.write(letters(20..23)).await.unwrap().written, 3);
    assert_eq!(q.stats().entries, 6);
}

fn sealed_path(dir: &Path, id: u64) -> std::path::PathBuf {
    inspect::segments(dir).unwrap().into_iter().find(|g| g.id == id).unwrap().path
}

#[tokio::test]
async fn a_corrupt_frame_is_skipped_and_its_neighbours_kept() {
    let dir = tempfile::tempdir().unwrap();
    let q = DeadLetterQueue::open(dir.path(), opts()).unwrap();
    q.write(letters(10..15)).await.unwrap();
    q.close().unwrap();
    let path = sealed_path(dir.path(), 1);
    let mut bytes = fs::read(&path).unwrap();
    let f = frame_bytes(10) as usize;
    let third = 64 + 2 * f;
    bytes[third + f / 2] ^= 0x55;
    fs::write(&path, &bytes).unwrap();

    let mut reader = DlqReader::open(dir.path(), ReadFrom::Beginning).unwrap();
    let got = reader.next_batch(100, false).await.unwrap();
    assert_eq!(ns(&got), vec![10, 11, 13, 14]);
    assert_eq!(reader.damaged_frames(), 1);
    assert_eq!(reader.entry_bytes(), 4 * f as u64, "the entries' frames, not the damaged one nor the header");
    let items: Vec<Item> = inspect::entries(dir.path(), ReadFrom::Beginning).unwrap().map(Result::unwrap).collect();
    assert_eq!(items.len(), 5);
    assert!(matches!(&items[2], Item::Damaged { segment: 1, offset, .. } if *offset == third as u64), "{:?}", items[2]);
    assert!(matches!(&items[3], Item::Entry { offset, .. } if *offset == (third + f) as u64));

    // A frame whose checksum holds but whose body does not decode is damage too.
    let mut bytes = fs::read(&path).unwrap();
    bytes[third + f / 2] ^= 0x55;
    let body_at = 64 + f + 12;
    bytes[body_at + 8] = 0xff; // attempts: a varint that never ends within the body... or not
    let len = u32::from_le_bytes(bytes[64 + f..64 + f + 4].try_into().unwrap()) as usize;
    let crc = sluice_segment::frame_checksum(len as u32, &bytes[64 + f + 4..64 + f + 4 + len]);
    bytes[64 + f + 4 + len..64 + f + 8 + len].copy_from_slice(&crc.to_le_bytes());
    bytes[body_at + 9..body_at + 18].fill(0xff);
    let crc = sluice_segment::frame_checksum(len as u32, &bytes[64 + f + 4..64 + f + 4 + len]);
    bytes[64 + f + 4 + len..64 + f + 8 + len].copy_from_slice(&crc.to_le_bytes());
    fs::write(&path, &bytes).unwrap();
    let mut reader = DlqReader::open(dir.path(), ReadFrom::Beginning).unwrap();
    assert_eq!(ns(&reader.next_batch(100, false).await.unwrap()), vec![10, 12, 13, 14]);
    assert_eq!(reader.damaged_frames(), 1);
}

#[tokio::test]
async fn a_torn_tail_is_cut_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let q = DeadLetterQueue::open(dir.path(), opts()).unwrap();
    q.write(letters(10..15)).await.unwrap();
    q.crash();
    drop(q);
    let open = dir.path().join(naming::open_name(1));
    let full = fs::metadata(&open).unwrap().len();
    assert_eq!(full, 64 + 5 * frame_bytes(10));
    fs::OpenOptions::new().write(true).open(&open).unwrap().set_len(full - 7).unwrap();
    // Offline, the torn frame is simply not there yet.
    assert_eq!(ns(&read_all(dir.path(), ReadFrom::Beginning).await), vec![10, 11, 12, 13]);

    let q = DeadLetterQueue::open(dir.path(), opts()).unwrap();
    assert_eq!(segment_files(dir.path()), vec![(1, true)]);
    assert_eq!(fs::metadata(sealed_path(dir.path(), 1)).unwrap().len(), 64 + 4 * frame_bytes(10));
    let s = q.stats();
    assert_eq!((s.entries, s.segments, s.bytes), (4, 1, 64 + 4 * frame_bytes(10)));
    q.write(letters(20..22)).await.unwrap();
    let mut reader = DlqReader::open(dir.path(), ReadFrom::Beginning).unwrap();
    assert_eq!(ns(&reader.next_batch(100, false).await.unwrap()), vec![10, 11, 12, 13, 20, 21]);
    assert_eq!(reader.damaged_frames(), 0);
}

#[tokio::test]
async fn reopen_after_a_crash_keeps_everything_written() {
    let dir = tempfile::tempdir().unwrap();
    let o = DlqOptions { max_bytes: 1 << 20, ..tiny(StoragePolicy::DropNewer) };
    let q = DeadLetterQueue::open(dir.path(), o.clone()).unwrap();
    q.write(letters(10..17)).await.unwrap();
    q.crash();
    assert!(matches!(q.write(letters(0..1)).await, Err(DlqError::Closed(_))));
    drop(q);
    assert_eq!(segment_files(dir.path()), vec![(1, true), (2, true), (3, false)]);
    let q = DeadLetterQueue::open(dir.path(), o.clone()).unwrap();
    assert!(matches!(DeadLetterQueue::open(dir.path(), o.clone()), Err(DlqError::AlreadyOpen(_))));
    assert_eq!(segment_files(dir.path()), vec![(1, true), (2, true), (3, true)]);
    let s = q.stats();
    assert_eq!((s.entries, s.segments, s.bytes), (7, 3, 3 * 64 + 7 * frame_bytes(10)));
    assert_eq!((s.oldest_entry_time, s.newest_entry_time), (Some(1_000_010), Some(1_000_016)));
    q.write(letters(17..18)).await.unwrap();
    assert_eq!(segment_files(dir.path()), vec![(1, true), (2, true), (3, true), (4, false)]);
    assert_eq!(ns(&read_all(dir.path(), ReadFrom::Beginning).await), (10..18).collect::<Vec<_>>());
    let d = inspect::stats(dir.path()).unwrap();
    assert!(d.writer_active);
    assert_eq!((d.entries, d.segments, d.bytes), (8, 4, q.stats().bytes));
    assert!(matches!(inspect::purge(dir.path()), Err(DlqError::AlreadyOpen(_))));
    q.close().unwrap();
    assert_eq!(inspect::purge(dir.path()).unwrap(), 4);
    assert_eq!(inspect::stats(dir.path()).unwrap(), inspect::DirStats::default());
}

#[tokio::test]
async fn concurrent_writers_share_the_queue_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let q = DeadLetterQueue::open(
        dir.path(),
        DlqOptions { sync: DlqSync::Commit, segment_bytes: 8 << 10, max_bytes: 1 << 30, ..opts() },
    )
    .unwrap();
    let tasks: Vec<_> = (0..8u64)
        .map(|t| {
            let q = Arc::clone(&q);
            tokio::spawn(async move {
                for b in 0..20u64 {
                    let base = 1000 * t + 10 * b;
                    assert_eq!(q.write(letters(base..base + 10)).await.unwrap().written, 10);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(q.stats().entries, 1600);
    let mut got = ns(&read_all(dir.path(), ReadFrom::Beginning).await);
    got.sort();
    let mut want: Vec<i64> = (0..8).flat_map(|t| (0..200).map(move |i| 1000 * t + i)).collect();
    want.sort();
    assert_eq!(got, want);
}

#[test]
fn invalid_options_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    for (o, word) in [
        (DlqOptions { segment_bytes: 10, ..opts() }, "segment_bytes"),
        (DlqOptions { max_bytes: 1 << 20, segment_bytes: 2 << 20, ..opts() }, "max_bytes"),
        (DlqOptions { sync: DlqSync::Interval(Duration::ZERO), ..opts() }, "interval"),
        (DlqOptions { seal_idle: Duration::ZERO, ..opts() }, "seal_idle"),
        (DlqOptions { retain_age: Some(Duration::ZERO), ..opts() }, "retain_age"),
    ] {
        let e = DeadLetterQueue::open(dir.path(), o).unwrap_err();
        assert!(e.to_string().contains(word), "{e}");
    }
}

#[tokio::test]
async fn unencodable_events_are_counted_not_stored() {
    let dir = tempfile::tempdir().unwrap();
    let q = DeadLetterQueue::open(dir.path(), opts()).unwrap();
    let mut deep = Value::Null;
    for _ in 0..200 {
        deep = Value::Array(vec![deep]);
    }
    let mut bad = letter(10, 1);
    bad.event.fields.insert("deep", deep);
    let outcome = q.write(vec![letter(11, 1), bad, letter(12, 1)]).await.unwrap();
    assert_eq!(outcome, WriteOutcome { written: 2, dropped: 1 });
    assert_eq!(q.stats().unencodable, 1);
    assert_eq!(ns(&read_all(dir.path(), ReadFrom::Beginning).await), vec![11, 12]);
}

#[tokio::test]
async fn segment_ids_are_never_reused_and_stale_positions_restart() {
    let dir = tempfile::tempdir().unwrap();
    let q = DeadLetterQueue::open(dir.path(), opts()).unwrap();
    q.write(letters(10..12)).await.unwrap();
    q.close().unwrap();
    drop(q);
    let end = read_all(dir.path(), ReadFrom::Beginning).await.last().unwrap().1;
    assert_eq!(end.segment, 1);
    // Everything consumed and deleted: the next segment still gets a new id, so the saved
    // position does not hide the new entries.
    assert_eq!(DlqReader::open(dir.path(), ReadFrom::Position(end)).unwrap().delete_consumed(end).unwrap(), 1);
    let q = DeadLetterQueue::open(dir.path(), opts()).unwrap();
    q.write(letters(12..13)).await.unwrap();
    assert_eq!(segment_files(dir.path()), vec![(2, false)]);
    assert_eq!(ns(&read_all(dir.path(), ReadFrom::Position(end)).await), vec![12]);
    q.close().unwrap();
    drop(q);
    // Purge keeps the record too.
    assert_eq!(inspect::purge(dir.path()).unwrap(), 1);
    let q = DeadLetterQueue::open(dir.path(), opts()).unwrap();
    q.write(letters(13..14)).await.unwrap();
    assert_eq!(segment_files(dir.path()), vec![(3, false)]);
    // A position from a previous life of the directory (past every id used) reads from the start.
    let future = Position { segment: 99, offset: 64 };
    assert_eq!(ns(&read_all(dir.path(), ReadFrom::Position(future)).await), vec![13]);
    q.close().unwrap();
    drop(q);
    assert_eq!(ns(&read_all(dir.path(), ReadFrom::Position(future)).await), vec![13]);
}

#[tokio::test]
async fn a_reader_opened_before_the_writer_is_woken_by_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("not-yet");
    let mut reader = DlqReader::open(&path, ReadFrom::Beginning).unwrap();
    assert!(reader.next_batch(10, false).await.unwrap().is_empty());
    let follower = tokio::spawn(async move { reader.next_batch(10, true).await.unwrap() });
    tokio::time::sleep(Duration::from_millis(20)).await;
    // Another spelling of the same directory meets the same in-process state.
    let q = DeadLetterQueue::open(&dir.path().join(".").join("not-yet"), opts()).unwrap();
    q.write(letters(10..13)).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(20), follower).await.unwrap().unwrap();
    assert_eq!(ns(&got), vec![10, 11, 12]);
}

#[tokio::test]
async fn inspect_describes_open_and_sealed_segments_and_their_damage() {
    let dir = tempfile::tempdir().unwrap();
    let o = DlqOptions { max_bytes: 1 << 20, ..tiny(StoragePolicy::DropNewer) };
    let q = DeadLetterQueue::open(dir.path(), o.clone()).unwrap();
    q.write(letters(10..15)).await.unwrap();
    q.crash();
    drop(q);
    // Damage the second entry of the open segment.
    let open = dir.path().join(naming::open_name(2));
    let mut bytes = fs::read(&open).unwrap();
    let f = frame_bytes(10) as usize;
    bytes[64 + f + 40] ^= 1;
    fs::write(&open, &bytes).unwrap();
    let segs = inspect::segments(dir.path()).unwrap();
    assert_eq!(segs.len(), 2);
    assert!(segs[0].sealed && !segs[1].sealed);
    assert_eq!((segs[1].entries, segs[1].damaged_frames, segs[1].bytes), (1, 1, 64 + 2 * f as u64));
    let s = inspect::stats(dir.path()).unwrap();
    assert_eq!((s.segments, s.sealed_segments, s.entries, s.writer_active), (2, 1, 4, false));
    assert_eq!((s.oldest_entry_time, s.newest_entry_time), (Some(1_000_010), Some(1_000_013)));
    // Recovery keeps the damaged frame (and counts it); readers skip it.
    let q = DeadLetterQueue::open(dir.path(), o).unwrap();
    assert_eq!(q.stats().corrupt_frames, 1);
    assert_eq!(q.stats().entries, 4);
    let mut reader = DlqReader::open(dir.path(), ReadFrom::Beginning).unwrap();
    assert_eq!(ns(&reader.next_batch(100, false).await.unwrap()), vec![10, 11, 12, 13]);
    assert_eq!(reader.damaged_frames(), 1);
}

#[tokio::test]
async fn a_file_cut_by_hand_under_a_running_writer_does_not_hang_readers() {
    let dir = tempfile::tempdir().unwrap();
    let q = DeadLetterQueue::open(dir.path(), opts()).unwrap();
    q.write(letters(10..15)).await.unwrap();
    let open = dir.path().join(naming::open_name(1));
    let len = fs::metadata(&open).unwrap().len();
    fs::OpenOptions::new().write(true).open(&open).unwrap().set_len(len - 30).unwrap();
    let got = tokio::time::timeout(Duration::from_secs(20), read_all(dir.path(), ReadFrom::Beginning)).await.unwrap();
    assert_eq!(ns(&got), vec![10, 11, 12, 13]);
    q.close().unwrap();
}

#[tokio::test]
async fn any_damaged_byte_costs_at_most_the_entry_it_hits() {
    let dir = tempfile::tempdir().unwrap();
    let q = DeadLetterQueue::open(dir.path(), opts()).unwrap();
    q.write(letters(10..16)).await.unwrap();
    q.close().unwrap();
    drop(q);
    let path = sealed_path(dir.path(), 1);
    let good = fs::read(&path).unwrap();
    let f = frame_bytes(10) as usize;
    for at in (0..good.len()).step_by(5) {
        let mut bad = good.clone();
        bad[at] ^= 0x5a;
        fs::write(&path, &bad).unwrap();
        let got = ns(&read_all(dir.path(), ReadFrom::Beginning).await);
        if at < 64 {
            // The header: reported, and the frames, which prove themselves, are all read.
            assert_eq!(got, (10..16).collect::<Vec<_>>(), "flip at {at}");
            let mut reader = DlqReader::open(dir.path(), ReadFrom::Beginning).unwrap();
            reader.next_batch(100, false).await.unwrap();
            assert_eq!(reader.damaged_frames(), 1, "flip at {at}");
            continue;
        }
        let hit = (at - 64) / f;
        let want: Vec<i64> = (0..6).filter(|k| *k != hit).map(|k| 10 + k as i64).collect();
        assert_eq!(got, want, "flip at {at}");
    }
}

#[tokio::test]
async fn recovery_rewrites_a_damaged_header_and_sets_aside_a_file_with_no_entry() {
    let dir = tempfile::tempdir().unwrap();
    let q = DeadLetterQueue::open(dir.path(), opts()).unwrap();
    q.write(letters(10..13)).await.unwrap();
    q.crash();
    drop(q);
    let open = dir.path().join(naming::open_name(1));
    let mut bytes = fs::read(&open).unwrap();
    bytes[20] ^= 0xff;
    fs::write(&open, &bytes).unwrap();
    // A stranger with a segment's name: no frame of its own.
    fs::write(dir.path().join(naming::open_name(7)), vec![0x42u8; 500]).unwrap();
    let q = DeadLetterQueue::open(dir.path(), opts()).unwrap();
    assert_eq!(q.stats().entries, 3);
    assert_eq!(q.stats().corrupt_frames, 1);
    assert!(dir.path().join(format!("{}.damaged", naming::open_name(7))).exists());
    q.write(letters(13..14)).await.unwrap();
    assert_eq!(segment_files(dir.path()), vec![(1, true), (8, false)]);
    let mut reader = DlqReader::open(dir.path(), ReadFrom::Beginning).unwrap();
    assert_eq!(ns(&reader.next_batch(100, false).await.unwrap()), vec![10, 11, 12, 13]);
    assert_eq!(reader.damaged_frames(), 0);
}

/// ENOSPC or EIO while entries are written (part of the group reaching the file, or the fsync
/// failing): that write fails naming the segment, and its entries are not counted as written;
/// earlier entries are untouched, later writes go on, and everything reads back undamaged.
#[tokio::test]
async fn a_failed_write_costs_its_own_entries_and_never_earlier_ones() {
    // Linux's numbers (this crate does not link libc).
    const ENOSPC: i32 = 28;
    const EIO: i32 = 5;
    for (errno, failing) in [(ENOSPC, "write"), (EIO, "write"), (EIO, "fsync")] {
        let dir = tempfile::tempdir().unwrap();
        let q = DeadLetterQueue::open(dir.path(), DlqOptions { sync: DlqSync::Commit, ..opts() }).unwrap();
        q.write(letters(0..10)).await.unwrap();
        let shared = shared::shared_for(dir.path()).unwrap();
        shared.fail_errno.store(errno, std::sync::atomic::Ordering::SeqCst);
        let at_fsync = failing == "fsync";
        let counter = if at_fsync { &shared.fail_syncs } else { &shared.fail_writes };
        counter.store(1, std::sync::atomic::Ordering::SeqCst);
        let first_lost = 10;
        let e = q.write(letters(first_lost..first_lost + 5)).await.unwrap_err();
        let message = e.to_string();
        assert!(message.contains(".open"), "names the segment: {message}");
        assert!(message.contains(&std::io::Error::from_raw_os_error(errno).to_string()), "{message}");
        q.write(letters(100..103)).await.unwrap();
        let stats = q.stats();
        q.close().unwrap();
        let got = read_all(dir.path(), ReadFrom::Beginning).await;
        let mut expected: Vec<i64> = (0..first_lost as i64).collect();
        if at_fsync {
            // Written, not known durable: reported as failed, yet in the file (read back, and a
            // duplicate if the caller wrote them again).
            expected.extend(10..15);
        }
        expected.extend(100..103);
        assert_eq!(ns(&got), expected, "{errno} at {failing}");
        assert_eq!(inspect::stats(dir.path()).unwrap().entries, expected.len() as u64);
        let damaged = inspect::entries(dir.path(), ReadFrom::Beginning)
            .unwrap()
            .filter(|i| matches!(i, Ok(Item::Damaged { .. })))
            .count();
        assert_eq!(damaged, 0, "nothing damaged ({errno} at {failing})");
        assert_eq!(stats.written, expected.len() as u64, "{errno} at {failing}");
    }
}

/// A real full disk under the writer: writes fail (ENOSPC, naming the segment) and count as
/// not written, what was written before reads back whole, and once space returns writing goes
/// on in the same segment.
#[tokio::test]
async fn a_full_disk_fails_writes_without_damaging_what_was_written() {
    let Some(disk) = SmallTmpfs::mount("256k") else { return };
    let dir = disk.path().join("dlq");
    let ballast = disk.path().join("ballast");
    fs::write(&ballast, vec![0xa5u8; 64 << 10]).unwrap();
    let q = DeadLetterQueue::open(&dir, DlqOptions { sync: DlqSync::Commit, ..opts() }).unwrap();
    // About 400 bytes each: the disk is full after some hundreds.
    let mut written = 0u64;
    let mut failed = None;
    for i in 0..2000u64 {
        match q.write(letters(i..i + 1)).await {
            Ok(o) => written += o.written as u64,
            Err(e) => {
                failed = Some(e.to_string());
                break;
            }
        }
    }
    let message = failed.expect("the disk never filled");
    assert!(message.contains("No space left") && message.contains(".open"), "{message}");
    assert_eq!(q.stats().written, written);
    assert!(q.write(letters(5000..5001)).await.is_err(), "the disk is still full");
    fs::remove_file(&ballast).unwrap();
    q.write(letters(5000..5003)).await.expect("space returned");
    q.close().unwrap();
    let got = read_all(&dir, ReadFrom::Beginning).await;
    let expected: Vec<i64> = (0..written as i64).chain(5000..5003).collect();
    assert_eq!(ns(&got), expected, "everything written, in order, nothing of the failed writes");
    let damaged =
        inspect::entries(&dir, ReadFrom::Beginning).unwrap().filter(|i| matches!(i, Ok(Item::Damaged { .. }))).count();
    assert_eq!(damaged, 0);
}

/// Paths of the files this process holds open under `dir` that were deleted.
fn deleted_but_open(dir: &Path) -> Vec<String> {
    let dir = dir.canonicalize().unwrap().to_string_lossy().to_string();
    fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .map(|p| p.to_string_lossy().to_string())
        .filter(|p| p.starts_with(&dir) && p.ends_with("(deleted)"))
        .collect()
}

/// A following reader at the end of a segment that retention then deletes lets the file go,
/// so its space returns.
#[tokio::test]
async fn a_following_reader_lets_a_deleted_segment_go() {
    let dir = tempfile::tempdir().unwrap();
    let q = DeadLetterQueue::open(
        dir.path(),
        DlqOptions { retain_age: Some(Duration::from_secs(3600)), seal_idle: Duration::from_millis(20), ..opts() },
    )
    .unwrap();
    let now = sluice_core::value::now_nanos();
    let two_hours = 2 * 3600 * 1_000_000_000;
    q.write((10..13).map(|i| letter(i, now - two_hours)).collect()).await.unwrap();
    let mut reader = DlqReader::open(dir.path(), ReadFrom::Beginning).unwrap();
    let follower = tokio::spawn(async move {
        let mut got = Vec::new();
        while got.len() < 5 {
            got.extend(reader.next_batch(100, true).await.unwrap());
        }
        got
    });
    wait_until("the expiry", || q.stats().expired == 3).await;
    wait_until("the deleted segment is let go", || deleted_but_open(dir.path()).is_empty()).await;
    q.write((13..15).map(|i| letter(i, now)).collect()).await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(20), follower).await.unwrap().unwrap();
    assert_eq!(ns(&got), vec![10, 11, 12, 13, 14]);
}

/// Positions and starting points read in logs as a user would write them, not as Rust's Debug.
#[test]
fn positions_and_starting_points_display_plainly() {
    let p = Position { segment: 3, offset: 415 };
    assert_eq!(p.to_string(), "segment 3, offset 415");
    assert_eq!(ReadFrom::Position(p).to_string(), "after segment 3, offset 415");
    assert_eq!(ReadFrom::Beginning.to_string(), "the oldest entry");
    assert_eq!(ReadFrom::Time(1_763_718_122_000_000_000).to_string(), "entries from 2025-11-21T09:42:02.000Z");
}
