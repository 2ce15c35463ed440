//! The background writer: the one thread that owns the files. It takes everything pending at
//! once, appends it to the op log (fsynced once per interval), compacts the log into the
//! snapshot past `compact_after_bytes`, and keeps records of a failed write to write again.

use std::fs::{self, File};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::format::{self, DurableEntry, State};
use crate::state::*;
use crate::*;

/// The background writer: owns the files and the state as it should be on disk.
pub(crate) struct Writer {
    pub(crate) dir: PathBuf,
    pub(crate) state: State,
    pub(crate) generation: u64,
    pub(crate) log: Option<File>,
    pub(crate) log_len: u64,
    pub(crate) snapshot_len: u64,
    /// The log is not trustworthy (a failed write or fsync): write a snapshot and a fresh log.
    pub(crate) needs_rewrite: bool,
    pub(crate) opts: RegistryOptions,
    pub(crate) buf: Vec<u8>,
    /// Records of an append that failed, written again (at the same place) before the next
    /// ones: they are in `state` and in memory, not yet on disk.
    pub(crate) unwritten: Vec<u8>,
    pub(crate) unwritten_records: u64,
    /// Compactions that failed since the last one that succeeded (a full disk): the log goes
    /// on taking records in its reserved room meanwhile.
    pub(crate) compaction_failures: u64,
    pub(crate) batch: Vec<PendingOp>,
    #[cfg(test)]
    pub(crate) fail_writes: Arc<std::sync::atomic::AtomicU32>,
    #[cfg(test)]
    pub(crate) fail_errno: Arc<std::sync::atomic::AtomicI32>,
}

/// A failed write is logged at most this often; each line counts the failures since the last.
pub(crate) const WARN_EVERY: Duration = Duration::from_secs(10);

impl Writer {
    /// Test support: fails this write if failures were asked for, with the errno asked for
    /// (`fail_errno`, e.g. ENOSPC or EIO) or a plain "injected write failure".
    pub(crate) fn injected_failure(&self) -> io::Result<()> {
        #[cfg(test)]
        if self.fail_writes.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            return Err(match self.fail_errno.load(Ordering::SeqCst) {
                0 => io::Error::other("injected write failure"),
                errno => io::Error::from_raw_os_error(errno),
            });
        }
        Ok(())
    }

    pub(crate) fn run(mut self, shared: &Shared) {
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
    pub(crate) fn cycle(&mut self, shared: &Shared) -> io::Result<()> {
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

    pub(crate) fn write_batch(&mut self, shared: &Shared, now: u64) -> io::Result<()> {
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
    pub(crate) fn compact_at(&self) -> u64 {
        self.opts.compact_after_bytes.max(self.snapshot_len)
    }

    /// The room reserved for the log: twice the size that triggers compaction, so that while
    /// compaction cannot be written (a full disk) the log takes as much again.
    pub(crate) fn log_reserve(&self) -> u64 {
        2 * self.compact_at()
    }

    pub(crate) fn append(&mut self, shared: &Shared, records: u64) -> io::Result<()> {
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
    pub(crate) fn compact(&mut self) -> io::Result<()> {
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
