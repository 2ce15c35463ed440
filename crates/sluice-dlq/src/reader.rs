//! Reading a DLQ: a synchronous cursor over the segments (shared with [`crate::inspect`]) and the
//! async [`DlqReader`] that follows a writer of the same process.
//!
//! Segments are found through the writer's index while a writer of this process has the
//! directory, and through the directory itself otherwise (offline); the cursor reads a segment
//! up to what the writer has written, so it never sees half a write.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sluice_segment::{EventDecoder, SEGMENT_HEADER_LEN};
use tokio::sync::watch;

use crate::entry::decode_entry_with;
use crate::naming::{self, Summary};
use crate::segment::{HeaderState, Next, SegmentFile};
use crate::shared::{Counters, Shared, shared_for, sync_dir};
use crate::{DeadLetter, DlqError, Position, ReadFrom};

/// How often a reader with no writer in this process looks for new entries when following.
const OFFLINE_POLL: Duration = Duration::from_millis(500);
/// A following reader re-checks this often even without a wake-up, as a safety net.
const FOLLOW_RECHECK: Duration = Duration::from_secs(1);

/// One thing a cursor found.
#[derive(Debug)]
pub(crate) enum Item {
    /// An entry, the position just after it, and the offset its frame starts at.
    Entry(DeadLetter, Position, u64),
    Damaged {
        segment: u64,
        path: PathBuf,
        offset: u64,
        reason: String,
    },
}

/// How much of the current segment can be read.
struct Extent {
    /// Readable length; `None`: the file's length.
    limit: Option<u64>,
    /// Nothing more will be appended (sealed, or a later segment exists).
    complete: bool,
}

/// A segment found by [`Cursor::locate`].
struct View {
    path: PathBuf,
    /// Nothing more will be appended (sealed, or a later segment exists).
    complete: bool,
}

pub(crate) struct Cursor {
    shared: Arc<Shared>,
    /// Where the next read starts; the segment may not exist (then the next one that does).
    pos: Position,
    /// Entries before the first one at or after this time are skipped.
    from_time: Option<i64>,
    cur: Option<(SegmentFile, PathBuf)>,
    decoder: EventDecoder,
    /// The directory as last listed, when no writer of this process has it.
    listing: Option<Vec<(u64, Option<Summary>)>>,
    /// The path of the segment read last, for reporting damage found as it finished.
    last_path: PathBuf,
}

impl Cursor {
    pub fn open(dir: &Path, from: ReadFrom) -> Result<Cursor, DlqError> {
        let shared = shared_for(dir).map_err(|e| DlqError::io(dir, e))?;
        let (mut pos, from_time) = match from {
            ReadFrom::Beginning => (Position::default(), None),
            ReadFrom::Time(t) => (Position::default(), Some(t)),
            ReadFrom::Position(p) => (p, None),
        };
        if pos.segment > 0 {
            // A position past every segment id this directory has used is from another life
            // of it (deleted and re-created): reading from there would skip everything.
            let attached = {
                let ix = shared.index.lock();
                ix.attached.then(|| ix.next_id.saturating_sub(1))
            };
            let highest = match attached {
                Some(h) => h,
                None => naming::list(&shared.dir).map_err(|e| DlqError::io(&shared.dir, e))?.highest_id(),
            };
            if pos.segment > highest {
                tracing::warn!(dir = %shared.dir.display(), segment = pos.segment, highest_segment = highest,
                    "dead letter queue position is past every segment this directory has had; reading from the beginning");
                pos = Position::default();
            }
        }
        Ok(Cursor {
            shared,
            pos,
            from_time,
            cur: None,
            decoder: EventDecoder::new(),
            listing: None,
            last_path: PathBuf::new(),
        })
    }

    fn list(&mut self) -> Result<&[(u64, Option<Summary>)], DlqError> {
        let dir = &self.shared.dir;
        let listing = naming::list(dir).map_err(|e| DlqError::io(dir, e))?;
        Ok(self.listing.insert(listing.segments))
    }

    /// The first segment with id ≥ `min_id` worth reading, and how it looks.
    fn locate(&mut self, min_id: u64) -> Result<Option<(u64, View)>, DlqError> {
        let skip_before = self.from_time;
        let old = |newest: Option<i64>, complete: bool| complete && skip_before.zip(newest).is_some_and(|(t, n)| n < t);
        {
            let ix = self.shared.index.lock();
            if ix.attached {
                let mut range = ix.segments.range(min_id..).peekable();
                while let Some((&id, info)) = range.next() {
                    let complete = info.sealed || range.peek().is_some();
                    let newest = (info.entries > 0).then_some(info.newest);
                    if old(newest, complete) {
                        continue;
                    }
                    let path = self.shared.path_of(id, info);
                    return Ok(Some((id, View { path, complete })));
                }
                return Ok(None);
            }
        }
        for refresh in [false, true] {
            if refresh || self.listing.is_none() {
                self.list()?;
            }
            let listing = self.listing.as_deref().unwrap_or_default();
            let start = listing.partition_point(|(id, _)| *id < min_id);
            for (i, (id, summary)) in listing.iter().enumerate().skip(start) {
                let complete = summary.is_some() || i + 1 < listing.len();
                let newest = summary.map(|s| s.newest);
                if old(newest, complete) {
                    continue;
                }
                let path = naming::path_of(&self.shared.dir, *id, summary.as_ref());
                return Ok(Some((*id, View { path, complete })));
            }
        }
        Ok(None)
    }

    /// The current segment's readable limit and completeness, re-read (re-listing the
    /// directory when offline and `refresh`).
    fn view(&mut self, id: u64, refresh: bool) -> Result<Extent, DlqError> {
        {
            let ix = self.shared.index.lock();
            if ix.attached {
                // Gone from the index (deleted while we read it): what the open file holds is all.
                return Ok(match ix.segments.get(&id) {
                    Some(info) => Extent {
                        limit: Some(info.bytes),
                        complete: info.sealed || ix.segments.range(id + 1..).next().is_some(),
                    },
                    None => Extent { limit: None, complete: true },
                });
            }
        }
        if refresh || self.listing.is_none() {
            self.list()?;
        }
        let listing = self.listing.as_deref().unwrap_or_default();
        let at = listing.partition_point(|(i, _)| *i < id);
        let complete = match listing.get(at) {
            Some((i, summary)) if *i == id => summary.is_some() || at + 1 < listing.len(),
            // Deleted, or a later segment exists.
            _ => true,
        };
        Ok(Extent { limit: None, complete })
    }

    fn finish_segment(&mut self, id: u64) {
        if let Some((_, path)) = self.cur.take() {
            self.last_path = path;
        }
        self.pos = Position { segment: id + 1, offset: 0 };
    }

    /// The next entry or damage; `None` when nothing more can be read now.
    pub fn next_item(&mut self) -> Result<Option<Item>, DlqError> {
        let mut missing_retried = false;
        loop {
            if self.cur.is_none() {
                let Some((id, view)) = self.locate(self.pos.segment)? else { return Ok(None) };
                let start = if id == self.pos.segment { self.pos.offset } else { 0 };
                match SegmentFile::open(&view.path, id, start) {
                    // Being created (offline: no index to hide it until its header is written).
                    Ok((_, HeaderState::Short)) if !view.complete => return Ok(None),
                    Ok((file, header)) => {
                        missing_retried = false;
                        self.pos = Position { segment: id, offset: file.pos };
                        let path = view.path;
                        self.cur = Some((file, path.clone()));
                        // Reported once, when reading starts at the top of the segment.
                        let reason = match header {
                            HeaderState::Ok => None,
                            HeaderState::Short => Some("the file is shorter than a segment header".to_string()),
                            HeaderState::Bad(reason) => Some(reason),
                        };
                        if let Some(reason) = reason
                            && start <= SEGMENT_HEADER_LEN as u64
                        {
                            let reason = format!("segment header: {reason}; reading its frames anyway");
                            return Ok(Some(Item::Damaged { segment: id, path, offset: 0, reason }));
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        // Renamed by a seal or deleted since we looked: look again once, then move on.
                        if missing_retried {
                            self.finish_segment(id);
                        }
                        missing_retried = true;
                        if !self.shared.index.lock().attached {
                            self.list()?;
                        }
                    }
                    Err(e) => return Err(DlqError::io(view.path, e)),
                }
                continue;
            }
            let id = self.cur.as_ref().expect("a segment").0.id;
            let view = self.view(id, false)?;
            let next = {
                let (file, path) = self.cur.as_mut().expect("a segment");
                let limit = match view.limit {
                    Some(l) => l,
                    None => file.file_len().map_err(|e| DlqError::io(&*path, e))?,
                };
                match file.next(limit).map_err(|e| DlqError::io(&*path, e))? {
                    Next::Frame { offset, end, body } => {
                        self.pos = Position { segment: id, offset: end };
                        Some(
                            decode_entry_with(body, &mut self.decoder)
                                .map(|e| (e, offset))
                                .map_err(|e| (offset, e.to_string())),
                        )
                    }
                    Next::Damaged { offset, next, reason } => {
                        self.pos = Position { segment: id, offset: next };
                        Some(Err((offset, reason)))
                    }
                    Next::Torn { offset } if view.complete => {
                        self.finish_segment(id);
                        Some(Err((offset, "torn tail: no whole frame from here to the end of the segment".into())))
                    }
                    Next::Torn { .. } | Next::End => None,
                }
            };
            match next {
                Some(Ok((entry, offset))) => {
                    if let Some(t) = self.from_time {
                        if entry.time < t {
                            continue;
                        }
                        self.from_time = None;
                    }
                    return Ok(Some(Item::Entry(entry, self.pos, offset)));
                }
                Some(Err((offset, reason))) => {
                    // The segment may be finished (a torn tail): its path was kept for this.
                    let path = match &self.cur {
                        Some((file, path)) if file.id == id => path.clone(),
                        _ => self.last_path.clone(),
                    };
                    return Ok(Some(Item::Damaged { segment: id, path, offset, reason }));
                }
                None => {
                    // At the readable end: done with this segment only if nothing more can come.
                    let complete = view.complete || self.view(id, true)?.complete;
                    if !complete {
                        return Ok(None);
                    }
                    // A segment completed between the read and the check may have grown: read on.
                    let grown = {
                        let view = self.view(id, false)?;
                        let (file, path) = self.cur.as_ref().expect("a segment");
                        let len = match view.limit {
                            Some(l) => l,
                            None => file.file_len().map_err(|e| DlqError::io(path, e))?,
                        };
                        len > file.pos
                    };
                    if !grown {
                        self.finish_segment(id);
                    }
                }
            }
        }
    }
}

/// Reads a DLQ directory in storage order, following new entries when asked.
pub struct DlqReader {
    cursor: Cursor,
    changed: watch::Receiver<u64>,
    damaged: u64,
    /// Bytes of the frames of the entries returned.
    entry_bytes: u64,
}

impl std::fmt::Debug for DlqReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DlqReader").field("dir", &self.cursor.shared.dir).field("pos", &self.cursor.pos).finish()
    }
}

impl DlqReader {
    /// Opens a DLQ directory for reading from `from` (creating the directory if it does not
    /// exist yet, so a reader can start before the first dead letter). Works with or without a
    /// writer.
    pub fn open(dir: &Path, from: ReadFrom) -> Result<DlqReader, DlqError> {
        std::fs::create_dir_all(dir).map_err(|e| DlqError::io(dir, e))?;
        let cursor = Cursor::open(dir, from)?;
        let changed = cursor.shared.changed.subscribe();
        Ok(DlqReader { cursor, changed, damaged: 0, entry_bytes: 0 })
    }

    /// Damaged frames this reader skipped (each also logged with its segment and offset).
    pub fn damaged_frames(&self) -> u64 {
        self.damaged
    }

    /// Bytes of the entries this reader returned, as stored: each whole frame, from its length
    /// to its checksum. Segment headers, damaged frames and entries skipped before a start
    /// time are not counted.
    pub fn entry_bytes(&self) -> u64 {
        self.entry_bytes
    }

    /// Up to `max` entries, each with the position just after it. Returns what is available
    /// (without waiting for `max`); with nothing available it returns an empty batch, or with
    /// `follow` waits for the writer of this process to write more (without a writer in this
    /// process it looks again every 500 ms).
    ///
    /// Cancel-safe: entries are only taken from the files in the synchronous part that ends in
    /// the return, so dropping the future (e.g. in `select!`) loses nothing. Reads are plain
    /// file reads of at most a few MiB per call, done on the calling task.
    pub async fn next_batch(&mut self, max: usize, follow: bool) -> Result<Vec<(DeadLetter, Position)>, DlqError> {
        loop {
            self.changed.borrow_and_update();
            let mut out = Vec::new();
            while out.len() < max {
                match self.cursor.next_item()? {
                    Some(Item::Entry(entry, pos, start)) => {
                        // `pos` is just past the entry's frame, in the segment it starts in.
                        self.entry_bytes += pos.offset.saturating_sub(start);
                        out.push((entry, pos));
                    }
                    Some(Item::Damaged { segment, path, offset, reason }) => {
                        self.damaged += 1;
                        tracing::error!(segment, path = %path.display(), offset, reason,
                            "damaged dead letter entry skipped");
                    }
                    None => break,
                }
            }
            if !out.is_empty() || !follow || max == 0 {
                return Ok(out);
            }
            if self.cursor.shared.index.lock().attached {
                let _ = tokio::time::timeout(FOLLOW_RECHECK, self.changed.changed()).await;
            } else {
                tokio::time::sleep(OFFLINE_POLL).await;
            }
        }
    }

    /// Deletes the sealed segments wholly before `up_to` (a position this reader returned):
    /// for `clean_consumed`. The writer of this process, if any, learns of it through its index
    /// (no rescan); without one the directory is listed. The open segment is never deleted.
    /// Returns how many segments were deleted.
    pub fn delete_consumed(&self, up_to: Position) -> Result<u64, DlqError> {
        delete_consumed(&self.cursor.shared, up_to)
    }
}

pub(crate) fn delete_consumed(shared: &Shared, up_to: Position) -> Result<u64, DlqError> {
    let dir = &shared.dir;
    let consumed = |id: u64, bytes: u64| id < up_to.segment || (id == up_to.segment && up_to.offset >= bytes);
    let mut ix = shared.index.lock();
    let doomed: Vec<PathBuf> = if ix.attached {
        let ids: Vec<u64> = ix
            .segments
            .range(..=up_to.segment)
            .filter(|(id, s)| s.sealed && consumed(**id, s.bytes))
            .map(|(id, _)| *id)
            .collect();
        let paths = ids.iter().filter_map(|id| ix.remove(*id).map(|info| shared.path_of(*id, &info))).collect();
        drop(ix);
        paths
    } else {
        // The lock stays held so a writer cannot open the directory half-way through.
        let listing = naming::list(dir).map_err(|e| DlqError::io(dir, e))?;
        let paths: Vec<PathBuf> = listing
            .segments
            .iter()
            .filter_map(|(id, s)| s.filter(|s| consumed(*id, s.bytes)).map(|s| naming::path_of(dir, *id, Some(&s))))
            .collect();
        let removed = remove_files(dir, &paths)?;
        drop(ix);
        Counters::add(&shared.counters.consumed_segments, removed);
        return Ok(removed);
    };
    let removed = remove_files(dir, &doomed)?;
    Counters::add(&shared.counters.consumed_segments, removed);
    shared.bump();
    Ok(removed)
}

/// Deletes files (a file already gone counts as deleted) and fsyncs the directory.
pub(crate) fn remove_files(dir: &Path, paths: &[PathBuf]) -> Result<u64, DlqError> {
    let mut removed = 0;
    for path in paths {
        match std::fs::remove_file(path) {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == io::ErrorKind::NotFound => removed += 1,
            Err(e) => return Err(DlqError::io(path, e)),
        }
    }
    if removed > 0 {
        sync_dir(dir).map_err(|e| DlqError::io(dir, e))?;
    }
    Ok(removed)
}
