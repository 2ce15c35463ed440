//! The persisted queue: N independent segment logs ("shards"), each with its own writer thread.
//!
//! - Pushes go to shards round-robin (one atomic increment, no global lock); a push returns
//!   once its batch is queued for its shard's writer. The workers get the batch once it is
//!   written (with direct I/O, the default, a batch no input waits for once it is encoded:
//!   see `writer::Stage`); the input's acknowledgement waits for the write and the `fdatasync`
//!   that covers it (`sync: commit`), so an acknowledged event survives a crash of the process
//!   or of the machine.
//! - Workers take batches from any shard; each batch acknowledges its own range of its shard's
//!   log. Ranges complete in any order; the contiguous completed prefix is checkpointed (every
//!   `checkpoint_interval`, as soon as a whole older segment is completed, and at shutdown) in
//!   place, without new disk space (see `checkpoint.rs`), and segments wholly before it are
//!   kept for reuse (two per shard) or deleted, their read handles closed at once. What the
//!   workers finished past the checkpoint on disk shows as `checkpoint_lag_events`.
//! - Start-up reads each shard's checkpoint and queues the rest of the log for reading, without
//!   reading it; only the last segment is scanned, to cut a torn tail left by a crash. A
//!   damaged frame found later is skipped, counted and logged with its segment and offset.
//! - `max_bytes` bounds the bytes of frames not yet acknowledged (plus batches waiting for
//!   their writer); at the limit, and while the disk is full, inputs wait.
//! - Batches within `memory_bytes` reach the workers from memory; beyond it a push waits for
//!   the workers while they keep taking and the CPUs are busy, and otherwise goes to disk only,
//!   to be read back (`pacing.rs`).
//!
//! Order: each shard is FIFO. Across shards there is no order: two batches pushed one after the
//! other may be delivered in either order (with one shard, the order of pushes is kept).
//!
//! On disk: `<path>/shard-<k>/<first-seq>.seg` and `<path>/shard-<k>/checkpoint`, plus a `lock`
//! file held while a process uses the queue. The segment and frame format is `sluice-segment`'s.

mod checkpoint;
mod checkpointer;
mod direct;
pub mod inspect;
mod pacing;
mod read_cache;
mod recovery;
mod shard;
mod syncer;
mod writer;

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;
use serde::Deserialize;
use sluice_config::{ByteSize, HumanDuration};
use sluice_core::metrics::Histogram;
use sluice_core::{Batch, Queue, QueueClosed, QueueStats, WaitGuard, WaitTime};
use tokio::sync::Notify;

use shard::Shard;
use writer::Writer;

/// Bytes of batches per shard that may wait for the writer before pushes wait too.
const PENDING_LIMIT: usize = 8 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SyncPolicy {
    /// fdatasync, then acknowledge: nothing acknowledged is lost, even to a power cut.
    #[default]
    Commit,
    /// Acknowledge after the write; fdatasync every `sync_interval`. A crash of the process
    /// loses nothing; a crash of the machine can lose up to `sync_interval` of events.
    Interval,
    /// Never fdatasync (the OS writes back when it likes). For tests and throwaway data.
    None,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PersistedQueueConfig {
    /// Default: `<data_dir>/queue/<pipeline>`.
    pub path: Option<PathBuf>,
    pub max_bytes: ByteSize,
    pub segment_bytes: ByteSize,
    /// Default: the number of CPUs.
    pub shards: Option<usize>,
    pub sync: SyncPolicy,
    pub sync_interval: HumanDuration,
    pub checkpoint_interval: HumanDuration,
    /// Written batches kept in memory for the workers; beyond this they are read back from disk.
    pub memory_bytes: ByteSize,
    /// Write and read segments with `O_DIRECT` where the filesystem supports it (the default).
    pub direct_io: bool,
}

impl Default for PersistedQueueConfig {
    fn default() -> Self {
        PersistedQueueConfig {
            path: None,
            max_bytes: ByteSize(1 << 30),
            segment_bytes: ByteSize(64 << 20),
            shards: None,
            sync: SyncPolicy::Commit,
            sync_interval: HumanDuration(Duration::from_secs(1)),
            checkpoint_interval: HumanDuration(Duration::from_secs(1)),
            memory_bytes: ByteSize(16 << 20),
            // Cheaper in CPU than the page cache on the VMs measured, and it falls back by
            // itself where O_DIRECT is refused (see `direct.rs`).
            direct_io: true,
        }
    }
}

/// The settings as the queue uses them.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub path: PathBuf,
    pub max_bytes: u64,
    pub segment_bytes: u64,
    pub shards: usize,
    pub sync: SyncPolicy,
    pub sync_interval: Duration,
    pub checkpoint_interval: Duration,
    pub memory_bytes: usize,
    pub direct_io: bool,
    /// How long staged frames may wait for their write (not a user setting: tests lengthen it).
    pub stage_hold: Duration,
}

impl PersistedQueueConfig {
    pub(crate) fn settings(&self, data_dir: &Path, pipeline: &str) -> Result<Settings, String> {
        if self.segment_bytes.0 < 64 << 10 {
            return Err("queue.segment_bytes must be at least 64KiB".to_string());
        }
        if self.max_bytes.0 < self.segment_bytes.0 {
            return Err(format!(
                "queue.max_bytes ({}) must be at least queue.segment_bytes ({})",
                self.max_bytes, self.segment_bytes
            ));
        }
        if self.shards == Some(0) || self.shards.is_some_and(|s| s > 256) {
            return Err("queue.shards must be between 1 and 256".to_string());
        }
        Ok(Settings {
            path: self.path.clone().unwrap_or_else(|| data_dir.join("queue").join(pipeline)),
            max_bytes: self.max_bytes.0,
            segment_bytes: self.segment_bytes.0,
            shards: self.shards.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
            sync: self.sync,
            sync_interval: self.sync_interval.0.max(Duration::from_millis(1)),
            checkpoint_interval: self.checkpoint_interval.0,
            memory_bytes: self.memory_bytes.as_usize(),
            direct_io: self.direct_io,
            stage_hold: writer::STAGE_HOLD,
        })
    }
}

/// Counters the queue keeps beyond [`QueueStats`].
#[derive(Debug, Default)]
pub struct PersistedMetrics {
    pub fsyncs: AtomicU64,
    /// Failed fdatasyncs: the groups they covered were given up (see `syncer.rs`).
    pub fsync_failures: AtomicU64,
    pub commit_latency: Histogram,
    pub corrupt_frames: AtomicU64,
    pub torn_tails: AtomicU64,
    /// Events lost with the torn tails cut at start-up (the frames in the cut bytes).
    pub torn_tail_events: AtomicU64,
    /// Checkpoint writes that failed (each one logged; see `checkpointer.rs`).
    pub checkpoint_failures: AtomicU64,
    pub checkpoint_rebuilds: AtomicU64,
    /// Events the queue accepted but could not store: refused by the encoder, or still unwritten
    /// when shutdown came during a full disk. Logged, and counted here so no drop is silent.
    pub unstored: AtomicU64,
    /// Time writers spent waiting for the disk (full, or failing).
    pub stalled_nanos: AtomicU64,
    /// Events handed to the workers from memory, as written.
    pub events_from_memory: AtomicU64,
    /// Events read back from the segments (the backlog outgrew `memory_bytes`, or a restart).
    pub events_read_back: AtomicU64,
    /// Frame bytes read back from the segments.
    pub bytes_read_back: AtomicU64,
}

pub(crate) struct Inner {
    pub config: Settings,
    /// Bytes of unacknowledged frames plus estimates for batches not yet written.
    pub bytes: AtomicU64,
    /// Bytes of batches kept in memory for the workers (written, not yet taken).
    pub mem_bytes: AtomicU64,
    /// Bytes of batches pushed and not yet handed over by their writer (also in memory).
    pub unwritten_bytes: AtomicU64,
    pub pacing: pacing::Pacing,
    pub not_empty: Notify,
    pub not_full: Notify,
    pub metrics: PersistedMetrics,
    /// The next this many segment writes fail as on a full disk (tests of the writer's waiting).
    #[cfg(test)]
    pub fail_writes: std::sync::atomic::AtomicU32,
    /// The next this many direct writes are refused with EINVAL, as by a filesystem that takes
    /// `O_DIRECT` opens but not the writes (tests of the fall-back to the page cache).
    #[cfg(test)]
    pub refuse_direct_writes: std::sync::atomic::AtomicU32,
    /// The next this many checkpoint writes fail with EIO (tests of the checkpointer).
    #[cfg(test)]
    pub fail_checkpoints: std::sync::atomic::AtomicU32,
}

pub struct PersistedQueue {
    inner: Arc<Inner>,
    /// Set once, when the queue opens; read without a lock on every push and pop.
    shards: std::sync::OnceLock<Vec<Arc<Shard>>>,
    writers: Mutex<Vec<std::thread::JoinHandle<()>>>,
    lock: Mutex<Option<File>>,
    next_push: AtomicUsize,
    next_pop: AtomicUsize,
    closed: AtomicBool,
    /// Set by `inputs_ended`: pops hand out what they have without waiting for more.
    inputs_ended: AtomicBool,
    /// Time producers waited (a full queue, or busy workers), waits in progress included.
    blocked: WaitTime,
}

impl PersistedQueue {
    pub(crate) fn new(config: Settings) -> PersistedQueue {
        PersistedQueue {
            inner: Arc::new(Inner {
                config,
                bytes: AtomicU64::new(0),
                mem_bytes: AtomicU64::new(0),
                unwritten_bytes: AtomicU64::new(0),
                pacing: pacing::Pacing::new(),
                not_empty: Notify::new(),
                not_full: Notify::new(),
                metrics: PersistedMetrics::default(),
                #[cfg(test)]
                fail_writes: Default::default(),
                #[cfg(test)]
                refuse_direct_writes: Default::default(),
                #[cfg(test)]
                fail_checkpoints: Default::default(),
            }),
            shards: std::sync::OnceLock::new(),
            writers: Mutex::new(Vec::new()),
            lock: Mutex::new(None),
            next_push: AtomicUsize::new(0),
            next_pop: AtomicUsize::new(0),
            closed: AtomicBool::new(false),
            inputs_ended: AtomicBool::new(false),
            blocked: WaitTime::default(),
        }
    }

    /// A queue from its settings; `path` (if unset) becomes `<data_dir>/queue/<pipeline>`.
    /// Nothing is opened until [`Queue::start`].
    pub fn from_config(
        config: &PersistedQueueConfig,
        data_dir: &Path,
        pipeline: &str,
    ) -> Result<PersistedQueue, String> {
        Ok(PersistedQueue::new(config.settings(data_dir, pipeline)?))
    }

    pub fn path(&self) -> &Path {
        &self.inner.config.path
    }

    pub fn metrics(&self) -> &PersistedMetrics {
        &self.inner.metrics
    }

    /// Opens (or creates) the queue directory, recovers every shard and starts the writers.
    fn open_now(&self) -> std::io::Result<()> {
        let path = &self.inner.config.path;
        fs::create_dir_all(path)?;
        let Some(lock) = sluice_segment::files::try_lock_exclusive(&path.join("lock"))? else {
            return Err(std::io::Error::other(format!(
                "{} is in use by another process (its lock file is held)",
                path.display()
            )));
        };
        *self.lock.lock() = Some(lock);
        // Shards already on disk are all recovered, even if `shards` was lowered since.
        let on_disk = fs::read_dir(path)?
            .filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("shard-")?.parse::<usize>().ok())
            .max()
            .map_or(0, |m| m + 1);
        let count = self.inner.config.shards.max(on_disk);
        if on_disk > self.inner.config.shards {
            tracing::warn!(path = %path.display(), on_disk, configured = self.inner.config.shards,
                "the queue has more shards on disk than configured; using all of them");
        }
        let started = Instant::now();
        // Shards open side by side: each recovery reads its own files and each new segment
        // waits for its own fsyncs, so a start-up costs the slowest shard, not their sum.
        let opened: Vec<std::io::Result<(Arc<Shard>, Writer)>> = std::thread::scope(|scope| {
            let opening: Vec<_> = (0..count).map(|id| scope.spawn(move || self.open_shard(id))).collect();
            opening
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(std::io::Error::other("a shard's opening panicked"))))
                .collect()
        });
        let mut shards = Vec::with_capacity(count);
        let mut writers = Vec::with_capacity(count);
        for (id, opened) in opened.into_iter().enumerate() {
            let (shard, writer) = opened?;
            let (syncer, inner, synced_shard) = (writer.syncer.clone(), self.inner.clone(), shard.clone());
            writers.push(
                std::thread::Builder::new()
                    .name(format!("sluice-qsync-{id}"))
                    .spawn(move || syncer.run(&inner, &synced_shard))?,
            );
            let checkpoints = writer.checkpoints.clone();
            writers
                .push(std::thread::Builder::new().name(format!("sluice-qckpt-{id}")).spawn(move || checkpoints.run())?);
            writers.push(std::thread::Builder::new().name(format!("sluice-queue-{id}")).spawn(move || writer.run())?);
            shards.push(shard);
        }
        let backlog = self.inner.bytes.load(Ordering::Relaxed);
        tracing::info!(path = %path.display(), shards = count, backlog_bytes = backlog,
            took = ?started.elapsed(), "persisted queue opened");
        if self.shards.set(shards).is_err() {
            return Err(std::io::Error::other("the queue was already opened"));
        }
        *self.writers.lock() = writers;
        self.inner.not_empty.notify_waiters();
        Ok(())
    }

    /// Recovers shard `id` and makes its writer, with a first segment if the shard is new.
    fn open_shard(&self, id: usize) -> std::io::Result<(Arc<Shard>, Writer)> {
        let dir = self.inner.config.path.join(format!("shard-{id}"));
        // Each shard names itself: the caller reports only the first failure.
        let named = |e: std::io::Error| std::io::Error::new(e.kind(), format!("shard-{id}: {e}"));
        let (shard, recovered) = Shard::open(&self.inner, id as u32, dir).map_err(named)?;
        let mut writer = Writer {
            inner: self.inner.clone(),
            shard: shard.clone(),
            next_seq: recovered.next_seq,
            active: recovered.active,
            direct: None,
            syncer: Arc::new(syncer::Syncer::default()),
            stage: writer::Stage::default(),
            // Made (and faulted in) while the queue opens, not on its first write. One huge
            // page; a shard busy enough to fill a stage (`STAGE_BYTES`) grows it to two. If the
            // mapping fails here, it is made on the first write, which logs a failure.
            buf: direct::StageBuf::with_capacity(direct::HUGE).unwrap_or_default(),
            direct_io: self.inner.config.direct_io,
            gave_up: false,
            // The position the checkpoint on disk records, read before any worker can
            // complete anything.
            checkpoints: Arc::new(checkpointer::Checkpointer::new(
                self.inner.clone(),
                shard.clone(),
                recovered.checkpoint,
                recovered.free,
                shard.state.lock().done_lsn,
            )),
        };
        if writer.active.is_none() {
            // A new shard: its first segment is made now, off the write path, its first pages ready.
            writer.start_segment(writer.next_seq, 0, true).map_err(named)?;
        }
        Ok((shard, writer))
    }

    fn shards(&self) -> &[Arc<Shard>] {
        self.shards.get().map_or(&[], Vec::as_slice)
    }

    /// Takes up to `want` events from the shards, starting at the next in turn. Memory is
    /// tried on every shard first; disk reads run outside the async worker threads.
    fn take(&self, want: usize) -> Option<Batch> {
        let shards = self.shards();
        if shards.is_empty() {
            return None;
        }
        let first = self.next_pop.fetch_add(1, Ordering::Relaxed);
        let mut out: Option<Batch> = None;
        let mut on_disk = Vec::new();
        for i in 0..shards.len() {
            let have = out.as_ref().map_or(0, Batch::len);
            if have >= want {
                break;
            }
            let shard = &shards[(first + i) % shards.len()];
            match shard.take_from_memory(&self.inner, want - have) {
                Ok(Some(piece)) => match &mut out {
                    Some(b) => b.append(piece),
                    None => out = Some(piece),
                },
                Ok(None) => {}
                Err(()) => on_disk.push(shard.clone()),
            }
        }
        // Besides the pop's own start: a pop filling a batch over its delay takes many times.
        if !on_disk.is_empty() || out.is_some() {
            self.inner.pacing.saw_worker();
        }
        // Read on the worker's own thread: one read of at most a few MiB plus decoding is the
        // same order of work as the processors do per batch, and `block_in_place` handed the
        // runtime to another thread per read (so each worker's allocations wandered between
        // threads' heaps, faulting fresh pages in).
        for shard in on_disk {
            let have = out.as_ref().map_or(0, Batch::len);
            if have >= want {
                break;
            }
            if let Some(piece) = shard.take(&self.inner, want - have) {
                match &mut out {
                    Some(b) => b.append(piece),
                    None => out = Some(piece),
                }
            }
        }
        out
    }

    fn all_writers_finished(&self) -> bool {
        self.shards().iter().all(|s| s.state.lock().writer_finished)
    }
}

#[async_trait]
impl Queue for PersistedQueue {
    async fn start(&self) -> Result<(), String> {
        blocking(|| self.open_now())
            .map_err(|e| format!("cannot open the persisted queue at {}: {e}", self.inner.config.path.display()))
    }

    async fn push(&self, batch: Batch) -> Result<(), QueueClosed> {
        if batch.is_empty() {
            batch.complete();
            return Ok(());
        }
        let shards = self.shards();
        if shards.is_empty() {
            return Err(QueueClosed);
        }
        let shard = &shards[self.next_push.fetch_add(1, Ordering::Relaxed) % shards.len()];
        let mut blocked: Option<WaitGuard<'_>> = None;
        let budget = self.inner.config.memory_bytes as u64;
        let admit = || {
            let used = self.inner.bytes.load(Ordering::Relaxed);
            let fits = used == 0 || used + batch.bytes as u64 <= self.inner.config.max_bytes;
            // Batches waiting for the writer are in memory: keep that backlog short, so a slow
            // disk slows the inputs instead of growing the heap.
            if !fits || shard.state.lock().pending_bytes >= PENDING_LIMIT {
                return false;
            }
            // Beyond the memory budget the batch would be read back later: wait for the
            // workers instead while that would cost them CPU time (see `pacing.rs`).
            let in_memory =
                self.inner.mem_bytes.load(Ordering::Relaxed) + self.inner.unwritten_bytes.load(Ordering::Relaxed);
            in_memory == 0
                || in_memory + batch.bytes as u64 <= budget
                || batch.bytes as u64 > budget
                || !self.inner.pacing.should_wait()
        };
        loop {
            if self.closed.load(Ordering::Acquire) {
                return Err(QueueClosed);
            }
            if admit() {
                break;
            }
            // Slow path: register for a wake-up, then look again so none is missed.
            let notified = self.inner.not_full.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.closed.load(Ordering::Acquire) {
                return Err(QueueClosed);
            }
            if admit() {
                break;
            }
            if blocked.is_none() {
                blocked = Some(self.blocked.start());
            }
            // Woken when room is made; the time-out looks again whether the workers still
            // take events (waiting for memory stops when they do not).
            let _ = tokio::time::timeout(pacing::SPILL_AFTER, notified).await;
        }
        drop(blocked);
        self.inner.bytes.fetch_add(batch.bytes as u64, Ordering::Relaxed);
        self.inner.unwritten_bytes.fetch_add(batch.bytes as u64, Ordering::Relaxed);
        let wake;
        {
            let mut s = shard.state.lock();
            if s.closed {
                drop(s);
                self.inner.bytes.fetch_sub(batch.bytes as u64, Ordering::Relaxed);
                self.inner.unwritten_bytes.fetch_sub(batch.bytes as u64, Ordering::Relaxed);
                return Err(QueueClosed);
            }
            let first = s.pending.is_empty();
            let before = s.pending_bytes;
            s.pending_bytes += batch.bytes;
            s.bytes += batch.bytes as u64;
            s.pending.push(batch);
            // The writer needs waking for the first batch of a group, or when the group is big
            // enough to end its wait; a wake per batch would cost a context switch per batch.
            wake = first || (before < writer::GROUP_WINDOW_BYTES && s.pending_bytes >= writer::GROUP_WINDOW_BYTES);
        }
        if wake {
            shard.wake.notify_one();
        }
        Ok(())
    }

    async fn pop(&self, max_events: usize, delay: Duration) -> Option<Batch> {
        let want = max_events.max(1);
        self.inner.pacing.saw_worker();
        let mut out: Option<Batch> = None;
        let mut deadline: Option<tokio::time::Instant> = None;
        loop {
            let notified = self.inner.not_empty.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.closed.load(Ordering::Acquire) {
                // What was read stays on disk for the next start; hand out what is in hand.
                return out;
            }
            let have = out.as_ref().map_or(0, Batch::len);
            if let Some(piece) = self.take(want - have) {
                match &mut out {
                    Some(b) => b.append(piece),
                    None => out = Some(piece),
                }
                continue;
            }
            let have = out.as_ref().map_or(0, Batch::len);
            let no_more = delay.is_zero() || self.inputs_ended.load(Ordering::Acquire);
            if have >= want || (have > 0 && no_more) {
                return out;
            }
            if have > 0 {
                let d = *deadline.get_or_insert_with(|| tokio::time::Instant::now() + delay);
                if tokio::time::timeout_at(d, notified).await.is_err() {
                    return out;
                }
            } else {
                // Woken by new data; the periodic look is a safety net (a disk read that failed
                // for a moment leaves data behind with nobody to announce it).
                let _ = tokio::time::timeout(Duration::from_millis(100), notified).await;
            }
        }
    }

    fn inputs_ended(&self) {
        self.inputs_ended.store(true, Ordering::Release);
        self.inner.not_empty.notify_waiters();
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        for s in self.shards() {
            s.state.lock().closed = true;
            s.wake.notify_one();
        }
        self.inner.not_empty.notify_waiters();
        self.inner.not_full.notify_waiters();
    }

    async fn shutdown(&self) {
        self.close();
        for s in self.shards() {
            s.state.lock().stopping = true;
            s.wake.notify_one();
        }
        let writers = std::mem::take(&mut *self.writers.lock());
        let joined = tokio::task::spawn_blocking(move || {
            for w in writers {
                let _ = w.join();
            }
        });
        let _ = joined.await;
        debug_assert!(self.all_writers_finished());
        self.lock.lock().take();
        let m = &self.inner.metrics;
        tracing::info!(path = %self.inner.config.path.display(),
            fsyncs = m.fsyncs.load(Ordering::Relaxed),
            events_from_memory = m.events_from_memory.load(Ordering::Relaxed),
            events_read_back = m.events_read_back.load(Ordering::Relaxed),
            bytes_read_back = m.bytes_read_back.load(Ordering::Relaxed),
            corrupt_frames = m.corrupt_frames.load(Ordering::Relaxed),
            "persisted queue closed");
    }

    fn persistent(&self) -> bool {
        true
    }

    fn stats(&self) -> QueueStats {
        let mut events = 0;
        let mut stalling_now = 0u64;
        let mut unrecorded = 0u64;
        let shards = self
            .shards()
            .iter()
            .map(|sh| {
                let s = sh.state.lock();
                let pending: u64 = s.pending.iter().map(|b| b.len() as u64).sum();
                events += s.events + pending;
                stalling_now += s.stalled_since.map_or(0, |t| t.elapsed().as_nanos() as u64);
                unrecorded += s.unrecorded_events();
                sluice_core::ShardStats {
                    shard: sh.id,
                    events: s.events + pending,
                    bytes: s.bytes,
                    segments: s.segments.len() as u64,
                    stalled: s.stalled.clone(),
                }
            })
            .collect();
        let m = &self.inner.metrics;
        QueueStats {
            kind: "persisted",
            events,
            bytes: self.inner.bytes.load(Ordering::Relaxed),
            max_events: 0,
            max_bytes: self.inner.config.max_bytes,
            blocked_nanos: self.blocked.total_nanos(),
            shards,
            fsyncs: m.fsyncs.load(Ordering::Relaxed),
            fsync_failures: m.fsync_failures.load(Ordering::Relaxed),
            commit_latency: Some(m.commit_latency.snapshot_struct()),
            corrupt_frames: m.corrupt_frames.load(Ordering::Relaxed),
            unstored: m.unstored.load(Ordering::Relaxed),
            // Finished stalls, plus the ones going on now.
            stalled_nanos: m.stalled_nanos.load(Ordering::Relaxed) + stalling_now,
            events_from_memory: m.events_from_memory.load(Ordering::Relaxed),
            events_read_back: m.events_read_back.load(Ordering::Relaxed),
            bytes_read_back: m.bytes_read_back.load(Ordering::Relaxed),
            checkpoint_lag_events: unrecorded,
        }
    }
}

/// Runs file I/O from async code without stalling other tasks on a multi-threaded runtime.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

#[cfg(test)]
mod tests;
