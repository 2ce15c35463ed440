//! Recovery of a shard at start-up: its checkpoint read (or migrated, see `checkpoint.rs`),
//! acknowledged segments deleted, spare files found, the last segment scanned and a torn tail
//! cut there, logged with the number of events the cut bytes held, and the unacknowledged rest
//! queued to be read without reading it.

use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use parking_lot::{Condvar, Mutex};
use sluice_segment::{CODEC_EVENT, DEFAULT_MAX_FRAME_LEN, FrameCursor, FrameResult, SEGMENT_HEADER_LEN, SegmentHeader};

use super::Inner;
use super::checkpoint::{self, CheckpointFile};
use super::read_cache::ReadCache;
use super::shard::{Readable, SegInfo, Shard, ShardState, segment_path};

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
