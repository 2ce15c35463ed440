//! [`Registry`]: opening a registry directory (lock, recovery, repair, the writer thread), the
//! keys and their cursors, flushing and closing, and reading a directory offline.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, RwLock};

use crate::cursor::*;
use crate::format::{self, Meta};
use crate::state::*;
use crate::writer::*;
use crate::*;

/// The durable key → cursor store. Open one per data directory per process and share it.
pub struct Registry {
    pub(crate) shared: Arc<Shared>,
    pub(crate) writer: Mutex<Option<JoinHandle<()>>>,
    /// Held for the registry's lifetime: one process owns a registry directory.
    pub(crate) _lock: Option<File>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").field("dir", &self.shared.dir).finish()
    }
}

pub(crate) fn lock_exclusive(file: &File) -> bool {
    file.try_lock().is_ok()
}

/// Whether another process holds `dir`'s lock (tested with a shared lock released at once).
pub(crate) fn lock_held(dir: &Path) -> bool {
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
