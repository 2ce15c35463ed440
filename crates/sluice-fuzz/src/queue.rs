//! A whole persisted-queue directory read offline, as `sluice queue stats` and `sluice queue
//! verify` read it: one shard with a checkpoint file and up to two segment files, all from the
//! fuzz input. This reaches the checkpoint parser (through `inspect`, its only public reader)
//! and the segment scan with every event body decoded.

use std::fs;
use std::path::Path;

use sluice_queue::persisted::inspect::inspect;
use sluice_segment::SegmentHeader;

use crate::checksums::{fix_checkpoint, fix_segment};
use crate::split::split;

/// Input: `[checkpoint, first segment, second segment]` cut by [`split`](crate::split). An empty
/// checkpoint or second segment part leaves that file out. Segment files are named after
/// their header's first sequence number when it decodes, as the queue names them.
///
/// The directory is read twice: as given, and with every checksum made to hold (see
/// [`checksums`](crate::checksums)), so that damaged contents behind valid checksums are read too.
pub fn queue_dir(data: &[u8]) {
    let parts = split(data, 3);
    let (checkpoint, first, second) = (parts[0], parts[1], parts[2]);
    inspect_files(checkpoint, first, second);
    let fixed = (fix_checkpoint(checkpoint), fix_segment(first), fix_segment(second));
    if (fixed.0.as_slice(), fixed.1.as_slice(), fixed.2.as_slice()) != (checkpoint, first, second) {
        inspect_files(&fixed.0, &fixed.1, &fixed.2);
    }
}

fn inspect_files(checkpoint: &[u8], first: &[u8], second: &[u8]) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let shard = dir.path().join("shard-0");
    fs::create_dir(&shard).expect("a shard directory");
    if !checkpoint.is_empty() {
        fs::write(shard.join("checkpoint"), checkpoint).expect("the checkpoint file");
    }
    let first_id = SegmentHeader::decode(first).map_or(0, |h| h.first_seq);
    let mut files = vec![(first_id, first)];
    if !second.is_empty() {
        let named = SegmentHeader::decode(second).map_or(0, |h| h.first_seq);
        if let Some(id) = if named > first_id { Some(named) } else { first_id.checked_add(1) } {
            files.push((id, second));
        }
    }
    for (id, bytes) in &files {
        fs::write(shard.join(format!("{id:020}.seg")), bytes).expect("a segment file");
    }
    let before = snapshot(&shard);

    for verify in [false, true] {
        let report = inspect(dir.path(), verify).expect("a readable queue directory is inspected");
        assert_eq!(report.shards.len(), 1);
        let s = &report.shards[0];
        assert_eq!(s.segments.len(), files.len(), "segments listed");
        for (g, (id, bytes)) in s.segments.iter().zip(&files) {
            assert_eq!((g.id, g.file_bytes), (*id, bytes.len() as u64));
            assert!(g.live_bytes <= g.file_bytes, "live bytes past the end of the file: {g:?}");
            assert!(g.acked_bytes + g.unacked_bytes <= g.live_bytes, "more frame bytes than live bytes: {g:?}");
            assert!(g.first_seq <= g.last_seq, "sequence numbers out of order: {g:?}");
            assert_eq!(g.first_seq.is_some(), g.frames > 0, "{g:?}");
            for d in &g.damage {
                assert!(d.offset + d.bytes <= g.file_bytes, "damage past the end of the file: {d:?}");
                assert!(!d.reason.is_empty(), "damage without a reason: {d:?}");
            }
        }
        let t = &report.totals;
        assert_eq!(t.frames, s.segments.iter().map(|g| g.frames).sum::<u64>());
        assert_eq!(t.acked_events + t.unacked_events, s.acked_events + s.unacked_events);
        assert_eq!(t.damaged, report.damage().count());
        assert!(!report.to_string().is_empty());
        serde_json::to_string(&report).expect("the report serializes");
    }
    assert_eq!(snapshot(&shard), before, "inspecting changed the queue directory");
}

fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = fs::read_dir(dir)
        .expect("the shard directory lists")
        .map(|e| {
            let e = e.expect("a directory entry");
            (e.file_name().to_string_lossy().into_owned(), fs::read(e.path()).expect("a file reads"))
        })
        .collect();
    files.sort();
    files
}
