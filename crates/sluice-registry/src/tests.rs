use std::collections::HashMap;
use std::path::Path;

use proptest::prelude::*;
use serde_json::json;
use sluice_testkit::SmallTmpfs;

use super::*;
use crate::format;
use std::fs::{self, File};
use std::sync::atomic::Ordering;
use std::time::{Instant, UNIX_EPOCH};

/// No timed flushes: tests flush explicitly (or close).
fn manual() -> RegistryOptions {
    RegistryOptions { flush_interval: Duration::from_secs(3600), compact_after_bytes: 1 << 20 }
}

fn offsets(r: &Registry) -> Vec<(String, u64)> {
    r.entries().into_iter().map(|e| (e.key, e.offset)).collect()
}

fn pairs(v: &[(&str, u64)]) -> Vec<(String, u64)> {
    v.iter().map(|(k, o)| (k.to_string(), *o)).collect()
}

fn log_len(dir: &Path) -> u64 {
    fs::metadata(dir.join(format::LOG)).unwrap().len()
}

/// Writes keys `a`, `b`, `c` with offsets 1, 2, 3, one flush (so one record) each, and returns
/// the log's length before each record and at the end.
fn three_records(dir: &Path) -> Vec<u64> {
    let r = Registry::open(dir, manual()).unwrap();
    let mut bounds = vec![log_len(dir)];
    for (i, key) in ["a", "b", "c"].into_iter().enumerate() {
        r.cursor(key).commit(i as u64 + 1);
        r.flush().unwrap();
        bounds.push(log_len(dir));
    }
    r.close().unwrap();
    bounds
}

#[test]
fn commit_flush_reopen_restores_offsets_meta_and_time() {
    let dir = tempfile::tempdir().unwrap();
    let r = Registry::open(dir.path(), manual()).unwrap();
    let c = r.cursor("a");
    assert_eq!(c.key(), "a");
    assert!(r.get("a").is_none(), "a key exists before anything is committed to it");
    c.commit(5);
    c.set_meta(json!({"path": "/x", "inode": 7}));
    assert_eq!(r.get("a").unwrap().offset, 5, "commits are visible before they are flushed");
    r.flush().unwrap();
    let updated = r.get("a").unwrap().updated;
    r.close().unwrap();
    r.close().unwrap();
    drop(r);
    let r = Registry::open(dir.path(), manual()).unwrap();
    let e = r.get("a").unwrap();
    assert_eq!((e.offset, e.meta), (5, json!({"path": "/x", "inode": 7})));
    let ms = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_millis();
    assert_eq!(ms(e.updated), ms(updated));
    assert_eq!(r.cursor("a").offset(), 5);
}

#[test]
fn many_commits_of_one_key_merge_into_one_record() {
    let dir = tempfile::tempdir().unwrap();
    let r = Registry::open(dir.path(), manual()).unwrap();
    let c = r.cursor("k");
    let clone = c.clone();
    for i in 1..=1000 {
        if i % 2 == 0 { c.commit(i) } else { clone.commit(i) }
    }
    assert_eq!(r.stats().pending_keys, 1);
    r.flush().unwrap();
    let s = r.stats();
    assert_eq!((s.records_written, s.flushes, s.fsyncs), (1, 1, 1));
    assert_eq!(r.get("k").unwrap().offset, 1000);
    // Nothing changed since: a flush writes nothing and does not fsync.
    r.flush().unwrap();
    assert_eq!(r.stats().fsyncs, 1);
    // The same offset again is no change either.
    c.commit(1000);
    r.flush().unwrap();
    assert_eq!(r.stats().records_written, 1);
}

#[test]
fn latest_commit_wins_even_when_lower() {
    let dir = tempfile::tempdir().unwrap();
    let r = Registry::open(dir.path(), manual()).unwrap();
    let c = r.cursor("k");
    c.commit(50);
    c.commit(7); // a truncated file read again from the start
    r.flush().unwrap();
    c.commit(9);
    c.commit(3);
    r.flush().unwrap();
    assert_eq!(r.stats().records_written, 2);
    r.close().unwrap();
    drop(r);
    let r = Registry::open(dir.path(), manual()).unwrap();
    assert_eq!(offsets(&r), pairs(&[("k", 3)]));
}

#[test]
fn meta_is_written_only_when_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    let r = Registry::open(dir.path(), manual()).unwrap();
    let c = r.cursor("k");
    c.set_meta(json!({"path": "/var/log/a.log"}));
    c.commit(1);
    r.flush().unwrap();
    let with_meta = r.stats().bytes_written;
    c.commit(2);
    r.flush().unwrap();
    let offset_only = r.stats().bytes_written - with_meta;
    assert!(offset_only < with_meta, "{offset_only} !< {with_meta}");
    c.set_meta(json!({"path": "/var/log/a.log.1"}));
    r.flush().unwrap();
    r.close().unwrap();
    drop(r);
    let r = Registry::open(dir.path(), manual()).unwrap();
    let e = r.get("k").unwrap();
    assert_eq!((e.offset, e.meta), (2, json!({"path": "/var/log/a.log.1"})));
}

#[test]
fn remove_detaches_old_cursors_and_a_new_cursor_recreates_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let r = Registry::open(dir.path(), manual()).unwrap();
    let old = r.cursor("k");
    old.commit(10);
    r.cursor("other").commit(1);
    r.flush().unwrap();
    r.remove("k");
    r.remove("never-existed");
    assert!(r.get("k").is_none());
    old.commit(11); // ignored: the key was removed
    r.flush().unwrap();
    assert!(r.get("k").is_none());
    r.close().unwrap();
    drop(r);

    let r = Registry::open(dir.path(), manual()).unwrap();
    assert_eq!(offsets(&r), pairs(&[("other", 1)]));
    // Remove and recreate within one flush: the key ends up with the new cursor's offset.
    r.cursor("k").commit(5);
    r.remove("k");
    r.cursor("k").commit(6);
    r.close().unwrap();
    drop(r);
    let r = Registry::open(dir.path(), manual()).unwrap();
    assert_eq!(offsets(&r), pairs(&[("k", 6), ("other", 1)]));
}

#[test]
fn entries_are_sorted() {
    let dir = tempfile::tempdir().unwrap();
    let r = Registry::open(dir.path(), manual()).unwrap();
    for k in ["m", "a", "z", "b"] {
        r.cursor(k).commit(1);
    }
    let _unused = r.cursor("unused");
    let keys: Vec<String> = r.entries().into_iter().map(|e| e.key).collect();
    assert_eq!(keys, ["a", "b", "m", "z"]);
}

#[test]
fn a_second_open_of_the_same_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _r = Registry::open(dir.path(), manual()).unwrap();
    let e = Registry::open(dir.path(), manual()).unwrap_err();
    assert!(matches!(e, RegistryError::Locked { .. }), "{e}");
    assert!(e.to_string().contains(dir.path().to_str().unwrap()), "{e}");
}

#[test]
fn open_failure_names_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    fs::write(&file, b"x").unwrap();
    let e = Registry::open(&file.join("registry"), manual()).unwrap_err();
    assert!(e.to_string().contains("a-file/registry"), "{e}");
}

#[test]
fn torn_log_tail_is_cut_and_earlier_records_kept() {
    let dir = tempfile::tempdir().unwrap();
    let bounds = three_records(dir.path());
    // Cut in the middle of the last record (`c`).
    let cut = (bounds[2] + bounds[3]) / 2;
    let f = File::options().write(true).open(dir.path().join(format::LOG)).unwrap();
    f.set_len(cut).unwrap();
    drop(f);

    let view = Registry::read(dir.path()).unwrap();
    assert_eq!(view.entries.len(), 2);
    assert!(view.warnings[0].contains(&format!("offset {}", bounds[2])), "{:?}", view.warnings);
    assert_eq!(log_len(dir.path()), cut, "a read-only view truncated the log");

    let r = Registry::open(dir.path(), manual()).unwrap();
    assert_eq!(offsets(&r), pairs(&[("a", 1), ("b", 2)]));
    assert_eq!(log_len(dir.path()), bounds[2], "the torn tail is truncated at open");
    r.cursor("d").commit(4);
    r.close().unwrap();
    drop(r);
    let r = Registry::open(dir.path(), manual()).unwrap();
    assert_eq!(offsets(&r), pairs(&[("a", 1), ("b", 2), ("d", 4)]));
}

#[test]
fn a_flipped_byte_stops_recovery_at_that_record() {
    let dir = tempfile::tempdir().unwrap();
    let bounds = three_records(dir.path());
    let path = dir.path().join(format::LOG);
    let mut bytes = fs::read(&path).unwrap();
    // Inside `b`'s payload.
    bytes[bounds[1] as usize + 12] ^= 0x01;
    fs::write(&path, &bytes).unwrap();
    let r = Registry::open(dir.path(), manual()).unwrap();
    assert_eq!(offsets(&r), pairs(&[("a", 1)]), "records after the bad one must not be applied");
    assert_eq!(log_len(dir.path()), bounds[1]);

    // A length field gone wild is caught too.
    drop(r);
    let bounds = {
        let dir2 = tempfile::tempdir().unwrap();
        let b = three_records(dir2.path());
        let mut bytes = fs::read(dir2.path().join(format::LOG)).unwrap();
        bytes[b[2] as usize + 3] = 0x7f;
        fs::write(dir.path().join(format::LOG), &bytes).unwrap();
        fs::copy(dir2.path().join(format::SNAPSHOT), dir.path().join(format::SNAPSHOT)).unwrap();
        b
    };
    let r = Registry::open(dir.path(), manual()).unwrap();
    assert_eq!(offsets(&r), pairs(&[("a", 1), ("b", 2)]));
    assert_eq!(log_len(dir.path()), bounds[2]);
}

/// A registry whose snapshot holds `a`=1, `b`=2 and whose log then holds `c`=3, `a`=10.
fn snapshot_and_log(dir: &Path) {
    // A tiny threshold: the first flush compacts.
    let r = Registry::open(dir, RegistryOptions { compact_after_bytes: 1, ..manual() }).unwrap();
    r.cursor("a").commit(1);
    r.cursor("b").commit(2);
    r.flush().unwrap();
    assert_eq!(r.stats().compactions, 1);
    r.close().unwrap();
    drop(r);
    let r = Registry::open(dir, manual()).unwrap();
    r.cursor("c").commit(3);
    r.cursor("a").commit(10);
    r.close().unwrap();
    assert!(fs::metadata(dir.join(format::SNAPSHOT)).unwrap().len() > format::HEADER_LEN as u64 + 20);
    assert!(log_len(dir) > format::HEADER_LEN as u64);
}

#[test]
fn corrupt_snapshot_falls_back_to_the_log() {
    let dir = tempfile::tempdir().unwrap();
    snapshot_and_log(dir.path());
    let path = dir.path().join(format::SNAPSHOT);
    let mut bytes = fs::read(&path).unwrap();
    bytes[3] ^= 0xff; // the magic
    fs::write(&path, &bytes).unwrap();
    let view = Registry::read(dir.path()).unwrap();
    assert!(view.warnings.iter().any(|w| w.contains("snapshot") && w.contains("corrupt")), "{:?}", view.warnings);
    let r = Registry::open(dir.path(), manual()).unwrap();
    assert_eq!(offsets(&r), pairs(&[("a", 10), ("c", 3)]));
    r.cursor("d").commit(4);
    r.close().unwrap();
    drop(r);
    // The open rewrote a good snapshot: everything recovered so far survives the next open.
    let view = Registry::read(dir.path()).unwrap();
    assert!(view.warnings.is_empty(), "{:?}", view.warnings);
    let r = Registry::open(dir.path(), manual()).unwrap();
    assert_eq!(offsets(&r), pairs(&[("a", 10), ("c", 3), ("d", 4)]));
}

#[test]
fn damaged_snapshot_record_keeps_the_entries_before_it() {
    let dir = tempfile::tempdir().unwrap();
    snapshot_and_log(dir.path());
    let path = dir.path().join(format::SNAPSHOT);
    let mut bytes = fs::read(&path).unwrap();
    let len = bytes.len();
    // The snapshot holds `a` then `b` then the end record; damage `b`'s record.
    bytes[len - 30] ^= 0x40;
    fs::write(&path, &bytes).unwrap();
    let r = Registry::open(dir.path(), manual()).unwrap();
    assert_eq!(offsets(&r), pairs(&[("a", 10), ("c", 3)]));
}

#[test]
fn zeroed_snapshot_falls_back_to_the_log() {
    let dir = tempfile::tempdir().unwrap();
    snapshot_and_log(dir.path());
    let path = dir.path().join(format::SNAPSHOT);
    let len = fs::metadata(&path).unwrap().len() as usize;
    fs::write(&path, vec![0u8; len]).unwrap();
    let r = Registry::open(dir.path(), manual()).unwrap();
    assert_eq!(offsets(&r), pairs(&[("a", 10), ("c", 3)]));
}

#[test]
fn zeroed_log_keeps_the_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    snapshot_and_log(dir.path());
    let path = dir.path().join(format::LOG);
    fs::write(&path, vec![0u8; log_len(dir.path()) as usize]).unwrap();
    let r = Registry::open(dir.path(), manual()).unwrap();
    assert_eq!(offsets(&r), pairs(&[("a", 1), ("b", 2)]));
    r.cursor("e").commit(5);
    r.close().unwrap();
    drop(r);
    let r = Registry::open(dir.path(), manual()).unwrap();
    assert_eq!(offsets(&r), pairs(&[("a", 1), ("b", 2), ("e", 5)]));
}

/// The generation of the snapshot and of the log in `dir`.
fn generations(dir: &Path) -> (u64, u64) {
    let g = |name: &str| u64::from_le_bytes(fs::read(dir.join(name)).unwrap()[16..24].try_into().unwrap());
    (g(format::SNAPSHOT), g(format::LOG))
}

#[test]
fn crash_during_compaction_recovers_at_every_step() {
    let expected = pairs(&[("a", 10), ("b", 2), ("c", 3)]);
    let base = tempfile::tempdir().unwrap();
    snapshot_and_log(base.path());
    let (s, l) = generations(base.path());
    assert_eq!(s, l);
    let state = format::recover(base.path()).unwrap().state;
    let copy = || {
        let d = tempfile::tempdir().unwrap();
        for f in [format::SNAPSHOT, format::LOG] {
            fs::copy(base.path().join(f), d.path().join(f)).unwrap();
        }
        d
    };
    // What compaction writes as the next snapshot; `a` differs from the log so that a wrongly
    // replayed stale log would show.
    let mut next_state = state.clone();
    next_state.get_mut("a").unwrap().offset = 11;
    let next_snapshot = format::encode_snapshot(&next_state, s + 1);

    // 1. Crashed while writing snapshot.tmp: a partial tmp is left; the old pair is whole.
    let d = copy();
    fs::write(d.path().join(format::SNAPSHOT_TMP), &next_snapshot[..next_snapshot.len() / 2]).unwrap();
    let r = Registry::open(d.path(), manual()).unwrap();
    assert_eq!(offsets(&r), expected);
    assert!(!d.path().join(format::SNAPSHOT_TMP).exists());
    drop(r);

    // 2. snapshot.tmp complete and synced but not renamed: still the old pair.
    let d = copy();
    fs::write(d.path().join(format::SNAPSHOT_TMP), &next_snapshot).unwrap();
    let r = Registry::open(d.path(), manual()).unwrap();
    assert_eq!(offsets(&r), expected);
    drop(r);

    // 3. The new snapshot renamed in place, the log not yet reset (it predates the snapshot).
    let d = copy();
    fs::write(d.path().join(format::SNAPSHOT), &next_snapshot).unwrap();
    let r = Registry::open(d.path(), manual()).unwrap();
    assert_eq!(offsets(&r), pairs(&[("a", 11), ("b", 2), ("c", 3)]), "the stale log was replayed");
    let (s2, l2) = generations(d.path());
    assert_eq!(s2, l2, "the open leaves a matching pair");
    assert!(s2 > s + 1);
    r.cursor("z").commit(26);
    drop(r);
    let r = Registry::open(d.path(), manual()).unwrap();
    assert_eq!(offsets(&r), pairs(&[("a", 11), ("b", 2), ("c", 3), ("z", 26)]));
    drop(r);

    // 4. As 3, with a partial log.tmp left behind.
    let d = copy();
    fs::write(d.path().join(format::SNAPSHOT), &next_snapshot).unwrap();
    fs::write(d.path().join(format::LOG_TMP), &format::log_header(s + 1)[..10]).unwrap();
    let r = Registry::open(d.path(), manual()).unwrap();
    assert_eq!(offsets(&r), pairs(&[("a", 11), ("b", 2), ("c", 3)]));
    assert!(!d.path().join(format::LOG_TMP).exists());
    drop(r);

    // 5. Compaction finished: the new snapshot and an empty log of its generation.
    let d = copy();
    fs::write(d.path().join(format::SNAPSHOT), &next_snapshot).unwrap();
    fs::write(d.path().join(format::LOG), format::log_header(s + 1)).unwrap();
    let view = Registry::read(d.path()).unwrap();
    assert!(view.warnings.is_empty(), "{:?}", view.warnings);
    let r = Registry::open(d.path(), manual()).unwrap();
    assert_eq!(offsets(&r), pairs(&[("a", 11), ("b", 2), ("c", 3)]));
    assert_eq!(generations(d.path()), (s + 1, s + 1), "a clean pair is appended to, not rewritten");
    drop(r);

    // 6. The log vanished (or was never created): the snapshot stands.
    let d = copy();
    fs::remove_file(d.path().join(format::LOG)).unwrap();
    let r = Registry::open(d.path(), manual()).unwrap();
    assert_eq!(offsets(&r), pairs(&[("a", 1), ("b", 2)]));
    drop(r);
}

#[test]
fn compaction_under_load_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let opts = RegistryOptions { flush_interval: Duration::from_millis(1), compact_after_bytes: 4096 };
    let r = Registry::open(dir.path(), opts.clone()).unwrap();
    let cursors: Vec<Cursor> = (0..200).map(|i| r.cursor(&format!("key-{i:03}"))).collect();
    for round in 1..=200u64 {
        for c in &cursors {
            c.commit(round);
        }
        if round % 50 == 0 {
            cursors[round as usize % 200].set_meta(json!({"round": round}));
        }
        std::thread::yield_now();
    }
    r.flush().unwrap();
    assert!(r.stats().compactions > 0, "{:?}", r.stats());
    r.close().unwrap();
    drop(r);
    let r = Registry::open(dir.path(), opts).unwrap();
    let entries = r.entries();
    assert_eq!(entries.len(), 200);
    assert!(entries.iter().all(|e| e.offset == 200), "{entries:?}");
    assert_eq!(r.get("key-100").unwrap().meta, json!({"round": 100}));
}

#[test]
fn zero_flush_interval_writes_and_fsyncs_every_batch() {
    let dir = tempfile::tempdir().unwrap();
    let r = Registry::open(dir.path(), RegistryOptions { flush_interval: Duration::ZERO, ..manual() }).unwrap();
    let c = r.cursor("k");
    for i in 1..=3u64 {
        c.commit(i);
        let started = Instant::now();
        // Written without any flush() call.
        while r.stats().records_written < i {
            assert!(started.elapsed() < Duration::from_secs(10), "the commit was not written: {:?}", r.stats());
            std::thread::sleep(Duration::from_millis(1));
        }
        let s = r.stats();
        assert_eq!(s.fsyncs, s.flushes, "{s:?}");
    }
    // What was written is on disk, read by someone else.
    assert_eq!(Registry::read(dir.path()).unwrap().entries[0].offset, 3);
}

#[test]
fn timed_flush_writes_without_being_asked() {
    let dir = tempfile::tempdir().unwrap();
    let opts = RegistryOptions { flush_interval: Duration::from_millis(20), ..manual() };
    let r = Registry::open(dir.path(), opts).unwrap();
    r.cursor("k").commit(42);
    let started = Instant::now();
    while Registry::read(dir.path()).unwrap().entries.is_empty() {
        assert!(started.elapsed() < Duration::from_secs(10), "nothing was flushed");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(Registry::read(dir.path()).unwrap().entries[0].offset, 42);
}

#[test]
fn many_threads_commit_while_the_writer_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let opts = RegistryOptions { flush_interval: Duration::from_micros(200), compact_after_bytes: 64 << 10 };
    let r = Registry::open(dir.path(), opts.clone()).unwrap();
    let threads = 6;
    let keys_per_thread = 50;
    let rounds = 2_000u64;
    std::thread::scope(|s| {
        for t in 0..threads {
            let r = &r;
            s.spawn(move || {
                let cursors: Vec<Cursor> = (0..keys_per_thread).map(|k| r.cursor(&format!("t{t}-k{k}"))).collect();
                for round in 1..=rounds {
                    for c in &cursors {
                        c.commit(round);
                    }
                }
            });
        }
        let r = &r;
        s.spawn(move || {
            for _ in 0..50 {
                r.flush().unwrap();
            }
        });
    });
    r.flush().unwrap();
    assert!(r.entries().iter().all(|e| e.offset == rounds));
    let view = Registry::read(dir.path()).unwrap();
    assert_eq!(view.entries.len(), threads * keys_per_thread);
    assert!(view.entries.iter().all(|e| e.offset == rounds), "a newer offset was lost");
    r.close().unwrap();
    drop(r);
    let r = Registry::open(dir.path(), opts).unwrap();
    assert!(r.entries().iter().all(|e| e.offset == rounds));
}

#[test]
fn removes_reads_and_flushes_race_with_commits() {
    let dir = tempfile::tempdir().unwrap();
    let opts = RegistryOptions { flush_interval: Duration::ZERO, compact_after_bytes: 8 << 10 };
    let r = Registry::open(dir.path(), opts.clone()).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let (r, stop) = (&r, &stop);
        for t in 0..2 {
            s.spawn(move || {
                let mut round = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    round += 1;
                    for k in 0..20 {
                        r.cursor(&format!("k{k}")).commit(round * 10 + t);
                    }
                }
            });
        }
        s.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for k in 0..20 {
                    r.remove(&format!("k{k}"));
                }
                let _ = (r.stats(), r.entries(), r.get("k1"));
                r.flush().unwrap();
            }
        });
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, Ordering::Relaxed);
    });
    // Quiet now: one last state, written and read back identically.
    r.cursor("k1").commit(7);
    r.remove("k2");
    r.flush().unwrap();
    let in_memory = offsets(&r);
    r.close().unwrap();
    drop(r);
    let r = Registry::open(dir.path(), opts).unwrap();
    assert_eq!(offsets(&r), in_memory);
    assert!(in_memory.contains(&("k1".to_string(), 7)));
}

#[test]
fn in_memory_registry_keeps_cursors_and_writes_nothing() {
    let r = Registry::in_memory();
    assert!(!r.is_persistent());
    let c = r.cursor("k");
    c.commit(3);
    c.set_meta(json!({"p": 1}));
    assert_eq!(r.get("k").unwrap().offset, 3);
    assert_eq!(r.stats().pending_keys, 0);
    r.remove("k");
    assert!(r.get("k").is_none());
    r.flush().unwrap();
    r.close().unwrap();
}

#[test]
fn flush_after_close_reports_unwritten_updates() {
    let dir = tempfile::tempdir().unwrap();
    let r = Registry::open(dir.path(), manual()).unwrap();
    let c = r.cursor("k");
    c.commit(1);
    r.close().unwrap();
    r.flush().unwrap();
    c.commit(2);
    let e = r.flush().unwrap_err();
    assert!(matches!(e, RegistryError::Closed { pending: 1, .. }), "{e}");
}

#[test]
fn a_failed_write_is_reported_and_retried_by_rewriting() {
    let dir = tempfile::tempdir().unwrap();
    let r = Registry::open(dir.path(), manual()).unwrap();
    r.cursor("a").commit(1);
    r.flush().unwrap();
    r.cursor("b").commit(2);
    r.shared.fail_writes.store(1, Ordering::SeqCst);
    let e = r.flush().unwrap_err();
    assert!(e.to_string().contains("injected write failure") && e.to_string().contains("registry"), "{e}");
    assert_eq!(r.stats().write_errors, 1);
    // The next flush writes the failed batch again, with what came since.
    r.flush().unwrap();
    assert_eq!(Registry::read(dir.path()).unwrap().entries.len(), 2);

    // The append and then the rewrite fail; the third attempt succeeds.
    r.cursor("c").commit(3);
    r.shared.fail_writes.store(2, Ordering::SeqCst);
    assert!(r.flush().is_err());
    assert!(r.flush().is_err());
    r.cursor("a").commit(10);
    r.flush().unwrap();
    // A failure that lasts: close reports it.
    r.cursor("d").commit(4);
    r.shared.fail_writes.store(u32::MAX, Ordering::SeqCst);
    assert!(r.close().is_err());
    drop(r);
    let r = Registry::open(dir.path(), manual()).unwrap();
    assert_eq!(offsets(&r), pairs(&[("a", 10), ("b", 2), ("c", 3)]));
}

#[test]
fn oversized_keys_and_metadata_are_refused_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let r = Registry::open(dir.path(), manual()).unwrap();
    let c = r.cursor("k");
    c.set_meta(json!({"path": "/a"}));
    c.set_meta(json!({"blob": "x".repeat(format::MAX_META_LEN + 1)}));
    c.commit(1);
    r.cursor(&"k".repeat(format::MAX_KEY_LEN + 1)).commit(2);
    r.cursor("z").commit(3);
    r.close().unwrap();
    drop(r);
    let view = Registry::read(dir.path()).unwrap();
    assert!(view.warnings.is_empty(), "{:?}", view.warnings);
    let got: Vec<(String, u64, Value)> = view.entries.into_iter().map(|e| (e.key, e.offset, e.meta)).collect();
    assert_eq!(got, [("k".to_string(), 1, json!({"path": "/a"})), ("z".to_string(), 3, Value::Null)]);
}

#[derive(Debug, Clone)]
enum Op {
    Commit(u8, u64),
    Meta(u8, u8),
    Remove(u8),
    Flush,
    Reopen,
    /// The files as a crash right now would leave them, opened elsewhere.
    Crash,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..8, 0u64..1_000_000).prop_map(|(k, o)| Op::Commit(k, o)),
        1 => (0u8..8, 0u8..4).prop_map(|(k, m)| Op::Meta(k, m)),
        2 => (0u8..8).prop_map(Op::Remove),
        2 => Just(Op::Flush),
        1 => Just(Op::Reopen),
        1 => Just(Op::Crash),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn matches_a_map_across_reopens(ops in proptest::collection::vec(op(), 1..100)) {
        let dir = tempfile::tempdir().unwrap();
        // A tiny threshold so that compaction happens often.
        let opts = RegistryOptions { flush_interval: Duration::from_secs(3600), compact_after_bytes: 200 };
        let mut r = Registry::open(dir.path(), opts.clone()).unwrap();
        let mut cursors: HashMap<u8, Cursor> = HashMap::new();
        let mut model: HashMap<String, (u64, Value)> = HashMap::new();
        // The model as of the last flush: what a crash must keep.
        let mut flushed = model.clone();
        let check = |r: &Registry, model: &HashMap<String, (u64, Value)>| {
            let mut want: Vec<(String, u64, Value)> =
                model.iter().map(|(k, (o, m))| (k.clone(), *o, m.clone())).collect();
            want.sort_by(|a, b| a.0.cmp(&b.0));
            let got: Vec<(String, u64, Value)> = r.entries().into_iter().map(|e| (e.key, e.offset, e.meta)).collect();
            prop_assert_eq!(got, want);
            Ok(())
        };
        for op in ops {
            match op {
                Op::Commit(k, o) => {
                    cursors.entry(k).or_insert_with(|| r.cursor(&format!("key{k}"))).commit(o);
                    model.entry(format!("key{k}")).or_insert((0, Value::Null)).0 = o;
                }
                Op::Meta(k, m) => {
                    cursors.entry(k).or_insert_with(|| r.cursor(&format!("key{k}"))).set_meta(json!({"m": m}));
                    model.entry(format!("key{k}")).or_insert((0, Value::Null)).1 = json!({"m": m});
                }
                Op::Remove(k) => {
                    r.remove(&format!("key{k}"));
                    cursors.remove(&k);
                    model.remove(&format!("key{k}"));
                }
                Op::Flush => {
                    r.flush().unwrap();
                    flushed = model.clone();
                }
                Op::Crash => {
                    let copy = tempfile::tempdir().unwrap();
                    for f in [format::SNAPSHOT, format::LOG] {
                        fs::copy(dir.path().join(f), copy.path().join(f)).unwrap();
                    }
                    let crashed = Registry::open(copy.path(), opts.clone()).unwrap();
                    check(&crashed, &flushed)?;
                }
                Op::Reopen => {
                    flushed = model.clone();
                    r.close().unwrap();
                    drop(r);
                    cursors.clear();
                    r = Registry::open(dir.path(), opts.clone()).unwrap();
                    let view = Registry::read(dir.path()).unwrap();
                    prop_assert!(view.warnings.is_empty(), "{:?}", view.warnings);
                }
            }
            check(&r, &model)?;
        }
        r.close().unwrap();
        drop(r);
        let r = Registry::open(dir.path(), opts).unwrap();
        check(&r, &model)?;
    }
}

/// The disk fills: every flush still writes (the op log's room is reserved), compaction that
/// cannot make its files changes nothing, and a restart on the still-full disk resumes from the
/// last offset written. Once space returns, compaction runs again.
#[test]
fn a_full_disk_does_not_stop_the_op_log() {
    let Some(disk) = SmallTmpfs::mount("1m") else { return };
    let dir = disk.path().join("registry");
    let opts = RegistryOptions { flush_interval: Duration::from_secs(3600), compact_after_bytes: 8 << 10 };
    let r = Registry::open(&dir, opts.clone()).unwrap();
    r.cursor("a").commit(1);
    r.flush().unwrap();
    let ballast = disk.fill();
    let cursor = r.cursor("file:2049:131");
    // About 15 KB of records: past a page, and past the size that triggers compaction.
    for i in 1..=300u64 {
        cursor.commit(i * 100);
        r.flush().unwrap_or_else(|e| panic!("flush {i} on a full disk: {e}"));
    }
    assert_eq!(r.stats().write_errors, 0);
    assert_eq!(r.stats().compactions, 0, "no room for a snapshot");
    r.close().unwrap();
    drop(r);
    let r = Registry::open(&dir, opts.clone()).unwrap();
    assert_eq!(offsets(&r), pairs(&[("a", 1), ("file:2049:131", 30_000)]));
    fs::remove_file(ballast).unwrap();
    r.cursor("a").commit(2);
    r.flush().unwrap();
    assert!(r.stats().compactions > 0, "compacted once space returned");
    r.close().unwrap();
    drop(r);
    let r = Registry::open(&dir, opts).unwrap();
    assert_eq!(offsets(&r), pairs(&[("a", 2), ("file:2049:131", 30_000)]));
}

/// ENOSPC and EIO on the op log (part of the records reaching the file): the registry keeps the
/// offsets in memory and reports each failure; the next flush writes them again; a restart while
/// the failures last resumes from the last offsets written, never from earlier ones.
#[test]
fn failed_appends_keep_offsets_in_memory_and_restarts_resume_from_the_last_written() {
    for errno in [libc::ENOSPC, libc::EIO] {
        let dir = tempfile::tempdir().unwrap();
        let r = Registry::open(dir.path(), manual()).unwrap();
        r.cursor("a").commit(1);
        r.cursor("b").commit(1);
        r.flush().unwrap();
        r.cursor("a").commit(2);
        r.flush().unwrap();
        r.shared.fail_errno.store(errno, Ordering::SeqCst);
        r.shared.fail_writes.store(1, Ordering::SeqCst);
        r.cursor("a").commit(3);
        r.cursor("c").commit(7);
        let e = r.flush().unwrap_err();
        assert!(e.to_string().contains(&io::Error::from_raw_os_error(errno).to_string()), "{e}");
        assert_eq!(offsets(&r), pairs(&[("a", 3), ("b", 1), ("c", 7)]), "kept in memory");
        r.cursor("b").commit(4);
        r.flush().unwrap();
        assert_eq!(r.stats().write_errors, 1);
        let view = Registry::read(dir.path()).unwrap();
        assert!(view.warnings.is_empty(), "{:?}", view.warnings);
        let on_disk: Vec<(String, u64)> = view.entries.iter().map(|e| (e.key.clone(), e.offset)).collect();
        assert_eq!(on_disk, pairs(&[("a", 3), ("b", 4), ("c", 7)]), "written again, whole");

        // Failures that last until the process ends.
        r.shared.fail_writes.store(u32::MAX, Ordering::SeqCst);
        r.cursor("a").commit(9);
        assert!(r.flush().is_err());
        assert!(r.close().is_err());
        drop(r);
        let r = Registry::open(dir.path(), manual()).unwrap();
        assert_eq!(offsets(&r), pairs(&[("a", 3), ("b", 4), ("c", 7)]), "the last written, not earlier");
    }
}
