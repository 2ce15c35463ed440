//! A pipeline's side of its dead letter queue: opening it from the config, the entries a worker
//! gathers from one batch, the loop guard, and the counters and rate-limited logs of what could
//! not be stored.
//!
//! Guarantees:
//! - An event that already came out of a dead letter queue (it carries
//!   `/@metadata/dead_letter_queue`) is never written back: it is counted in
//!   `dead_letter_loop_rejected` and logged at most once per [`LOG_INTERVAL`].
//! - [`DeadLetterSink::write`] returns once the entries are durable as the queue's `sync` asks;
//!   the worker acknowledges the batch only after that.
//! - A write the queue fails (a full disk, an I/O error) is the environment's fault, not the
//!   events': it is retried with backoff and the worker's batch waits (backpressure), logged at
//!   most once per [`LOG_INTERVAL`] and counted in `dead_letter_write_retries`, until it succeeds
//!   or the drain timeout aborts it (the batch is then not acknowledged).
//! - Entries the queue refuses by its policy (`drop_newer` when full, larger than `max_bytes`)
//!   are lost on purpose: counted in `dead_letter_lost` and logged at most once per
//!   [`LOG_INTERVAL`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sluice_config::model::PipelineSpec;
use sluice_core::event::METADATA;
use sluice_core::metrics::{DeadLetterStats, DeadLetterStatsSource, PipelineMetrics};
use sluice_core::value::now_nanos;
use sluice_core::{Event, Value};
use sluice_dlq::{DeadLetter, DeadLetterQueue, DeadLetterQueueConfig};

/// Where an event that came from a dead letter queue keeps what the queue said about it.
pub const DLQ_METADATA_KEY: &str = "dead_letter_queue";

/// The shortest time between two log lines about lost or looping dead letters.
pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// True when the event was read from a dead letter queue (`/@metadata/dead_letter_queue` set).
pub fn came_from_dead_letter_queue(event: &Event) -> bool {
    event.fields.get(METADATA).and_then(Value::as_object).is_some_and(|m| m.contains_key(DLQ_METADATA_KEY))
}

/// An open dead letter queue and the settings and directory it was opened with (to tell on
/// reload whether it can be kept).
#[derive(Clone)]
pub struct OpenDeadLetterQueue {
    pub queue: Arc<DeadLetterQueue>,
    pub config: DeadLetterQueueConfig,
    pub dir: PathBuf,
}

impl OpenDeadLetterQueue {
    /// Opens the pipeline's queue if it has one enabled.
    pub fn open(spec: &PipelineSpec, data_dir: &Path) -> Result<Option<OpenDeadLetterQueue>, String> {
        // The section was checked when the pipeline was built.
        let c = DeadLetterQueueConfig::of(spec).map_err(|e| e.to_string())?;
        if !c.enabled {
            return Ok(None);
        }
        let dir = c.dir(data_dir, &spec.name);
        std::fs::create_dir_all(&dir).map_err(|e| {
            format!("pipeline {}: cannot create the dead letter queue {}: {e}", spec.name, dir.display())
        })?;
        let queue =
            DeadLetterQueue::open(&dir, c.options.clone()).map_err(|e| format!("pipeline {}: {e}", spec.name))?;
        tracing::info!(pipeline = %spec.name, path = %dir.display(), max_bytes = c.options.max_bytes,
            "dead letter queue open");
        Ok(Some(OpenDeadLetterQueue { queue, config: c, dir }))
    }

    /// True when the new spec would open the same queue the same way.
    pub fn fits(&self, spec: &PipelineSpec, data_dir: &Path) -> bool {
        DeadLetterQueueConfig::of(spec)
            .is_ok_and(|c| c.enabled && c.dir(data_dir, &spec.name) == self.dir && c == self.config)
    }

    pub fn close(&self, pipeline: &str) {
        if let Err(e) = self.queue.close() {
            tracing::error!(pipeline = %pipeline, error = %e, "closing the dead letter queue failed");
        }
    }
}

/// Reports the store's numbers to `/metrics` and `/stats`.
pub struct StatsSource(pub OpenDeadLetterQueue);

impl DeadLetterStatsSource for StatsSource {
    fn dead_letter_stats(&self) -> DeadLetterStats {
        DeadLetterStats {
            path: self.0.dir.display().to_string(),
            max_bytes: self.0.config.options.max_bytes,
            store: self.0.queue.stats(),
        }
    }
}

/// What workers of one pipeline share to hand events to its dead letter queue.
pub struct DeadLetterSink {
    pipeline: String,
    queue: Option<Arc<DeadLetterQueue>>,
    metrics: Arc<PipelineMetrics>,
    loop_log: RateLimited,
    lost_log: RateLimited,
    stall_log: RateLimited,
    /// Cancelled when the drain timeout runs out: a write waiting on a failing disk gives up.
    abort: tokio_util::sync::CancellationToken,
}

impl DeadLetterSink {
    pub fn new(
        pipeline: &str,
        queue: Option<Arc<DeadLetterQueue>>,
        metrics: Arc<PipelineMetrics>,
        abort: tokio_util::sync::CancellationToken,
    ) -> DeadLetterSink {
        DeadLetterSink {
            pipeline: pipeline.to_string(),
            queue,
            metrics,
            loop_log: RateLimited::default(),
            lost_log: RateLimited::default(),
            stall_log: RateLimited::default(),
            abort,
        }
    }

    pub fn enabled(&self) -> bool {
        self.queue.is_some()
    }

    /// Decides whether `event` may go to the dead letter queue: not when there is none, and
    /// not when it came from one (counted and logged as a loop). Returns true if it may.
    pub fn admits(&self, event: &Event, plugin_id: &str, reason: &str) -> bool {
        if self.queue.is_none() {
            return false;
        }
        if came_from_dead_letter_queue(event) {
            self.metrics.dead_letter_loop_rejected.add(1);
            if let Some(suppressed) = self.loop_log.due() {
                tracing::warn!(pipeline = %self.pipeline, plugin = %plugin_id, reason = %reason,
                    also_since_last_log = suppressed,
                    "an event replayed from the dead letter queue failed again; it is not written back (no loop)");
            }
            return false;
        }
        true
    }

    /// An entry for `event`, rejected now by a plugin.
    pub fn entry(&self, event: Event, reason: String, plugin_id: &str, plugin_type: &str, attempts: u32) -> DeadLetter {
        DeadLetter {
            event,
            reason,
            plugin_id: plugin_id.to_string(),
            plugin_type: plugin_type.to_string(),
            pipeline: self.pipeline.clone(),
            time: now_nanos(),
            attempts,
        }
    }

    /// Writes the entries and waits until they are durable per `sync`. Returns how many were
    /// stored; those the queue refused by its policy are counted as lost and logged
    /// (rate-limited). A write the queue fails — the disk full, an I/O error: the environment,
    /// not the events — is tried again with backoff until it succeeds, holding the worker's batch
    /// (backpressure); `Err` when the drain timeout aborted the wait (nothing acknowledged).
    pub async fn write(&self, entries: Vec<DeadLetter>) -> Result<u64, Aborted> {
        let Some(queue) = &self.queue else { return Ok(0) };
        if entries.is_empty() {
            return Ok(0);
        }
        let total = entries.len() as u64;
        let mut backoff = RETRY_INITIAL;
        let mut failures = 0u64;
        let outcome = loop {
            match queue.write(entries.clone()).await {
                Ok(outcome) => break outcome,
                Err(e) => {
                    failures += 1;
                    self.metrics.dead_letter_write_retries.add(1);
                    if let Some(suppressed) = self.stall_log.due() {
                        tracing::warn!(pipeline = %self.pipeline, error = %e, entries = total, failures,
                            also_since_last_log = suppressed,
                            "the dead letter queue cannot write; the batch waits and is tried again (backpressure)");
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = self.abort.cancelled() => return Err(Aborted),
                    }
                    backoff = (backoff * 2).min(RETRY_MAX);
                }
            }
        };
        if failures > 0 {
            tracing::info!(pipeline = %self.pipeline, failures, "the dead letter queue writes again");
        }
        let stored = outcome.written as u64;
        self.metrics.dead_lettered.add(stored);
        let lost = total - stored;
        if lost > 0 {
            self.metrics.dead_letter_lost.add(lost);
            if let Some(suppressed) = self.lost_log.due() {
                tracing::error!(pipeline = %self.pipeline, lost, also_since_last_log = suppressed,
                    reason = "dropped by the storage policy (full) or too large",
                    "the dead letter queue did not store rejected events; they are lost");
            }
        }
        Ok(stored)
    }
}

/// The drain timeout cut a dead letter write short: the batch is not acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aborted;

/// The pause before retrying a failed dead letter write, doubled each time up to the maximum.
const RETRY_INITIAL: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// Lets a log line through at most once per [`LOG_INTERVAL`], counting the ones held back.
#[derive(Default)]
struct RateLimited {
    state: Mutex<(Option<Instant>, u64)>,
}

impl RateLimited {
    /// `Some(held back since the last one)` when a line may be logged now.
    fn due(&self) -> Option<u64> {
        let mut s = self.state.lock();
        let now = Instant::now();
        match s.0 {
            Some(last) if now.duration_since(last) < LOG_INTERVAL => {
                s.1 += 1;
                None
            }
            _ => {
                let held = std::mem::take(&mut s.1);
                s.0 = Some(now);
                Some(held)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limited_logs_once_per_interval() {
        let r = RateLimited::default();
        assert_eq!(r.due(), Some(0));
        assert_eq!(r.due(), None);
        assert_eq!(r.due(), None);
        r.state.lock().0 = Some(Instant::now() - LOG_INTERVAL);
        assert_eq!(r.due(), Some(2));
    }

    #[test]
    fn replayed_events_are_recognised() {
        let mut e = Event::from_message("x");
        assert!(!came_from_dead_letter_queue(&e));
        let path = sluice_core::FieldPath::parse("/@metadata/dead_letter_queue/reason").unwrap();
        e.insert(&path, Value::from("HTTP 400")).unwrap();
        assert!(came_from_dead_letter_queue(&e));
    }
}
