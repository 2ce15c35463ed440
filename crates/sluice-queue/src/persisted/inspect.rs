//! Offline inspection of a persisted queue directory (`sluice queue stats` and `sluice queue verify`).
//!
//! [`inspect`] reports, per shard: its checkpoint (or that there is none, or why it is
//! damaged); its segment files with their size, the bytes of live data (header and frames up to
//! the end of live data) and their frames; the events and frame bytes before the checkpoint
//! (acknowledged) and after it (not yet); and every damaged spot with its file, offset and
//! reason: a segment header that does not decode, a frame whose checksum fails, bytes that are
//! not a frame, a file that ends inside a frame, and (with `verify`) a frame whose body is not an
//! event.
//!
//! It never writes: files are opened read-only, nothing is truncated, repaired or deleted, and
//! the queue's lock is not taken. Whether a running process holds it is probed with a shared,
//! non-blocking `flock` on a read-only descriptor, released at once; when it is held, the report
//! says so and is a snapshot of files being written.
//!
//! Live data: a segment's frames carry consecutive sequence numbers from its header's
//! `first_seq`. A reused file can hold stale frames after the live data; the first frame whose
//! sequence number is not the next one expected ends the live data, and so do zeros up to the
//! end of the file (space written ahead, not used yet). After damage the exact next number is
//! unknown, so any later number below the next segment's first one is accepted; damage followed
//! only by stale frames is taken as leftovers of the file's previous use, not reported. Spare
//! segment files kept for reuse (not named `*.seg`) are not listed.

use std::fmt;
use std::fs::{self, File, TryLockError};
use std::io::{self, ErrorKind};
use std::path::{Path, PathBuf};

use serde::Serialize;
use sluice_segment::{
    Corruption, FRAME_OVERHEAD, FrameCursor, FrameResult, SEGMENT_HEADER_LEN, SegmentHeader, decode_event_body,
    frame_size,
};

use super::checkpoint::{self, Checkpoint};
use super::recovery::FREE_SUFFIX;
use super::shard::segment_path;

/// What [`inspect`] found in a queue directory.
#[derive(Debug, Clone, Serialize)]
pub struct QueueReport {
    pub path: PathBuf,
    /// A running process holds the queue's lock: the files may change while they are read.
    pub in_use: bool,
    /// Every event body was decoded, not only every frame checksummed.
    pub verified: bool,
    pub shards: Vec<ShardReport>,
    pub totals: Totals,
    /// Things worth knowing that are not damage (e.g. the lock could not be probed).
    pub warnings: Vec<String>,
}

/// Sums over every shard.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    pub shards: usize,
    pub segments: usize,
    pub file_bytes: u64,
    pub live_bytes: u64,
    pub frames: u64,
    pub acked_events: u64,
    pub acked_bytes: u64,
    pub unacked_events: u64,
    pub unacked_bytes: u64,
    /// Damaged spots found (see [`Damage`]).
    pub damaged: usize,
    /// Acknowledged segment files kept for reuse (`*.free`), and their size on disk.
    pub spare_files: usize,
    pub spare_bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ShardReport {
    pub shard: u32,
    pub dir: PathBuf,
    pub checkpoint: CheckpointState,
    /// Oldest first.
    pub segments: Vec<SegmentReport>,
    pub acked_events: u64,
    pub acked_bytes: u64,
    pub unacked_events: u64,
    pub unacked_bytes: u64,
    /// Acknowledged segment files kept for reuse (`*.free`): no events, but disk space.
    pub spare_files: usize,
    pub spare_bytes: u64,
    pub warnings: Vec<String>,
}

/// A shard's checkpoint. Without a usable one the queue replays the shard from its oldest
/// segment, so everything in it counts as not acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum CheckpointState {
    None,
    Ok { segment: u64, offset: u64 },
    Damaged { reason: String },
}

#[derive(Debug, Clone, Serialize)]
pub struct SegmentReport {
    /// The file name's number: the sequence number of its first frame.
    pub id: u64,
    pub file: PathBuf,
    pub file_bytes: u64,
    /// Header plus frames (damaged ones included) up to the end of live data.
    pub live_bytes: u64,
    /// Intact live frames; each holds one event.
    pub frames: u64,
    pub first_seq: Option<u64>,
    pub last_seq: Option<u64>,
    pub acked_events: u64,
    pub acked_bytes: u64,
    pub unacked_events: u64,
    pub unacked_bytes: u64,
    pub damage: Vec<Damage>,
}

/// One damaged spot in a segment file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Damage {
    pub file: PathBuf,
    pub offset: u64,
    /// Bytes it covers (to the end of the file for a torn tail).
    pub bytes: u64,
    pub kind: DamageKind,
    pub reason: String,
    /// Before the checkpoint: already delivered, so harmless to the queue (still a sign of a
    /// disk problem).
    pub acked: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DamageKind {
    /// The segment header does not decode, or names another first sequence number than the
    /// file name. The queue reads the frames anyway, but would cut a last segment back to its
    /// header at the next start.
    Header,
    /// A whole frame whose checksum fails: that event is lost.
    Corrupt,
    /// Bytes that are not a frame, with intact frames after them.
    Garbage,
    /// A frame with a good checksum whose body is not an event (found by `verify` only).
    Undecodable,
    /// The file ends inside a frame, or with bytes that are not frames.
    TornTail,
}

impl DamageKind {
    fn name(self) -> &'static str {
        match self {
            DamageKind::Header => "header",
            DamageKind::Corrupt => "corrupt",
            DamageKind::Garbage => "garbage",
            DamageKind::Undecodable => "undecodable",
            DamageKind::TornTail => "torn tail",
        }
    }
}

impl QueueReport {
    /// Every damaged spot, shard by shard, oldest segment first.
    pub fn damage(&self) -> impl Iterator<Item = &Damage> {
        self.shards.iter().flat_map(|s| s.segments.iter()).flat_map(|g| g.damage.iter())
    }
}

/// Inspects the queue directory at `path` (`<data_dir>/queue/<pipeline>` by default) without
/// writing anything. With `verify`, every event body is decoded too. Fails, naming the path, if
/// `path` is not a queue directory (no `shard-N` directory and no `lock` file).
pub fn inspect(path: &Path, verify: bool) -> io::Result<QueueReport> {
    let meta = fs::metadata(path)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot open the queue directory {}: {e}", path.display())))?;
    if !meta.is_dir() {
        return Err(io::Error::new(
            ErrorKind::InvalidInput,
            format!("{} is not a persisted queue directory (not a directory)", path.display()),
        ));
    }
    let mut shard_ids = Vec::new();
    for entry in fs::read_dir(path).map_err(|e| context(path, e))? {
        let entry = entry.map_err(|e| context(path, e))?;
        let name = entry.file_name();
        let Some(id) = name.to_str().and_then(|n| n.strip_prefix("shard-")).and_then(|k| k.parse::<u32>().ok()) else {
            continue;
        };
        if entry.file_type().map_err(|e| context(&entry.path(), e))?.is_dir() {
            shard_ids.push(id);
        }
    }
    shard_ids.sort_unstable();
    let lock = path.join("lock");
    if shard_ids.is_empty() && !lock.exists() {
        return Err(io::Error::new(
            ErrorKind::InvalidInput,
            format!("{} is not a persisted queue directory (no shard-N directories, no lock file)", path.display()),
        ));
    }
    let mut warnings = Vec::new();
    let in_use = match lock_held(&lock) {
        Ok(held) => held,
        Err(e) => {
            warnings.push(format!("cannot tell whether a process uses the queue ({}: {e})", lock.display()));
            false
        }
    };
    let mut shards = Vec::with_capacity(shard_ids.len());
    for id in shard_ids {
        shards.push(inspect_shard(id, &path.join(format!("shard-{id}")), verify, in_use)?);
    }
    let mut totals = Totals { shards: shards.len(), ..Totals::default() };
    for s in &shards {
        totals.segments += s.segments.len();
        totals.acked_events += s.acked_events;
        totals.acked_bytes += s.acked_bytes;
        totals.unacked_events += s.unacked_events;
        totals.unacked_bytes += s.unacked_bytes;
        totals.spare_files += s.spare_files;
        totals.spare_bytes += s.spare_bytes;
        for g in &s.segments {
            totals.file_bytes += g.file_bytes;
            totals.live_bytes += g.live_bytes;
            totals.frames += g.frames;
            totals.damaged += g.damage.len();
        }
    }
    Ok(QueueReport { path: path.to_path_buf(), in_use, verified: verify, shards, totals, warnings })
}

fn context(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// Whether another process holds the lock: a shared, non-blocking `flock` on a read-only
/// descriptor, released at once. No lock file: nobody.
fn lock_held(lock: &Path) -> io::Result<bool> {
    let file = match File::open(lock) {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    match file.try_lock_shared() {
        Ok(()) => {
            // Closing the file would release it too; this is explicit.
            file.unlock()?;
            Ok(false)
        }
        Err(TryLockError::WouldBlock) => Ok(true),
        Err(TryLockError::Error(e)) => Err(e),
    }
}

/// Segment files of a shard directory, oldest first.
/// What one listing of a shard directory holds: its segment ids, oldest first, and how many
/// reusable spare files (`*.free`) there are and their bytes. A spare deleted meanwhile (the
/// running queue reused or dropped it) is not counted.
struct Listing {
    segments: Vec<u64>,
    spare_files: usize,
    spare_bytes: u64,
}

fn list_shard(dir: &Path) -> io::Result<Listing> {
    let mut listing = Listing { segments: Vec::new(), spare_files: 0, spare_bytes: 0 };
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(id) = name.strip_suffix(".seg").and_then(|s| s.parse::<u64>().ok()) {
            listing.segments.push(id);
        } else if name.ends_with(FREE_SUFFIX)
            && let Ok(meta) = entry.metadata()
        {
            listing.spare_files += 1;
            listing.spare_bytes += meta.len();
        }
    }
    listing.segments.sort_unstable();
    Ok(listing)
}

fn inspect_shard(id: u32, dir: &Path, verify: bool, in_use: bool) -> io::Result<ShardReport> {
    let (checkpoint, ckpt) = match checkpoint::read(dir) {
        Ok(Some(c)) => (CheckpointState::Ok { segment: c.segment, offset: c.offset }, Some(c)),
        Ok(None) => (CheckpointState::None, None),
        Err(reason) => (CheckpointState::Damaged { reason }, None),
    };
    let Listing { segments: ids, spare_files, spare_bytes } = list_shard(dir).map_err(|e| context(dir, e))?;
    let mut warnings = Vec::new();
    let mut segments = Vec::with_capacity(ids.len());
    for (i, &seg) in ids.iter().enumerate() {
        let file = segment_path(dir, seg);
        let bytes = match fs::read(&file) {
            Ok(b) => b,
            // A running queue deletes segments once they are acknowledged.
            Err(e) if e.kind() == ErrorKind::NotFound && in_use => {
                warnings.push(format!("{} was deleted while being read", file.display()));
                continue;
            }
            Err(e) => return Err(context(&file, e)),
        };
        let mut report = scan_segment(&file, seg, &bytes, ids.get(i + 1).copied(), verify, ckpt);
        let last = i + 1 == ids.len();
        if in_use && last && report.damage.last().is_some_and(|d| d.kind == DamageKind::TornTail) {
            // Recovery cut any torn tail when the queue opened: this is a write in progress.
            let d = report.damage.pop().expect("a torn tail");
            warnings.push(format!(
                "{} ends in a partly written frame at offset {}: a write in progress (the queue is in use)",
                file.display(),
                d.offset
            ));
        }
        segments.push(report);
    }
    if let Some(c) = ckpt {
        match segments.iter().find(|g| g.id == c.segment) {
            None => warnings.push(format!(
                "the checkpoint names segment {}, which is missing: the queue starts at the next segment",
                c.segment
            )),
            Some(g) if c.offset > g.live_bytes => warnings.push(format!(
                "the checkpoint offset {} is past the live data of segment {} ({} bytes)",
                c.offset, c.segment, g.live_bytes
            )),
            Some(_) => {}
        }
    }
    let sum = |f: fn(&SegmentReport) -> u64| segments.iter().map(f).sum::<u64>();
    Ok(ShardReport {
        spare_files,
        spare_bytes,
        shard: id,
        dir: dir.to_path_buf(),
        checkpoint,
        acked_events: sum(|g| g.acked_events),
        acked_bytes: sum(|g| g.acked_bytes),
        unacked_events: sum(|g| g.unacked_events),
        unacked_bytes: sum(|g| g.unacked_bytes),
        segments,
        warnings,
    })
}

/// Before the checkpoint position: acknowledged. No checkpoint: nothing is.
fn is_acked(ckpt: Option<Checkpoint>, segment: u64, offset: u64) -> bool {
    ckpt.is_some_and(|c| segment < c.segment || (segment == c.segment && offset < c.offset))
}

/// Scans one segment file's bytes. `next_id` is the next segment's first sequence number, a
/// bound on this one's live frames.
fn scan_segment(
    file: &Path,
    id: u64,
    bytes: &[u8],
    next_id: Option<u64>,
    verify: bool,
    ckpt: Option<Checkpoint>,
) -> SegmentReport {
    let mut r = SegmentReport {
        id,
        file: file.to_path_buf(),
        file_bytes: bytes.len() as u64,
        live_bytes: bytes.len().min(SEGMENT_HEADER_LEN) as u64,
        frames: 0,
        first_seq: None,
        last_seq: None,
        acked_events: 0,
        acked_bytes: 0,
        unacked_events: 0,
        unacked_bytes: 0,
        damage: Vec::new(),
    };
    let damage = |offset: usize, len: usize, kind: DamageKind, reason: String| Damage {
        file: file.to_path_buf(),
        offset: offset as u64,
        bytes: len as u64,
        kind,
        reason,
        acked: is_acked(ckpt, id, offset as u64),
    };
    let mut expected = match SegmentHeader::decode(bytes) {
        Ok(h) => {
            if h.first_seq != id {
                let reason = format!("the header's first sequence number is {}, the file name's {id}", h.first_seq);
                r.damage.push(damage(0, SEGMENT_HEADER_LEN, DamageKind::Header, reason));
            }
            h.first_seq
        }
        Err(e) => {
            r.damage.push(damage(0, bytes.len().min(SEGMENT_HEADER_LEN), DamageKind::Header, e.to_string()));
            id
        }
    };
    if bytes.len() < SEGMENT_HEADER_LEN {
        return r;
    }
    let mut live_end = SEGMENT_HEADER_LEN;
    // Damage since the last live frame: confirmed by a live frame or the end of the file,
    // dismissed as leftovers by a stale frame.
    let mut pending: Vec<Damage> = Vec::new();
    let mut stale = false;
    for item in FrameCursor::new(bytes, SEGMENT_HEADER_LEN) {
        match item {
            FrameResult::Frame { offset, seq, body } => {
                let live = if pending.is_empty() {
                    seq == expected
                } else {
                    seq >= expected && next_id.is_none_or(|n| seq < n)
                };
                if !live {
                    stale = true;
                    break;
                }
                r.damage.append(&mut pending);
                let size = frame_size(body.len());
                live_end = offset + size;
                r.frames += 1;
                r.first_seq.get_or_insert(seq);
                r.last_seq = Some(seq);
                expected = seq + 1;
                if is_acked(ckpt, id, offset as u64) {
                    r.acked_events += 1;
                    r.acked_bytes += size as u64;
                } else {
                    r.unacked_events += 1;
                    r.unacked_bytes += size as u64;
                }
                if verify && let Err(e) = decode_event_body(body) {
                    r.damage.push(damage(offset, size, DamageKind::Undecodable, format!("not an event: {e}")));
                }
                if next_id == Some(expected) {
                    // Every frame up to the next segment is here: anything after is stale.
                    break;
                }
            }
            FrameResult::Corrupt { offset, len, reason } => {
                pending.push(damage(offset, FRAME_OVERHEAD + len as usize, DamageKind::Corrupt, describe(reason)));
                expected += 1;
            }
            FrameResult::Garbage { offset, len, reason } => {
                let reason = format!("not a frame ({}); intact frames follow", describe(reason));
                pending.push(damage(offset, len, DamageKind::Garbage, reason));
            }
            // Space written ahead with zeros (a new segment's), not used yet: not damage.
            FrameResult::Torn { offset } if bytes[offset..].iter().all(|&b| b == 0) => {}
            FrameResult::Torn { offset } => {
                pending.push(damage(offset, bytes.len() - offset, DamageKind::TornTail, torn_reason(bytes, offset)));
            }
            FrameResult::End => {}
        }
    }
    if !stale {
        for d in &pending {
            let end = if d.kind == DamageKind::TornTail { d.offset } else { d.offset + d.bytes };
            live_end = live_end.max(end as usize);
        }
        r.damage.append(&mut pending);
    }
    r.live_bytes = live_end as u64;
    r
}

fn describe(reason: Corruption) -> String {
    match reason {
        Corruption::Checksum { stored, computed } => {
            format!("checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")
        }
        Corruption::LengthMismatch { leading, trailing } => {
            format!("leading length {leading} and trailing length {trailing} differ")
        }
        Corruption::LengthOutOfRange(len) => format!("length {len} out of range"),
        Corruption::Truncated { len } => format!("a frame of {len} payload bytes runs past the end"),
    }
}

fn torn_reason(bytes: &[u8], offset: usize) -> String {
    let left = bytes.len() - offset;
    let len = bytes.get(offset..offset + 4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
    match len {
        Some(len) if len > 0 && (len as usize) + FRAME_OVERHEAD > left => format!(
            "the file ends inside a frame ({left} of its {} bytes are here): a write cut short",
            len as usize + FRAME_OVERHEAD
        ),
        _ => format!("{left} bytes up to the end of the file are not a frame"),
    }
}

impl fmt::Display for QueueReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.totals;
        writeln!(
            f,
            "queue {}: {} shard(s), {}; {}",
            self.path.display(),
            t.shards,
            if self.in_use { "IN USE by a running process (a snapshot of files being written)" } else { "not in use" },
            if self.verified { "checksums and event bodies verified" } else { "checksums verified" }
        )?;
        for w in &self.warnings {
            writeln!(f, "warning: {w}")?;
        }
        for s in &self.shards {
            let checkpoint = match &s.checkpoint {
                CheckpointState::None => "none".to_string(),
                CheckpointState::Ok { segment, offset } => format!("segment {segment} offset {offset}"),
                CheckpointState::Damaged { reason } => format!("damaged: {reason}"),
            };
            writeln!(
                f,
                "\nshard {}: checkpoint {checkpoint}; acked {} events ({} bytes), unacked {} events ({} bytes)",
                s.shard, s.acked_events, s.acked_bytes, s.unacked_events, s.unacked_bytes
            )?;
            writeln!(
                f,
                "  {:<24} {:>12} {:>12} {:>9} {:>9} {:>9} {:>7}",
                "segment", "file bytes", "live bytes", "frames", "acked", "unacked", "damaged"
            )?;
            for g in &s.segments {
                let name = g.file.file_name().map_or_else(|| g.id.to_string(), |n| n.to_string_lossy().into_owned());
                writeln!(
                    f,
                    "  {:<24} {:>12} {:>12} {:>9} {:>9} {:>9} {:>7}",
                    name,
                    g.file_bytes,
                    g.live_bytes,
                    g.frames,
                    g.acked_events,
                    g.unacked_events,
                    g.damage.len()
                )?;
            }
            if s.segments.is_empty() {
                writeln!(f, "  (no segments)")?;
            }
            if s.spare_files > 0 {
                writeln!(f, "  {} spare file(s) kept for reuse, {} bytes", s.spare_files, s.spare_bytes)?;
            }
            for w in &s.warnings {
                writeln!(f, "  warning: {w}")?;
            }
        }
        writeln!(
            f,
            "\ntotal: {} segment(s), {} file bytes, {} live bytes, {} frames; acked {} events ({} bytes), \
             unacked {} events ({} bytes); {} damaged; {} spare file(s), {} bytes",
            t.segments,
            t.file_bytes,
            t.live_bytes,
            t.frames,
            t.acked_events,
            t.acked_bytes,
            t.unacked_events,
            t.unacked_bytes,
            t.damaged,
            t.spare_files,
            t.spare_bytes
        )?;
        if t.damaged > 0 {
            writeln!(f, "damaged ({}):", t.damaged)?;
            for d in self.damage() {
                writeln!(
                    f,
                    "  {} offset {} ({} bytes{}): {}: {}",
                    d.file.display(),
                    d.offset,
                    d.bytes,
                    if d.acked { ", already acked" } else { "" },
                    d.kind.name(),
                    d.reason
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use sluice_core::{AckSet, Acker, Batch, Event, Queue, Value};
    use sluice_segment::{CODEC_EVENT, append_frame, encode_event};

    use super::super::{PersistedQueue, Settings, SyncPolicy};
    use super::*;

    fn settings(dir: &Path) -> Settings {
        Settings {
            path: dir.to_path_buf(),
            max_bytes: 64 << 20,
            // Smaller than one test batch: every batch gets a segment of its own.
            segment_bytes: 8 << 10,
            shards: 2,
            sync: SyncPolicy::None,
            sync_interval: Duration::from_millis(50),
            checkpoint_interval: Duration::from_millis(10),
            memory_bytes: 16 << 20,
            direct_io: true,
            stage_hold: super::super::writer::STAGE_HOLD,
        }
    }

    fn numbered(from: i64, n: i64) -> Vec<Event> {
        (from..from + n)
            .map(|i| {
                let mut e = Event::from_message_at(format!("event number {i}, padded to look like a log line"), i);
                e.fields.insert("n", Value::Int(i));
                e
            })
            .collect()
    }

    async fn push_durable(q: &PersistedQueue, events: Vec<Event>) {
        let n = events.len();
        let (acker, done) = Acker::with_notify(n);
        q.push(Batch::new(events, AckSet::single(acker, n), n * 80)).await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), done).await.unwrap().unwrap();
    }

    fn numbers(b: &Batch) -> Vec<i64> {
        b.events.iter().map(|e| if let Some(Value::Int(i)) = e.fields.get("n") { *i } else { panic!() }).collect()
    }

    /// Shard 0 gets events 0.., shard 1 events 1000..: three batches of 100 each (pushes
    /// alternate between shards), each in a segment of its own (ids 0, 100, 200). Then pops,
    /// acknowledging all but the last piece. Returns the events acknowledged per shard.
    async fn build_queue(dir: &Path) -> [u64; 2] {
        let q = PersistedQueue::new(settings(dir));
        q.start().await.unwrap();
        for b in 0..3 {
            push_durable(&q, numbered(b * 100, 100)).await;
            push_durable(&q, numbered(1000 + b * 100, 100)).await;
        }
        let mut acked = [0u64; 2];
        for (want, ack) in [(130, true), (60, true), (40, false)] {
            let b = q.pop(want, Duration::ZERO).await.unwrap();
            if ack {
                for n in numbers(&b) {
                    acked[usize::from(n >= 1000)] += 1;
                }
                b.complete();
            } else {
                std::mem::forget(b.acks); // taken, never handled
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await; // checkpoints
        let report = inspect(dir, false).unwrap();
        assert!(report.in_use, "the queue holds its lock while it runs");
        q.shutdown().await;
        acked
    }

    /// (offset, size) of every live frame of an intact segment file.
    fn frames(path: &Path) -> Vec<(usize, usize)> {
        let bytes = fs::read(path).unwrap();
        let mut next = SegmentHeader::decode(&bytes).unwrap().first_seq;
        let mut out = Vec::new();
        for r in FrameCursor::new(&bytes, SEGMENT_HEADER_LEN) {
            match r {
                FrameResult::Frame { offset, seq, body } if seq == next => {
                    out.push((offset, frame_size(body.len())));
                    next += 1;
                }
                _ => break, // unused room at the end of the active segment
            }
        }
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn inspect_counts_acked_and_unacked_events_per_shard() {
        let dir = tempfile::tempdir().unwrap();
        let acked = build_queue(dir.path()).await;
        assert_eq!(acked.iter().sum::<u64>(), 190);
        let before: BTreeMap<PathBuf, Vec<u8>> = walk(dir.path());

        for verify in [false, true] {
            let r = inspect(dir.path(), verify).unwrap();
            assert!(!r.in_use);
            assert_eq!(r.verified, verify);
            assert_eq!(r.shards.len(), 2);
            assert_eq!(r.totals.damaged, 0, "{r}");
            for (k, s) in r.shards.iter().enumerate() {
                // Segments wholly acknowledged are deleted (or kept as spares) by the checkpoint.
                let ids: Vec<u64> = s.segments.iter().map(|g| g.id).collect();
                let expect: Vec<u64> = [0, 100, 200].into_iter().filter(|id| id + 100 > acked[k]).collect();
                assert_eq!(ids, expect, "shard {k}:\n{r}");
                let deleted = 100 * (3 - expect.len() as u64);
                assert_eq!((s.acked_events, s.unacked_events), (acked[k] - deleted, 300 - acked[k]), "shard {k}:\n{r}");
                let CheckpointState::Ok { segment, offset } = s.checkpoint else { panic!("shard {k}: {r}") };
                let at = acked[k] as usize % 100;
                let seg = acked[k] / 100 * 100;
                let offsets = frames(&segment_path(&s.dir, seg));
                assert_eq!((segment, offset), (seg, offsets[at].0 as u64), "shard {k}");
                for g in &s.segments {
                    assert_eq!(g.frames, 100);
                    assert_eq!((g.first_seq, g.last_seq), (Some(g.id), Some(g.id + 99)));
                    // The active segment may have room left (zeros, or a reused file's old frames).
                    assert!(g.live_bytes == g.file_bytes || (g.id == 200 && g.live_bytes < g.file_bytes));
                    assert_eq!(g.acked_events + g.unacked_events, 100);
                }
                let frame_bytes: u64 = s.segments.iter().map(|g| g.live_bytes - SEGMENT_HEADER_LEN as u64).sum();
                assert_eq!(s.acked_bytes + s.unacked_bytes, frame_bytes);
            }
            let deleted = 100 * r.shards.iter().map(|s| 3 - s.segments.len() as u64).sum::<u64>();
            assert_eq!(r.totals.acked_events, 190 - deleted);
            assert_eq!(r.totals.unacked_events, 410);
            assert_eq!(r.totals.frames, 600 - deleted);
            let text = r.to_string();
            assert!(text.ends_with(" bytes\n") && !text.ends_with("\n\n"), "the last line ends once: {text:?}");
            assert!(text.contains(&format!("acked {} events", 190 - deleted)), "{text}");
            assert!(text.contains("unacked 410 events"), "{text}");
            let json = serde_json::to_value(&r).unwrap();
            assert_eq!(json["totals"]["unacked_events"], 410);
            // Every `*.free` file on disk, and nothing else, is reported as a spare.
            let spares: Vec<u64> = walk(dir.path())
                .iter()
                .filter(|(p, _)| p.to_str().unwrap().ends_with(".free"))
                .map(|(_, b)| b.len() as u64)
                .collect();
            assert!(!spares.is_empty(), "a wholly acknowledged segment is kept as a spare:\n{r}");
            assert_eq!(r.totals.spare_files, spares.len(), "{r}");
            assert_eq!(r.totals.spare_bytes, spares.iter().sum::<u64>(), "{r}");
            assert_eq!(r.shards.iter().map(|s| s.spare_files).sum::<usize>(), spares.len());
            assert!(text.contains(&format!("{} spare file(s)", spares.len())), "{text}");
            assert_eq!(json["shards"][0]["checkpoint"]["state"], "ok");
        }
        assert_eq!(walk(dir.path()), before, "inspect wrote nothing");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn verify_reports_exactly_a_flipped_byte_and_a_cut_segment() {
        let dir = tempfile::tempdir().unwrap();
        let acked = build_queue(dir.path()).await;
        assert!(acked[0] < 200 && acked[1] < 200, "segment 100 of shard 0 and 200 of shard 1 are unacked: {acked:?}");
        let shard = |k: usize| dir.path().join(format!("shard-{k}"));

        // Shard 1, segment 200 (unacknowledged): a byte in the body of its 10th frame.
        let flipped_file = segment_path(&shard(1), 200);
        let flipped = frames(&flipped_file)[10];
        let mut bytes = fs::read(&flipped_file).unwrap();
        bytes[flipped.0 + flipped.1 / 2] ^= 0x40;
        fs::write(&flipped_file, &bytes).unwrap();
        // Shard 0, segment 100 (not the last one): cut in the middle of its 60th frame.
        let cut_file = segment_path(&shard(0), 100);
        let cut = frames(&cut_file)[60];
        let f = fs::OpenOptions::new().write(true).open(&cut_file).unwrap();
        f.set_len((cut.0 + 7) as u64).unwrap();
        drop(f);

        let r = inspect(dir.path(), true).unwrap();
        let found: Vec<(PathBuf, u64, DamageKind)> = r.damage().map(|d| (d.file.clone(), d.offset, d.kind)).collect();
        assert_eq!(
            found,
            vec![
                (cut_file.clone(), cut.0 as u64, DamageKind::TornTail),
                (flipped_file.clone(), flipped.0 as u64, DamageKind::Corrupt)
            ],
            "{r}"
        );
        assert_eq!(r.totals.damaged, 2);
        // `sluice queue verify` prints this as it is: every line, the last one too, ends in a
        // newline.
        let text = r.to_string();
        assert!(text.ends_with('\n') && !text.ends_with("\n\n"), "{text:?}");
        assert!(text.lines().last().unwrap().contains(&format!("{} offset ", flipped_file.display())), "{text}");
        let corrupt = r.damage().find(|d| d.kind == DamageKind::Corrupt).unwrap();
        assert!(corrupt.reason.contains("checksum mismatch"), "{}", corrupt.reason);
        assert_eq!(corrupt.bytes, flipped.1 as u64);
        assert!(!corrupt.acked);
        let torn = r.damage().find(|d| d.kind == DamageKind::TornTail).unwrap();
        assert_eq!(torn.bytes, 7);
        assert!(torn.reason.contains("ends inside a frame"), "{}", torn.reason);

        let s0 = &r.shards[0];
        let g = s0.segments.iter().find(|g| g.id == 100).unwrap();
        assert_eq!((g.frames, g.live_bytes, g.last_seq), (60, cut.0 as u64, Some(159)));
        assert_eq!(s0.acked_events + s0.unacked_events, 100 * s0.segments.len() as u64 - 40);
        let s1 = &r.shards[1];
        let g = s1.segments.iter().find(|g| g.id == 200).unwrap();
        assert_eq!((g.frames, g.last_seq), (99, Some(299)));
        assert_eq!(s1.unacked_events, 300 - acked[1] - 1);

        let text = r.to_string();
        assert!(text.contains(&format!("{} offset {}", flipped_file.display(), flipped.0)), "{text}");
        assert!(text.contains(&format!("{} offset {}", cut_file.display(), cut.0)), "{text}");
        // Without verify the same damage is found: checksums are always checked.
        assert_eq!(inspect(dir.path(), false).unwrap().totals.damaged, 2);
    }

    /// A hand-made segment: header for `first_seq`, then frames with the given numbers (one
    /// event each, or `junk` bodies with good checksums).
    fn segment(first_seq: u64, seqs: &[u64], junk: bool) -> Vec<u8> {
        let mut out = SegmentHeader { codec: CODEC_EVENT, first_seq, ..Default::default() }.encode().to_vec();
        for &seq in seqs {
            append_frame(&mut out, seq, |body| {
                if junk {
                    body.extend_from_slice(&[0xff; 9]);
                } else {
                    encode_event(&Event::from_message_at(format!("frame {seq}"), seq as i64), body).unwrap();
                }
            })
            .unwrap();
        }
        out
    }

    #[test]
    fn stale_frames_of_a_reused_file_end_the_live_data() {
        let dir = tempfile::tempdir().unwrap();
        let shard = dir.path().join("shard-0");
        fs::create_dir(&shard).unwrap();
        let live = segment(500, &(500..510).collect::<Vec<_>>(), false);
        let mut bytes = live.clone();
        // The previous use's frames, and a partial one, after the live data.
        let old = segment(100, &(100..120).collect::<Vec<_>>(), false);
        bytes.extend_from_slice(&old[SEGMENT_HEADER_LEN + 40..]);
        fs::write(segment_path(&shard, 500), &bytes).unwrap();
        let r = inspect(dir.path(), true).unwrap();
        let g = &r.shards[0].segments[0];
        assert_eq!((g.frames, g.first_seq, g.last_seq), (10, Some(500), Some(509)));
        assert_eq!(g.live_bytes, live.len() as u64);
        assert_eq!(g.file_bytes, bytes.len() as u64);
        assert_eq!(r.totals.damaged, 0, "{r}");
        assert_eq!(r.shards[0].checkpoint, CheckpointState::None);
        assert_eq!(r.shards[0].unacked_events, 10);

        // A new segment written ahead with zeros: the zeros are room, not damage.
        let mut fresh = segment(0, &[0, 1, 2], false);
        let written = fresh.len();
        fresh.resize(64 << 10, 0);
        let shard = dir.path().join("shard-1");
        fs::create_dir(&shard).unwrap();
        fs::write(segment_path(&shard, 0), &fresh).unwrap();
        let r = inspect(dir.path(), true).unwrap();
        let g = &r.shards[1].segments[0];
        assert_eq!((g.frames, g.live_bytes, g.file_bytes), (3, written as u64, 64 << 10));
        assert_eq!(r.totals.damaged, 0, "{r}");
    }

    #[test]
    fn bad_header_undecodable_body_and_damaged_checkpoint_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let shard = dir.path().join("shard-0");
        fs::create_dir(&shard).unwrap();
        let mut first = segment(0, &[0, 1, 2], false);
        first[3] ^= 1; // magic
        fs::write(segment_path(&shard, 0), &first).unwrap();
        let mut second = segment(3, &[3, 4], false);
        let at = second.len();
        second.extend_from_slice(&segment(0, &[5], true)[SEGMENT_HEADER_LEN..]);
        fs::write(segment_path(&shard, 3), &second).unwrap();
        fs::write(shard.join("checkpoint"), b"not a checkpoint").unwrap();

        let r = inspect(dir.path(), true).unwrap();
        assert!(matches!(&r.shards[0].checkpoint, CheckpointState::Damaged { reason } if reason.contains("bytes")));
        let found: Vec<(u64, DamageKind)> = r.damage().map(|d| (d.offset, d.kind)).collect();
        assert_eq!(found, vec![(0, DamageKind::Header), (at as u64, DamageKind::Undecodable)], "{r}");
        assert_eq!(r.shards[0].unacked_events, 6, "frames are counted whatever their body");
        // Bodies are decoded only by verify.
        let stats = inspect(dir.path(), false).unwrap();
        assert_eq!(stats.damage().map(|d| d.kind).collect::<Vec<_>>(), vec![DamageKind::Header]);
    }

    #[test]
    fn a_directory_that_is_not_a_queue_is_refused_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let e = inspect(dir.path(), false).unwrap_err();
        assert!(e.to_string().contains(&dir.path().display().to_string()), "{e}");
        assert!(e.to_string().contains("not a persisted queue directory"), "{e}");
        let missing = dir.path().join("nope");
        let e = inspect(&missing, true).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert!(e.to_string().contains(&missing.display().to_string()), "{e}");
    }

    /// Every file under `dir` with its bytes.
    fn walk(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
        let mut out = BTreeMap::new();
        for entry in fs::read_dir(dir).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.insert(p.clone(), fs::read(&p).unwrap());
            }
        }
        out
    }
}
