//! One shard: an independent segment log with its own writer thread.
//!
//! Positions in a shard are byte offsets in its log (LSNs): segment `k` covers
//! `[base_k, base_k + len_k)`, with the next segment's base right after. Every batch written
//! occupies a range of LSNs, and so does every piece a reader takes back out; completion is
//! tracked as ranges, and the contiguous completed prefix (`done_lsn`) is what the checkpoint
//! records, translated to `(segment, offset)`. Recovery therefore starts exactly where the
//! acknowledged prefix ends and never rescans what was acknowledged.
//!
//! The writer thread takes every batch queued since its last pass, encodes them as frames
//! (one frame per event) and writes them with one `pwrite`. The written batches go to the
//! workers at once, from memory while a memory budget allows; beyond it only their position is
//! kept and workers read them back from the segment. The inputs' acknowledgements wait for
//! `fdatasync` per the sync policy, called outside any lock producers use (see `syncer.rs`),
//! and so does the checkpoint: it records the completed prefix only as far as it is durable.

use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use sluice_core::ack::AckOutcome;
use sluice_core::{AckSet, Acker, Batch, Event, SharedText, TextPool};
use sluice_segment::ByteBuf;
use sluice_segment::{
    CODEC_EVENT, DEFAULT_MAX_FRAME_LEN, EventDecoder, FrameCursor, FrameResult, SEGMENT_HEADER_LEN, SegmentHeader,
    encode_event, try_append_frame,
};

use super::checkpoint::{self, CheckpointFile};
use super::checkpointer::Checkpointer;
use super::direct::{AlignedBuf, BLOCK, DirectFile, StageBuf};
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

/// Events read back from disk per piece at most, whatever the worker asked for.
const READ_WINDOW: usize = 4 << 20;

#[derive(Debug, Clone, Copy)]
pub(crate) struct SegInfo {
    pub id: u64,
    pub base: u64,
    pub len: u64,
}

pub(crate) enum Readable {
    /// Handed over and still in memory (written, or staged to be written: see `Stage`): the
    /// events of one or more batches written one after the other, which stand for `bytes`.
    /// `ends[i]` is the LSN just past event `i`'s frame, so any prefix can be acknowledged as
    /// exactly its own range. Both are taken from the front a few at a time, hence the deques.
    Mem { events: VecDeque<Event>, bytes: usize, start: u64, ends: VecDeque<u64> },
    /// Written, to be read back from disk: `[start, end)` in LSNs. `counted` of its events are
    /// already in the shard's event count (those written in this run); the rest, found at
    /// start-up without reading them, are counted as they are read.
    Disk { start: u64, end: u64, counted: u64 },
}

pub(crate) struct ShardState {
    pub pending: Vec<Batch>,
    pub pending_bytes: usize,
    /// Bytes and events not yet acknowledged (pending batches by estimate, written ones exactly).
    pub bytes: u64,
    pub events: u64,
    pub readable: VecDeque<Readable>,
    pub segments: VecDeque<SegInfo>,
    done: BTreeMap<u64, u64>,
    pub done_lsn: u64,
    /// Everything before this LSN is on disk (covered by an fdatasync, or found at start-up).
    /// Workers may finish events before that, but the checkpoint stays within it.
    pub synced_lsn: u64,
    /// No more pushes (the pipeline is stopping).
    pub closed: bool,
    /// The workers are done: the writer writes what is pending, checkpoints, and exits.
    pub stopping: bool,
    pub writer_finished: bool,
    /// Why the writer is stuck (disk full), for stats.
    pub stalled: Option<String>,
    /// Since when the writer has been waiting on the disk, while it is.
    pub stalled_since: Option<Instant>,
    /// Ranges the workers finished past the checkpoint on disk: their end LSN → their events.
    unrecorded: BTreeMap<u64, u64>,
}

impl ShardState {
    /// How far the checkpoint may go: the completed prefix, as far as it is durable.
    pub fn checkpointable(&self) -> u64 {
        self.done_lsn.min(self.synced_lsn)
    }

    /// Events the workers finished that the checkpoint on disk does not record: what a restart
    /// now would deliver again. An upper bound: a range the checkpoint ends inside counts whole.
    pub fn unrecorded_events(&self) -> u64 {
        self.unrecorded.values().sum()
    }

    /// A checkpoint at `lsn` is on disk: the ranges ending there or before are recorded.
    pub fn recorded(&mut self, lsn: u64) {
        let later = self.unrecorded.split_off(&(lsn + 1));
        self.unrecorded = later;
    }

    fn mark_done(&mut self, start: u64, end: u64) {
        if start == self.done_lsn {
            self.done_lsn = end;
            while let Some(e) = self.done.remove(&self.done_lsn) {
                self.done_lsn = e;
            }
        } else {
            self.done.insert(start, end);
        }
    }
}

/// What a read from disk came to.
enum DiskTake {
    Batch(Batch),
    /// No events, but the shard moved on (damaged frames consumed, or the front changed): try again.
    Again,
    /// Nothing could be read now (an I/O error, or frames not written yet); the range is kept
    /// for a later try.
    Failed,
}

pub(crate) struct Shard {
    pub id: u32,
    pub dir: PathBuf,
    pub state: Mutex<ShardState>,
    pub wake: Condvar,
    /// The last bytes read from disk, so consecutive pieces of one segment cost one read.
    reader: Mutex<ReadCache>,
}

/// Read buffers a shard keeps for reuse, and the largest it keeps.
const READ_BUFFERS_KEPT: usize = 4;
const READ_BUFFER_LARGEST: usize = 2 * READ_WINDOW;

struct ReadCache {
    segment: u64,
    /// File offset of the first valid byte; `len` bytes are valid.
    start: u64,
    len: usize,
    /// The last window read through the page cache. Events decoded from it point into it
    /// (their long strings are slices of it), so it is never written again: the next window
    /// goes to another buffer, and this one returns to `pool` when its last event is gone.
    text: Option<SharedText>,
    pool: Arc<TextPool>,
    /// Reads with `O_DIRECT` into `aligned` (see `direct.rs` for why); off after the
    /// filesystem refuses one. Events from it are copies: the buffer is reused.
    direct: bool,
    aligned: AlignedBuf,
    file: Option<(u64, File)>,
    /// Remembers the previous event's root keys, so they are not checked and built again.
    decoder: EventDecoder,
}

/// A window of a segment, as [`ReadCache::fill`] gives it.
struct Window<'a> {
    bytes: &'a [u8],
    /// The buffer `bytes` lies in, when strings may point into it.
    text: Option<SharedText>,
    decoder: &'a mut EventDecoder,
}

impl ReadCache {
    fn new(direct: bool) -> ReadCache {
        ReadCache {
            segment: u64::MAX,
            start: 0,
            len: 0,
            text: None,
            pool: TextPool::new(READ_BUFFERS_KEPT, READ_BUFFER_LARGEST),
            direct,
            aligned: AlignedBuf::default(),
            file: None,
            decoder: EventDecoder::new(),
        }
    }

    /// Makes `[from, from + want)` of the segment available (`want` capped by the caller).
    fn fill(&mut self, dir: &Path, segment: u64, from: u64, want: usize) -> io::Result<Window<'_>> {
        let cached =
            self.segment == segment && self.start <= from && from + want as u64 <= self.start + self.len as u64;
        if !cached {
            if self.file.as_ref().is_none_or(|(id, _)| *id != segment) {
                self.file = None;
                let path = segment_path(dir, segment);
                if self.direct {
                    match OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&path) {
                        Ok(f) => self.file = Some((segment, f)),
                        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => self.direct = false,
                        Err(e) => return Err(e),
                    }
                }
                if self.file.is_none() {
                    self.file = Some((segment, File::open(path)?));
                }
            }
            self.segment = u64::MAX;
            self.text = None;
            let (_, file) = self.file.as_ref().expect("opened above");
            if self.direct {
                match read_direct(file, &mut self.aligned, from, want) {
                    Ok((start, len)) => (self.start, self.len) = (start, len),
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                        // Opened but not readable directly: buffered from now on.
                        self.direct = false;
                        self.file = None;
                        return self.fill(dir, segment, from, want);
                    }
                    Err(e) => return Err(e),
                }
            } else {
                let mut bytes = self.pool.take(want);
                read_exact_into(file, &mut bytes, want, from)?;
                self.text = Some(SharedText::pooled_records(bytes, &self.pool));
                (self.start, self.len) = (from, want);
            }
            self.segment = segment;
        }
        let at = (from - self.start) as usize;
        let decoder = &mut self.decoder;
        match &self.text {
            Some(text) => Ok(Window { bytes: &text.as_bytes()[at..at + want], text: Some(text.clone()), decoder }),
            None => Ok(Window { bytes: &self.aligned.filled(self.len)[at..at + want], text: None, decoder }),
        }
    }
}

/// Reads exactly `want` bytes at `offset` into the spare capacity of the empty `bytes`,
/// without zeroing it first (a window is megabytes, read many times a second).
fn read_exact_into(file: &File, bytes: &mut Vec<u8>, want: usize, offset: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    debug_assert!(bytes.is_empty());
    bytes.reserve(want);
    while bytes.len() < want {
        let got = bytes.len();
        // SAFETY: pread writes at most `want - got` bytes into the spare capacity reserved
        // above, and only the bytes it reports are then counted as initialised.
        let n = unsafe {
            libc::pread(
                file.as_raw_fd(),
                bytes.as_mut_ptr().add(got).cast(),
                want - got,
                (offset + got as u64) as libc::off_t,
            )
        };
        match n {
            0 => return Err(io::Error::new(ErrorKind::UnexpectedEof, "segment shorter than its recorded length")),
            n if n < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() != ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            // SAFETY: the `n` bytes after `got` were just written by pread.
            n => unsafe { bytes.set_len(got + n as usize) },
        }
    }
    Ok(())
}

/// Reads `[from, from + want)` with block-aligned offset and length into `buf`; returns the
/// file offset of `buf`'s first byte and how many bytes from there hold what was asked for.
/// Bytes past `from + want` were read too but are not reported: the writer may not have
/// written them yet.
fn read_direct(file: &File, buf: &mut AlignedBuf, from: u64, want: usize) -> io::Result<(u64, usize)> {
    let start = from & !(BLOCK as u64 - 1);
    let need = (from - start) as usize + want;
    let len = need.next_multiple_of(BLOCK);
    let out = buf.slice(len)?;
    let mut got = 0;
    while got < need {
        let n = file.read_at(&mut out[got..len], start + got as u64)?;
        // Only the end of the file gives a short read; anything else cannot continue aligned.
        if n == 0 || (got + n < need && (got + n) % BLOCK != 0) {
            return Err(io::Error::new(ErrorKind::UnexpectedEof, "segment shorter than its recorded length"));
        }
        got += n;
    }
    Ok((start, need))
}

pub(crate) fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:020}.seg"))
}

/// Segment files of a shard directory, oldest first.
fn list_segments(dir: &Path) -> io::Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".seg")) else { continue };
        if let Ok(id) = stem.parse::<u64>() {
            out.push((id, entry.metadata()?.len()));
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// What recovery found in a shard, for the writer to continue from.
pub(crate) struct Recovered {
    pub next_seq: u64,
    pub active: Option<(Arc<File>, SegInfo)>,
    /// Acknowledged segment files kept for reuse.
    pub free: Vec<PathBuf>,
    pub checkpoint: CheckpointFile,
}

pub(crate) const FREE_SUFFIX: &str = ".free";
/// Acknowledged segments kept per shard for reuse: their pages are written and likely cached,
/// so writing into them again skips the kernel's cost of fresh page-cache pages.
pub(crate) const FREE_POOL: usize = 2;

impl Shard {
    /// Opens a shard directory: reads the checkpoint, deletes acknowledged segments, truncates
    /// a torn tail, and queues the unacknowledged rest for reading.
    pub fn open(inner: &Inner, id: u32, dir: PathBuf) -> io::Result<(Arc<Shard>, Recovered)> {
        fs::create_dir_all(&dir)?;
        let files = list_segments(&dir)?;
        let free: Vec<PathBuf> = fs::read_dir(&dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.to_str().is_some_and(|n| n.ends_with(FREE_SUFFIX)))
            .collect();
        let found = match checkpoint::load(&dir) {
            Ok(found) => {
                if let Some(reason) = &found.torn_slot {
                    tracing::info!(shard = %dir.display(), %reason,
                        "one checkpoint slot did not verify (a write cut short); using the other");
                }
                found
            }
            Err(reason) => {
                tracing::warn!(shard = %dir.display(), %reason,
                    "queue checkpoint is damaged; replaying the shard from its oldest segment (events may repeat)");
                inner.metrics.checkpoint_rebuilds.fetch_add(1, Ordering::Relaxed);
                // Made anew by the first checkpoint written.
                checkpoint::Found { checkpoint: None, seq: 0, slotted: false, torn_slot: None }
            }
        };
        let ckpt = found.checkpoint;
        let checkpoint_file = CheckpointFile::open(&dir, &found)?;
        // Segments wholly before the checkpoint's segment are acknowledged.
        let (start_id, start_offset) = match ckpt {
            Some(c) => (c.segment, c.offset),
            None => (files.first().map(|f| f.0).unwrap_or(0), SEGMENT_HEADER_LEN as u64),
        };
        let mut segments = VecDeque::new();
        let mut base = 0u64;
        let mut readable = VecDeque::new();
        let mut next_seq = start_id;
        let mut active = None;
        let mut readable_bytes = 0u64;
        let count = files.len();
        for (i, (seg_id, file_len)) in files.into_iter().enumerate() {
            let path = segment_path(&dir, seg_id);
            let last = i + 1 == count;
            if seg_id < start_id && !last {
                fs::remove_file(&path)?;
                continue;
            }
            let mut len = file_len;
            if last {
                let (valid_len, last_seq) = recover_tail(inner, &path, seg_id)?;
                len = valid_len;
                next_seq = next_seq.max(last_seq.map_or(seg_id, |s| s + 1));
                let file = OpenOptions::new().read(true).write(true).open(&path)?;
                active = Some((Arc::new(file), SegInfo { id: seg_id, base, len }));
            }
            let from = if seg_id == start_id {
                start_offset.max(SEGMENT_HEADER_LEN as u64)
            } else {
                SEGMENT_HEADER_LEN as u64
            };
            if seg_id >= start_id && from < len {
                readable.push_back(Readable::Disk { start: base + from, end: base + len, counted: 0 });
                readable_bytes += len - from;
            }
            segments.push_back(SegInfo { id: seg_id, base, len });
            base += len;
        }
        inner.bytes.fetch_add(readable_bytes, Ordering::Relaxed);
        // Where the acknowledged prefix ends, in LSNs.
        let done_lsn = segments
            .iter()
            .find(|s| s.id >= start_id)
            .map(|s| {
                if s.id == start_id { s.base + start_offset.min(s.len).max(SEGMENT_HEADER_LEN as u64) } else { s.base }
            })
            .unwrap_or(base);
        // Segment headers hold no events: their ranges count as done from the start.
        let mut done = BTreeMap::new();
        for seg in segments.iter().filter(|g| g.base >= done_lsn) {
            done.insert(seg.base, seg.base + SEGMENT_HEADER_LEN as u64);
        }
        let mut done_lsn = done_lsn;
        while let Some(e) = done.remove(&done_lsn) {
            done_lsn = e;
        }
        let shard = Arc::new(Shard {
            id,
            dir,
            state: Mutex::new(ShardState {
                pending: Vec::new(),
                pending_bytes: 0,
                bytes: readable_bytes,
                events: 0,
                readable,
                segments,
                done,
                done_lsn,
                synced_lsn: base,
                closed: false,
                stopping: false,
                writer_finished: false,
                stalled: None,
                stalled_since: None,
                unrecorded: BTreeMap::new(),
            }),
            wake: Condvar::new(),
            reader: Mutex::new(ReadCache::new(inner.config.direct_io)),
        });
        Ok((shard, Recovered { next_seq, active, free, checkpoint: checkpoint_file }))
    }

    /// Closes the read handle on segment `id` if the reader holds one (the segment was deleted
    /// or renamed for reuse: an open handle would keep a deleted file's space).
    pub fn close_segment(&self, id: u64) {
        let mut cache = self.reader.lock();
        if cache.file.as_ref().is_some_and(|(open, _)| *open == id) {
            cache.file = None;
        }
        if cache.segment == id {
            cache.segment = u64::MAX;
            cache.text = None;
        }
    }

    /// Marks `[start, end)` handled and advances the acknowledged prefix.
    pub fn complete(&self, inner: &Inner, start: u64, end: u64, events: u64) {
        {
            let mut s = self.state.lock();
            s.mark_done(start, end);
            if events > 0 {
                *s.unrecorded.entry(end).or_default() += events;
            }
            s.bytes = s.bytes.saturating_sub(end - start);
            s.events = s.events.saturating_sub(events);
        }
        inner.bytes.fetch_sub(end - start, Ordering::Relaxed);
        inner.not_full.notify_waiters();
    }

    /// An acker that completes `[start, end)` once its `events` are handled.
    fn range_acker(self: &Arc<Self>, inner: &Arc<Inner>, start: u64, end: u64, events: usize) -> Acker {
        let (shard, inner) = (self.clone(), inner.clone());
        Acker::new(events, move |outcome| match outcome {
            AckOutcome::Handled => shard.complete(&inner, start, end, events as u64),
            // Taken but never handled (a delivery cut short): read it again from disk.
            AckOutcome::Abandoned => shard.requeue(&inner, start, end, events as u64),
        })
    }

    fn requeue(&self, inner: &Inner, start: u64, end: u64, events: u64) {
        // Still unacknowledged: the events stay counted.
        self.state.lock().readable.push_front(Readable::Disk { start, end, counted: events });
        inner.not_empty.notify_waiters();
    }

    /// Takes up to `want` events from the front of this shard if they are in memory: adjacent
    /// in-memory entries (one per batch written, or per run of small batches) are merged into
    /// one piece with one acknowledgement for their whole range. `Err(())` when the front is on
    /// disk (see [`Shard::take_from_disk`]).
    pub fn take_from_memory(self: &Arc<Self>, inner: &Arc<Inner>, want: usize) -> Result<Option<Batch>, ()> {
        let mut s = self.state.lock();
        // The piece so far: its events, bytes and LSN range.
        let mut taken: Vec<Event> = Vec::new();
        let (mut taken_bytes, mut from, mut to) = (0usize, 0u64, 0u64);
        while taken.len() < want {
            let room = want - taken.len();
            match s.readable.front_mut() {
                Some(Readable::Mem { events, bytes, start, ends }) if taken.is_empty() || to == *start => {
                    if taken.is_empty() {
                        from = *start;
                    }
                    let n = events.len().min(room);
                    let share = if n == events.len() { *bytes } else { *bytes * n / events.len() };
                    if taken.is_empty() && n == events.len() {
                        // The whole entry: its vector moves (an entry nothing was taken from
                        // yet is contiguous, so this copies no event).
                        taken = Vec::from(std::mem::take(events));
                    } else {
                        taken.extend(events.drain(..n));
                    }
                    to = ends[n - 1];
                    ends.drain(..n);
                    *start = to;
                    *bytes -= share;
                    taken_bytes += share;
                    if events.is_empty() {
                        s.readable.pop_front();
                    }
                }
                Some(Readable::Disk { .. }) if taken.is_empty() => return Err(()),
                _ => break,
            }
        }
        drop(s);
        if taken.is_empty() {
            return Ok(None);
        }
        inner.mem_bytes.fetch_sub(taken_bytes as u64, Ordering::Relaxed);
        // Room in memory for a push waiting for it (see `pacing.rs`).
        inner.not_full.notify_waiters();
        let n = taken.len();
        inner.metrics.events_from_memory.fetch_add(n as u64, Ordering::Relaxed);
        let acker = self.range_acker(inner, from, to, n);
        Ok(Some(Batch::new(taken, AckSet::single(acker, n), taken_bytes)))
    }

    /// Takes up to `want` events from the front of this shard, reading from disk if the front
    /// is on disk. `None` when the shard has nothing readable.
    pub fn take(self: &Arc<Self>, inner: &Arc<Inner>, want: usize) -> Option<Batch> {
        // Go on while there is progress: a piece that held only damaged frames, or a front that
        // another worker changed meanwhile, is no reason to report "nothing" while data waits.
        for _ in 0..64 {
            match self.take_from_memory(inner, want) {
                Ok(piece) => return piece,
                Err(()) => match self.take_from_disk(inner, want) {
                    DiskTake::Batch(b) => return Some(b),
                    DiskTake::Again => continue,
                    DiskTake::Failed => return None,
                },
            }
        }
        None
    }

    fn take_from_disk(self: &Arc<Self>, inner: &Arc<Inner>, want: usize) -> DiskTake {
        let front = {
            let mut s = self.state.lock();
            let Some(front) = s.readable.pop_front() else { return DiskTake::Again };
            match front {
                Readable::Disk { start, end, counted } => {
                    let seg = s.segments.iter().rev().find(|g| g.base <= start).copied();
                    (start, end, counted, seg)
                }
                mem => {
                    // Another worker took the disk entry meanwhile.
                    s.readable.push_front(mem);
                    return DiskTake::Again;
                }
            }
        };
        let (start, end, counted, seg) = front;
        if seg.is_some_and(|g| start >= g.base + g.len) {
            // Not written yet: a range of staged frames that a worker gave back (see
            // `Writer::flush_stage`, which announces the write).
            self.state.lock().readable.push_front(Readable::Disk { start, end, counted });
            return DiskTake::Failed;
        }
        let Some(seg) = seg else {
            tracing::error!(shard = self.id, start, "queue position has no segment; skipping it");
            self.complete(inner, start, end, counted);
            return DiskTake::Again;
        };
        // A piece never crosses a segment boundary.
        let seg_end = (seg.base + seg.len).min(end);
        let (events, consumed) = match self.read_piece(inner, &seg, start - seg.base, seg_end - seg.base, want) {
            Ok(r) => r,
            Err(e) => {
                // Put it back: an I/O error now may pass (it is retried on the next pop).
                tracing::error!(shard = self.id, segment = seg.id, offset = start - seg.base, error = %e,
                    "cannot read the persisted queue; will retry");
                self.state.lock().readable.push_front(Readable::Disk { start, end, counted });
                return DiskTake::Failed;
            }
        };
        let piece_end = start + consumed;
        let n = events.len();
        inner.metrics.events_read_back.fetch_add(n as u64, Ordering::Relaxed);
        inner.metrics.bytes_read_back.fetch_add(consumed, Ordering::Relaxed);
        {
            // The events read are counted now unless they were already; what stays counted
            // goes with the rest of the range, and a range read to its end leaves nothing
            // counted behind (damaged frames held events that will never be acknowledged).
            let mut s = self.state.lock();
            let already = counted.min(n as u64);
            s.events += n as u64 - already;
            let left = counted - already;
            if piece_end < end {
                s.readable.push_front(Readable::Disk { start: piece_end, end, counted: left });
            } else {
                s.events = s.events.saturating_sub(left);
            }
        }
        if n == 0 {
            // Only damaged frames here (counted and logged): move on to what follows.
            self.complete(inner, start, piece_end, 0);
            return if piece_end > start { DiskTake::Again } else { DiskTake::Failed };
        }
        let acker = self.range_acker(inner, start, piece_end, n);
        DiskTake::Batch(Batch::new(events, AckSet::single(acker, n), consumed as usize))
    }

    /// Reads frames from `[from, to)` of a segment, at most `want` events. Returns the events
    /// and how many bytes were consumed (whole frames, damaged ones included).
    fn read_piece(
        &self,
        inner: &Inner,
        seg: &SegInfo,
        from: u64,
        to: u64,
        want: usize,
    ) -> io::Result<(Vec<Event>, u64)> {
        let range = (to - from) as usize;
        let mut window = range.min(READ_WINDOW);
        let mut cache = self.reader.lock();
        loop {
            let Window { bytes: buf, text, decoder } = cache.fill(&self.dir, seg.id, from, window)?;
            let mut cursor = FrameCursor::new(buf, 0);
            let mut events = Vec::with_capacity(want.min(4096));
            let mut consumed = 0usize;
            let mut grow = false;
            while events.len() < want {
                match cursor.next_frame() {
                    FrameResult::Frame { body, offset, .. } => {
                        if let Err(err) = decoder.decode_event_body_into(body, text.as_ref(), &mut events) {
                            self.damaged(inner, seg, from + offset as u64, &format!("undecodable event: {err}"))
                        }
                        consumed = cursor.position();
                    }
                    FrameResult::Corrupt { offset, reason, .. } => {
                        self.damaged(inner, seg, from + offset as u64, &format!("{reason:?}"));
                        consumed = cursor.position();
                    }
                    FrameResult::Garbage { offset, len, reason } => {
                        self.damaged(inner, seg, from + offset as u64, &format!("{reason:?} ({len} bytes skipped)"));
                        consumed = cursor.position();
                    }
                    FrameResult::Torn { offset } if window < range => {
                        if offset == 0 {
                            // The first frame is larger than the window: read again, larger.
                            let len = u32::from_le_bytes(buf[..4].try_into().expect("window holds 4 bytes"));
                            window = (len as usize + 12).max(window * 2).min(range);
                            grow = true;
                        } else {
                            consumed = offset;
                        }
                        break;
                    }
                    FrameResult::Torn { offset } => {
                        // The written range ends inside this "frame": nothing more is readable.
                        self.damaged(
                            inner,
                            seg,
                            from + offset as u64,
                            "torn or unreadable bytes up to the end of the range",
                        );
                        consumed = range;
                        break;
                    }
                    FrameResult::End => {
                        consumed = cursor.position();
                        break;
                    }
                }
            }
            if !grow {
                return Ok((events, consumed as u64));
            }
        }
    }

    fn damaged(&self, inner: &Inner, seg: &SegInfo, offset: u64, reason: &str) {
        inner.metrics.corrupt_frames.fetch_add(1, Ordering::Relaxed);
        tracing::error!(shard = self.id, segment = %segment_path(&self.dir, seg.id).display(), offset, reason,
            "damaged frame in the persisted queue skipped");
    }
}

/// Scans the last segment: returns the length of its valid prefix (truncating a torn tail) and
/// the sequence number of its last good frame. A damaged header makes the whole file a tail.
fn recover_tail(inner: &Inner, path: &Path, seg_id: u64) -> io::Result<(u64, Option<u64>)> {
    let bytes = fs::read(path)?;
    let header = SegmentHeader::decode(&bytes).ok();
    let mut last_seq = None;
    let mut valid = SEGMENT_HEADER_LEN;
    let mut stale = false;
    if let Some(h) = &header {
        // Live frames carry rising sequence numbers from the header's on; a frame with an
        // older one is left over from the file's previous life (a recycled segment).
        let mut expected = h.first_seq;
        let mut cursor = FrameCursor::new(&bytes, SEGMENT_HEADER_LEN);
        loop {
            match cursor.next_frame() {
                FrameResult::Frame { seq, .. } if seq < expected => {
                    stale = true;
                    break;
                }
                FrameResult::Frame { seq, .. } => {
                    last_seq = Some(seq);
                    expected = seq + 1;
                    valid = cursor.position();
                }
                // Damage before the end is kept for the reader to skip and count.
                FrameResult::Corrupt { .. } | FrameResult::Garbage { .. } => valid = cursor.position(),
                FrameResult::Torn { offset } if bytes.len() < offset + 4 || bytes[offset..offset + 4] == [0; 4] => {
                    // The terminator (or the end of the file): a clean end.
                    break;
                }
                FrameResult::Torn { offset } => {
                    // A live frame later on means this is damage in the middle, not the end.
                    let next = sluice_segment::resync(&bytes, offset, DEFAULT_MAX_FRAME_LEN);
                    let live = next.and_then(|n| match FrameCursor::new(&bytes, n).next_frame() {
                        FrameResult::Frame { seq, .. } => (seq >= expected).then_some(n),
                        _ => None,
                    });
                    match live {
                        Some(n) => {
                            cursor = FrameCursor::new(&bytes, n);
                            valid = n;
                        }
                        None => break,
                    }
                }
                FrameResult::End => break,
            }
        }
    }
    if valid < bytes.len() || header.is_none() {
        let tail = &bytes[valid.min(bytes.len())..];
        let unused = stale || tail.len() < 4 && tail.iter().all(|b| *b == 0) || tail.starts_with(&[0; 4]);
        if unused && header.is_some() {
            tracing::debug!(segment = %path.display(), valid_bytes = valid, "segment has unused space after its last frame");
        } else {
            let events_lost = frames_from(&bytes, valid);
            tracing::warn!(segment = %path.display(), valid_bytes = valid, file_bytes = bytes.len(), events_lost,
                "persisted queue segment ends in a torn frame (a crash mid-write); cutting it there");
            inner.metrics.torn_tails.fetch_add(1, Ordering::Relaxed);
            inner.metrics.torn_tail_events.fetch_add(events_lost, Ordering::Relaxed);
        }
        let f = OpenOptions::new().write(true).open(path)?;
        if header.is_none() {
            let header = SegmentHeader { codec: CODEC_EVENT, first_seq: seg_id, ..Default::default() };
            f.write_all_at(&header.encode(), 0)?;
        }
        if !unused || header.is_none() {
            f.set_len(valid as u64)?;
        } else {
            // Keep the written space for reuse, but make sure no stale frame follows the live ones.
            f.write_all_at(&[0u8; 12], valid as u64)?;
        }
        f.sync_all()?;
    }
    Ok((valid as u64, last_seq))
}

/// How many events the frames from `from` on held: whole frames (damaged or not) and a torn
/// last one; zeros after them are unused space, not events.
fn frames_from(bytes: &[u8], from: usize) -> u64 {
    let mut cursor = FrameCursor::new(bytes, from);
    let mut events = 0;
    loop {
        match cursor.next_frame() {
            FrameResult::Frame { .. } | FrameResult::Corrupt { .. } => events += 1,
            FrameResult::Garbage { .. } => {}
            FrameResult::Torn { offset } => {
                if bytes[offset..].iter().take(4).any(|b| *b != 0) {
                    events += 1;
                }
                return events;
            }
            FrameResult::End => return events,
        }
    }
}

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
