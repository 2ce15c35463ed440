//! The dead letter queue (DLQ): where a pipeline keeps the events its outputs (and processors)
//! reject for good, with why, so they can be inspected and replayed.
//!
//! - [`DeadLetterQueue`] is the writer of one directory: [`DeadLetterQueue::write`] returns once
//!   the entries are durable as [`DlqSync`] asks (fsync happens on a writer thread, never on the
//!   async runtime). It enforces `max_bytes` ([`StoragePolicy::DropNewer`] rejects new entries,
//!   [`StoragePolicy::DropOlder`] evicts whole oldest segments) and `retain_age`, and seals
//!   segments on size and after `seal_idle` without writes.
//! - [`DlqReader`] reads a directory from the beginning, a time or a [`Position`], follows new
//!   entries written in the same process (woken by the writer, no polling), works offline when
//!   no writer is open, and deletes fully consumed segments ([`DlqReader::delete_consumed`]).
//! - [`inspect`] reads a directory offline: statistics, segments, entries with their positions
//!   and any damage, and purge.
//! - [`config`] reads a pipeline's `dead_letter_queue:` section into [`DlqOptions`] (their
//!   defaults are the section's), naming the key and line of every error.
//!
//! # The index, and why nothing lists the directory after start-up
//!
//! The writer keeps an in-memory index: segment id → bytes, entries, oldest and newest entry
//! time, sealed or open. It is built by ONE `read_dir` at [`DeadLetterQueue::open`] and kept up
//! to date by every write, seal, eviction, expiry and reader deletion. Finding the oldest or
//! newest segment and deciding the size policy are O(log n) map look-ups plus O(1) totals; the
//! write path, the retention timer and the size policy never list, stat or sort the directory.
//!
//! Start-up reads no sealed segment: a sealed segment's summary is in its file name, written by
//! the rename that seals it. Only a segment left open by a crash is scanned frame by frame; a
//! torn tail is cut there, and the segment is sealed. A segment file that disappears under the
//! writer (deleted by hand) is dropped from the index when the writer next touches it, so the
//! size accounting never stays "full"; the next start-up sees exactly what is on disk. While the
//! writer refuses entries for room ([`StoragePolicy::DropNewer`]) it also checks, once a second,
//! that its oldest segments still exist (one `stat` each, from the oldest, stopping at the
//! first that does), so deleting files by hand to make room takes effect without a restart.
//!
//! # On disk (a contract)
//!
//! One directory per DLQ. Files:
//!
//! ```text
//! <id:010>.open                                          the segment being written (at most one)
//! <id:010>_<entries>_<bytes>_<oldest-ns>_<newest-ns>.dlq a sealed segment and its summary
//! last-segment-<id:010>                                  empty; the highest segment id ever used
//! lock                                                   held (flock) while a writer has it open
//! <id:010>.open.damaged                                  an open segment whose header was unusable
//! ```
//!
//! `id` is the segment number, rising from 1; `bytes` is the file's length; times are entry
//! times ([`DeadLetter::time`]) in nanoseconds since the Unix epoch, in decimal, possibly
//! negative. Other files are ignored. Segment ids are never reused, even after every segment has
//! been consumed or purged (`last-segment-<id>` remembers them), so a saved [`Position`] never
//! points past new entries; a position past every id the directory has used (the directory was
//! deleted and re-created) reads from the beginning, with a warning.
//!
//! A segment is `sluice-segment`'s format: a 64-byte [`SegmentHeader`](sluice_segment::SegmentHeader)
//! with codec id [`CODEC_DEAD_LETTER`] (`first_seq` = `id << 32`), then one frame per entry:
//! `len | seq | body | crc32c | len`, where `seq = id << 32 | index of the entry in the segment`.
//! The frame body of an entry (integers little-endian, `varint` = unsigned LEB128, `string` =
//! `varint` byte length then UTF-8):
//!
//! ```text
//! offset size     field
//! 0      8        time       i64, nanoseconds since the Unix epoch (read alone by recovery)
//! 8      varint   attempts   u32
//!        string   reason
//!        string   plugin id
//!        string   plugin type
//!        string   pipeline
//!        ...      event      the original event in sluice-segment's event codec (root object)
//! ```
//!
//! # Guarantees
//!
//! - A write returns only after its entries are written (and fsynced with [`DlqSync::Commit`]).
//!   New segment files and the directory are fsynced when created and when sealed (unless
//!   [`DlqSync::None`]).
//! - A damaged frame (bad checksum, or a body that does not decode) costs that entry only: it is
//!   skipped, counted and logged with its segment and offset, and reading resumes after it
//!   (tested: any damaged byte of a segment loses at most the entry it hits). A damaged segment
//!   header costs nothing: it is reported, and the frames, which prove themselves by checksum and
//!   by a sequence number of their segment, are read anyway (recovery rewrites it).
//! - Dropped (either policy), expired and unencodable entries are counted in [`DlqStats`] and
//!   logged at most once per [`DROP_LOG_INTERVAL`], never once per entry.
//! - A [`Position`] is the point just after an entry; reading from it resumes exactly at the
//!   next entry, including across seals, restarts and deleted segments.
//! - A write that fails (ENOSPC, EIO) fails whole, naming the segment: the bytes it wrote are
//!   cut off again (the file is shortened to its last whole entry, which needs no space), its
//!   entries are not counted as written, and the caller gets the error; the pipeline counts
//!   them as lost (`sluice_dlq_lost_total`) and logs it. It is counted loss, not backpressure:
//!   the events were rejected for good, and holding the pipeline for them would stop every
//!   other event. Earlier entries are never touched, and the next write goes on in the same
//!   segment once space returns (tested on a full tmpfs and with injected ENOSPC and EIO).
//!   After a failed fsync the entries were written but are not known to be durable: the
//!   write is reported failed, yet they stay in the file and are read back.
//! - Progress and index records need no new space: the index is in memory, rebuilt from file
//!   names; a sealed segment's summary is its name, given by a rename (no data block); the
//!   highest id is the name of an empty file, moved by a rename. A reader's progress is kept in
//!   the registry, whose op log has its room reserved (see `sluice-registry`).
//! - A segment deleted by retention or `drop_older` wakes the readers: one following at the end
//!   of it closes it at once, so its space returns. (A reader nobody is reading from holds the
//!   segment it is in until its next read.)

pub mod config;
mod entry;
pub mod inspect;
mod naming;
mod reader;
mod segment;
mod shared;
mod writer;

#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::time::Duration;

pub use config::{DeadLetterQueueConfig, default_dir};
pub use entry::{decode_entry, encode_entry, entry_time};
pub use reader::DlqReader;
pub use writer::DeadLetterQueue;

/// Codec id of DLQ segments in the segment header: each frame body is one dead letter entry.
pub const CODEC_DEAD_LETTER: u8 = 16;

/// How often drops, expiries and unencodable entries are logged (with the counts since the last
/// log line).
pub const DROP_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Largest accepted `segment_bytes`: offsets within a segment must fit the 32 bits a
/// [`Position`] gives them, with room for one maximal frame past the limit.
pub const MAX_SEGMENT_BYTES: u64 = 2 << 30;

/// Smallest accepted `segment_bytes`.
pub const MIN_SEGMENT_BYTES: u64 = 1 << 10;

/// What to do when an entry would take the stored bytes past `max_bytes`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StoragePolicy {
    /// Reject the new entry (counted as `dropped_newer`).
    #[default]
    DropNewer,
    /// Delete whole oldest segments until the new entry fits (their entries are counted as
    /// `dropped_older`).
    DropOlder,
}

/// When written entries are fsynced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DlqSync {
    /// `fdatasync` before [`DeadLetterQueue::write`] returns: nothing written is lost, even to
    /// a power cut. Concurrent writes share one fsync.
    Commit,
    /// `write` returns after the write; `fdatasync` at this interval. A process crash loses
    /// nothing; a machine crash can lose up to one interval.
    Interval(Duration),
    /// Never fsync (the OS writes back when it likes). For tests and throwaway data.
    None,
}

/// Settings of a [`DeadLetterQueue`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DlqOptions {
    /// Upper bound of the bytes of all segment files (headers and frames). Default 1 GiB.
    pub max_bytes: u64,
    /// A segment is sealed when the next entry would take it past this size (a single entry
    /// larger than this gets a segment of its own). Default 16 MiB; between
    /// [`MIN_SEGMENT_BYTES`] and [`MAX_SEGMENT_BYTES`], and at most `max_bytes`.
    pub segment_bytes: u64,
    pub storage_policy: StoragePolicy,
    /// Segments whose newest entry is older than this are deleted (checked every second, and
    /// from the oldest segment on). Default: none.
    pub retain_age: Option<Duration>,
    /// Default [`DlqSync::Commit`].
    pub sync: DlqSync,
    /// The open segment is sealed after this long without writes, so readers and retention see
    /// it whole. Default 5 s.
    pub seal_idle: Duration,
}

impl Default for DlqOptions {
    fn default() -> Self {
        DlqOptions {
            max_bytes: 1 << 30,
            segment_bytes: 16 << 20,
            storage_policy: StoragePolicy::DropNewer,
            retain_age: None,
            sync: DlqSync::Commit,
            seal_idle: Duration::from_secs(5),
        }
    }
}

impl DlqOptions {
    /// Checks the settings, naming the one that is wrong.
    pub fn validate(&self) -> Result<(), DlqError> {
        if !(MIN_SEGMENT_BYTES..=MAX_SEGMENT_BYTES).contains(&self.segment_bytes) {
            return Err(DlqError::InvalidOptions(format!(
                "segment_bytes ({}) must be between {MIN_SEGMENT_BYTES} and {MAX_SEGMENT_BYTES}",
                self.segment_bytes
            )));
        }
        if self.max_bytes < self.segment_bytes {
            return Err(DlqError::InvalidOptions(format!(
                "max_bytes ({}) must be at least segment_bytes ({})",
                self.max_bytes, self.segment_bytes
            )));
        }
        if let DlqSync::Interval(d) = self.sync
            && d.is_zero()
        {
            return Err(DlqError::InvalidOptions("the sync interval must be more than zero".into()));
        }
        if self.seal_idle.is_zero() {
            return Err(DlqError::InvalidOptions("seal_idle must be more than zero".into()));
        }
        if self.retain_age.is_some_and(|d| d.is_zero()) {
            return Err(DlqError::InvalidOptions("retain_age must be more than zero".into()));
        }
        Ok(())
    }
}

/// One rejected event and why.
#[derive(Clone, Debug, PartialEq)]
pub struct DeadLetter {
    /// The event as the plugin received it.
    pub event: sluice_core::Event,
    /// Why it was rejected (e.g. the HTTP status and the response's error text).
    pub reason: String,
    /// The id of the plugin that rejected it.
    pub plugin_id: String,
    /// The plugin's type (e.g. `http`, `json`).
    pub plugin_type: String,
    pub pipeline: String,
    /// When it was rejected: nanoseconds since the Unix epoch (like [`sluice_core::Value::Timestamp`]).
    /// Retention, [`ReadFrom::Time`] and the segment summaries use this time.
    pub time: i64,
    /// How many times delivery was attempted.
    pub attempts: u32,
}

/// What a [`DeadLetterQueue::write`] did with its entries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteOutcome {
    /// Entries stored.
    pub written: usize,
    /// Entries not stored: rejected by [`StoragePolicy::DropNewer`], larger than `max_bytes`, or
    /// not encodable. Each is counted in [`DlqStats`] and logged (once per interval).
    pub dropped: usize,
}

/// Counters and the index's totals (shared with the metrics, which is why it is defined in
/// `sluice-core`).
pub use sluice_core::metrics::DlqStats;

/// The size policy's decision for an entry (see [`DeadLetterQueue::room_for`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Room {
    /// It fits under `max_bytes`.
    Fits,
    /// [`StoragePolicy::DropNewer`] and it does not fit: the entry is dropped.
    Reject,
    /// [`StoragePolicy::DropOlder`]: this segment (the oldest sealed one) goes first.
    EvictOldest(u64),
    /// [`StoragePolicy::DropOlder`] with only the open segment left: it is sealed, then evicted.
    SealOpen,
}

/// One segment as the index knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentSummary {
    pub id: u64,
    pub bytes: u64,
    pub entries: u64,
    pub oldest_entry_time: Option<i64>,
    pub newest_entry_time: Option<i64>,
    pub sealed: bool,
}

impl SegmentSummary {
    pub(crate) fn new(id: u64, s: &shared::SegInfo) -> SegmentSummary {
        let times = s.entries > 0;
        SegmentSummary {
            id,
            bytes: s.bytes,
            entries: s.entries,
            oldest_entry_time: times.then_some(s.oldest),
            newest_entry_time: times.then_some(s.newest),
            sealed: s.sealed,
        }
    }
}

/// A place in a DLQ: a segment and a byte offset in it. A position returned with an entry is
/// the offset just after that entry.
///
/// Positions order like the entries they follow (segment first, then offset).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    pub segment: u64,
    pub offset: u64,
}

impl Position {
    /// Packs the position into one `u64`: the segment in the high 32 bits, the offset in the low
    /// 32 bits. Every position this crate returns fits: segment ids stay below 2^32 (the writer
    /// refuses to go further) and offsets below 2^32 (`segment_bytes` ≤ [`MAX_SEGMENT_BYTES`],
    /// plus one frame of at most 64 MiB). Returns `None` for a position that does not fit.
    pub fn to_u64(self) -> Option<u64> {
        (self.segment <= u32::MAX as u64 && self.offset <= u32::MAX as u64).then_some(self.segment << 32 | self.offset)
    }

    /// The inverse of [`Position::to_u64`].
    pub fn from_u64(packed: u64) -> Position {
        Position { segment: packed >> 32, offset: packed & u32::MAX as u64 }
    }
}

/// `segment 3, offset 415`, as `sluice dlq show` names an entry's place.
impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "segment {}, offset {}", self.segment, self.offset)
    }
}

/// Where a [`DlqReader`] starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadFrom {
    /// The oldest stored entry.
    Beginning,
    /// The first entry, in storage order, whose time (nanoseconds since the Unix epoch) is at or
    /// after this one; everything stored after it follows, whatever its time.
    Time(i64),
    /// Just after the entry this position was returned with. If its segment is gone, the next
    /// segment's first entry.
    Position(Position),
}

/// `the oldest entry`, `entries from 2026-11-21T09:42:02.000Z`, `after segment 3, offset 415`.
impl std::fmt::Display for ReadFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadFrom::Beginning => f.write_str("the oldest entry"),
            ReadFrom::Time(nanos) => write!(f, "entries from {}", sluice_core::value::format_timestamp(*nanos)),
            ReadFrom::Position(p) => write!(f, "after {p}"),
        }
    }
}

/// Errors of the DLQ. Each names the file or directory it concerns.
#[derive(Debug, thiserror::Error)]
pub enum DlqError {
    #[error("dead letter queue {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("dead letter queue {0} is already open for writing (by this process or another)")]
    AlreadyOpen(PathBuf),
    #[error("dead letter queue {0} is closed")]
    Closed(PathBuf),
    #[error("invalid dead letter queue settings: {0}")]
    InvalidOptions(String),
    #[error("dead letter queue {0} has used every segment number (2^32); purge it")]
    SegmentIdsExhausted(PathBuf),
}

impl DlqError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> DlqError {
        DlqError::Io { path: path.into(), source }
    }
}
