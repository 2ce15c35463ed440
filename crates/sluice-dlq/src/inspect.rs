//! Offline access to a DLQ directory, for `sluice dlq`: statistics, segments, entries with
//! their positions (and any damage, reported rather than skipped silently), and purge.
//!
//! Nothing here changes a segment; only [`purge`] deletes, and it refuses while a writer (of
//! this process or another) has the directory.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use crate::naming;
use crate::reader::{Cursor, Item as CursorItem, remove_files};
use crate::segment;
use crate::shared::try_lock;
use crate::{DeadLetter, DlqError, Position, ReadFrom};

/// One segment file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    pub id: u64,
    pub path: PathBuf,
    /// False for the segment being written (or one a crash left open).
    pub sealed: bool,
    pub bytes: u64,
    pub entries: u64,
    pub oldest_entry_time: Option<i64>,
    pub newest_entry_time: Option<i64>,
    /// Damaged frames found when scanning an open segment (sealed segments are not read here;
    /// [`entries`] reports their damage).
    pub damaged_frames: u64,
}

/// A directory's totals.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DirStats {
    pub segments: u64,
    pub sealed_segments: u64,
    pub bytes: u64,
    pub entries: u64,
    pub oldest_entry_time: Option<i64>,
    pub newest_entry_time: Option<i64>,
    /// Whether a writer holds the directory right now.
    pub writer_active: bool,
}

/// The segments of `dir`, oldest first. Sealed segments are described by their names; open
/// ones are read to count their entries.
pub fn segments(dir: &Path) -> Result<Vec<SegmentInfo>, DlqError> {
    let listing = naming::list(dir).map_err(|e| DlqError::io(dir, e))?;
    let mut out = Vec::with_capacity(listing.segments.len());
    for (id, summary) in listing.segments {
        let path = naming::path_of(dir, id, summary.as_ref());
        let info = match summary {
            Some(s) => SegmentInfo {
                id,
                path,
                sealed: true,
                bytes: s.bytes,
                entries: s.entries,
                oldest_entry_time: Some(s.oldest),
                newest_entry_time: Some(s.newest),
                damaged_frames: 0,
            },
            None => {
                let scanned = match segment::scan(&path, id) {
                    Ok(s) => s,
                    // Sealed (renamed) or deleted by a writer since the listing.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(DlqError::io(path, e)),
                };
                SegmentInfo {
                    id,
                    path,
                    sealed: false,
                    bytes: scanned.file_len,
                    entries: scanned.summary.map_or(0, |s| s.entries),
                    oldest_entry_time: scanned.summary.map(|s| s.oldest),
                    newest_entry_time: scanned.summary.map(|s| s.newest),
                    damaged_frames: scanned.damaged.len() as u64,
                }
            }
        };
        out.push(info);
    }
    Ok(out)
}

/// Totals over [`segments`].
pub fn stats(dir: &Path) -> Result<DirStats, DlqError> {
    let segs = segments(dir)?;
    let mut s = DirStats { writer_active: writer_active(dir)?, ..Default::default() };
    for g in &segs {
        s.segments += 1;
        s.sealed_segments += g.sealed as u64;
        s.bytes += g.bytes;
        s.entries += g.entries;
        if g.entries > 0 {
            s.oldest_entry_time =
                Some(s.oldest_entry_time.map_or(g.oldest_entry_time.unwrap_or(i64::MAX), |o| {
                    o.min(g.oldest_entry_time.unwrap_or(i64::MAX))
                }));
            s.newest_entry_time =
                Some(s.newest_entry_time.map_or(g.newest_entry_time.unwrap_or(i64::MIN), |n| {
                    n.max(g.newest_entry_time.unwrap_or(i64::MIN))
                }));
        }
    }
    Ok(s)
}

/// What [`entries`] yields.
#[derive(Debug)]
pub enum Item {
    /// An entry; `position` is just after it (resume there), `offset` where its frame starts.
    Entry { entry: DeadLetter, position: Position, offset: u64 },
    /// A damaged frame or segment, skipped: where, and why.
    Damaged { segment: u64, path: PathBuf, offset: u64, reason: String },
}

/// Entries of `dir` in storage order from `from`, ending at what is written now.
pub struct Entries {
    cursor: Cursor,
}

impl Iterator for Entries {
    type Item = Result<Item, DlqError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.cursor.next_item() {
            Ok(None) => None,
            Ok(Some(CursorItem::Entry(entry, position, offset))) => Some(Ok(Item::Entry { entry, position, offset })),
            Ok(Some(CursorItem::Damaged { segment, path, offset, reason })) => {
                Some(Ok(Item::Damaged { segment, path, offset, reason }))
            }
            Err(e) => Some(Err(e)),
        }
    }
}

/// Reads the entries of `dir` from `from` (see [`Item`]).
pub fn entries(dir: &Path, from: ReadFrom) -> Result<Entries, DlqError> {
    if !dir.is_dir() {
        return Err(DlqError::io(dir, io::Error::new(io::ErrorKind::NotFound, "no such directory")));
    }
    Ok(Entries { cursor: Cursor::open(dir, from)? })
}

/// Deletes every segment of `dir` (sealed, open and set-aside `.damaged` ones). Refuses while a
/// writer has the directory. The record of the highest segment id used is kept, so new segments
/// get new ids and positions saved before the purge cannot point past them. Returns how many
/// segment files were deleted.
pub fn purge(dir: &Path) -> Result<u64, DlqError> {
    let _lock = match try_lock(dir)? {
        Some(lock) => lock,
        None => return Err(DlqError::AlreadyOpen(dir.to_path_buf())),
    };
    let highest = naming::list(dir).map_err(|e| DlqError::io(dir, e))?.highest_id();
    let mut paths = Vec::new();
    let mut marks = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| DlqError::io(dir, e))? {
        let entry = entry.map_err(|e| DlqError::io(dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let damaged = name.strip_suffix(".damaged").is_some_and(|n| naming::parse(n).is_some());
        if damaged || naming::parse(name).is_some() {
            paths.push(entry.path());
        } else if name.starts_with(naming::LAST_ID_PREFIX) {
            marks.push(entry.path());
        }
    }
    if highest > 0 {
        let mark = dir.join(naming::last_id_name(highest));
        if !marks.contains(&mark) {
            File::create(&mark).map_err(|e| DlqError::io(&mark, e))?;
        }
        paths.extend(marks.into_iter().filter(|m| *m != mark));
    }
    let marks_removed = paths
        .iter()
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(naming::LAST_ID_PREFIX)))
        .count() as u64;
    Ok(remove_files(dir, &paths)? - marks_removed)
}

/// Whether a writer holds `dir`.
pub fn writer_active(dir: &Path) -> Result<bool, DlqError> {
    Ok(try_lock(dir)?.is_none())
}
