//! One shard: an independent segment log with its own writer thread (see `writer.rs`).
//!
//! Positions in a shard are byte offsets in its log (LSNs): segment `k` covers
//! `[base_k, base_k + len_k)`, with the next segment's base right after. Every batch written
//! occupies a range of LSNs, and so does every piece a reader takes back out; completion is
//! tracked as ranges, and the contiguous completed prefix (`done_lsn`) is what the checkpoint
//! records, translated to `(segment, offset)`. Recovery therefore starts exactly where the
//! acknowledged prefix ends and never rescans what was acknowledged.
//!
//! This module holds the shard's state and the workers' side: taking events from memory or
//! reading them back from the segments ([`Shard::take`]), completing ranges, and the
//! contiguous completed prefix. The writer thread is in `writer.rs` (it hands written batches
//! over from memory while a memory budget allows; beyond it only their position is kept and
//! workers read them back), recovery at start-up in `recovery.rs`, the read buffers and open
//! handles in `read_cache.rs`. The inputs' acknowledgements wait for `fdatasync` per the sync
//! policy (see `syncer.rs`), and so does the checkpoint: it records the completed prefix only
//! as far as it is durable. A damaged frame read back is skipped, counted and logged.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};
use sluice_core::ack::AckOutcome;
use sluice_core::{AckSet, Acker, Batch, Event};
use sluice_segment::{FrameCursor, FrameResult};

use super::Inner;
use super::read_cache::{ReadCache, Window};

/// Events read back from disk per piece at most, whatever the worker asked for.
pub(super) const READ_WINDOW: usize = 4 << 20;

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
    pub(super) done: BTreeMap<u64, u64>,
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
    pub(super) unrecorded: BTreeMap<u64, u64>,
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

    pub(super) fn mark_done(&mut self, start: u64, end: u64) {
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
    pub(super) reader: Mutex<ReadCache>,
}

pub(crate) fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:020}.seg"))
}

impl Shard {
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
