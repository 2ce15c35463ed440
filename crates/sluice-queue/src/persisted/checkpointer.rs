//! A shard's checkpoints, written beside its writer rather than by it.
//!
//! A checkpoint costs two fsyncs (the file, then its directory after the rename), and the
//! segments it passes are then kept for reuse or deleted. Done by the writer, that stopped the
//! shard once per `checkpoint_interval` for as long as those fsyncs took: nothing new was
//! written, the workers ran out of events in memory, and a CPU-bound pipeline lost a tenth of
//! a second of throughput each time (a generator → `json` → blackhole run showed the dips once
//! a second). Here the writer asks, and a thread per shard writes the checkpoint.
//!
//! Guarantees:
//! - checkpoints are written one at a time (a slot of `checkpoint.rs` is rewritten by one writer
//!   at a time), and the position on disk never goes back;
//! - a checkpoint needs no new disk space (see `checkpoint.rs`), so a full disk does not stop
//!   them; a failed one (an I/O error) is a warning that counts the failures since the last
//!   success (at most one line per `WARN_EVERY`), counted in `checkpoint_failures`, and tried
//!   again with the next request;
//! - the events the workers finished past the checkpoint on disk are counted per shard
//!   (`ShardState::unrecorded_events`): what a restart right now would deliver again;
//! - a checkpoint records at most what the writer asked for, which it took from
//!   `ShardState::checkpointable` (acknowledged and synced);
//! - a segment is kept for reuse or deleted only after a checkpoint past it is on disk (except
//!   when the disk is full: see [`Checkpointer::write`]), and never the segment being written
//!   (the last one); a deleted segment's read handle is closed at once, so its space returns;
//! - at shutdown the writer stops the thread and writes the last checkpoint itself.

use std::fs;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::Inner;
use super::checkpoint::{Checkpoint, CheckpointFile};
use super::recovery::{FREE_POOL, FREE_SUFFIX};
use super::shard::{Shard, segment_path};

/// Failed checkpoints are logged at most this often (each line counts those since the last).
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Failed checkpoint writes since the last success, for the rate-limited warning.
#[derive(Default)]
struct Failures {
    count: u64,
    warned: Option<Instant>,
}

#[derive(Default)]
struct Requests {
    /// The latest position asked for and not yet taken.
    wanted: Option<u64>,
    stop: bool,
}

pub(crate) struct Checkpointer {
    inner: Arc<Inner>,
    shard: Arc<Shard>,
    /// Acknowledged segment files kept for reuse; the writer takes them for new segments.
    pub free: Mutex<Vec<PathBuf>>,
    /// The checkpoint file, locked while a checkpoint is written.
    file: Mutex<CheckpointFile>,
    failures: Mutex<Failures>,
    /// The position the checkpoint on disk records.
    written: AtomicU64,
    requests: Mutex<Requests>,
    wake: Condvar,
}

impl Checkpointer {
    /// `written` is the position of the checkpoint found on disk; `free` the spare files found.
    pub fn new(
        inner: Arc<Inner>,
        shard: Arc<Shard>,
        file: CheckpointFile,
        free: Vec<PathBuf>,
        written: u64,
    ) -> Checkpointer {
        Checkpointer {
            inner,
            shard,
            free: Mutex::new(free),
            file: Mutex::new(file),
            failures: Mutex::new(Failures::default()),
            written: AtomicU64::new(written),
            requests: Mutex::new(Requests::default()),
            wake: Condvar::new(),
        }
    }

    /// The position the checkpoint on disk records.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Acquire)
    }

    /// Asks the thread for a checkpoint at `done_lsn`; a later request replaces one not yet taken.
    pub fn request(&self, done_lsn: u64) {
        self.requests.lock().wanted = Some(done_lsn);
        self.wake.notify_one();
    }

    /// Ends the thread after the checkpoint it is writing, if any.
    pub fn stop(&self) {
        self.requests.lock().stop = true;
        self.wake.notify_one();
    }

    /// The checkpoint thread's body.
    pub fn run(&self) {
        loop {
            let wanted = {
                let mut r = self.requests.lock();
                while r.wanted.is_none() && !r.stop {
                    self.wake.wait(&mut r);
                }
                if r.stop {
                    return;
                }
                r.wanted.take()
            };
            if let Some(done_lsn) = wanted {
                // A failure is logged and counted by `write`; the next request tries again.
                let _ = self.write(done_lsn, false);
            }
        }
    }

    /// Writes the checkpoint file, or fails as a test asked (`Inner::fail_checkpoints`).
    fn record(&self, file: &mut CheckpointFile, point: &Checkpoint) -> io::Result<()> {
        #[cfg(test)]
        if self.inner.fail_checkpoints.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_ok()
        {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        file.write(&self.shard.dir, point)
    }

    /// Counts a failed checkpoint and warns, at most once per `WARN_EVERY`.
    fn failed(&self, e: &io::Error) {
        self.inner.metrics.checkpoint_failures.fetch_add(1, Ordering::Relaxed);
        let mut f = self.failures.lock();
        f.count += 1;
        if f.warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
            f.warned = Some(Instant::now());
            let unrecorded = self.shard.state.lock().unrecorded_events();
            tracing::warn!(shard = self.shard.id, dir = %self.shard.dir.display(), error = %e,
                failures = f.count, unrecorded_events = unrecorded,
                "cannot write the queue checkpoint (will retry); a restart now would deliver the unrecorded events again");
        }
    }

    fn succeeded(&self) {
        let mut f = self.failures.lock();
        if f.count > 0 {
            tracing::info!(shard = self.shard.id, failures = f.count, "queue checkpoint written again");
            *f = Failures::default();
        }
    }

    /// Writes a checkpoint at `done_lsn` (unless one at or past it is on disk), then keeps the
    /// segments wholly before it for reuse, or deletes them when the pool is full. With
    /// `free_space` (the disk is full) the spares and those segments are deleted even if the
    /// checkpoint could not be written: every event in them is acknowledged, so recovery
    /// starting from an older position brings duplicates, never loss.
    pub fn write(&self, done_lsn: u64, free_space: bool) -> io::Result<()> {
        let mut file = self.file.lock();
        if done_lsn <= self.written() && !free_space {
            return Ok(());
        }
        let (point, doomed) = {
            let s = self.shard.state.lock();
            let Some(seg) = s.segments.iter().rev().find(|g| g.base <= done_lsn).copied() else { return Ok(()) };
            let active = s.segments.back().map(|g| g.id);
            let doomed: Vec<u64> = s
                .segments
                .iter()
                .filter(|g| g.base + g.len <= done_lsn && Some(g.id) != active)
                .map(|g| g.id)
                .collect();
            (Checkpoint { segment: seg.id, offset: done_lsn - seg.base }, doomed)
        };
        let written = self.record(&mut file, &point);
        match &written {
            Ok(()) => {
                self.succeeded();
                self.shard.state.lock().recorded(done_lsn);
            }
            Err(e) => self.failed(e),
        }
        if free_space {
            for spare in self.free.lock().drain(..) {
                let _ = fs::remove_file(spare);
            }
        } else {
            written.as_ref().map_err(|e| io::Error::new(e.kind(), e.to_string()))?;
        }
        if written.is_ok() {
            self.written.fetch_max(done_lsn, Ordering::AcqRel);
        }
        if !doomed.is_empty() {
            for id in &doomed {
                let path = segment_path(&self.shard.dir, *id);
                // Only this (serialized) method adds spares and the writer only takes them, so
                // the room seen here is still there after the rename, done outside the lock
                // the writer takes when it starts a segment.
                let room = self.free.lock().len() < FREE_POOL;
                if room && !free_space {
                    let spare = self.shard.dir.join(format!("{id:020}{FREE_SUFFIX}"));
                    fs::rename(&path, &spare)?;
                    self.free.lock().push(spare);
                } else {
                    fs::remove_file(path)?;
                }
                // Gone from the directory, nobody opens it again: a handle kept for reading
                // would keep a deleted file's blocks.
                self.shard.close_segment(*id);
            }
            self.shard.state.lock().segments.retain(|g| !doomed.contains(&g.id));
        }
        written
    }
}
