//! The reader thread (the harvester): walks the globs, opens and tracks files by identity,
//! reads them in turns, cuts lines and hands them to the builders or builds them itself, and
//! commits each file's offset as its events are acknowledged. See the module above for what it
//! guarantees.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use sluice_core::value::now_nanos;
use sluice_core::{AckSet, Batch};
use sluice_registry::Registry;

use super::acks::AckTracker;
use super::builders::{Builders, Chunk};
use super::config::{ReadFrom, Settings};
use super::discovery::{Change, Notifications};
use super::events::BatchBuilder;
use super::identity::{FINGERPRINT_MAX, FileId, Fingerprint};
use super::reader::{CountedFile, Source, Tracked, Turn};
use super::{identity, lag, reader};
use crate::{InputContext, InputError};

/// Events per batch before it is pushed in the middle of a pass.
const BATCH_EVENTS: usize = 1024;
/// The longest a read line waits for its batch to fill while files keep giving a little data
/// at every pass (many files, each written slowly).
const BATCH_WAIT: Duration = Duration::from_millis(10);
/// A file at its end is looked at again at least this often, notification or not.
const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// A file let go (renamed away, deleted) is closed once it stayed at its end this long.
const RELEASE_GRACE: Duration = Duration::from_secs(1);
/// Notifications of new files are answered by a walk at most this often.
const SCAN_DEBOUNCE: Duration = Duration::from_millis(50);

/// The reader thread's state.
pub(super) struct Harvester {
    s: Settings,
    ctx: InputContext,
    positions: Arc<Registry>,
    handle: tokio::runtime::Handle,
    key_prefix: String,
    files: HashMap<FileId, Tracked>,
    by_path: HashMap<PathBuf, FileId>,
    /// Files in the order they were found: the order of turns.
    order: Vec<FileId>,
    open: usize,
    first_scan: bool,
    /// Keys of ours whose file was not found, and since when (for `clean_removed_after`).
    missing_since: HashMap<String, Instant>,
    /// Paths already warned about (unreadable), so a scan does not repeat the warning.
    warned: HashSet<PathBuf>,
    warned_cap: bool,
    /// Whether the last scan found no file (warned once until files appear again).
    warned_empty: bool,
    buf: Vec<u8>,
    batch: BatchBuilder,
    /// Threads that make the events of plain lines; none with `multiline` (joining lines
    /// needs them in order) or on one core.
    builders: Option<Builders>,
    lag: Arc<lag::FileLag>,
    /// When the lag was last published.
    lag_published: Instant,
}

enum Stop {
    Shutdown,
}

impl Harvester {
    pub(super) fn new(
        s: Settings,
        ctx: InputContext,
        positions: Arc<Registry>,
        handle: tokio::runtime::Handle,
    ) -> Harvester {
        let key_prefix = format!("file:{}/{}:", ctx.pipeline, ctx.id);
        let buf = vec![0u8; s.read_buffer];
        let threads = if s.shape.multiline.is_none() { Builders::suggested_threads() } else { 0 };
        let builders = match threads {
            0 => None,
            n => match Builders::start(n, s.shape.clone(), &ctx, &handle) {
                Ok(b) => Some(b),
                Err(e) => {
                    tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, error = %e,
                        "file input cannot start event builder threads; its reader thread makes the events");
                    None
                }
            },
        };
        let batch = BatchBuilder { deferred: builders.is_some(), ..BatchBuilder::default() };
        let lag = Arc::new(lag::FileLag::default());
        let _ = ctx.metrics.state.set(lag.clone());
        Harvester {
            s,
            ctx,
            positions,
            handle,
            key_prefix,
            files: HashMap::new(),
            by_path: HashMap::new(),
            order: Vec::new(),
            open: 0,
            first_scan: true,
            missing_since: HashMap::new(),
            warned: HashSet::new(),
            warned_cap: false,
            warned_empty: false,
            buf,
            batch,
            builders,
            lag,
            lag_published: Instant::now() - lag::PUBLISH_EVERY,
        }
    }

    /// Publishes each started plain file's bytes behind its end (see [`lag`]) when
    /// [`lag::PUBLISH_EVERY`] has passed, or at once with `now_anyway`: before each push, since
    /// a push the pipeline holds back keeps this thread from publishing until it is let in, and
    /// the figure must not then stay as it was before the stall. (Sizes are not looked at
    /// again until the reader reads on, so while held back it shows the lag it had then.) A
    /// walk over the files per batch of up to [`BATCH_EVENTS`] events is small beside making
    /// them.
    fn publish_lag(&mut self, now: Instant, now_anyway: bool) {
        if !now_anyway && now.duration_since(self.lag_published) < lag::PUBLISH_EVERY {
            return;
        }
        self.lag_published = now;
        let files = self.files.values().filter(|t| t.started && !t.gzip);
        self.lag.publish(files.map(|t| (t.path.as_path(), t.size.saturating_sub(t.pos))));
    }

    pub(super) fn run(mut self) -> Result<(), InputError> {
        let mut notifications = match Notifications::start(self.s.patterns.watch_roots()) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(pipeline = %self.ctx.pipeline, input = %self.ctx.id, error = %e,
                    "file input cannot use filesystem notifications; finding changes by rescanning only");
                Notifications::disabled()
            }
        };
        tracing::info!(pipeline = %self.ctx.pipeline, input = %self.ctx.id, include = %self.s.include.join(", "),
            "file input watching");
        let mut changes = Vec::new();
        let mut last_scan = Instant::now() - self.s.scan_interval;
        let mut scan_soon = true;
        let mut last_poll = Instant::now();
        // When the oldest line of the batch being filled was read (about: the start of its pass).
        let mut batch_since: Option<Instant> = None;
        let result = loop {
            if self.ctx.shutdown.is_cancelled() {
                break Ok(());
            }
            let now = Instant::now();
            if now.duration_since(last_scan) >= self.s.scan_interval
                || (scan_soon && now.duration_since(last_scan) >= SCAN_DEBOUNCE)
            {
                if notifications.retry_missing() {
                    tracing::debug!(input = %self.ctx.id, "file input now watches a directory that appeared");
                }
                self.scan(now);
                last_scan = now;
                scan_soon = false;
            }
            if now.duration_since(last_poll) >= POLL_INTERVAL {
                for t in self.files.values_mut() {
                    t.ready |= t.source.is_some();
                }
                last_poll = now;
            }
            self.publish_lag(now, false);
            self.open_wanted(now);
            let read = match self.pass(now) {
                Ok(n) => n,
                Err(Stop::Shutdown) => break Ok(()),
            };
            if let Err(Stop::Shutdown) = self.housekeeping(now) {
                break Ok(());
            }
            // While files keep giving data, batches fill up to BATCH_EVENTS across passes (one
            // pass reads at most `read_buffer` per file); a pass that found nothing, or a batch
            // waiting BATCH_WAIT, sends what waits.
            if self.batch.len() == 0 {
                batch_since = None;
            } else {
                let since = *batch_since.get_or_insert(now);
                if read == 0 || self.batch.len() >= BATCH_EVENTS || now.duration_since(since) >= BATCH_WAIT {
                    if self.flush_batch().is_err() {
                        break Ok(());
                    }
                    batch_since = None;
                }
            }
            changes.clear();
            if read == 0 {
                let wait = POLL_INTERVAL.min(self.s.scan_interval.saturating_sub(now.duration_since(last_scan)));
                notifications.wait(wait.max(Duration::from_millis(1)), &mut changes);
            } else {
                notifications.drain(&mut changes);
            }
            for change in changes.drain(..) {
                match change {
                    Change::Rescan => {
                        scan_soon = true;
                        for t in self.files.values_mut() {
                            t.ready = true;
                        }
                    }
                    Change::Paths(paths) => {
                        for p in paths {
                            match self.by_path.get(&p).and_then(|id| self.files.get_mut(id)) {
                                Some(t) => t.ready = true,
                                None => scan_soon = true,
                            }
                        }
                    }
                }
            }
        };
        // What was read is pushed; a shutdown that stops the push leaves it for the next run.
        let _ = self.flush_batch();
        // Every chunk handed over is pushed (or given up, at shutdown) before the input ends.
        drop(self.builders.take());
        for t in self.files.values() {
            if t.truncated_lines > 0 {
                tracing::warn!(pipeline = %self.ctx.pipeline, input = %self.ctx.id, path = %t.path.display(),
                    lines = t.truncated_lines, "file input stopped; lines of this file were cut to max_line_bytes");
            }
        }
        result
    }

    /// Walks the globs: new files become tracked, moved files get their new path, files no
    /// longer found are let go, and registry entries of long-gone files are removed.
    fn scan(&mut self, now: Instant) {
        let (pipeline, input) = (self.ctx.pipeline.clone(), self.ctx.id.clone());
        let warned = &mut self.warned;
        let found = self.s.patterns.walk(&mut |path, e| {
            if warned.insert(path.to_path_buf()) {
                tracing::warn!(pipeline = %pipeline, input = %input, path = %path.display(), error = %e,
                    "file input cannot read this path; trying again at every scan");
            }
        });
        // A pattern that matches nothing (a typo, a directory not there yet) is said once, not
        // left to look like an input with nothing to read.
        if found.is_empty() && !self.warned_empty {
            tracing::warn!(pipeline = %pipeline, input = %input, include = %self.s.include.join(", "),
                searched = %self.s.patterns.searched(),
                "file input: no file matches `include`; looking again at every scan");
        }
        self.warned_empty = found.is_empty();
        let mut seen = HashSet::with_capacity(found.len());
        let wall = SystemTime::now();
        for f in found {
            let id = FileId::of(&f.meta);
            seen.insert(id);
            if let Some(t) = self.files.get_mut(&id) {
                if t.path != f.path {
                    tracing::info!(pipeline = %self.ctx.pipeline, input = %self.ctx.id, from = %t.path.display(),
                        to = %f.path.display(), "file input follows a renamed file");
                    if self.by_path.get(&t.path) == Some(&id) {
                        self.by_path.remove(&t.path);
                    }
                    t.path = f.path.clone();
                    t.template = self.s.shape.template(&f.path);
                    if let Some(c) = &t.cursor {
                        c.set_meta(meta_json(t));
                    }
                }
                t.released = false;
                if f.meta.len() != t.pos && !t.done {
                    t.ready = true;
                }
                self.by_path.insert(f.path, id);
                continue;
            }
            if let Some(max_age) = self.s.ignore_older
                && let Ok(modified) = f.meta.modified()
                && wall.duration_since(modified).is_ok_and(|age| age > max_age)
            {
                continue;
            }
            let key = format!("{}{}:{}", self.key_prefix, id.dev, id.ino);
            self.missing_since.remove(&key);
            let mut t = Tracked::new(id, key, f.path.clone(), self.s.shape.template(&f.path), now);
            // `read_from: end` is for files present at start-up; files that appear later are
            // new and read whole, or a rotation would lose the first lines of the new file.
            if self.first_scan && self.s.read_from == ReadFrom::End {
                t.pos = u64::MAX;
            }
            self.by_path.insert(f.path, id);
            self.files.insert(id, t);
            self.order.push(id);
        }
        for t in self.files.values_mut() {
            if !seen.contains(&t.id) && !t.released {
                t.released = true;
                t.ready = true;
                tracing::debug!(pipeline = %self.ctx.pipeline, input = %self.ctx.id, path = %t.path.display(),
                    "file no longer at a matching path; reading it to its end");
            }
        }
        // Files let go while closed cannot be read further: what they left pending goes out.
        let drop_ids: Vec<FileId> =
            self.files.values().filter(|t| t.released && t.source.is_none()).map(|t| t.id).collect();
        let timestamp = now_nanos();
        for id in drop_ids {
            if let Some(t) = self.files.get_mut(&id)
                && t.started
                && !t.done
            {
                reader::finish(t, &self.s.shape, &mut self.batch, now, timestamp);
            }
            self.forget(id);
        }
        self.clean_registry(&seen, now);
        self.first_scan = false;
    }

    fn clean_registry(&mut self, seen: &HashSet<FileId>, now: Instant) {
        let known: HashSet<&str> = self.files.values().map(|t| t.key.as_str()).collect();
        let seen_keys: HashSet<String> =
            seen.iter().map(|id| format!("{}{}:{}", self.key_prefix, id.dev, id.ino)).collect();
        let ours = self.positions.entries().into_iter().map(|e| e.key).filter(|k| k.starts_with(&self.key_prefix));
        for key in ours {
            if known.contains(key.as_str()) || seen_keys.contains(&key) {
                self.missing_since.remove(&key);
                continue;
            }
            let since = *self.missing_since.entry(key.clone()).or_insert(now);
            if now.duration_since(since) >= self.s.clean_removed_after {
                tracing::info!(pipeline = %self.ctx.pipeline, input = %self.ctx.id, key = %key,
                    "file input forgets the position of a file gone longer than clean_removed_after");
                self.positions.remove(&key);
                self.missing_since.remove(&key);
            }
        }
    }

    fn forget(&mut self, id: FileId) {
        if let Some(t) = self.files.remove(&id) {
            if t.source.is_some() {
                self.open -= 1;
            }
            if self.by_path.get(&t.path) == Some(&id) {
                self.by_path.remove(&t.path);
            }
            self.order.retain(|x| *x != id);
        }
    }

    /// Opens files that have something to read, within `max_open_files`.
    fn open_wanted(&mut self, now: Instant) {
        let wanted: Vec<FileId> = self
            .order
            .iter()
            .filter(|id| self.files.get(id).is_some_and(|t| t.source.is_none() && t.ready && !t.done))
            .copied()
            .collect();
        for id in wanted {
            if self.open >= self.s.max_open_files && !self.evict_one() {
                if !self.warned_cap {
                    self.warned_cap = true;
                    tracing::warn!(pipeline = %self.ctx.pipeline, input = %self.ctx.id, max_open_files = self.s.max_open_files,
                        "file input has max_open_files files open with data to read; other files wait their turn");
                }
                return;
            }
            self.open_file(id, now);
        }
    }

    /// Closes the least recently active open file that is at its end; false if none is.
    fn evict_one(&mut self) -> bool {
        let victim = self
            .files
            .values()
            .filter(|t| t.source.is_some() && t.at_end && !t.released)
            .min_by_key(|t| t.last_data)
            .map(|t| t.id);
        match victim {
            Some(id) => {
                if let Some(t) = self.files.get_mut(&id) {
                    // Stays ready only if it grew since it was last read; otherwise it waits,
                    // closed, until a notification or a scan sees it grow. Left ready, files
                    // with nothing new were opened again at once, ahead of files with data,
                    // which could then wait for ever.
                    let size =
                        t.source.as_ref().and_then(Source::plain).and_then(|f| f.metadata().ok()).map(|m| m.len());
                    t.ready = size.is_some_and(|s| s != t.pos);
                    t.size = size.unwrap_or(t.size);
                    t.source = None;
                    self.open -= 1;
                }
                true
            }
            None => false,
        }
    }

    fn open_file(&mut self, id: FileId, now: Instant) {
        let Some(t) = self.files.get_mut(&id) else { return };
        let (pipeline, input) = (&self.ctx.pipeline, &self.ctx.id);
        let file = match std::fs::File::open(&t.path) {
            Ok(f) => f,
            Err(e) => {
                t.ready = false;
                if e.kind() != std::io::ErrorKind::NotFound && self.warned.insert(t.path.clone()) {
                    tracing::warn!(pipeline = %pipeline, input = %input, path = %t.path.display(), error = %e,
                        "file input cannot open this file; trying again at every scan");
                }
                return;
            }
        };
        let meta = match file.metadata() {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(pipeline = %pipeline, input = %input, path = %t.path.display(), error = %e,
                    "file input cannot stat this file");
                t.ready = false;
                return;
            }
        };
        if FileId::of(&meta) != id {
            // Another file is at this path now: the next scan sorts out which is which.
            t.ready = false;
            return;
        }
        self.warned.remove(&t.path);
        let size = meta.len();
        t.size = size;
        if !t.started {
            if !start(t, &file, size, &self.positions, pipeline, input) {
                return;
            }
        } else if !t.gzip {
            check_same_content(t, &file, size, pipeline, input);
        }
        let source = if t.gzip {
            let mut gz = Box::new(flate2::read::MultiGzDecoder::new(CountedFile::new(file, self.ctx.metrics.clone())));
            if t.pos > 0 && !skip_decompressed(&mut gz, t.pos) {
                tracing::warn!(pipeline = %pipeline, input = %input, path = %t.path.display(),
                    "gzip file is shorter than its saved position; reading it from the start");
                t.restart();
                gz = match std::fs::File::open(&t.path) {
                    Ok(f) => Box::new(flate2::read::MultiGzDecoder::new(CountedFile::new(f, self.ctx.metrics.clone()))),
                    Err(_) => return,
                };
            }
            Source::Gzip(gz)
        } else {
            Source::Plain(file)
        };
        t.source = Some(source);
        t.last_data = now;
        t.ready = true;
        // Not known to be at its end until a read says so: a file just opened must not be the
        // one closed again to make room for the next (the cap would then churn through the
        // waiting files without reading any of them).
        t.at_end = false;
        self.open += 1;
    }

    /// One turn for every open file that may have data. Returns the bytes read (decompressed).
    /// A plain file's reads count in the input's `bytes_in` here, a gzip file's where its
    /// decoder reads (see [`CountedFile`]).
    fn pass(&mut self, now: Instant) -> Result<usize, Stop> {
        let mut total = 0;
        let timestamp = now_nanos();
        for i in 0..self.order.len() {
            let Some(id) = self.order.get(i).copied() else { break };
            let Some(t) = self.files.get_mut(&id) else { continue };
            if t.source.is_none() || !t.ready {
                continue;
            }
            if !t.gzip && t.at_end && !check_growth(t, &self.ctx) {
                continue;
            }
            let fingerprint = t.fingerprint;
            match reader::read_turn(t, &self.s.shape, &mut self.buf, &mut self.batch, now, timestamp) {
                Ok(Turn::Data(n)) => {
                    total += n;
                    if !t.gzip {
                        self.ctx.metrics.bytes_in.add(n as u64);
                    }
                    t.at_end = false;
                    t.size = t.size.max(t.pos);
                    if t.fingerprint != fingerprint
                        && let Some(c) = &t.cursor
                    {
                        c.set_meta(meta_json(t));
                    }
                }
                Ok(Turn::End) => {
                    t.ready = false;
                    t.at_end = true;
                    if t.gzip {
                        self.finish_gzip(id, now, timestamp);
                    }
                }
                Err(e) => {
                    tracing::warn!(pipeline = %self.ctx.pipeline, input = %self.ctx.id, path = %t.path.display(),
                        error = %e, "file input cannot read this file; closing it (a later scan retries)");
                    t.source = None;
                    t.ready = false;
                    self.open -= 1;
                    if t.gzip {
                        // A damaged or unfinished gzip stream: what was read is kept; it is not retried.
                        t.done = true;
                    }
                }
            }
            if self.batch.len() >= BATCH_EVENTS {
                self.flush_batch()?;
            }
        }
        Ok(total)
    }

    fn finish_gzip(&mut self, id: FileId, now: Instant, timestamp: i64) {
        let Some(t) = self.files.get_mut(&id) else { return };
        reader::finish(t, &self.s.shape, &mut self.batch, now, timestamp);
        t.done = true;
        t.source = None;
        self.open -= 1;
        if let Some(c) = &t.cursor {
            c.set_meta(meta_json(t));
        }
        tracing::info!(pipeline = %self.ctx.pipeline, input = %self.ctx.id, path = %t.path.display(), bytes = t.pos,
            "gzip file read to its end");
    }

    /// Multiline timeouts, files let go, files inactive too long.
    fn housekeeping(&mut self, now: Instant) -> Result<(), Stop> {
        let timestamp = now_nanos();
        let mut release = Vec::new();
        for t in self.files.values_mut() {
            if self.s.shape.multiline.is_some() && !t.pending.is_empty() {
                reader::flush_idle(t, &self.s.shape, &mut self.batch, now, timestamp);
            }
            if t.source.is_none() || t.ready {
                continue;
            }
            let idle = now.duration_since(t.last_data);
            if t.released && idle >= RELEASE_GRACE {
                release.push(t.id);
            } else if idle >= self.s.close_inactive {
                tracing::debug!(pipeline = %self.ctx.pipeline, input = %self.ctx.id, path = %t.path.display(),
                    "file input closes an inactive file (it is opened again when it grows)");
                t.source = None;
                self.open -= 1;
            }
        }
        for id in release {
            if let Some(t) = self.files.get_mut(&id) {
                reader::finish(t, &self.s.shape, &mut self.batch, now, timestamp);
                if t.truncated_lines > 0 {
                    tracing::warn!(pipeline = %self.ctx.pipeline, input = %self.ctx.id, path = %t.path.display(),
                        lines = t.truncated_lines, "file closed; lines of it were cut to max_line_bytes");
                }
                tracing::debug!(pipeline = %self.ctx.pipeline, input = %self.ctx.id, path = %t.path.display(),
                    "file input read a renamed or deleted file to its end and closed it");
            }
            self.forget(id);
        }
        Ok(())
    }

    /// Pushes the pending batch (or hands its lines to the builders), one acknowledgement
    /// piece per file in it, registered now so that pieces are in read order.
    fn flush_batch(&mut self) -> Result<(), Stop> {
        if self.batch.len() == 0 {
            return Ok(());
        }
        self.publish_lag(Instant::now(), true);
        let deferred = self.batch.deferred;
        let b = std::mem::replace(&mut self.batch, BatchBuilder { deferred, ..BatchBuilder::default() });
        if b.failed > 0 {
            self.ctx.metrics.failed.add(b.failed);
        }
        let mut acks = AckSet::none();
        for g in &b.groups {
            acks.append(AckSet::single(g.tracker.acker(g.count, g.end), g.count));
        }
        let ctx = &self.ctx;
        if let Some(builders) = self.builders.as_mut() {
            // Reserved here, in chunk order, so that no builder waits for memory that a later
            // chunk holds while it waits for its turn to send.
            let estimate =
                crate::admission::estimate(crate::codec::Codec::Lines, b.lines.text.len(), b.lines.spans.len());
            let memory = self.handle.block_on(ctx.reserve(estimate)).ok_or(Stop::Shutdown)?;
            let chunk = Chunk { lines: b.lines, groups: b.groups, acks, bytes: b.bytes, memory };
            builders.submit(chunk).map_err(|()| Stop::Shutdown)?;
            self.batch.lines = builders.spare_lines(self.buf.len());
            return Ok(());
        }
        // Built in this thread already: one batch at most is held before its charge, since
        // nothing more is read until it is sent.
        let held = crate::admission::measure_each(&b.events, 0);
        let memory = self.handle.block_on(ctx.reserve(held)).ok_or(Stop::Shutdown)?;
        let batch = Batch::new(b.events, acks, b.bytes).with_memory(memory);
        self.handle.block_on(ctx.send(batch)).map_err(|_| Stop::Shutdown)
    }
}

/// Decides where a newly opened file starts: its saved position if the file is still the one
/// that position belongs to, else 0 (or its end, for `read_from: end` at start-up).
fn start(t: &mut Tracked, file: &std::fs::File, size: u64, positions: &Registry, pipeline: &str, input: &str) -> bool {
    let saved = positions.get(&t.key).map(|e| (e.offset, e.meta));
    let wanted_end = t.pos == u64::MAX;
    t.pos = 0;
    if let Some((offset, meta)) = saved {
        let fp = meta.get("fingerprint").and_then(Fingerprint::from_json);
        let gzip_size = meta.get("gzip_size").and_then(serde_json::Value::as_u64);
        let same = match fp {
            Some(fp) if fp.len <= size => identity::still_matches(file, fp).unwrap_or(false),
            _ => false,
        };
        if !same {
            tracing::warn!(pipeline, input, path = %t.path.display(), offset,
                "file has a saved position but its first bytes changed (rewritten, or a reused inode); reading it from the start");
        } else if t.gzip {
            if gzip_size.is_some_and(|g| offset >= g) {
                t.done = true;
                t.started = true;
                t.ready = false;
                t.pos = offset;
                return false;
            }
            t.pos = offset;
        } else if offset > size {
            tracing::warn!(pipeline, input, path = %t.path.display(), offset, size,
                "file is shorter than its saved position (truncated); reading it from the start");
        } else {
            t.pos = offset;
        }
    } else if wanted_end && !t.gzip {
        t.pos = size;
    }
    t.fingerprint = identity::fingerprint(file, FINGERPRINT_MAX).unwrap_or_default();
    let cursor = positions.cursor(&t.key);
    let committer = cursor.clone();
    t.tracker = Some(AckTracker::new(move |offset| committer.commit(offset)));
    t.started = true;
    cursor.set_meta(meta_json(t));
    t.cursor = Some(cursor);
    true
}

/// For a file opened again: is it still the content we were reading?
fn check_same_content(t: &mut Tracked, file: &std::fs::File, size: u64, pipeline: &str, input: &str) {
    let same = identity::still_matches(file, t.fingerprint).unwrap_or(false);
    if !same || size < t.pos {
        tracing::warn!(pipeline, input, path = %t.path.display(), offset = t.pos, size,
            "file was truncated or rewritten while closed; reading it from the start");
        t.restart();
    }
}

/// Before reading more of a plain file: was it truncated or rewritten in place? Returns
/// whether there may be data to read.
fn check_growth(t: &mut Tracked, ctx: &InputContext) -> bool {
    let Some(file) = t.source.as_ref().and_then(Source::plain) else { return true };
    let Ok(meta) = file.metadata() else { return true };
    let size = meta.len();
    t.size = size;
    if size == t.pos {
        t.ready = false;
        return false;
    }
    let truncated = size < t.pos;
    let rewritten =
        !truncated && t.fingerprint.len > 0 && !identity::still_matches(file, t.fingerprint).unwrap_or(true);
    if truncated || rewritten {
        let what = if truncated { "truncated (copytruncate?)" } else { "rewritten in place" };
        tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, path = %t.path.display(), offset = t.pos, size,
            "file was {what}; reading it again from the start");
        t.restart();
    }
    true
}

fn skip_decompressed(gz: &mut flate2::read::MultiGzDecoder<CountedFile>, mut n: u64) -> bool {
    use std::io::Read;
    let mut sink = vec![0u8; 64 << 10];
    while n > 0 {
        let want = sink.len().min(n as usize);
        match gz.read(&mut sink[..want]) {
            Ok(0) | Err(_) => return false,
            Ok(k) => n -= k as u64,
        }
    }
    true
}

fn meta_json(t: &Tracked) -> serde_json::Value {
    let mut m = serde_json::json!({
        "path": t.path.to_string_lossy(),
        "dev": t.id.dev,
        "inode": t.id.ino,
        "fingerprint": t.fingerprint.to_json(),
    });
    if t.gzip && t.done {
        m["gzip_size"] = t.pos.into();
    }
    m
}
