//! Pipelined group commit: a shard's fsyncs run on a thread of their own.
//!
//! With `sync: commit` a written group may be acknowledged to its inputs only after an
//! fdatasync that began after its write. If the writer itself waited for each fdatasync, the
//! batches arriving meanwhile would wait too, and a burst would pay for one fdatasync per
//! group, one after another. Here the writer hands each written group's events to the workers
//! at once ([`hand_over`]; with direct I/O, groups no input waits for even before the write:
//! see `writer::Stage`) and,
//! once written, its acknowledgements to the syncer, and goes on writing; the
//! syncer takes every group handed over so far, calls fdatasync once, then acknowledges them
//! in order. A burst thus costs its writes plus about one fdatasync at the end.
//!
//! Guarantees:
//! - a group's inputs are acknowledged only after an fdatasync of its file that started after
//!   its write returned;
//! - the shard's checkpoint never passes what an fdatasync covered (`ShardState::synced_lsn`),
//!   even when the workers finished those events first. Otherwise a crash could leave a
//!   checkpoint beyond the frames that reached the disk, and the next run would write new
//!   frames under it.
//!
//! Why the workers need not wait for the fdatasync: an event delivered before it is durable
//! costs nothing if the machine then crashes, since its input was not acknowledged and sends it
//! again (a duplicate, which at-least-once allows). Waiting would add an fdatasync's latency to
//! every event and leave the workers idle meanwhile.
//!
//! When fdatasync fails, what it covered may or may not be on disk, and asking again proves
//! nothing (the kernel reports a writeback error once). So those groups are not acknowledged:
//! their acknowledgements are dropped, which tells their inputs the events were abandoned (an
//! HTTP client gets an error and may retry; a file input does not move its offset). The workers
//! may have delivered them already: the input's retry is then a duplicate.

use std::fs::File;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};
use sluice_core::Batch;

use super::Inner;
use super::shard::{Readable, Shard};

/// Where one batch's frames are in its group.
#[derive(Clone, Copy)]
pub(crate) struct BatchFrames {
    /// `[from, to)`: the frames' bytes within the group.
    pub from: usize,
    pub to: usize,
    /// The batch's events end at this index of the group's `event_ends`.
    pub ends_to: usize,
}

/// One group, encoded (and written, unless staged: see `writer::Stage`), on its way to the
/// workers.
pub(crate) struct Written {
    pub work: Vec<Batch>,
    /// Per batch, where its frames are.
    pub ranges: Vec<BatchFrames>,
    /// Per event stored, in order, the group offset just past its frame.
    pub event_ends: Vec<u64>,
    /// The group's first LSN.
    pub base: u64,
    /// The group's bytes on disk.
    pub written: u64,
    /// What the batches were counted as while pending.
    pub estimate: u64,
}

/// A group handed to the workers whose inputs wait for an fdatasync.
pub(crate) struct Unsynced {
    /// The group's batches, emptied of their events: only their acknowledgements are left.
    pub acks: Vec<Batch>,
    pub file: Arc<File>,
    /// The LSN just past the group.
    pub end: u64,
}

/// Batches of fewer events than this are merged into the entry before them...
const MERGE_BELOW: usize = 64;
/// ...up to this many events per entry.
const MERGED_MAX: usize = 1024;

/// Hands a group's events to the workers (from memory for the batches the writer kept within
/// the memory budget, else as a range to read back, which must be written already) and counts
/// them in the shard. Returns the batches, emptied, for their acknowledgements: whoever
/// acknowledges them does so after this, so an input that hears back finds its events already
/// counted.
pub(crate) fn hand_over(inner: &Inner, shard: &Shard, group: Written) -> Vec<Batch> {
    let Written { mut work, ranges, event_ends, base, written, estimate } = group;
    let mut readables: Vec<Readable> = Vec::new();
    let mut events = 0u64;
    let mut ends_from = 0;
    for (batch, frames) in work.iter_mut().zip(ranges.iter()) {
        let (start, end) = (base + frames.from as u64, base + frames.to as u64);
        let ends = &event_ends[ends_from..frames.ends_to];
        ends_from = frames.ends_to;
        // The frames written, whether or not their events are still here.
        let written_events = ends.len() as u64;
        events += written_events;
        if batch.is_empty() {
            if end > start {
                readables.push(Readable::Disk { start, end, counted: written_events });
            }
            continue;
        }
        // Small batches kept in memory one after another make one entry: the workers then
        // take their events without walking a list entry per input batch. A larger batch keeps
        // its own entry, its event vector as the input made it, so a worker taking the whole
        // entry gets that vector without a copy of its events.
        if let Some(Readable::Mem { events: held, bytes, ends: held_ends, .. }) = readables.last_mut()
            && held_ends.back() == Some(&start)
            && batch.len() < MERGE_BELOW
            && held.len() + batch.len() <= MERGED_MAX
        {
            held.extend(batch.events.drain(..));
            *bytes += batch.bytes;
            held_ends.extend(ends.iter().map(|e| base + e));
        } else {
            readables.push(Readable::Mem {
                events: std::mem::take(&mut batch.events).into(),
                bytes: batch.bytes,
                start,
                ends: ends.iter().map(|e| base + e).collect(),
            });
        }
    }
    // The estimate stood for these bytes until now; the frames' real size replaces it.
    inner.bytes.fetch_add(written, Ordering::Relaxed);
    inner.bytes.fetch_sub(estimate, Ordering::Relaxed);
    {
        let mut s = shard.state.lock();
        s.readable.extend(readables);
        s.bytes = (s.bytes + written).saturating_sub(estimate);
        s.events += events;
    }
    inner.not_empty.notify_waiters();
    work
}

/// Acknowledges the inputs of batches handed over by [`hand_over`].
pub(crate) fn acknowledge(acks: Vec<Batch>) {
    for batch in acks {
        batch.complete();
    }
}

/// fdatasync, with failures injected by tests.
fn sync_data(file: &File, _shard_dir: &std::path::Path) -> std::io::Result<()> {
    #[cfg(test)]
    tests::wait_while_held(_shard_dir);
    #[cfg(test)]
    if tests::take_injected_failure(_shard_dir) {
        return Err(std::io::Error::other("injected fdatasync failure"));
    }
    file.sync_data()
}

#[cfg(test)]
pub(crate) mod tests {
    use std::path::{Path, PathBuf};

    use parking_lot::Mutex;

    /// Shard directories (under a test's own temporary directory) whose coming fdatasyncs fail,
    /// and how many.
    static FAILING: Mutex<Vec<(PathBuf, usize)>> = Mutex::new(Vec::new());

    /// Shard directories whose fdatasyncs wait until released.
    static HELD: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

    pub(crate) fn hold_syncs(dir_prefix: &Path) {
        HELD.lock().push(dir_prefix.to_path_buf());
    }

    pub(crate) fn release_syncs(dir_prefix: &Path) {
        HELD.lock().retain(|p| p != dir_prefix);
    }

    pub(super) fn wait_while_held(shard_dir: &Path) {
        while HELD.lock().iter().any(|p| shard_dir.starts_with(p)) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    pub(crate) fn fail_next_syncs(dir_prefix: &Path, count: usize) {
        FAILING.lock().push((dir_prefix.to_path_buf(), count));
    }

    pub(super) fn take_injected_failure(shard_dir: &Path) -> bool {
        let mut failing = FAILING.lock();
        match failing.iter_mut().find(|(prefix, n)| *n > 0 && shard_dir.starts_with(prefix)) {
            Some((_, n)) => {
                *n -= 1;
                true
            }
            None => false,
        }
    }
}

#[derive(Default)]
struct Queue {
    groups: Vec<Unsynced>,
    /// A pass (fdatasync and acknowledgements) is under way.
    busy: bool,
    stop: bool,
}

/// The hand-over point between a shard's writer and its syncer thread.
#[derive(Default)]
pub(crate) struct Syncer {
    queue: Mutex<Queue>,
    wake: Condvar,
    idle: Condvar,
}

impl Syncer {
    /// Hands a written group's acknowledgements over; true if a pass is under way, so that the
    /// group waits for the next one.
    pub fn submit(&self, group: Unsynced) -> bool {
        let busy = {
            let mut q = self.queue.lock();
            q.groups.push(group);
            q.busy
        };
        self.wake.notify_one();
        busy
    }

    /// Waits until every group submitted so far is acknowledged (or given up).
    pub fn wait_idle(&self) {
        let mut q = self.queue.lock();
        while q.busy || !q.groups.is_empty() {
            self.idle.wait(&mut q);
        }
    }

    /// Ends the thread once everything submitted is acknowledged (or given up).
    pub fn stop(&self) {
        self.queue.lock().stop = true;
        self.wake.notify_one();
    }

    /// The syncer thread's body.
    pub fn run(&self, inner: &Inner, shard: &Shard) {
        loop {
            let groups = {
                let mut q = self.queue.lock();
                while q.groups.is_empty() && !q.stop {
                    self.wake.wait(&mut q);
                }
                if q.groups.is_empty() {
                    break;
                }
                q.busy = true;
                std::mem::take(&mut q.groups)
            };
            // Earlier files were sealed with their own fsync before the writer moved on, but
            // a group handed over before that seal is covered only if its file is synced here.
            let mut synced: Vec<*const File> = Vec::with_capacity(2);
            let mut failed = None;
            for group in groups.iter().rev() {
                let key = Arc::as_ptr(&group.file);
                if synced.contains(&key) {
                    continue;
                }
                synced.push(key);
                let started = Instant::now();
                if let Err(e) = sync_data(&group.file, &shard.dir) {
                    inner.metrics.fsync_failures.fetch_add(1, Ordering::Relaxed);
                    failed = Some(e);
                }
                inner.metrics.fsyncs.fetch_add(1, Ordering::Relaxed);
                inner.metrics.commit_latency.observe(started.elapsed());
            }
            match failed {
                None => {
                    let end = groups.iter().map(|g| g.end).max().unwrap_or(0);
                    {
                        let mut s = shard.state.lock();
                        s.synced_lsn = s.synced_lsn.max(end);
                    }
                    groups.into_iter().for_each(|group| acknowledge(group.acks));
                }
                Some(e) => {
                    let batches: usize = groups.iter().map(|g| g.acks.len()).sum();
                    tracing::error!(shard = shard.id, dir = %shard.dir.display(), error = %e, batches,
                        "fdatasync of the persisted queue failed: these batches are not acknowledged (their \
                         inputs see them abandoned and may send them again)");
                    // Dropped unacknowledged: each batch reports itself abandoned.
                    drop(groups);
                }
            }
            self.queue.lock().busy = false;
            self.idle.notify_all();
        }
        self.idle.notify_all();
    }
}
