//! `dead_letter_queue`: replays a pipeline's dead letter queue into this pipeline.
//!
//! Reads the entries of a DLQ directory in storage order — from the beginning, or from the first
//! entry written at or after `start_from` — and emits each original event with what the queue
//! knew about it under `/@metadata/dead_letter_queue/` (`reason`, `plugin_id`, `plugin_type`,
//! `pipeline`, `entry_time`, `attempts`). With `follow` (the default) it then waits for new
//! entries; without, it ends once everything it read is acknowledged.
//!
//! Guarantees:
//! - With `commit_offsets`, the position after the last entry of the longest run of
//!   acknowledged batches (batches may be acknowledged out of order) is committed to the
//!   registry under `dlq:<canonical directory>`, and a restart resumes there: no entry is
//!   skipped, and what is read again is bounded by the batches in flight plus the registry's
//!   flush interval. A batch given up at shutdown blocks commits past it until the restart.
//! - With `clean_consumed`, sealed segments whose every entry is acknowledged (the committed
//!   position is past them) are deleted; the writer of this process learns of it without
//!   rescanning. The segment being written is never deleted.
//! - A damaged entry is skipped, counted as failed for this input and logged with its segment
//!   and offset; its neighbours are delivered.
//! - The input's `bytes_in` counts the entries' frames as stored in the segments.

mod config;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;
use sluice_config::model::ComponentSpec;
use sluice_config::{ConfigError, Link};
use sluice_core::ack::AckOutcome;
use sluice_core::{AckSet, Acker, Batch, Event, Map, Value};
use sluice_dlq::{DeadLetter, DlqReader, Position, ReadFrom};
use tokio::sync::watch;

use crate::{Input, InputContext, InputError};
use config::{Settings, Source};

/// How long the input waits, with nothing to read or acknowledge, before it tries to delete
/// consumed segments again (`clean_consumed`).
const CLEAN_IDLE_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Where the queue's own facts about an event go, under `@metadata`.
pub const METADATA_KEY: &str = "dead_letter_queue";

struct DeadLetterQueueInput {
    source: Source,
    start: ReadFrom,
    commit_offsets: bool,
    clean_consumed: bool,
    follow: bool,
    batch_size: usize,
}

/// The pipeline whose queue it reads from that pipeline's default directory, when it names one.
pub(crate) fn links(spec: &ComponentSpec) -> Vec<Link> {
    match spec.settings::<config::DeadLetterQueueInputConfig>() {
        Ok(config::DeadLetterQueueInputConfig { pipeline: Some(pipeline), path: None, .. }) => {
            vec![Link::ReadsDeadLetterQueueOf { pipeline, key: "pipeline" }]
        }
        _ => Vec::new(),
    }
}

pub(crate) fn build(spec: &ComponentSpec) -> Result<Box<dyn Input>, ConfigError> {
    let Settings { source, start, commit_offsets, clean_consumed, follow, batch_size } = config::read(spec)?;
    Ok(Box::new(DeadLetterQueueInput { source, start, commit_offsets, clean_consumed, follow, batch_size }))
}

/// The registry key of a DLQ reader of `dir` (canonical, so two spellings share one position).
pub fn registry_key(canonical_dir: &std::path::Path) -> String {
    format!("dlq:{}", canonical_dir.display())
}

/// Which batches are acknowledged, to find the contiguous prefix whose end may be committed.
#[derive(Debug, Default)]
struct Progress {
    /// The lowest batch number not yet part of the committed prefix.
    next: u64,
    /// Batches finished out of order: their end position, or `None` if given up.
    finished: BTreeMap<u64, Option<Position>>,
}

impl Progress {
    /// Records batch `seq` as finished; returns the new end of the prefix if it moved.
    fn finish(&mut self, seq: u64, end: Position, outcome: AckOutcome) -> Option<Position> {
        self.finished.insert(seq, (outcome == AckOutcome::Handled).then_some(end));
        let mut moved = None;
        while let Some(entry) = self.finished.first_entry() {
            if *entry.key() != self.next {
                break;
            }
            match *entry.get() {
                Some(end) => {
                    entry.remove();
                    self.next += 1;
                    moved = Some(end);
                }
                // Given up (shutdown): nothing after it may be committed in this run.
                None => break,
            }
        }
        moved
    }
}

/// The event as it leaves the input: the original with the queue's facts in its metadata.
fn replayed_event(entry: DeadLetter) -> Event {
    let DeadLetter { mut event, reason, plugin_id, plugin_type, pipeline, time, attempts } = entry;
    let mut facts = Map::with_capacity(6);
    facts.push_unchecked("reason", Value::from(reason.as_str()));
    facts.push_unchecked("plugin_id", Value::from(plugin_id.as_str()));
    facts.push_unchecked("plugin_type", Value::from(plugin_type.as_str()));
    facts.push_unchecked("pipeline", Value::from(pipeline.as_str()));
    facts.push_unchecked("entry_time", Value::Timestamp(time));
    facts.push_unchecked("attempts", Value::Int(i64::from(attempts)));
    event.metadata_mut().insert(METADATA_KEY, Value::Object(facts));
    event
}

#[async_trait]
impl Input for DeadLetterQueueInput {
    fn uses_registry(&self) -> bool {
        self.commit_offsets
    }

    async fn run(self: Box<Self>, ctx: InputContext) -> Result<(), InputError> {
        let dir = match &self.source {
            Source::Path(p) => p.clone(),
            Source::Pipeline(name) => sluice_dlq::default_dir(&ctx.data_dir, name),
        };
        // A `path` that is not there is most likely mistyped: replaying it would create an
        // empty directory and end with nothing said. Following it waits for a writer instead.
        if let Source::Path(p) = &self.source
            && !p.exists()
        {
            if !self.follow {
                return Err(InputError(format!(
                    "no dead letter queue at {}: the directory does not exist (is `path` right? `pipeline: NAME` reads a pipeline's own)",
                    p.display()
                )));
            }
            tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, path = %p.display(),
                "the dead letter queue directory does not exist yet; waiting for a writer to create it");
        }
        // The writer may open it later (another pipeline starting, or a later run).
        std::fs::create_dir_all(&dir).map_err(|e| InputError::io(format!("creating {}", dir.display()), e))?;
        let canonical = dir.canonicalize().map_err(|e| InputError::io(dir.display(), e))?;
        let key = registry_key(&canonical);
        // Looked up before taking a cursor, which would create the key.
        let resume =
            if self.commit_offsets { ctx.registry.get(&key).map(|e| Position::from_u64(e.offset)) } else { None };
        let cursor = self.commit_offsets.then(|| ctx.registry.cursor(&key));
        let from = match resume {
            Some(p) => ReadFrom::Position(p),
            None => self.start,
        };
        let mut reader = DlqReader::open(&dir, from).map_err(|e| InputError(e.to_string()))?;
        tracing::info!(pipeline = %ctx.pipeline, input = %ctx.id, path = %dir.display(), from = %from,
            "reading the dead letter queue");
        if self.clean_consumed
            && let Some(p) = resume
        {
            clean(&reader, p, &ctx);
        }

        let progress = Arc::new(Mutex::new(Progress::default()));
        // The end of the acknowledged prefix, and how many batches it covers.
        let (acked_tx, mut acked_rx) = watch::channel((None::<Position>, 0u64));
        let acked_tx = Arc::new(acked_tx);
        let mut sent: u64 = 0;
        let mut cleaned: Option<Position> = resume;
        let (mut damaged_seen, mut bytes_seen) = (0, 0);
        let mut reading = true;
        loop {
            if !reading && acked_rx.borrow().1 == sent {
                break;
            }
            tokio::select! {
                biased;
                _ = ctx.shutdown.cancelled() => break,
                changed = acked_rx.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let end = acked_rx.borrow_and_update().0;
                    if self.clean_consumed
                        && let Some(end) = end
                        && cleaned.is_none_or(|c| c.segment < end.segment)
                    {
                        clean(&reader, end, &ctx);
                        cleaned = Some(end);
                    }
                }
                // Idle: the writer may have sealed the segment the acknowledged prefix ends in.
                _ = tokio::time::sleep(CLEAN_IDLE_EVERY), if self.clean_consumed && acked_rx.borrow().0.is_some() => {
                    if let Some(end) = acked_rx.borrow().0 {
                        clean(&reader, end, &ctx);
                        cleaned = Some(end);
                    }
                }
                got = reader.next_batch(self.batch_size, self.follow), if reading => {
                    let entries = got.map_err(|e| InputError(e.to_string()))?;
                    let damaged = reader.damaged_frames();
                    ctx.metrics.failed.add(damaged - damaged_seen);
                    damaged_seen = damaged;
                    let read = reader.entry_bytes();
                    ctx.metrics.bytes_in.add(read - bytes_seen);
                    bytes_seen = read;
                    let Some(&(_, end)) = entries.last() else {
                        // Only without `follow`: everything is read.
                        reading = false;
                        continue;
                    };
                    let events: Vec<Event> = entries.into_iter().map(|(entry, _)| replayed_event(entry)).collect();
                    let bytes = events.iter().map(Event::estimated_bytes).sum();
                    let n = events.len();
                    let seq = sent;
                    let (progress, acked_tx, cursor) = (progress.clone(), acked_tx.clone(), cursor.clone());
                    let (pipeline, id) = (ctx.pipeline.clone(), ctx.id.clone());
                    let acker = Acker::new(n, move |outcome| {
                        let mut p = progress.lock();
                        if outcome == AckOutcome::Abandoned {
                            tracing::warn!(pipeline = %pipeline, input = %id, batch = seq,
                                "a replayed batch was given up; positions after it are not committed until a restart");
                        }
                        if let Some(end) = p.finish(seq, end, outcome) {
                            if let Some(c) = &cursor {
                                match end.to_u64() {
                                    Some(packed) => c.commit(packed),
                                    None => tracing::error!(pipeline = %pipeline, input = %id, position = %end,
                                        "dead letter queue position does not fit the registry; not committed"),
                                }
                            }
                            acked_tx.send_replace((Some(end), p.next));
                        }
                    });
                    sent += 1;
                    // Read already: one batch at most is held before its charge, since nothing
                    // more is read until it is sent.
                    let Some(memory) = ctx.reserve(crate::admission::measure_each(&events, 0)).await else {
                        break;
                    };
                    if ctx.send(Batch::new(events, AckSet::single(acker, n), bytes).with_memory(memory)).await.is_err() {
                        break;
                    }
                }
            }
        }
        let (end, acked) = *acked_rx.borrow();
        if self.clean_consumed
            && let Some(end) = end
        {
            clean(&reader, end, &ctx);
        }
        tracing::info!(pipeline = %ctx.pipeline, input = %ctx.id, batches = sent, acknowledged = acked,
            position = %end.map_or_else(|| "none".to_string(), |p| p.to_string()), "dead letter queue input stopped");
        Ok(())
    }
}

fn clean(reader: &DlqReader, up_to: Position, ctx: &InputContext) {
    match reader.delete_consumed(up_to) {
        Ok(0) => {}
        Ok(n) => tracing::info!(pipeline = %ctx.pipeline, input = %ctx.id, segments = n,
            "deleted consumed dead letter queue segments"),
        Err(e) => tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, error = %e,
            "cannot delete consumed dead letter queue segments; will try again"),
    }
}

#[cfg(test)]
mod tests;
