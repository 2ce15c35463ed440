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
//! Limits: a key is at most 64 KiB and metadata at most 1 MiB of JSON; beyond that the update is
//! refused and logged rather than written as a record recovery would reject.

pub mod config;
mod format;

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex, RwLock};
use serde_json::Value;

use format::{DurableEntry, Meta, State};
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

const DIRTY: u8 = 1;
/// The key has been committed (or given metadata) at least once and so exists.
const LIVE: u8 = 2;
/// The key was removed; this slot is detached and its updates are ignored.
const REMOVED: u8 = 4;

struct Slot {
    key: Box<str>,
    offset: AtomicU64,
    state: AtomicU8,
    meta: Mutex<Arc<Meta>>,
    updated_ms: AtomicU64,
}

enum PendingOp {
    Slot(Arc<Slot>),
    Remove(Box<str>),
}

#[derive(Default)]
struct Control {
    /// Flush requests made / fully handled (written and fsynced, or failed).
    requested: u64,
    completed: u64,
    /// The error of the last cycle, if it failed.
    last_error: Option<String>,
    stop: bool,
    stopped: bool,
}

struct Shared {
    dir: PathBuf,
    slots: RwLock<HashMap<Box<str>, Arc<Slot>>>,
    pending: Mutex<Vec<PendingOp>>,
    control: Mutex<Control>,
    wake: Condvar,
    /// `flush_interval` is zero: a commit that makes the pending list non-empty wakes the writer.
    eager: bool,
    disabled: bool,
    /// An in-memory registry ([`Registry::in_memory`]): nothing is queued or written.
    memory_only: bool,
    warned_memory_only: std::sync::atomic::AtomicBool,
    stats: Arc<RegistryMetrics>,
    /// Test support: the number of upcoming file writes to fail, and with what errno (0: a
    /// plain error).
    #[cfg(test)]
    fail_writes: Arc<std::sync::atomic::AtomicU32>,
    #[cfg(test)]
    fail_errno: Arc<std::sync::atomic::AtomicI32>,
}

impl Shared {
    fn push(&self, op: PendingOp) {
        let was_empty = {
            let mut p = self.pending.lock();
            p.push(op);
            p.len() == 1
        };
        if self.eager && was_empty {
            // Taking the control lock orders this wake-up after the writer's "is anything
            // pending?" check, so it cannot be lost.
            let _c = self.control.lock();
            self.wake.notify_all();
        }
    }
}

/// The durable key → cursor store. Open one per data directory per process and share it.
pub struct Registry {
    shared: Arc<Shared>,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// Held for the registry's lifetime: one process owns a registry directory.
    _lock: Option<File>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("dir", &self.shared.dir).finish()
    }
}

/// A handle on one key for the acknowledgement path. Cheap to clone.
#[derive(Clone)]
pub struct Cursor {
    slot: Arc<Slot>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cursor")
            .field("key", &self.slot.key)
            .field("offset", &self.slot.offset.load(Ordering::Relaxed))
            .finish()
    }
}

impl Cursor {
    /// Records `offset` as the key's newest cursor. No syscall, no allocation in steady state,
    /// and no lock the writer holds during I/O; the writer persists it with its next flush.
    /// Only the commit that finds the key clean queues it (a short, uncontended lock); with a
    /// zero flush interval that commit also wakes the writer.
    #[inline]
    pub fn commit(&self, offset: u64) {
        if self.shared.disabled {
            return;
        }
        let slot = &*self.slot;
        // SeqCst pairs with the writer's `fetch_and(!DIRTY)` then offset load: either the writer
        // reads this offset, or this commit sees the slot clean and queues it again.
        slot.offset.store(offset, Ordering::SeqCst);
        if slot.state.load(Ordering::SeqCst) & (DIRTY | LIVE) != (DIRTY | LIVE) {
            self.mark_dirty();
        }
    }

    #[cold]
    fn mark_dirty(&self) {
        let prev = self.slot.state.fetch_or(DIRTY | LIVE, Ordering::SeqCst);
        if prev & DIRTY == 0 {
            self.shared.push(PendingOp::Slot(self.slot.clone()));
        }
    }

    /// Replaces the key's metadata (file identity, path after a rename); rare. Persisted with
    /// the next flush. Like a commit, it creates the key if it does not exist yet.
    pub fn set_meta(&self, meta: Value) {
        let meta = Meta::new(meta);
        if meta.bytes.len() > format::MAX_META_LEN {
            tracing::error!(key = %self.slot.key, bytes = meta.bytes.len(), limit = format::MAX_META_LEN,
                "registry metadata too large; keeping the previous metadata");
            return;
        }
        *self.slot.meta.lock() = Arc::new(meta);
        self.mark_dirty();
    }

    pub fn key(&self) -> &str {
        &self.slot.key
    }

    /// The newest offset committed through any handle on this key (or loaded at start-up).
    pub fn offset(&self) -> u64 {
        self.slot.offset.load(Ordering::Relaxed)
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn ms_to_time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn lock_exclusive(file: &File) -> bool {
    file.try_lock().is_ok()
}

/// Whether another process holds `dir`'s lock (tested with a shared lock released at once).
fn lock_held(dir: &Path) -> bool {
    let Ok(f) = File::open(dir.join(format::LOCK)) else { return false };
    if f.try_lock_shared().is_ok() {
        // Closing the file would release it too; this is explicit.
        let _ = f.unlock();
        false
    } else {
        true
    }
}

/// What [`Registry::read`] found: the entries, and notes about any damage it worked around.
#[derive(Debug, Clone)]
pub struct ReadOnlyView {
    pub entries: Vec<Entry>,
    pub warnings: Vec<String>,
    /// Another process has the registry open (it may hold newer offsets in memory).
    pub in_use: bool,
}

impl Registry {
    /// Opens (or creates) the registry in `dir`: recovers snapshot and op log, repairs what it
    /// must (truncates a torn log tail, rewrites after damage or an interrupted compaction) and
    /// starts the background writer.
    pub fn open(dir: &Path, opts: RegistryOptions) -> Result<Arc<Registry>, RegistryError> {
        let io_err = |source| RegistryError::Io { dir: dir.to_path_buf(), source };
        if !dir.is_dir() {
            fs::create_dir_all(dir).map_err(io_err)?;
            // The new directory's own entry must be durable too, or a crash could lose it whole.
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                format::sync_dir(parent).map_err(io_err)?;
            }
        }
        let lock =
            File::options().create(true).truncate(false).write(true).open(dir.join(format::LOCK)).map_err(io_err)?;
        if !lock_exclusive(&lock) {
            return Err(RegistryError::Locked { dir: dir.to_path_buf() });
        }
        for tmp in [format::SNAPSHOT_TMP, format::LOG_TMP] {
            match fs::remove_file(dir.join(tmp)) {
                Ok(()) => {
                    tracing::info!(file = %dir.join(tmp).display(), "removed a leftover of an interrupted registry compaction")
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(e)),
            }
        }
        let started = Instant::now();
        let rec = format::recover(dir).map_err(io_err)?;
        let mut writer = Writer {
            dir: dir.to_path_buf(),
            state: rec.state,
            generation: rec.max_generation,
            log: None,
            log_len: 0,
            snapshot_len: rec.snapshot_len,
            needs_rewrite: false,
            opts: opts.clone(),
            buf: Vec::new(),
            unwritten: Vec::new(),
            unwritten_records: 0,
            compaction_failures: 0,
            batch: Vec::new(),
            #[cfg(test)]
            fail_writes: Default::default(),
            #[cfg(test)]
            fail_errno: Default::default(),
        };
        match rec.log_generation {
            Some(generation) if !rec.needs_rewrite => {
                let log = File::options().read(true).write(true).open(dir.join(format::LOG)).map_err(io_err)?;
                if rec.log_good_len < rec.log_len {
                    log.set_len(rec.log_good_len).map_err(io_err)?;
                    log.sync_all().map_err(io_err)?;
                    tracing::warn!(file = %dir.join(format::LOG).display(), offset = rec.log_good_len,
                        "truncated the registry op log at its first bad record");
                }
                // A log of an older release, or one just cut back (which gives up its blocks):
                // reserve its room now, where the disk allows.
                if let Err(e) = format::reserve(&log, writer.log_reserve()) {
                    tracing::warn!(file = %dir.join(format::LOG).display(), error = %e,
                        "cannot reserve space for the registry op log; appends take space as they go");
                }
                writer.generation = generation;
                writer.log = Some(log);
                writer.log_len = rec.log_good_len;
            }
            _ => writer.compact().map_err(io_err)?,
        }

        let load_ms = now_ms();
        let slots: HashMap<Box<str>, Arc<Slot>> = writer
            .state
            .iter()
            .map(|(k, e)| {
                let slot = Slot {
                    key: k.as_str().into(),
                    offset: AtomicU64::new(e.offset),
                    state: AtomicU8::new(LIVE),
                    meta: Mutex::new(e.meta.clone()),
                    updated_ms: AtomicU64::new(if e.updated_ms == 0 { load_ms } else { e.updated_ms }),
                };
                (k.as_str().into(), Arc::new(slot))
            })
            .collect();
        tracing::info!(dir = %dir.display(), keys = slots.len(), log_bytes = writer.log_len,
            elapsed_ms = started.elapsed().as_millis() as u64, "registry opened");
        let disabled = std::env::var(DISABLED_ENV).is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
        if disabled {
            tracing::warn!("{DISABLED_ENV} is set: registry commits are ignored (a benchmarking switch)");
        }
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            slots: RwLock::new(slots),
            pending: Mutex::new(Vec::with_capacity(1024)),
            control: Mutex::new(Control::default()),
            wake: Condvar::new(),
            eager: opts.flush_interval.is_zero(),
            disabled,
            memory_only: false,
            warned_memory_only: Default::default(),
            stats: Arc::default(),
            #[cfg(test)]
            fail_writes: writer.fail_writes.clone(),
            #[cfg(test)]
            fail_errno: writer.fail_errno.clone(),
        });
        shared.stats.log_bytes.store(writer.log_len, Ordering::Relaxed);
        shared.stats.keys.store(writer.state.len() as u64, Ordering::Relaxed);
        shared.stats.durable_unix_ms.store(now_ms(), Ordering::Relaxed);
        let thread_shared = shared.clone();
        let handle = std::thread::Builder::new()
            .name("sluice-registry".into())
            .spawn(move || writer.run(&thread_shared))
            .map_err(io_err)?;
        Ok(Arc::new(Registry { shared, writer: Mutex::new(Some(handle)), _lock: Some(lock) }))
    }

    /// A registry that keeps cursors in memory only and writes nothing: for a process none of
    /// whose inputs resumes from a position (so it touches no directory), and for tests.
    /// Taking a cursor on it logs a warning once, since nothing taken there survives a restart.
    pub fn in_memory() -> Arc<Registry> {
        let shared = Arc::new(Shared {
            dir: PathBuf::from("(in memory)"),
            slots: RwLock::new(HashMap::new()),
            pending: Mutex::new(Vec::new()),
            control: Mutex::new(Control { stopped: true, ..Control::default() }),
            wake: Condvar::new(),
            eager: false,
            disabled: false,
            memory_only: true,
            warned_memory_only: Default::default(),
            stats: Arc::default(),
            #[cfg(test)]
            fail_writes: Default::default(),
            #[cfg(test)]
            fail_errno: Default::default(),
        });
        Arc::new(Registry { shared, writer: Mutex::new(None), _lock: None })
    }

    /// False for [`Registry::in_memory`].
    pub fn is_persistent(&self) -> bool {
        !self.shared.memory_only
    }

    /// Reads the registry in `dir` without taking it over: no lock, no truncation, no rewrite.
    /// Works while another process has it open (showing what that process has written so far).
    pub fn read(dir: &Path) -> Result<ReadOnlyView, RegistryError> {
        if !dir.is_dir() {
            return Err(RegistryError::Io {
                dir: dir.to_path_buf(),
                source: io::Error::new(io::ErrorKind::NotFound, "no registry directory"),
            });
        }
        let in_use = lock_held(dir);
        let mut rec = format::recover(dir).map_err(|source| RegistryError::Io { dir: dir.to_path_buf(), source })?;
        // The owner may have compacted between our reads of the snapshot and the log: read again.
        for _ in 0..3 {
            if !(in_use && rec.needs_rewrite) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
            rec = format::recover(dir).map_err(|source| RegistryError::Io { dir: dir.to_path_buf(), source })?;
        }
        let entries = rec
            .state
            .into_iter()
            .map(|(key, e)| Entry {
                key,
                offset: e.offset,
                meta: e.meta.value.clone(),
                updated: ms_to_time(e.updated_ms),
            })
            .collect();
        Ok(ReadOnlyView { entries, warnings: rec.warnings, in_use })
    }

    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    pub fn get(&self, key: &str) -> Option<Entry> {
        let slots = self.shared.slots.read();
        slots.get(key).and_then(|s| entry_of(s))
    }

    /// Every key, sorted.
    pub fn entries(&self) -> Vec<Entry> {
        let mut out: Vec<Entry> = self.shared.slots.read().values().filter_map(|s| entry_of(s)).collect();
        out.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        out
    }

    /// A handle on `key` for the ack path. The key exists once something is committed through it.
    pub fn cursor(&self, key: &str) -> Cursor {
        if let Some(slot) = self.shared.slots.read().get(key) {
            return Cursor { slot: slot.clone(), shared: self.shared.clone() };
        }
        if self.shared.memory_only && !self.shared.warned_memory_only.swap(true, Ordering::Relaxed) {
            tracing::warn!(key, "a cursor was taken on an in-memory registry: positions will not survive a restart");
        }
        // In memory, a slot is born dirty so that commits never queue it for a writer.
        let initial = if self.shared.memory_only { DIRTY } else { 0 };
        let mut slots = self.shared.slots.write();
        let slot = slots
            .entry(key.into())
            .or_insert_with(|| {
                Arc::new(Slot {
                    key: key.into(),
                    offset: AtomicU64::new(0),
                    state: AtomicU8::new(initial),
                    meta: Mutex::new(Arc::new(Meta::null())),
                    updated_ms: AtomicU64::new(now_ms()),
                })
            })
            .clone();
        Cursor { slot, shared: self.shared.clone() }
    }

    /// Removes `key`. Cursors taken on it before are detached: their commits are ignored; take
    /// a new cursor to create the key again.
    pub fn remove(&self, key: &str) {
        let mut slots = self.shared.slots.write();
        if let Some(slot) = slots.remove(key) {
            slot.state.fetch_or(REMOVED, Ordering::SeqCst);
            if self.shared.memory_only {
                return;
            }
            // Queued under the map's lock, so a cursor created again afterwards queues after it.
            self.shared.push(PendingOp::Remove(key.into()));
        }
    }

    /// Writes and fsyncs everything pending now.
    pub fn flush(&self) -> Result<(), RegistryError> {
        let mut c = self.shared.control.lock();
        if c.stopped {
            let pending = self.shared.pending.lock().len();
            return if pending == 0 {
                Ok(())
            } else {
                Err(RegistryError::Closed { dir: self.shared.dir.clone(), pending })
            };
        }
        c.requested += 1;
        let ticket = c.requested;
        self.shared.wake.notify_all();
        while c.completed < ticket && !c.stopped {
            self.shared.wake.wait(&mut c);
        }
        if c.completed < ticket {
            let pending = self.shared.pending.lock().len();
            return Err(RegistryError::Closed { dir: self.shared.dir.clone(), pending });
        }
        match &c.last_error {
            None => Ok(()),
            Some(message) => Err(RegistryError::Write { dir: self.shared.dir.clone(), message: message.clone() }),
        }
    }

    /// Flushes everything pending and stops the writer. Idempotent; also run on drop.
    pub fn close(&self) -> Result<(), RegistryError> {
        let Some(handle) = self.writer.lock().take() else { return Ok(()) };
        {
            let mut c = self.shared.control.lock();
            c.stop = true;
            self.shared.wake.notify_all();
        }
        if handle.join().is_err() {
            return Err(RegistryError::Write {
                dir: self.shared.dir.clone(),
                message: "the registry writer thread panicked".into(),
            });
        }
        let s = self.stats();
        tracing::info!(dir = %self.shared.dir.display(), keys = s.keys, flushes = s.flushes, fsyncs = s.fsyncs,
            records = s.records_written, bytes = s.bytes_written, compactions = s.compactions,
            write_errors = s.write_errors, "registry closed");
        let c = self.shared.control.lock();
        match &c.last_error {
            None => Ok(()),
            Some(message) => Err(RegistryError::Write { dir: self.shared.dir.clone(), message: message.clone() }),
        }
    }

    pub fn stats(&self) -> StatsSnapshot {
        let s = &self.shared.stats;
        // One lock at a time: `remove` takes the slots and then the pending list.
        let pending_keys = self.shared.pending.lock().len() as u64;
        let keys = self.shared.slots.read().values().filter(|s| s.state.load(Ordering::Relaxed) & LIVE != 0).count();
        StatsSnapshot {
            flushes: s.flushes.get(),
            fsyncs: s.fsyncs.get(),
            records_written: s.records_written.get(),
            bytes_written: s.bytes_written.get(),
            compactions: s.compactions.get(),
            write_errors: s.write_errors.get(),
            pending_keys,
            keys: keys as u64,
            log_bytes: s.log_bytes.load(Ordering::Relaxed),
        }
    }

    /// The writer's figures, for the monitoring API.
    pub fn metrics(&self) -> Arc<RegistryMetrics> {
        self.shared.stats.clone()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::error!("{e}");
        }
    }
}

fn entry_of(slot: &Slot) -> Option<Entry> {
    if slot.state.load(Ordering::Acquire) & LIVE == 0 {
        return None;
    }
    Some(Entry {
        key: slot.key.to_string(),
        offset: slot.offset.load(Ordering::Acquire),
        meta: slot.meta.lock().value.clone(),
        updated: ms_to_time(slot.updated_ms.load(Ordering::Relaxed)),
    })
}

/// The background writer: owns the files and the state as it should be on disk.
struct Writer {
    dir: PathBuf,
    state: State,
    generation: u64,
    log: Option<File>,
    log_len: u64,
    snapshot_len: u64,
    /// The log is not trustworthy (a failed write or fsync): write a snapshot and a fresh log.
    needs_rewrite: bool,
    opts: RegistryOptions,
    buf: Vec<u8>,
    /// Records of an append that failed, written again (at the same place) before the next
    /// ones: they are in `state` and in memory, not yet on disk.
    unwritten: Vec<u8>,
    unwritten_records: u64,
    /// Compactions that failed since the last one that succeeded (a full disk): the log goes
    /// on taking records in its reserved room meanwhile.
    compaction_failures: u64,
    batch: Vec<PendingOp>,
    #[cfg(test)]
    fail_writes: Arc<std::sync::atomic::AtomicU32>,
    #[cfg(test)]
    fail_errno: Arc<std::sync::atomic::AtomicI32>,
}

/// A failed write is logged at most this often; each line counts the failures since the last.
const WARN_EVERY: Duration = Duration::from_secs(10);

impl Writer {
    /// Test support: fails this write if failures were asked for, with the errno asked for
    /// (`fail_errno`, e.g. ENOSPC or EIO) or a plain "injected write failure".
    fn injected_failure(&self) -> io::Result<()> {
        #[cfg(test)]
        if self.fail_writes.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            return Err(match self.fail_errno.load(Ordering::SeqCst) {
                0 => io::Error::other("injected write failure"),
                errno => io::Error::from_raw_os_error(errno),
            });
        }
        Ok(())
    }

    fn run(mut self, shared: &Shared) {
        // With a zero interval the writer sleeps until a commit wakes it; it still wakes this
        // often, idle, so that the lag it reports stays fresh.
        const IDLE_WAKE: Duration = Duration::from_secs(1);
        let interval = if self.opts.flush_interval.is_zero() { IDLE_WAKE } else { self.opts.flush_interval };
        let mut next_flush = Instant::now() + interval;
        let mut retry_at: Option<Instant> = None;
        // Failed cycles since the last that succeeded, and when that was last logged.
        let mut failures = 0u64;
        let mut warned: Option<Instant> = None;
        loop {
            let (ticket, stop) = {
                let mut c = shared.control.lock();
                loop {
                    if c.stop || c.requested > c.completed {
                        break;
                    }
                    let now = Instant::now();
                    if let Some(at) = retry_at {
                        if now >= at {
                            break;
                        }
                    } else if now >= next_flush || (shared.eager && !shared.pending.lock().is_empty()) {
                        break;
                    }
                    let deadline = retry_at.unwrap_or(next_flush);
                    shared.wake.wait_until(&mut c, deadline);
                }
                (c.requested, c.stop)
            };
            next_flush = Instant::now() + interval;
            let result = self.cycle(shared);
            retry_at = match &result {
                Ok(()) => {
                    if failures > 0 {
                        tracing::info!(dir = %self.dir.display(), failures, "registry written again");
                    }
                    failures = 0;
                    None
                }
                Err(e) => {
                    shared.stats.write_errors.add(1);
                    failures += 1;
                    if warned.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                        warned = Some(Instant::now());
                        tracing::warn!(dir = %self.dir.display(), failures, unwritten_records = self.unwritten_records,
                            "registry write failed (retrying; positions are kept in memory, a restart now resumes \
                             from the last written ones): {e}");
                    }
                    Some(Instant::now() + self.opts.flush_interval.max(Duration::from_secs(1)))
                }
            };
            let mut c = shared.control.lock();
            c.completed = c.completed.max(ticket);
            c.last_error = result.err().map(|e| e.to_string());
            if stop {
                c.stopped = true;
                shared.wake.notify_all();
                return;
            }
            shared.wake.notify_all();
        }
    }

    /// Takes everything pending, appends it to the log and fsyncs; compacts when due.
    fn cycle(&mut self, shared: &Shared) -> io::Result<()> {
        {
            let mut pending = shared.pending.lock();
            std::mem::swap(&mut *pending, &mut self.batch);
        }
        let taken = self.batch.len() as u64;
        let now = now_ms();
        self.write_batch(shared, now)?;
        let s = &shared.stats;
        s.log_bytes.store(self.log_len, Ordering::Relaxed);
        s.keys.store(self.state.len() as u64, Ordering::Relaxed);
        s.flushed_keys.store(taken, Ordering::Relaxed);
        s.durable_unix_ms.store(now, Ordering::Relaxed);
        Ok(())
    }

    fn write_batch(&mut self, shared: &Shared, now: u64) -> io::Result<()> {
        self.buf.clear();
        let mut records = 0u64;
        for op in self.batch.drain(..) {
            match op {
                PendingOp::Remove(key) => {
                    if self.state.remove(&*key).is_some() {
                        format::encode_record(&mut self.buf, format::KIND_REMOVE, now, 0, &key, &[]);
                        records += 1;
                    }
                }
                PendingOp::Slot(slot) => {
                    let prev = slot.state.fetch_and(!DIRTY, Ordering::SeqCst);
                    if prev & REMOVED != 0 {
                        continue;
                    }
                    if slot.key.len() > format::MAX_KEY_LEN {
                        tracing::error!(key_prefix = %slot.key.chars().take(64).collect::<String>(),
                            bytes = slot.key.len(), limit = format::MAX_KEY_LEN, "registry key too long; not written");
                        continue;
                    }
                    let offset = slot.offset.load(Ordering::SeqCst);
                    let meta = slot.meta.lock().clone();
                    match self.state.get_mut(&*slot.key) {
                        Some(e) if Arc::ptr_eq(&e.meta, &meta) => {
                            if e.offset == offset {
                                continue;
                            }
                            e.offset = offset;
                            e.updated_ms = now;
                            format::encode_record(&mut self.buf, format::KIND_SET_OFFSET, now, offset, &slot.key, &[]);
                        }
                        _ => {
                            format::encode_record(
                                &mut self.buf,
                                format::KIND_SET_WITH_META,
                                now,
                                offset,
                                &slot.key,
                                &meta.bytes,
                            );
                            self.state.insert(slot.key.to_string(), DurableEntry { offset, meta, updated_ms: now });
                        }
                    }
                    slot.updated_ms.store(now, Ordering::Relaxed);
                    records += 1;
                }
            }
        }
        if self.needs_rewrite {
            self.compact()?;
            shared.stats.compactions.add(1);
            return Ok(());
        }
        if !self.buf.is_empty() || !self.unwritten.is_empty() {
            self.append(shared, records)?;
        }
        if self.log_len >= self.compact_at() {
            match self.compact() {
                Ok(()) => {
                    shared.stats.compactions.add(1);
                    if self.compaction_failures > 0 {
                        tracing::info!(dir = %self.dir.display(), failures = self.compaction_failures,
                            "registry compacted again");
                    }
                    self.compaction_failures = 0;
                }
                // The records are in the log already; it goes on within its reserved room, and
                // compaction is tried again with the next flush.
                Err(e) if self.log.is_some() => {
                    self.compaction_failures += 1;
                    if self.compaction_failures == 1 || self.compaction_failures.is_multiple_of(100) {
                        tracing::warn!(dir = %self.dir.display(), failures = self.compaction_failures,
                            log_bytes = self.log_len, reserved_bytes = self.log_reserve(),
                            "cannot compact the registry (retrying with each flush); the op log goes on: {e}");
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The log size that triggers compaction.
    fn compact_at(&self) -> u64 {
        self.opts.compact_after_bytes.max(self.snapshot_len)
    }

    /// The room reserved for the log: twice the size that triggers compaction, so that while
    /// compaction cannot be written (a full disk) the log takes as much again.
    fn log_reserve(&self) -> u64 {
        2 * self.compact_at()
    }

    fn append(&mut self, shared: &Shared, records: u64) -> io::Result<()> {
        if self.log.is_none() {
            self.needs_rewrite = true;
            return self.compact();
        }
        let mut records = records;
        if !self.unwritten.is_empty() {
            let mut all = std::mem::take(&mut self.unwritten);
            all.extend_from_slice(&self.buf);
            self.buf = all;
            records += std::mem::take(&mut self.unwritten_records);
        }
        // Written at the end of the good records, not at the file's end: a failed attempt may
        // have left part of these same records there, which this write covers whole.
        let log = self.log.as_ref().expect("checked above");
        let result = match self.injected_failure() {
            // As a real failure may: part of the records reached the file.
            Err(e) => log.write_all_at(&self.buf[..self.buf.len() / 2], self.log_len).and(Err(e)),
            Ok(()) => log.write_all_at(&self.buf, self.log_len).and_then(|()| log.sync_data()),
        };
        match result {
            Ok(()) => {
                self.log_len += self.buf.len() as u64;
                let s = &shared.stats;
                s.flushes.add(1);
                s.fsyncs.add(1);
                s.records_written.add(records);
                s.bytes_written.add(self.buf.len() as u64);
                Ok(())
            }
            Err(e) => {
                // Nothing after `log_len` counts: the records are written again there with the
                // next flush (a failed fsync may have lost their pages; writing them again makes
                // them dirty again, and the records before were fsynced already). A crash
                // meanwhile leaves at most a torn tail, which recovery cuts.
                self.unwritten = std::mem::take(&mut self.buf);
                self.unwritten_records = records;
                Err(e)
            }
        }
    }

    /// Writes the whole state as a snapshot of the next generation, then a fresh empty log of
    /// that generation. Each step is atomic (tmp, fsync, rename, fsync dir) and every state
    /// between them recovers (see the `format` module).
    ///
    /// Until the new snapshot is in place the old log stays in use: a compaction that fails
    /// before (no room for the new files on a full disk) costs nothing, and the log goes on.
    /// The new log has its room reserved before it replaces the old one; where the disk cannot
    /// give it, the compaction fails unless the old log is unusable anyway.
    fn compact(&mut self) -> io::Result<()> {
        let generation = self.generation + 1;
        let snapshot = format::encode_snapshot(&self.state, generation);
        self.injected_failure()?;
        let reserve = 2 * self.opts.compact_after_bytes.max(snapshot.len() as u64);
        let keep_old = self.log.is_some() && !self.needs_rewrite;
        let prepared = format::prepare_log(&self.dir, generation, reserve, keep_old).and_then(|log| {
            format::replace_file(&self.dir, format::SNAPSHOT_TMP, format::SNAPSHOT, &snapshot)?;
            Ok(log)
        });
        let log = match prepared {
            Ok(log) => log,
            Err(e) => {
                // Half-made files would hold space a full disk needs.
                for tmp in [format::LOG_TMP, format::SNAPSHOT_TMP] {
                    let _ = fs::remove_file(self.dir.join(tmp));
                }
                return Err(e);
            }
        };
        // The old log now predates the snapshot: recovery ignores it, so nothing more goes there.
        self.log = None;
        self.needs_rewrite = true;
        fs::rename(self.dir.join(format::LOG_TMP), self.dir.join(format::LOG))?;
        format::sync_dir(&self.dir)?;
        self.generation = generation;
        self.snapshot_len = snapshot.len() as u64;
        self.log_len = format::HEADER_LEN as u64;
        self.log = Some(log);
        self.needs_rewrite = false;
        // The snapshot holds every record of a failed append.
        self.unwritten.clear();
        self.unwritten_records = 0;
        tracing::debug!(dir = %self.dir.display(), generation, keys = self.state.len(), "registry compacted");
        Ok(())
    }
}

#[cfg(test)]
mod tests;
