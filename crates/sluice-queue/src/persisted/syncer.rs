//! Pipelined group commit: a shard's fsyncs run on a thread of their own.
//!
//! With `sync: commit` a written group may be acknowledged only after an fdatasync that began
//! after its write. If the writer itself waited for each fdatasync, the batches arriving
//! meanwhile would wait too, and a burst would pay for one fdatasync per group, one after
//! another. Here the writer hands each written group to the syncer and goes on writing; the
//! syncer takes every group handed over so far, calls fdatasync once, then releases them in
//! order. A burst thus costs its writes plus about one fdatasync at the end.
//!
//! Guarantee: a group is released (its inputs acknowledged, its events given to the workers)
//! only after an fdatasync of its file that started after its write returned.
//!
//! When fdatasync fails, what it covered may or may not be on disk, and asking again proves
//! nothing (the kernel reports a writeback error once). So those groups are not acknowledged:
//! they are dropped, which tells their inputs the events were abandoned (an HTTP client gets an
//! error and may retry; a file input does not move its offset). Their frames stay in the
//! segment unacknowledged, so the shard's checkpoint cannot pass them: the next start-up reads
//! back whatever of them reached the disk.

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

/// One group, written but not yet released.
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
    /// Bytes of the batches whose events are still held in memory, counted in the queue's
    /// memory budget since the write (the others were dropped then: they are read back).
    pub held: u64,
    /// The segment file the group went to.
    pub file: Arc<File>,
}

impl Written {
    /// Gives the group up without releasing it: its memory reservation ends, and its batches'
    /// acknowledgements report them abandoned as they drop.
    pub fn abandon(self, inner: &Inner) {
        inner.mem_bytes.fetch_sub(self.held, Ordering::Relaxed);
    }
}

/// Hands a durable group's events to the workers (from memory for the batches the writer
/// kept within the memory budget, else as a range to read back), then acknowledges its
/// inputs: an input that hears back finds its events already counted in the queue.
pub(crate) fn release(inner: &Inner, shard: &Shard, group: Written) {
    let Written { mut work, ranges, event_ends, base, written, estimate, held: _, file: _ } = group;
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
        // Batches kept in memory one after another make one entry: the workers then take
        // their events without walking a list entry per input batch.
        if let Some(Readable::Mem { events: held, bytes, ends: held_ends, .. }) = readables.last_mut()
            && held_ends.back() == Some(&start)
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
    for batch in work {
        batch.complete();
    }
}

/// fdatasync, with failures injected by tests.
fn sync_data(file: &File, _shard_dir: &std::path::Path) -> std::io::Result<()> {
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
    groups: Vec<Written>,
    /// A pass (fdatasync and release) is under way.
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
    /// Hands a written group over; true if a pass is under way, so that the group waits for
    /// the next one.
    pub fn submit(&self, group: Written) -> bool {
        let busy = {
            let mut q = self.queue.lock();
            q.groups.push(group);
            q.busy
        };
        self.wake.notify_one();
        busy
    }

    /// Waits until every group submitted so far is released.
    pub fn wait_idle(&self) {
        let mut q = self.queue.lock();
        while q.busy || !q.groups.is_empty() {
            self.idle.wait(&mut q);
        }
    }

    /// Ends the thread once everything submitted is released.
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
                None => groups.into_iter().for_each(|group| release(inner, shard, group)),
                Some(e) => {
                    let events: usize = groups.iter().flat_map(|g| &g.work).map(Batch::len).sum();
                    tracing::error!(shard = shard.id, dir = %shard.dir.display(), error = %e, events,
                        "fdatasync of the persisted queue failed: these events are not acknowledged (their \
                         inputs see them abandoned); what reached the disk is delivered after a restart");
                    groups.into_iter().for_each(|group| group.abandon(inner));
                }
            }
            self.queue.lock().busy = false;
            self.idle.notify_all();
        }
        self.idle.notify_all();
    }
}
