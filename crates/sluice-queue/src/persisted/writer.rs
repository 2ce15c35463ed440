//! The writer thread of one shard: takes the batches queued since its last pass as one group,
//! encodes them as frames and writes them with one `pwrite` (direct I/O where it can, see
//! `direct.rs`), hands them to the workers (groups no input waits for before their write, see
//! [`Stage`]), passes the acknowledgements to the syncer (see `syncer.rs`), starts and seals
//! segments, waits out a full disk (inputs held back meanwhile) and asks for checkpoints.

use std::fs::{self, File, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sluice_core::Batch;
use sluice_segment::ByteBuf;
use sluice_segment::{CODEC_EVENT, SEGMENT_HEADER_LEN, SegmentHeader, encode_event, try_append_frame};

use super::checkpoint::{self};
use super::checkpointer::Checkpointer;
use super::direct::{AlignedBuf, BLOCK, DirectFile, StageBuf};
use super::shard::{SegInfo, Shard, segment_path};
use super::syncer::{BatchFrames, Syncer, Unsynced, Written, acknowledge, hand_over};
use super::{Inner, SyncPolicy};

/// How long a small group waits for more before it is written, and what counts as small.
const GROUP_WINDOW: Duration = Duration::from_micros(100);
pub(crate) const GROUP_WINDOW_BYTES: usize = 64 << 10;

/// The most bytes of batches (as pushed) one group of a burst takes; the rest make the next
/// group, at once (a longer backlog makes larger groups: see `group_cap`). Why: a burst taken
/// whole is encoded and written before its first fdatasync can start, and that fdatasync then
/// flushes all of it. Taken in pieces, the syncer flushes the
/// first pieces while the writer encodes the next, so after the burst's last write only its
/// last piece is left to flush. fdatasyncs do not multiply: the syncer covers every piece
/// written by the time it starts with one.
const GROUP_MAX_BYTES: usize = 256 << 10;

/// The most one group takes under a backlog: once several groups' worth waits, the first
/// piece's latency matters less than the cost of each write (its syscalls, its writeback
/// request, the fdatasync that covers it), which larger groups spread over more events.
/// Measured on a generator → `json` → blackhole pipeline: 1 MiB groups took 9–15% less
/// system time than 256 KiB ones, and 2 MiB groups more than either.
const BACKLOG_GROUP_MAX_BYTES: usize = 1 << 20;

/// How much the next group takes when `pending` bytes wait: `GROUP_MAX_BYTES` for a burst,
/// growing with the backlog to `BACKLOG_GROUP_MAX_BYTES`.
fn group_cap(pending: usize) -> usize {
    (pending / 4).clamp(GROUP_MAX_BYTES, BACKLOG_GROUP_MAX_BYTES)
}

/// With direct I/O, groups nobody waits for are written in pieces of at least this many bytes
/// (or after `STAGE_HOLD`). Why: each direct write costs a fixed ~50-70 µs of CPU time on the
/// virtual machines this runs on (measured: writing 1.2 GB took 0.43 s of system time in
/// 288 KiB writes, 0.22 s in 1 MiB ones), and the workers need not wait for it: they have the
/// events already (see `Writer::write_group`). 2 MiB rather than 1 cut the writes and
/// fdatasyncs of the end-to-end benchmark by a third, and its persisted/memory ratio went from
/// 0.849 to 0.865 (12 rounds, each persisted run after a memory run; larger pieces measured no
/// better). A piece plus the group that completes it (at most `BACKLOG_GROUP_MAX_BYTES` of
/// input) still fits the 4 MiB the buffer grows to, and one request of the block layer
/// (`max_sectors_kb` is 4 MiB on virtio).
const STAGE_BYTES: usize = 2 << 20;

/// The longest staged frames wait for their write (`Settings::stage_hold`).
pub(crate) const STAGE_HOLD: Duration = Duration::from_millis(5);

/// Groups no input waits for, handed to the workers but not yet written (direct I/O only).
/// Their frames are the writer's buffer. A group an input waits for is never staged: it is
/// written (with the staged frames before it) and only then handed over.
#[derive(Default)]
pub(crate) struct Stage {
    /// Their batches, emptied, whose acknowledgements wait for the write (and its fdatasync).
    acks: Vec<Batch>,
    events: u64,
    /// When the first of them was staged.
    since: Option<Instant>,
}

/// The first pending batches up to `max` bytes (at least one batch), in order.
fn take_group(pending: &mut Vec<Batch>, max: usize) -> Vec<Batch> {
    let mut bytes = 0;
    let n = pending
        .iter()
        .position(|b| {
            bytes += b.bytes;
            bytes > max
        })
        .map_or(pending.len(), |i| i.max(1));
    if n == pending.len() { std::mem::take(pending) } else { pending.drain(..n).collect() }
}

/// How much of a new shard's first segment is pre-written when the queue opens. The opening
/// waits for it, and nothing else can run meanwhile: pre-writing a whole 64 MiB segment per
/// shard took about 80 ms of a generator → `json` → blackhole run of 4 s, and 8 MiB still
/// 15 ms, while what it saves is the metadata of the first fdatasyncs (later segments are
/// reused files or new ones). 2 MiB covers a first burst such as `sync_1k`'s 0.75 MiB.
const PREWRITE_BYTES: u64 = 2 << 20;

/// The writer thread of one shard.
pub(crate) struct Writer {
    pub inner: Arc<Inner>,
    pub shard: Arc<Shard>,
    pub next_seq: u64,
    pub active: Option<(Arc<File>, SegInfo)>,
    /// The active segment's direct-I/O handle, when the settings and the filesystem allow one.
    pub direct: Option<DirectFile>,
    /// False once direct I/O turned out not to work here (or when it is switched off).
    pub direct_io: bool,
    /// A write was given up because the queue closed while the disk was full: later ones
    /// during the same shutdown are given up after one failed try, not after the whole backoff.
    pub gave_up: bool,
    /// Groups handed over, waiting to be written together (direct I/O).
    pub stage: Stage,
    /// Where groups are encoded, and written from (see `StageBuf`).
    pub buf: StageBuf,
    /// Runs the fsyncs of `sync: commit` beside the writer (see `syncer.rs`).
    pub syncer: Arc<Syncer>,
    /// Writes the checkpoints beside the writer, and keeps the spare segment files (see
    /// `checkpointer.rs`).
    pub checkpoints: Arc<Checkpointer>,
}

impl Writer {
    pub fn run(mut self) {
        let policy = self.inner.config.sync;
        let sync_interval = self.inner.config.sync_interval;
        let mut buf = std::mem::take(&mut self.buf);
        let mut last_sync = Instant::now();
        let mut unsynced = false;
        let mut last_checkpoint = Instant::now();
        // The end of the oldest segment a checkpoint was last asked for early (see below).
        let mut retire_asked = 0;
        // Batches were left pending by the last group's size cap: they have waited already.
        let mut backlog = false;
        loop {
            let (work, closed) = {
                let mut s = self.shard.state.lock();
                if s.pending.is_empty() && !s.stopping {
                    let idle = self
                        .inner
                        .config
                        .checkpoint_interval
                        .clamp(Duration::from_millis(1), Duration::from_millis(100));
                    // Staged frames are written by their deadline at the latest.
                    let wait = self
                        .stage
                        .since
                        .map_or(idle, |t| (t + self.inner.config.stage_hold).saturating_duration_since(Instant::now()));
                    if !wait.is_zero() {
                        self.shard.wake.wait_for(&mut s, wait.min(idle));
                    }
                }
                // Group commit: a small group that just arrived waits a moment for the rest of
                // its burst, so one fsync covers it all rather than one for the first event.
                if !backlog && !s.pending.is_empty() && s.pending_bytes < GROUP_WINDOW_BYTES && !s.stopping {
                    let until = Instant::now() + GROUP_WINDOW;
                    while s.pending_bytes < GROUP_WINDOW_BYTES && !s.stopping {
                        if self.shard.wake.wait_until(&mut s, until).timed_out() {
                            break;
                        }
                    }
                }
                let cap = group_cap(s.pending_bytes);
                let work = take_group(&mut s.pending, cap);
                s.pending_bytes -= work.iter().map(|b| b.bytes).sum::<usize>();
                backlog = !s.pending.is_empty();
                (work, s.stopping)
            };
            if !work.is_empty() {
                self.inner.not_full.notify_waiters();
                self.write_group(work, &mut buf, policy, &mut unsynced);
            }
            if self.stage.since.is_some_and(|t| closed || t.elapsed() >= self.inner.config.stage_hold) {
                self.flush_stage(&mut buf, policy, &mut unsynced);
            }
            if unsynced && (closed || last_sync.elapsed() >= sync_interval) {
                self.sync(&mut last_sync);
                unsynced = false;
            }
            if closed {
                // Every input acknowledged, and everything written synced, before the last
                // checkpoint.
                self.syncer.wait_idle();
            }
            // The last checkpoint failed: ending anyway costs duplicates, retrying could hang.
            let mut last_failed = false;
            let (done_lsn, oldest_done) = {
                let s = self.shard.state.lock();
                // A whole segment behind the one being written, acknowledged and synced: a
                // checkpoint now puts its file in the spare pool before the writer needs a new
                // segment. Rewriting a file whose pages are cached costs the kernel a fraction
                // of what fresh pages do (measured on 2-vCPU VMs: 3.2 GB/s against 450 MiB/s),
                // and waiting for `checkpoint_interval` let a fast input fill three new files
                // per shard before the first came back.
                let oldest_end = s.segments.front().filter(|_| s.segments.len() > 1).map(|g| g.base + g.len);
                (s.done_lsn, oldest_end.filter(|&end| end <= s.checkpointable() && end > retire_asked))
            };
            if done_lsn != self.checkpoints.written()
                && (closed
                    || oldest_done.is_some()
                    || last_checkpoint.elapsed() >= self.inner.config.checkpoint_interval)
            {
                if let Some(end) = oldest_done {
                    retire_asked = end;
                }
                if unsynced {
                    self.sync(&mut last_sync);
                    unsynced = false;
                }
                let done = self.shard.state.lock().checkpointable();
                if done != self.checkpoints.written() {
                    if closed {
                        // The last one, written here so that the writer ends only once it is.
                        if let Err(e) = self.checkpoints.write(done, false) {
                            tracing::error!(shard = self.shard.id, error = %e,
                                "cannot write the last queue checkpoint: the next start delivers again the events \
                                 acknowledged since the previous one");
                            last_failed = true;
                        }
                    } else {
                        self.checkpoints.request(done);
                    }
                }
                last_checkpoint = Instant::now();
            }
            let finished = {
                let s = self.shard.state.lock();
                s.pending.is_empty() && (s.checkpointable() == self.checkpoints.written() || last_failed)
            };
            if closed && finished {
                break;
            }
        }
        self.syncer.stop();
        self.checkpoints.stop();
        let mut s = self.shard.state.lock();
        s.writer_finished = true;
        drop(s);
        self.inner.not_empty.notify_waiters();
    }

    fn sync(&mut self, last_sync: &mut Instant) {
        if let Some((file, seg)) = &self.active {
            let started = Instant::now();
            match file.sync_data() {
                Ok(()) => {
                    let mut s = self.shard.state.lock();
                    s.synced_lsn = s.synced_lsn.max(seg.base + seg.len);
                }
                Err(e) => {
                    self.inner.metrics.fsync_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(shard = self.shard.id, error = %e, "fdatasync of the persisted queue failed");
                }
            }
            self.inner.metrics.fsyncs.fetch_add(1, Ordering::Relaxed);
            self.inner.metrics.commit_latency.observe(started.elapsed());
        }
        *last_sync = Instant::now();
    }

    fn write_group(&mut self, mut work: Vec<Batch>, buf: &mut StageBuf, policy: SyncPolicy, unsynced: &mut bool) {
        // With direct I/O, `buf` may start with staged frames: the group's frames follow them.
        let origin = buf.len();
        let mut ranges = Vec::with_capacity(work.len());
        let mut event_ends: Vec<u64> = Vec::with_capacity(work.iter().map(Batch::len).sum());
        let first_seq = self.next_seq;
        let mut estimate = 0;
        for batch in &mut work {
            let start = buf.len() - origin;
            estimate += batch.bytes;
            let mut refused = Vec::new();
            for (i, event) in batch.events.iter().enumerate() {
                let encoded = try_append_frame(buf, self.next_seq, |body| {
                    encode_event(event, body).map_err(sluice_segment::Error::from)
                });
                match encoded {
                    Ok(_) => {
                        self.next_seq += 1;
                        event_ends.push((buf.len() - origin) as u64);
                    }
                    Err(e) => {
                        // Nothing of the frame is left in `buf`; the event is counted and logged.
                        self.inner.metrics.unstored.fetch_add(1, Ordering::Relaxed);
                        tracing::error!(shard = self.shard.id, error = %e,
                            "event cannot be stored in the persisted queue; dropped");
                        refused.push(i);
                    }
                }
            }
            if !refused.is_empty() {
                let mut i = 0;
                batch.events.retain(|_| {
                    i += 1;
                    !refused.contains(&(i - 1))
                });
            }
            ranges.push(BatchFrames { from: start, to: buf.len() - origin, ends_to: event_ends.len() });
        }
        let group_len = buf.len() - origin;
        let mut origin = origin;
        if origin > 0 && self.needs_new_segment(origin as u64, group_len as u64) {
            // The staged frames belong to the segment being sealed: they are written first.
            let group = buf.frames()[origin..].to_vec();
            buf.truncate(origin);
            self.flush_stage(buf, policy, unsynced);
            buf.extend_from_slice(&group);
            origin = 0;
        }
        let seg = match self.segment_for(group_len as u64, first_seq) {
            Ok(s) => s,
            Err(e) => {
                tracing::error!(shard = self.shard.id, error = %e, "cannot open a new queue segment");
                // Give the batches back to be encoded again (as in the first attempt).
                buf.truncate(origin);
                self.next_seq = first_seq;
                let mut s = self.shard.state.lock();
                s.pending_bytes += work.iter().map(|b| b.bytes).sum::<usize>();
                work.append(&mut s.pending);
                s.pending = work;
                drop(s);
                std::thread::sleep(Duration::from_millis(500));
                return;
            }
        };
        let base = seg.base + seg.len + origin as u64;
        let budget = self.inner.config.memory_bytes as u64;
        let in_memory = self.inner.mem_bytes.load(Ordering::Relaxed);
        // A group an input waits for is written at once, and handed to the workers only then:
        // were the write never made (the queue closing on a full disk), its input hears "not
        // stored" and sends again, which must not duplicate events already delivered.
        let awaited = work.iter().any(|b| !b.acks.is_empty());
        if self.staging() && !awaited && in_memory + estimate as u64 <= budget {
            // Every event stays in memory and no input waits for them, so the workers need not
            // wait for the write: they get the group now.
            self.inner.mem_bytes.fetch_add(estimate as u64, Ordering::Relaxed);
            self.inner.unwritten_bytes.fetch_sub(estimate as u64, Ordering::Relaxed);
            let events = event_ends.len() as u64;
            let group =
                Written { work, ranges, event_ends, base, written: group_len as u64, estimate: estimate as u64 };
            let acks = hand_over(&self.inner, &self.shard, group);
            let stage = &mut self.stage;
            stage.acks.extend(acks);
            stage.events += events;
            stage.since.get_or_insert_with(Instant::now);
            if buf.len() >= STAGE_BYTES {
                self.flush_stage(buf, policy, unsynced);
            }
            return;
        }
        // Written first, with whatever is staged before it; its events are then handed over,
        // from memory within `memory_bytes`, else as a range to read back.
        let live = buf.len();
        let ok = self.write_all(buf, seg.len);
        // Events are kept in memory for the workers only within `memory_bytes`, counted from
        // the write: a fast input would otherwise have its whole backlog held (hundreds of MiB)
        // while the workers catch up. The others are dropped here and read back from disk.
        let mut held = 0;
        if ok {
            let mut in_memory = self.inner.mem_bytes.load(Ordering::Relaxed);
            for batch in &mut work {
                if in_memory + batch.bytes as u64 <= budget {
                    in_memory += batch.bytes as u64;
                    held += batch.bytes as u64;
                } else {
                    batch.events = Vec::new();
                }
            }
            self.inner.mem_bytes.fetch_add(held, Ordering::Relaxed);
        }
        // Handed over or given up: either way no longer waiting for the writer.
        self.inner.unwritten_bytes.fetch_sub(estimate as u64, Ordering::Relaxed);
        if !ok {
            // Closed while the disk was full: these events were never stored.
            let lost = work.iter().map(Batch::len).sum::<usize>();
            self.give_up_stage(lost as u64);
            buf.clear();
            self.inner.bytes.fetch_sub(estimate as u64, Ordering::Relaxed);
            return;
        }
        let file = self.advance_written(live as u64);
        let group = Written { work, ranges, event_ends, base, written: group_len as u64, estimate: estimate as u64 };
        let mut acks = std::mem::take(&mut self.stage.acks);
        self.stage = Stage::default();
        acks.extend(hand_over(&self.inner, &self.shard, group));
        self.after_write(acks, file, base + group_len as u64, seg.len, live as u64, policy, unsynced);
    }

    /// Direct I/O writes groups in pieces of about [`STAGE_BYTES`] when no input waits for them.
    fn staging(&self) -> bool {
        self.direct_io
    }

    /// Writes the staged frames (`buf` holds exactly them) and passes their acknowledgements on.
    fn flush_stage(&mut self, buf: &mut StageBuf, policy: SyncPolicy, unsynced: &mut bool) {
        if buf.is_empty() {
            // Only groups whose every event the encoder refused (counted and logged): nothing to
            // write or sync for them.
            acknowledge(std::mem::take(&mut self.stage).acks);
            return;
        }
        let offset = self.active.as_ref().expect("an active segment").1.len;
        let live = buf.len();
        if !self.write_all(buf, offset) {
            buf.clear();
            self.give_up_stage(0);
            return;
        }
        let file = self.advance_written(live as u64);
        let base = self.active.as_ref().expect("an active segment").1.base + offset;
        let acks = std::mem::take(&mut self.stage).acks;
        self.after_write(acks, file, base + live as u64, offset, live as u64, policy, unsynced);
        // A range a worker gave back before its write may be waiting to be read.
        self.inner.not_empty.notify_waiters();
    }

    /// Counts `live` more bytes written to the active segment (for readers too); its file.
    fn advance_written(&mut self, live: u64) -> Arc<File> {
        let (file, active) = self.active.as_mut().expect("an active segment");
        active.len += live;
        let (file, len) = (file.clone(), active.len);
        // The segment's length covers the frames before they are handed over as a range to
        // read: a reader looks for its frames within it.
        if let Some(last) = self.shard.state.lock().segments.back_mut() {
            last.len = len;
        }
        file
    }

    /// The staged events were never written (the queue closed while the disk was full); their
    /// acknowledgements are dropped, which tells their inputs so. `more` unwritten events of an
    /// unstaged group are counted with them.
    fn give_up_stage(&mut self, more: u64) {
        let lost = std::mem::take(&mut self.stage).events + more;
        self.inner.metrics.unstored.fetch_add(lost, Ordering::Relaxed);
        tracing::error!(
            shard = self.shard.id,
            events = lost,
            "shutdown while the queue disk is full: events not stored"
        );
    }

    /// After a write of `[offset, offset + len)` of the active segment, ending at LSN `end`:
    /// the acknowledgements wait for an fdatasync (`commit`), or go now.
    #[allow(clippy::too_many_arguments)]
    fn after_write(
        &mut self,
        acks: Vec<Batch>,
        file: Arc<File>,
        end: u64,
        offset: u64,
        len: u64,
        policy: SyncPolicy,
        unsynced: &mut bool,
    ) {
        match policy {
            SyncPolicy::Commit => {
                // A pass under way cannot cover this group: starting its writeback now leaves the
                // next fdatasync less to flush. An idle syncer starts that fdatasync at once,
                // which makes the hint redundant, and it would only delay the next group.
                let waits = self.syncer.submit(Unsynced { acks, file, end });
                if waits && !self.direct_io {
                    self.start_writeback(offset, len);
                }
            }
            SyncPolicy::Interval => {
                *unsynced = true;
                acknowledge(acks);
            }
            SyncPolicy::None => {
                // Nothing is ever synced: the checkpoint follows the workers.
                self.shard.state.lock().synced_lsn = end;
                acknowledge(acks);
            }
        }
    }

    /// Whether `incoming` more bytes after `staged` ones would push the active segment past
    /// `segment_bytes` (a segment holding only its header takes them anyway).
    fn needs_new_segment(&self, staged: u64, incoming: u64) -> bool {
        match &self.active {
            None => true,
            Some((_, s)) => {
                let len = s.len + staged;
                len > SEGMENT_HEADER_LEN as u64 && len + incoming > self.inner.config.segment_bytes
            }
        }
    }

    /// The active segment, rotated when `incoming` would push it past `segment_bytes`.
    fn segment_for(&mut self, incoming: u64, first_seq: u64) -> io::Result<SegInfo> {
        if self.needs_new_segment(0, incoming) {
            if let Some((f, s)) = &self.active {
                // Sealed: cut to its live length (a reused file is longer) and made durable.
                f.set_len(s.len)?;
                f.sync_all()?;
            }
            let base = self.active.as_ref().map_or_else(
                || self.shard.state.lock().segments.back().map_or(0, |s| s.base + s.len),
                |(_, s)| s.base + s.len,
            );
            self.start_segment(first_seq, base, false)?;
        }
        Ok(self.active.as_ref().expect("an active segment").1)
    }

    /// Makes a new active segment: a reused file from the free pool if there is one, else a new
    /// file (pre-written with zeros if `prewrite`, so the first writes find their pages ready).
    pub fn start_segment(&mut self, first_seq: u64, base: u64, prewrite: bool) -> io::Result<()> {
        let path = segment_path(&self.shard.dir, first_seq);
        let spare = self.checkpoints.free.lock().pop();
        let file = match spare {
            Some(old) => {
                fs::rename(&old, &path)?;
                OpenOptions::new().read(true).write(true).open(&path)?
            }
            None => {
                // `truncate`, not `create_new`: a file left by an attempt that failed half-way
                // (a full disk) is this same segment, not someone else's.
                let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path)?;
                if prewrite {
                    self.prewrite(&path, &file)?;
                }
                file
            }
        };
        let header = SegmentHeader {
            codec: CODEC_EVENT,
            shard: self.shard.id,
            first_seq,
            created_unix_nanos: sluice_core::value::now_nanos(),
            ..Default::default()
        };
        file.write_all_at(&header.encode(), 0)?;
        // No stale frame may follow the header of a reused file.
        file.write_all_at(&[0u8; 12], SEGMENT_HEADER_LEN as u64)?;
        file.sync_all()?;
        checkpoint::sync_dir(&self.shard.dir)?;
        let info = SegInfo { id: first_seq, base, len: SEGMENT_HEADER_LEN as u64 };
        let mut s = self.shard.state.lock();
        s.segments.push_back(info);
        s.mark_done(base, base + SEGMENT_HEADER_LEN as u64);
        drop(s);
        self.active = Some((Arc::new(file), info));
        Ok(())
    }

    /// Starts writing `[offset, offset + len)` of the active segment to the device without
    /// waiting, so that the syncer's fdatasync, which may come while the next groups are
    /// written, finds less to flush. A hint: failure changes nothing.
    fn start_writeback(&self, offset: u64, len: u64) {
        if let Some((file, _)) = &self.active {
            use std::os::fd::AsRawFd;
            // SAFETY: a plain syscall on a file descriptor this writer owns.
            unsafe {
                libc::sync_file_range(file.as_raw_fd(), offset as i64, len as i64, libc::SYNC_FILE_RANGE_WRITE);
            }
        }
    }

    /// The direct-I/O handle for the active segment, opened on first use; `stage` then gets the
    /// live bytes of the segment's last block as its head.
    fn direct_file(&mut self, stage: &mut StageBuf) -> io::Result<Option<&mut DirectFile>> {
        if !self.direct_io {
            return Ok(None);
        }
        let Some((file, seg)) = self.active.as_ref() else { return Ok(None) };
        if self.direct.as_ref().is_none_or(|d| d.segment != seg.id) {
            self.direct = None;
            match DirectFile::open(&segment_path(&self.shard.dir, seg.id), seg.id, seg.len, file) {
                Ok(Some(d)) => {
                    stage.set_head(d.opening_head())?;
                    self.direct = Some(d);
                }
                Ok(None) => {
                    tracing::info!(
                        shard = self.shard.id,
                        "direct I/O not supported here; the queue writes through the page cache"
                    );
                    self.direct_io = false;
                }
                Err(e) => {
                    tracing::warn!(shard = self.shard.id, error = %e,
                        "cannot open the segment for direct I/O; the queue writes through the page cache");
                    self.direct_io = false;
                }
            }
        }
        Ok(self.direct.as_mut())
    }

    /// Fills the start of a new segment file with zeros (up to [`PREWRITE_BYTES`]), so that
    /// the first writes neither allocate blocks nor change the file's size (each of which would
    /// make every fdatasync write metadata too), and, without direct I/O, find their page-cache
    /// pages ready.
    fn prewrite(&mut self, path: &Path, file: &File) -> io::Result<()> {
        let len = self.inner.config.segment_bytes.min(PREWRITE_BYTES);
        let mut direct = if self.direct_io { DirectFile::open(path, 0, 0, file)? } else { None };
        let chunk = (1usize << 20).min(len as usize).next_multiple_of(BLOCK);
        // One block-aligned chunk of zeros (a fresh mapping is zeros) serves both kinds of
        // write. Made here, not kept: only a new shard's first segment is pre-written.
        let mut zeros = AlignedBuf::new(chunk)?;
        let zeros = zeros.slice(chunk)?;
        let mut at = 0;
        while at < len {
            let n = chunk.min((len - at) as usize);
            if let Some(d) = &direct {
                match d.write_raw(&zeros[..n.next_multiple_of(BLOCK)], at) {
                    Ok(()) => {
                        at += n as u64;
                        continue;
                    }
                    // Opened but refused: this filesystem is written through the page cache.
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                        self.direct_io = false;
                        direct = None;
                    }
                    Err(e) => return Err(e),
                }
            }
            file.write_all_at(&zeros[..n], at)?;
            at += n as u64;
        }
        Ok(())
    }

    /// Writes the frames in `buf` at `offset`, followed by the end marker, waiting out a full
    /// disk; `buf` then holds no frames. False if the queue closed while waiting.
    fn write_all(&mut self, buf: &mut StageBuf, offset: u64) -> bool {
        let mut pause = Duration::from_millis(100);
        let mut logged = false;
        let mut since: Option<Instant> = None;
        loop {
            let written = match self.injected_failure() {
                Some(e) => Err(e),
                None => self.write_once(buf, offset),
            };
            let (file, _) = self.active.as_ref().expect("an active segment");
            match written {
                Ok(()) => {
                    if let Some(t) = since {
                        let waited = t.elapsed();
                        self.inner.metrics.stalled_nanos.fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
                        let mut st = self.shard.state.lock();
                        st.stalled = None;
                        st.stalled_since = None;
                        tracing::info!(shard = self.shard.id, waited = ?waited, "persisted queue writing again");
                    }
                    return true;
                }
                Err(e) => {
                    // Never leave a partial frame behind.
                    let _ = file.set_len(offset);
                    let full = e.kind() == ErrorKind::StorageFull || e.raw_os_error() == Some(libc::ENOSPC);
                    let why = if full { "disk full".to_string() } else { e.to_string() };
                    if !logged {
                        tracing::error!(shard = self.shard.id, dir = %self.shard.dir.display(), error = %e,
                            "persisted queue cannot write ({why}); inputs are held back until it can");
                        logged = true;
                    }
                    since.get_or_insert_with(Instant::now);
                    {
                        let mut st = self.shard.state.lock();
                        st.stalled = Some(why);
                        st.stalled_since.get_or_insert(since.unwrap_or_else(Instant::now));
                    }
                    // Make room from what the outputs have acknowledged meanwhile.
                    let done = self.shard.state.lock().checkpointable();
                    if let Err(e) = self.checkpoints.write(done, true) {
                        tracing::debug!(shard = self.shard.id, error = %e, "checkpoint while the disk is full");
                    }
                    if self.shard.state.lock().stopping && (self.gave_up || pause >= Duration::from_secs(2)) {
                        self.gave_up = true;
                        return false;
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// One try at [`Writer::write_all`]'s write, direct where it can be; a filesystem that
    /// refuses direct I/O is written through the page cache from then on.
    fn write_once(&mut self, buf: &mut StageBuf, offset: u64) -> io::Result<()> {
        loop {
            let refused = self.injected_refusal();
            return match self.direct_file(buf)? {
                Some(direct) => match refused.map_or_else(|| direct.write(buf, offset), Err) {
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                        tracing::info!(shard = self.shard.id, error = %e,
                            "direct I/O refused by the filesystem; the queue writes through the page cache");
                        self.direct_io = false;
                        self.direct = None;
                        continue;
                    }
                    r => r,
                },
                None => {
                    let file = self.active.as_ref().expect("an active segment").0.clone();
                    file.write_all_at(buf.frames_with_marker()?, offset)?;
                    buf.clear();
                    Ok(())
                }
            };
        }
    }

    /// A write failure a test asked for (`Inner::fail_writes`); never outside tests.
    fn injected_failure(&self) -> Option<io::Error> {
        #[cfg(test)]
        if take_one(&self.inner.fail_writes) {
            return Some(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        None
    }

    /// A direct write a test asked to be refused (`Inner::refuse_direct_writes`); never outside
    /// tests.
    fn injected_refusal(&self) -> Option<io::Error> {
        #[cfg(test)]
        if take_one(&self.inner.refuse_direct_writes) {
            return Some(io::Error::from_raw_os_error(libc::EINVAL));
        }
        None
    }
}

/// Counts one off a test's count of failures to inject; false when none is left.
#[cfg(test)]
fn take_one(count: &std::sync::atomic::AtomicU32) -> bool {
    count.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batches(sizes: &[usize]) -> Vec<Batch> {
        sizes.iter().map(|&bytes| Batch::untracked(Vec::new(), bytes)).collect()
    }

    #[test]
    fn a_group_takes_batches_in_order_up_to_its_cap_and_always_one() {
        let sizes = |v: &[Batch]| v.iter().map(|b| b.bytes).collect::<Vec<_>>();
        let mut pending = batches(&[100, 100, 100, 100]);
        assert_eq!(sizes(&take_group(&mut pending, 250)), [100, 100]);
        assert_eq!(sizes(&pending), [100, 100]);
        assert_eq!(sizes(&take_group(&mut pending, 250)), [100, 100]);
        assert!(pending.is_empty());
        // A batch bigger than the cap goes alone, so the writer never stalls on it.
        let mut pending = batches(&[1000, 10]);
        assert_eq!(sizes(&take_group(&mut pending, 250)), [1000]);
        assert_eq!(sizes(&take_group(&mut pending, 250)), [10]);
        let mut pending = batches(&[10, 20]);
        assert_eq!(sizes(&take_group(&mut pending, 30)), [10, 20], "exactly the cap fits");
    }

    #[test]
    fn groups_grow_with_the_backlog_between_two_caps() {
        assert_eq!(group_cap(0), GROUP_MAX_BYTES);
        assert_eq!(group_cap(740 << 10), GROUP_MAX_BYTES, "a burst is written in small pieces");
        assert_eq!(group_cap(2 << 20), 512 << 10);
        assert_eq!(group_cap(8 << 20), BACKLOG_GROUP_MAX_BYTES);
        assert_eq!(group_cap(usize::MAX), BACKLOG_GROUP_MAX_BYTES);
    }
}
