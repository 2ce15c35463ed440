//! The registry's files read back: a snapshot and an op log from the fuzz input, read with
//! `Registry::read`, the read-only path of `sluice registry show` that runs the same recovery
//! (snapshot, then the log's records up to the first bad one) as opening the registry does.

use std::fs;
use std::path::Path;

use sluice_registry::Registry;

use crate::checksums::fix_registry;
use crate::split::split;

/// Input: one flags byte (bit 0: write `snapshot`, bit 1: write `log`, bit 2: make every
/// checksum hold first, see [`checksums`](crate::checksums)), then `[snapshot, log]` cut by
/// [`split`](crate::split).
pub fn registry_files(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else { return };
    let parts = split(rest, 2);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let fix = |bytes: &[u8]| if flags & 4 != 0 { fix_registry(bytes) } else { bytes.to_vec() };
    if flags & 1 != 0 {
        fs::write(dir.path().join("snapshot"), fix(parts[0])).expect("the snapshot file");
    }
    if flags & 2 != 0 {
        fs::write(dir.path().join("log"), fix(parts[1])).expect("the log file");
    }
    let before = snapshot(dir.path());
    let view = Registry::read(dir.path()).expect("readable registry files are read");
    assert!(!view.in_use, "nothing holds the lock");
    assert!(view.entries.windows(2).all(|w| w[0].key < w[1].key), "entries not in key order or repeated");
    for w in &view.warnings {
        assert!(!w.is_empty());
    }
    let again = Registry::read(dir.path()).expect("a second read");
    assert_eq!(again.entries, view.entries, "a second read finds other entries");
    assert_eq!(snapshot(dir.path()), before, "reading changed the registry directory");
}

fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = fs::read_dir(dir)
        .expect("the registry directory lists")
        .map(|e| {
            let e = e.expect("a directory entry");
            (e.file_name().to_string_lossy().into_owned(), fs::read(e.path()).expect("a file reads"))
        })
        .collect();
    files.sort();
    files
}
