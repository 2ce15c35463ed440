//! The writer of a DLQ directory: a thread that owns the open segment, groups concurrent writes
//! into one `write` (and one fsync with `sync: commit`), and runs the seal, sync and retention
//! timers. The index is updated by every change, so none of this lists the directory.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sluice_segment::{SEGMENT_HEADER_LEN, SegmentHeader, append_frame, frame_size};
use tokio::sync::oneshot;

use crate::entry::encode_entry;
use crate::naming;
use crate::segment;
use crate::shared::{Counters, Index, SegInfo, Shared, shared_for, sync_dir, try_lock};
use crate::{
    CODEC_DEAD_LETTER, DROP_LOG_INTERVAL, DeadLetter, DlqError, DlqOptions, DlqStats, DlqSync, Room, SegmentSummary,
    WriteOutcome,
};

const HEADER: u64 = SEGMENT_HEADER_LEN as u64;
/// How often retention is checked (and the drop log considered) when nothing else wakes the
/// writer.
const TICK: Duration = Duration::from_secs(1);

type Reply = oneshot::Sender<Result<WriteOutcome, DlqError>>;

enum Cmd {
    Write(Vec<DeadLetter>, Reply),
    /// Seal, sync and stop.
    Close(mpsc::Sender<Result<(), DlqError>>),
    /// Stop without sealing or syncing, as a crash would (tests).
    #[cfg(test)]
    Abandon(mpsc::Sender<()>),
}

/// The writer of one DLQ directory. Share it with `Arc`; one per directory in a process (and,
/// through a `flock` on `lock`, across processes).
pub struct DeadLetterQueue {
    shared: Arc<Shared>,
    opts: DlqOptions,
    tx: Mutex<Option<mpsc::Sender<Cmd>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    lock: Mutex<Option<File>>,
}

impl std::fmt::Debug for DeadLetterQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadLetterQueue").field("dir", &self.shared.dir).finish_non_exhaustive()
    }
}

impl DeadLetterQueue {
    /// Opens (creating) `dir` for writing. One directory read builds the index; a segment a
    /// crash left open is scanned, its torn tail cut, and sealed.
    pub fn open(dir: &Path, opts: DlqOptions) -> Result<Arc<DeadLetterQueue>, DlqError> {
        opts.validate()?;
        fs::create_dir_all(dir).map_err(|e| DlqError::io(dir, e))?;
        let shared = shared_for(dir).map_err(|e| DlqError::io(dir, e))?;
        let dir = shared.dir.clone();
        let lock = lock_dir(&dir)?;
        let (next_id, last_id_mark) = {
            // Held through the build, so a reader deleting consumed segments either finishes
            // before the directory is read or goes through the index after.
            let mut ix = shared.index.lock();
            if ix.attached {
                return Err(DlqError::AlreadyOpen(dir));
            }
            let (next_id, last_id_mark) = build_index(&shared, &mut ix, opts.sync != DlqSync::None)?;
            ix.attached = true;
            ix.next_id = next_id;
            (next_id, last_id_mark)
        };
        let (tx, rx) = mpsc::channel();
        let writer = Writer::new(shared.clone(), opts.clone(), next_id, last_id_mark);
        let thread = std::thread::Builder::new()
            .name("sluice-dlq".into())
            .spawn(move || writer.run(rx))
            .map_err(|e| DlqError::io(&dir, e));
        let thread = match thread {
            Ok(t) => t,
            Err(e) => {
                shared.index.lock().attached = false;
                return Err(e);
            }
        };
        shared.bump();
        Ok(Arc::new(DeadLetterQueue {
            shared,
            opts,
            tx: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            lock: Mutex::new(Some(lock)),
        }))
    }

    /// The directory, canonical.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Stores `entries` and returns once they are durable as `sync` asks. Entries the size
    /// policy rejects (or that cannot be encoded) are counted in the outcome and in the stats.
    /// The file work happens on the writer thread; this only waits for it.
    pub async fn write(&self, entries: Vec<DeadLetter>) -> Result<WriteOutcome, DlqError> {
        if entries.is_empty() {
            return Ok(WriteOutcome::default());
        }
        let (reply, rx) = oneshot::channel();
        {
            let tx = self.tx.lock();
            let tx = tx.as_ref().ok_or_else(|| DlqError::Closed(self.shared.dir.clone()))?;
            tx.send(Cmd::Write(entries, reply)).map_err(|_| DlqError::Closed(self.shared.dir.clone()))?;
        }
        rx.await.map_err(|_| DlqError::Closed(self.shared.dir.clone()))?
    }

    pub fn stats(&self) -> DlqStats {
        self.shared.stats()
    }

    /// The oldest segment, from the index (no file system access).
    pub fn oldest_segment(&self) -> Option<SegmentSummary> {
        self.shared.index.lock().segments.first_key_value().map(|(id, s)| SegmentSummary::new(*id, s))
    }

    /// The newest segment (the open one, if any), from the index.
    pub fn newest_segment(&self) -> Option<SegmentSummary> {
        self.shared.index.lock().segments.last_key_value().map(|(id, s)| SegmentSummary::new(*id, s))
    }

    /// What the size policy would decide now for an entry taking `frame_bytes` on disk (the
    /// same decision the writer makes, made from the index alone).
    pub fn room_for(&self, frame_bytes: u64) -> Room {
        let ix = self.shared.index.lock();
        let open = ix.segments.last_key_value().filter(|(_, s)| !s.sealed).map(|(id, _)| *id);
        ix.room(frame_bytes, self.opts.max_bytes, self.opts.storage_policy, open)
    }

    /// Seals the open segment, fsyncs, stops the writer thread and releases the directory.
    /// Idempotent; later writes fail with [`DlqError::Closed`]. Blocks until the writer is done
    /// (call it from a blocking context or at shutdown).
    pub fn close(&self) -> Result<(), DlqError> {
        let Some(tx) = self.tx.lock().take() else { return Ok(()) };
        let (done, result) = mpsc::channel();
        let outcome = match tx.send(Cmd::Close(done)) {
            Ok(()) => result.recv().unwrap_or(Ok(())),
            Err(_) => Ok(()),
        };
        self.detach();
        outcome
    }

    /// Stops the writer as a crash would: nothing sealed, nothing synced.
    #[cfg(test)]
    pub(crate) fn crash(&self) {
        let Some(tx) = self.tx.lock().take() else { return };
        let (done, result) = mpsc::channel();
        if tx.send(Cmd::Abandon(done)).is_ok() {
            let _ = result.recv();
        }
        self.detach();
    }

    fn detach(&self) {
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
        self.shared.index.lock().attached = false;
        self.lock.lock().take();
        self.shared.bump();
    }
}

impl Drop for DeadLetterQueue {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::error!(dir = %self.shared.dir.display(), error = %e, "closing the dead letter queue failed");
        }
    }
}

fn lock_dir(dir: &Path) -> Result<File, DlqError> {
    try_lock(dir)?.ok_or_else(|| DlqError::AlreadyOpen(dir.to_path_buf()))
}

/// One directory read: sealed segments from their names; segments left open are recovered
/// (torn tail cut) and sealed, or deleted when they hold no entry. Returns the next segment id.
/// Returns the next segment id and the high-water mark file's id.
fn build_index(shared: &Shared, ix: &mut Index, durable: bool) -> Result<(u64, Option<u64>), DlqError> {
    let dir = &shared.dir;
    let listing = naming::list(dir).map_err(|e| DlqError::io(dir, e))?;
    for id in &listing.shadowed {
        tracing::warn!(dir = %dir.display(), segment = id,
            "a sealed segment and an open one share id {id}; the open one is ignored");
    }
    let highest = listing.highest_id();
    let mut last_ids = listing.last_ids.clone();
    last_ids.sort_unstable();
    let mut changed = false;
    // Extra marks (a crash between creating one and removing the old one) are merged.
    while last_ids.len() > 1 {
        let stale = dir.join(naming::last_id_name(last_ids.remove(0)));
        fs::remove_file(&stale).or_else(ignore_not_found).map_err(|e| DlqError::io(stale, e))?;
        changed = true;
    }
    let mut segments = Vec::with_capacity(listing.segments.len());
    for (id, summary) in listing.segments {
        match summary {
            Some(s) => segments.push((id, SegInfo::from_summary(&s))),
            None => {
                changed = true;
                if let Some(info) = recover_open(shared, id, durable)? {
                    segments.push((id, info));
                }
            }
        }
    }
    // Sorted input: the map is built in bulk.
    *ix = Index::from_sorted(segments);
    if durable && changed {
        sync_dir(dir).map_err(|e| DlqError::io(dir, e))?;
    }
    Ok((highest + 1, last_ids.pop()))
}

/// Scans a segment a crash left open: cuts a torn tail, then seals it (renames it with its
/// summary) or deletes it when it holds no entry. A segment with an unusable header is renamed
/// `<name>.damaged` and left for a person to look at.
fn recover_open(shared: &Shared, id: u64, durable: bool) -> Result<Option<SegInfo>, DlqError> {
    let dir = &shared.dir;
    let path = dir.join(naming::open_name(id));
    let io_err = |e| DlqError::io(&path, e);
    let scanned = segment::scan(&path, id).map_err(io_err)?;
    if let Some(reason) = &scanned.bad_header {
        if scanned.file_len <= HEADER {
            // Created but never written: a crash between creating the file and its header.
            fs::remove_file(&path).map_err(io_err)?;
            return Ok(None);
        }
        if scanned.summary.is_none() {
            // Not a single entry of this segment in it: leave it for a person to look at.
            let damaged = dir.join(format!("{}.damaged", naming::open_name(id)));
            tracing::error!(segment = %path.display(), reason, renamed_to = %damaged.display(),
                "dead letter segment has an unusable header and no readable entry; set aside");
            fs::rename(&path, &damaged).map_err(io_err)?;
            return Ok(None);
        }
        // Its frames are intact: give it a good header again.
        tracing::error!(segment = %path.display(), reason, "dead letter segment header damaged; rewritten");
        let f = OpenOptions::new().write(true).open(&path).map_err(io_err)?;
        f.write_all_at(&segment_header(id).encode(), 0).map_err(io_err)?;
    }
    for (offset, reason) in &scanned.damaged {
        Counters::add(&shared.counters.corrupt_frames, 1);
        tracing::error!(segment = %path.display(), offset, reason, "damaged dead letter frame found in recovery");
    }
    if scanned.valid_len < scanned.file_len {
        tracing::warn!(segment = %path.display(), valid_bytes = scanned.valid_len, file_bytes = scanned.file_len,
            "dead letter segment ends in a torn frame (a crash mid-write); cutting it there");
        segment::truncate(&path, scanned.valid_len).map_err(io_err)?;
    }
    let Some(summary) = scanned.summary else {
        fs::remove_file(&path).map_err(io_err)?;
        return Ok(None);
    };
    if durable {
        File::open(&path).and_then(|f| f.sync_all()).map_err(io_err)?;
    }
    let sealed = dir.join(naming::sealed_name(id, &summary));
    fs::rename(&path, &sealed).map_err(io_err)?;
    Ok(Some(SegInfo::from_summary(&summary)))
}

/// The segment being written.
struct Open {
    id: u64,
    file: File,
    /// Written and recorded in the index.
    info: SegInfo,
    /// Appended to the writer's buffer, not written yet.
    buffered_entries: u64,
    buffered_oldest: i64,
    buffered_newest: i64,
}

impl Open {
    fn entries(&self) -> u64 {
        self.info.entries + self.buffered_entries
    }
}

/// Counts not yet logged.
#[derive(Default)]
struct Unlogged {
    dropped_newer: u64,
    dropped_older: u64,
    expired: u64,
    unencodable: u64,
    too_large: u64,
}

struct Writer {
    shared: Arc<Shared>,
    opts: DlqOptions,
    next_id: u64,
    /// The id the high-water mark file records.
    last_id_mark: Option<u64>,
    open: Option<Open>,
    buf: Vec<u8>,
    body: Vec<u8>,
    last_write: Instant,
    last_sync: Instant,
    unsynced: bool,
    last_tick: Instant,
    last_log: Instant,
    unlogged: Unlogged,
    /// Entries were refused for room since the last tick: check that the oldest segments
    /// still exist (someone may have deleted files by hand to make room).
    refused_since_tick: bool,
}

impl Writer {
    fn new(shared: Arc<Shared>, opts: DlqOptions, next_id: u64, last_id_mark: Option<u64>) -> Writer {
        let now = Instant::now();
        Writer {
            shared,
            opts,
            next_id,
            last_id_mark,
            open: None,
            buf: Vec::with_capacity(1 << 20),
            body: Vec::with_capacity(4096),
            last_write: now,
            last_sync: now,
            unsynced: false,
            last_tick: now,
            last_log: now,
            unlogged: Unlogged::default(),
            refused_since_tick: false,
        }
    }

    fn dir(&self) -> &Path {
        &self.shared.dir
    }

    fn durable(&self) -> bool {
        self.opts.sync != DlqSync::None
    }

    fn run(mut self, rx: mpsc::Receiver<Cmd>) {
        let mut group: Vec<(Vec<DeadLetter>, Reply)> = Vec::new();
        loop {
            let cmd = match rx.recv_timeout(self.next_wake()) {
                Ok(cmd) => Some(cmd),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => Some(Cmd::Close(mpsc::channel().0)),
            };
            let mut stop = None;
            if let Some(cmd) = cmd {
                let mut next = Some(cmd);
                while let Some(cmd) = next.take() {
                    match cmd {
                        Cmd::Write(entries, reply) => group.push((entries, reply)),
                        other => {
                            stop = Some(other);
                            break;
                        }
                    }
                    next = rx.try_recv().ok();
                }
            }
            if !group.is_empty() {
                self.write_group(&mut group);
            }
            self.timers();
            match stop {
                None => {}
                Some(Cmd::Close(done)) => {
                    let result = self.close();
                    self.log_drops(true);
                    let _ = done.send(result);
                    return;
                }
                #[cfg(test)]
                Some(Cmd::Abandon(done)) => {
                    let _ = done.send(());
                    return;
                }
                Some(Cmd::Write(..)) => unreachable!("writes are grouped above"),
            }
        }
    }

    /// How long the writer may sleep: until the next sync, seal or tick.
    fn next_wake(&self) -> Duration {
        let now = Instant::now();
        let mut due = self.last_tick + TICK;
        if let (DlqSync::Interval(every), true) = (self.opts.sync, self.unsynced) {
            due = due.min(self.last_sync + every);
        }
        if self.open.is_some() {
            due = due.min(self.last_write + self.opts.seal_idle);
        }
        due.saturating_duration_since(now)
    }

    fn timers(&mut self) {
        let now = Instant::now();
        if let (DlqSync::Interval(every), true) = (self.opts.sync, self.unsynced)
            && now >= self.last_sync + every
            && let Err(e) = self.sync()
        {
            tracing::error!(dir = %self.dir().display(), error = %e, "dead letter queue fsync failed");
        }
        if self.open.is_some()
            && now >= self.last_write + self.opts.seal_idle
            && let Err(e) = self.seal()
        {
            tracing::error!(dir = %self.dir().display(), error = %e, "sealing the idle dead letter segment failed");
            // Try again after another idle period, not in a loop.
            self.last_write = now;
        }
        if now >= self.last_tick + TICK {
            self.last_tick = now;
            self.expire(sluice_core::value::now_nanos());
            if std::mem::take(&mut self.refused_since_tick) {
                self.forget_missing_oldest();
            }
            self.log_drops(false);
        }
    }

    fn write_group(&mut self, group: &mut Vec<(Vec<DeadLetter>, Reply)>) {
        let mut outcomes = Vec::with_capacity(group.len());
        let mut failure = None;
        'group: for (entries, _) in group.iter() {
            let mut outcome = WriteOutcome::default();
            for entry in entries {
                match self.append(entry) {
                    Ok(true) => outcome.written += 1,
                    Ok(false) => outcome.dropped += 1,
                    Err(e) => {
                        failure = Some(e);
                        break 'group;
                    }
                }
            }
            outcomes.push(outcome);
        }
        if failure.is_none() {
            failure = self.flush().err();
        }
        if failure.is_none() && self.opts.sync == DlqSync::Commit {
            failure = self.sync().err();
        }
        if let Some(e) = &failure {
            self.discard_buffer();
            tracing::error!(dir = %self.dir().display(), error = %e, "dead letter queue write failed");
        }
        self.last_write = Instant::now();
        self.shared.bump();
        for (i, (_, reply)) in group.drain(..).enumerate() {
            let result = match &failure {
                None => Ok(outcomes[i]),
                Some(e) => Err(copy_error(e)),
            };
            let _ = reply.send(result);
        }
    }

    /// Buffers one entry, sealing and making room first as needed. False if it was dropped.
    fn append(&mut self, entry: &DeadLetter) -> Result<bool, DlqError> {
        self.body.clear();
        if let Err(e) = encode_entry(entry, &mut self.body) {
            Counters::add(&self.shared.counters.unencodable, 1);
            self.unlogged.unencodable += 1;
            tracing::debug!(plugin_id = %entry.plugin_id, error = %e, "dead letter entry cannot be encoded");
            return Ok(false);
        }
        let frame = frame_size(self.body.len()) as u64;
        if let Some(open) = &self.open
            && open.entries() > 0
            && open.info.bytes + self.buf.len() as u64 + frame > self.opts.segment_bytes
        {
            self.seal()?;
        }
        if HEADER + frame > self.opts.max_bytes {
            Counters::add(&self.shared.counters.dropped_newer, 1);
            self.unlogged.too_large += 1;
            return Ok(false);
        }
        loop {
            let header = if self.open.is_none() { HEADER } else { 0 };
            let need = self.buf.len() as u64 + header + frame;
            let open_id = self.open.as_ref().map(|o| o.id);
            let room = self.shared.index.lock().room(need, self.opts.max_bytes, self.opts.storage_policy, open_id);
            match room {
                Room::Fits => break,
                Room::Reject => {
                    Counters::add(&self.shared.counters.dropped_newer, 1);
                    self.unlogged.dropped_newer += 1;
                    self.refused_since_tick = true;
                    return Ok(false);
                }
                Room::EvictOldest(id) => self.evict(id),
                // Only the open segment is left: seal it so the next round evicts it.
                Room::SealOpen if self.open.is_some() => self.seal()?,
                Room::SealOpen => {
                    // Nothing left to evict and still no room: only an entry larger than
                    // max_bytes gets here, which the check above already refuses.
                    Counters::add(&self.shared.counters.dropped_newer, 1);
                    self.unlogged.too_large += 1;
                    return Ok(false);
                }
            }
        }
        if self.open.is_none() {
            self.create_segment()?;
        }
        let open = self.open.as_mut().expect("an open segment");
        let seq = open.id << 32 | open.entries();
        let body = &self.body;
        append_frame(&mut self.buf, seq, |b| b.extend_from_slice(body)).map_err(|e| {
            DlqError::io(self.shared.dir.clone(), io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))
        })?;
        open.buffered_entries += 1;
        open.buffered_oldest = open.buffered_oldest.min(entry.time);
        open.buffered_newest = open.buffered_newest.max(entry.time);
        Ok(true)
    }

    /// Deletes a sealed segment to make room.
    fn evict(&mut self, id: u64) {
        let Some(info) = self.shared.index.lock().remove(id) else { return };
        Counters::add(&self.shared.counters.dropped_older, info.entries);
        self.unlogged.dropped_older += info.entries;
        self.delete_file(id, &info);
    }

    /// Deletes retired segments from the oldest on while their newest entry is older than
    /// `retain_age`.
    fn expire(&mut self, now_nanos: i64) {
        let Some(age) = self.opts.retain_age else { return };
        let cutoff = now_nanos.saturating_sub(age.as_nanos().min(i64::MAX as u128) as i64);
        loop {
            let open_id = self.open.as_ref().map(|o| o.id);
            let first = self.shared.index.lock().segments.first_key_value().map(|(id, s)| (*id, *s));
            let Some((id, info)) = first else { return };
            if info.entries > 0 && info.newest >= cutoff {
                return;
            }
            if info.entries == 0 && Some(id) == open_id {
                return;
            }
            if Some(id) == open_id {
                if self.open.as_ref().is_some_and(|o| o.buffered_entries > 0) {
                    return;
                }
                if let Err(e) = self.seal() {
                    tracing::error!(dir = %self.dir().display(), error = %e, "sealing an expired dead letter segment failed");
                    return;
                }
                continue;
            }
            let Some(info) = self.shared.index.lock().remove(id) else { continue };
            Counters::add(&self.shared.counters.expired, info.entries);
            self.unlogged.expired += info.entries;
            self.delete_file(id, &info);
        }
    }

    /// While the DLQ refuses entries for room: drops from the index the oldest sealed segments
    /// whose files are gone (deleted by hand), one `stat` each, stopping at the first that
    /// exists. At most once per tick and only while full, so the write path and the size
    /// policy still never look at the directory.
    fn forget_missing_oldest(&mut self) {
        loop {
            let first = self.shared.index.lock().segments.first_key_value().map(|(id, s)| (*id, *s));
            let Some((id, info)) = first else { return };
            if !info.sealed {
                return;
            }
            let path = self.shared.path_of(id, &info);
            match fs::symlink_metadata(&path) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    tracing::warn!(segment = %path.display(), entries = info.entries,
                        "dead letter segment deleted by someone else; no longer counted");
                    self.shared.index.lock().remove(id);
                }
                _ => return,
            }
        }
    }

    /// Removes a segment's file (already out of the index). A file already gone is only logged:
    /// the index no longer counts it either way.
    fn delete_file(&self, id: u64, info: &SegInfo) {
        let path = self.shared.path_of(id, info);
        match fs::remove_file(&path) {
            // A reader following at the end of this segment holds it open: woken now, it finds
            // the segment gone from the index and closes it, so its space returns at once.
            Ok(()) => self.shared.bump(),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                tracing::warn!(segment = %path.display(), "dead letter segment was already deleted");
            }
            Err(e) => {
                tracing::error!(segment = %path.display(), error = %e, "deleting a dead letter segment failed");
            }
        }
    }

    fn create_segment(&mut self) -> Result<(), DlqError> {
        let id = self.next_id;
        if id > u32::MAX as u64 {
            return Err(DlqError::SegmentIdsExhausted(self.shared.dir.clone()));
        }
        let path = self.dir().join(naming::open_name(id));
        let mark = self.dir().join(naming::last_id_name(id));
        let created = (|| {
            // The mark first: a segment id is never in use before it is recorded. The
            // directory fsync below makes both durable.
            match self.last_id_mark {
                Some(old) => fs::rename(self.dir().join(naming::last_id_name(old)), &mark).or_else(|e| {
                    if e.kind() == io::ErrorKind::NotFound { File::create(&mark).map(drop) } else { Err(e) }
                })?,
                None => File::create(&mark).map(drop)?,
            }
            let file = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path)?;
            file.write_all_at(&segment_header(id).encode(), 0)?;
            if self.durable() {
                file.sync_all()?;
                sync_dir(self.dir())?;
            }
            Ok(file)
        })();
        let file = match created {
            Ok(f) => f,
            Err(e) => {
                let _ = fs::remove_file(&path);
                return Err(DlqError::io(path, e));
            }
        };
        self.next_id += 1;
        self.last_id_mark = Some(id);
        self.shared.index.lock().next_id = self.next_id;
        let info = SegInfo { bytes: HEADER, entries: 0, oldest: i64::MAX, newest: i64::MIN, sealed: false };
        self.shared.index.lock().insert(id, info);
        self.open =
            Some(Open { id, file, info, buffered_entries: 0, buffered_oldest: i64::MAX, buffered_newest: i64::MIN });
        Ok(())
    }

    /// Writes the buffer to the open segment and records it in the index.
    fn flush(&mut self) -> Result<(), DlqError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let injected = self.injected_failure(false);
        let Some(open) = self.open.as_mut() else { return Ok(()) };
        let path = self.shared.dir.join(naming::open_name(open.id));
        let written = match injected {
            Some(e) => open.file.write_all_at(&self.buf[..self.buf.len() / 2], open.info.bytes).and(Err(e)),
            None => open.file.write_all_at(&self.buf, open.info.bytes),
        };
        if let Err(e) = written {
            // Never leave a partial frame behind.
            let _ = open.file.set_len(open.info.bytes);
            return Err(DlqError::io(path, e));
        }
        open.info.bytes += self.buf.len() as u64;
        open.info.entries += open.buffered_entries;
        open.info.oldest = open.info.oldest.min(open.buffered_oldest);
        open.info.newest = open.info.newest.max(open.buffered_newest);
        Counters::add(&self.shared.counters.written, open.buffered_entries);
        open.buffered_entries = 0;
        open.buffered_oldest = i64::MAX;
        open.buffered_newest = i64::MIN;
        self.buf.clear();
        self.unsynced = true;
        let mut ix = self.shared.index.lock();
        if ix.segments.contains_key(&open.id) {
            ix.insert(open.id, open.info);
        }
        Ok(())
    }

    /// A failure a test asked for (`Shared::fail_writes`, or `fail_syncs` for an fsync); never
    /// outside tests.
    fn injected_failure(&self, sync: bool) -> Option<io::Error> {
        #[cfg(test)]
        {
            use std::sync::atomic::Ordering;
            let s = &self.shared;
            let count = if sync { &s.fail_syncs } else { &s.fail_writes };
            if count.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
                return Some(io::Error::from_raw_os_error(s.fail_errno.load(Ordering::SeqCst)));
            }
        }
        #[cfg(not(test))]
        let _ = sync;
        None
    }

    fn discard_buffer(&mut self) {
        self.buf.clear();
        if let Some(open) = self.open.as_mut() {
            open.buffered_entries = 0;
            open.buffered_oldest = i64::MAX;
            open.buffered_newest = i64::MIN;
        }
    }

    fn sync(&mut self) -> Result<(), DlqError> {
        self.last_sync = Instant::now();
        if !self.unsynced {
            return Ok(());
        }
        if let Some(open) = &self.open {
            let synced = match self.injected_failure(true) {
                Some(e) => Err(e),
                None => open.file.sync_data(),
            };
            synced.map_err(|e| DlqError::io(self.dir().join(naming::open_name(open.id)), e))?;
        }
        self.unsynced = false;
        Ok(())
    }

    /// Seals the open segment: flushes, fsyncs, renames it with its summary, fsyncs the
    /// directory. An empty segment is deleted instead.
    fn seal(&mut self) -> Result<(), DlqError> {
        self.flush()?;
        let Some(open) = self.open.take() else { return Ok(()) };
        let path = self.dir().join(naming::open_name(open.id));
        if open.info.entries == 0 {
            self.shared.index.lock().remove(open.id);
            drop(open.file);
            return fs::remove_file(&path).or_else(ignore_not_found).map_err(|e| DlqError::io(path, e));
        }
        let durable = self.durable();
        if durable && let Err(e) = open.file.sync_all() {
            self.open = Some(open);
            return Err(DlqError::io(path, e));
        }
        self.unsynced = false;
        let sealed_info = SegInfo { sealed: true, ..open.info };
        let sealed_path = self.shared.path_of(open.id, &sealed_info);
        match fs::rename(&path, &sealed_path) {
            Ok(()) => {
                let mut ix = self.shared.index.lock();
                if ix.segments.contains_key(&open.id) {
                    ix.insert(open.id, sealed_info);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                tracing::warn!(segment = %path.display(), "the open dead letter segment was deleted by someone else");
                self.shared.index.lock().remove(open.id);
            }
            Err(e) => {
                // Left open on disk; the next start-up recovers and seals it. Readers treat it
                // as complete because a later segment follows.
                tracing::error!(segment = %path.display(), error = %e, "renaming a sealed dead letter segment failed");
                return Err(DlqError::io(path, e));
            }
        }
        if durable {
            sync_dir(self.dir()).map_err(|e| DlqError::io(self.dir(), e))?;
        }
        self.shared.bump();
        Ok(())
    }

    fn close(&mut self) -> Result<(), DlqError> {
        self.seal()?;
        self.sync()
    }

    fn log_drops(&mut self, force: bool) {
        if !force && self.last_log.elapsed() < DROP_LOG_INTERVAL {
            return;
        }
        let u = std::mem::take(&mut self.unlogged);
        self.last_log = Instant::now();
        let dir = self.shared.dir.display();
        if u.dropped_newer > 0 {
            tracing::warn!(dir = %dir, dropped = u.dropped_newer, max_bytes = self.opts.max_bytes,
                "dead letter queue full (storage_policy: drop_newer): new entries dropped");
        }
        if u.too_large > 0 {
            tracing::warn!(dir = %dir, dropped = u.too_large, max_bytes = self.opts.max_bytes,
                "dead letter entries larger than max_bytes dropped");
        }
        if u.dropped_older > 0 {
            tracing::warn!(dir = %dir, dropped = u.dropped_older, max_bytes = self.opts.max_bytes,
                "dead letter queue full (storage_policy: drop_older): oldest entries deleted");
        }
        if u.expired > 0 {
            tracing::info!(dir = %dir, expired = u.expired, "dead letter entries older than retain_age deleted");
        }
        if u.unencodable > 0 {
            tracing::error!(dir = %dir, dropped = u.unencodable,
                "dead letter entries whose event cannot be encoded (nested too deep) dropped");
        }
    }
}

fn segment_header(id: u64) -> SegmentHeader {
    SegmentHeader {
        codec: CODEC_DEAD_LETTER,
        first_seq: id << 32,
        created_unix_nanos: sluice_core::value::now_nanos(),
        ..Default::default()
    }
}

fn ignore_not_found(e: io::Error) -> io::Result<()> {
    if e.kind() == io::ErrorKind::NotFound { Ok(()) } else { Err(e) }
}

/// The same error for every write of a failed group.
fn copy_error(e: &DlqError) -> DlqError {
    match e {
        DlqError::Io { path, source } => {
            DlqError::Io { path: path.clone(), source: io::Error::new(source.kind(), source.to_string()) }
        }
        DlqError::AlreadyOpen(p) => DlqError::AlreadyOpen(p.clone()),
        DlqError::Closed(p) => DlqError::Closed(p.clone()),
        DlqError::InvalidOptions(s) => DlqError::InvalidOptions(s.clone()),
        DlqError::SegmentIdsExhausted(p) => DlqError::SegmentIdsExhausted(p.clone()),
    }
}
