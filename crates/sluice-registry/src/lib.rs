//! The registry: a small durable key → cursor store (file identity → offset, DLQ reader →
//! position) in `data_dir/registry/`.
//!
//! The acknowledgement path never writes: [`Cursor::commit`] stores the newest offset in the
//! key's in-memory slot (one atomic store) and, only when the slot was clean, queues the slot for
//! the background writer — so any number of acks for a key between two flushes become one
//! update. The writer takes everything pending at once, appends it to an op log as one batch of
//! records (each with a CRC32C), and fsyncs once per `flush_interval` (or after every batch when
//! the interval is zero). When the log grows past `compact_after_bytes` the writer compacts it
//! into a snapshot (tmp → fsync → rename → fsync dir), again off the ack path.
//!
//! Disk space: the op log has room reserved up front (`fallocate` with `FALLOC_FL_KEEP_SIZE`,
//! twice the size that triggers compaction) when it is made, and at open for a log of an older
//! release. Reserved rather than preallocated slots because its records vary in size and
//! number: the reservation keeps plain appends (and the format) while the appends need no new
//! blocks, so a full disk does not stop them. Compaction needs new files; when it cannot make
//! them it changes nothing, warns (counted), and the log goes on in its reserved room. A failed
//! append (ENOSPC past the reservation, EIO) keeps everything in memory, warns with a count at
//! most every 10 s, and writes the same records again, at the same place, with the next flush.
//!
//! Guarantees: after a crash, every offset committed more than one flush interval (plus the time
//! of one write and fsync, and while writes succeed) before it is recovered; a restart never
//! resumes from a record older than the last one written; newer ones may be lost, so at most about one
//! flush interval of input is read again. [`Registry::close`] (also run on drop) writes
//! everything pending. Start-up recovers the snapshot and the op log up to the first bad record,
//! names the file and offset of any damage, and survives a crash at any step of compaction
//! (see the `format` module).
//!
//! ```no_run
//! use std::path::Path;
//! use sluice_registry::{Registry, RegistryOptions};
//!
//! let registry = Registry::open(Path::new("data/registry"), RegistryOptions::default())?;
//! let start = registry.get("file:2049:131").map_or(0, |e| e.offset); // where to resume
//! let cursor = registry.cursor("file:2049:131");
//! cursor.set_meta(serde_json::json!({"path": "/var/log/app.log"})); // rare
//! cursor.commit(start + 4096); // on every acknowledgement: in memory only
//! registry.close()?; // at shutdown: everything pending is written
//! # Ok::<(), sluice_registry::RegistryError>(())
//! ```
//!
//! Layout: [`Registry`] (`registry.rs`) opens, reads and closes; [`Cursor`] (`cursor.rs`) is the
//! ack path; `state.rs` is what they and the writer share; `writer.rs` is the background writer;
//! `format.rs` the files and recovery; [`config`] the `registry:` section.
//!
//! Limits: a key is at most 64 KiB and metadata at most 1 MiB of JSON; beyond that the update is
//! refused and logged rather than written as a record recovery would reject.

pub mod config;
mod cursor;
mod format;
mod registry;
mod state;
mod writer;

use std::io;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use serde_json::Value;

pub use cursor::Cursor;
pub use registry::{ReadOnlyView, Registry};
pub use sluice_core::metrics::RegistryMetrics;

/// The environment switch that turns [`Cursor::commit`] into a no-op (for benchmarks that
/// measure what the registry costs).
pub const DISABLED_ENV: &str = "SLUICE_REGISTRY_DISABLED";

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("registry {dir}: {source}")]
    Io {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("registry {dir} is in use by another process (its lock file is held)")]
    Locked { dir: PathBuf },
    #[error("registry {dir}: writing failed: {message}")]
    Write { dir: PathBuf, message: String },
    #[error("registry {dir} is closed; {pending} pending updates were not written")]
    Closed { dir: PathBuf, pending: usize },
}

/// How the registry writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryOptions {
    /// How often pending updates are written and fsynced; `ZERO` writes and fsyncs after every
    /// batch of updates.
    pub flush_interval: Duration,
    /// Size of the op log that triggers compaction into the snapshot (the log is also allowed to
    /// grow to the snapshot's size first, so compaction never runs once per flush).
    pub compact_after_bytes: u64,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions { flush_interval: Duration::from_secs(1), compact_after_bytes: 16 << 20 }
    }
}

/// One key as the registry holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub key: String,
    pub offset: u64,
    pub meta: Value,
    /// When the writer last recorded a change of this key (or when it was loaded or created).
    pub updated: SystemTime,
}

/// A copy of the writer's [`RegistryMetrics`], plus the keys pending right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatsSnapshot {
    pub flushes: u64,
    pub fsyncs: u64,
    pub records_written: u64,
    pub bytes_written: u64,
    pub compactions: u64,
    pub write_errors: u64,
    /// Keys with updates not yet handed to the writer.
    pub pending_keys: u64,
    pub keys: u64,
    pub log_bytes: u64,
}

#[cfg(test)]
mod tests;
