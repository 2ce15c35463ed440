//! What the writer and the readers of one directory share inside a process: the segment index,
//! the counters, and the wake-up for readers. Found through a registry keyed by the directory's
//! canonical path, so a reader opened by path meets the writer opened by another spelling of it.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use parking_lot::Mutex;
use tokio::sync::watch;

use crate::naming::{self, Summary};
use crate::{DlqError, DlqStats, Room, StoragePolicy};

/// One segment in the index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SegInfo {
    /// The file's length (for the open segment: what has been written, which readers may read).
    pub bytes: u64,
    pub entries: u64,
    /// Oldest and newest entry time; meaningless while `entries == 0`.
    pub oldest: i64,
    pub newest: i64,
    pub sealed: bool,
}

impl SegInfo {
    pub fn summary(&self) -> Summary {
        Summary { entries: self.entries, bytes: self.bytes, oldest: self.oldest, newest: self.newest }
    }

    pub fn from_summary(s: &Summary) -> SegInfo {
        SegInfo { bytes: s.bytes, entries: s.entries, oldest: s.oldest, newest: s.newest, sealed: true }
    }

    pub fn file_name(&self, id: u64) -> String {
        if self.sealed { naming::sealed_name(id, &self.summary()) } else { naming::open_name(id) }
    }
}

/// The in-memory segment index: per segment, and totals kept with every change.
#[derive(Debug, Default)]
pub(crate) struct Index {
    /// True while a [`crate::DeadLetterQueue`] of this process has the directory; otherwise
    /// the index is not maintained and readers look at the directory instead.
    pub attached: bool,
    pub segments: BTreeMap<u64, SegInfo>,
    pub bytes: u64,
    pub entries: u64,
    /// The id the writer gives its next segment.
    pub next_id: u64,
}

impl Index {
    /// An index of `segments`, sorted by id.
    pub fn from_sorted(segments: Vec<(u64, SegInfo)>) -> Index {
        let bytes = segments.iter().map(|(_, s)| s.bytes).sum();
        let entries = segments.iter().map(|(_, s)| s.entries).sum();
        Index { attached: false, segments: segments.into_iter().collect(), bytes, entries, next_id: 0 }
    }

    pub fn insert(&mut self, id: u64, info: SegInfo) {
        if let Some(old) = self.segments.insert(id, info) {
            self.bytes -= old.bytes;
            self.entries -= old.entries;
        }
        self.bytes += info.bytes;
        self.entries += info.entries;
    }

    pub fn remove(&mut self, id: u64) -> Option<SegInfo> {
        let old = self.segments.remove(&id)?;
        self.bytes -= old.bytes;
        self.entries -= old.entries;
        Some(old)
    }

    /// The size policy's decision for `need` more bytes, with `open` the segment being written
    /// (never evicted while open). O(log n): the totals are kept, the oldest segment is the
    /// map's first key.
    pub fn room(&self, need: u64, max_bytes: u64, policy: StoragePolicy, open: Option<u64>) -> Room {
        if self.bytes.saturating_add(need) <= max_bytes {
            return Room::Fits;
        }
        match policy {
            StoragePolicy::DropNewer => Room::Reject,
            // Only the open segment can be skipped, and it is the last: at most two steps.
            StoragePolicy::DropOlder => match self.segments.keys().find(|id| Some(**id) != open) {
                Some(id) => Room::EvictOldest(*id),
                None => Room::SealOpen,
            },
        }
    }

    pub fn oldest_time(&self) -> Option<i64> {
        self.segments.values().find(|s| s.entries > 0).map(|s| s.oldest)
    }

    pub fn newest_time(&self) -> Option<i64> {
        self.segments.values().rev().find(|s| s.entries > 0).map(|s| s.newest)
    }
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub written: AtomicU64,
    pub dropped_newer: AtomicU64,
    pub dropped_older: AtomicU64,
    pub expired: AtomicU64,
    pub unencodable: AtomicU64,
    pub corrupt_frames: AtomicU64,
    pub consumed_segments: AtomicU64,
}

impl Counters {
    pub fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

pub(crate) struct Shared {
    pub dir: PathBuf,
    pub index: Mutex<Index>,
    pub counters: Counters,
    /// Bumped after every write and seal: readers wait on it.
    pub changed: watch::Sender<u64>,
    /// Test support: the next this many segment writes (`fail_writes`) or fsyncs
    /// (`fail_syncs`) fail with `fail_errno`; a failed write stores half its bytes first, as a
    /// real one may.
    #[cfg(test)]
    pub fail_writes: std::sync::atomic::AtomicU32,
    #[cfg(test)]
    pub fail_syncs: std::sync::atomic::AtomicU32,
    #[cfg(test)]
    pub fail_errno: std::sync::atomic::AtomicI32,
}

impl Shared {
    pub fn bump(&self) {
        self.changed.send_modify(|g| *g = g.wrapping_add(1));
    }

    pub fn stats(&self) -> DlqStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let ix = self.index.lock();
        // Skipping empty segments is at most one step: only the open segment can be empty.
        DlqStats {
            segments: ix.segments.len() as u64,
            bytes: ix.bytes,
            entries: ix.entries,
            written: get(&c.written),
            dropped_newer: get(&c.dropped_newer),
            dropped_older: get(&c.dropped_older),
            expired: get(&c.expired),
            unencodable: get(&c.unencodable),
            corrupt_frames: get(&c.corrupt_frames),
            consumed_segments: get(&c.consumed_segments),
            oldest_entry_time: ix.oldest_time(),
            newest_entry_time: ix.newest_time(),
        }
    }

    pub fn path_of(&self, id: u64, info: &SegInfo) -> PathBuf {
        self.dir.join(info.file_name(id))
    }
}

type Registry = Mutex<HashMap<PathBuf, Weak<Shared>>>;

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// The shared state of `dir` (which must exist), made on first use.
pub(crate) fn shared_for(dir: &Path) -> io::Result<Arc<Shared>> {
    let canonical = dir.canonicalize()?;
    let mut reg = registry().lock();
    if let Some(shared) = reg.get(&canonical).and_then(Weak::upgrade) {
        return Ok(shared);
    }
    reg.retain(|_, w| w.strong_count() > 0);
    let shared = Arc::new(Shared {
        dir: canonical.clone(),
        index: Mutex::new(Index::default()),
        counters: Counters::default(),
        changed: watch::Sender::new(0),
        #[cfg(test)]
        fail_writes: Default::default(),
        #[cfg(test)]
        fail_syncs: Default::default(),
        #[cfg(test)]
        fail_errno: Default::default(),
    });
    reg.insert(canonical, Arc::downgrade(&shared));
    Ok(shared)
}

pub(crate) use sluice_segment::files::sync_dir;

/// Takes the writer lock of `dir` (an exclusive `flock` on its `lock` file) if it is free;
/// `None` if a writer of this process or another holds it. The lock lasts as long as the file.
pub(crate) fn try_lock(dir: &Path) -> Result<Option<File>, DlqError> {
    let path = dir.join(naming::LOCK_FILE);
    sluice_segment::files::try_lock_exclusive(&path).map_err(|e| DlqError::io(path, e))
}
