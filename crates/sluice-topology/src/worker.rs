//! The worker loop: queue → processors → outputs → acknowledgement.
//!
//! Per batch, not per event: one pop, one metrics update per component, one `Vec<&Event>` per
//! output, one acknowledgement call per input batch covered. Processors run in order, each on
//! the events its `if:` selects. Outputs run one after another; a batch is acknowledged after
//! every output has delivered or rejected its share. If shutdown aborts an output mid-send,
//! the batch is not acknowledged (its inputs will see it as abandoned).

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_core::metrics::PipelineMetrics;
use sluice_core::{Event, Queue};
use sluice_processors::Verdict;

use crate::build::{BuiltOutput, BuiltProcessor};

pub struct Worker {
    pub pipeline: String,
    pub index: usize,
    pub queue: Arc<dyn Queue>,
    pub processors: Arc<Vec<BuiltProcessor>>,
    pub outputs: Arc<Vec<BuiltOutput>>,
    pub metrics: Arc<PipelineMetrics>,
    pub batch_size: usize,
    pub batch_delay: Duration,
}

impl Worker {
    pub async fn run(self) {
        while let Some(mut batch) = self.queue.pop(self.batch_size, self.batch_delay).await {
            let started = Instant::now();
            let taken = batch.len() as u64;
            self.metrics.events_in.add(taken);
            let dropped = self.process(&mut batch.events);
            let delivered = self.deliver(&batch.events).await;
            let elapsed = started.elapsed();
            self.metrics.batch_duration.observe(elapsed);
            self.metrics.worker_busy_nanos.add(elapsed.as_nanos() as u64);
            self.metrics.dropped.add(dropped);
            match delivered {
                Some(failed) => {
                    self.metrics.events_out.add(batch.len() as u64);
                    self.metrics.failed.add(failed);
                    batch.complete();
                }
                None => {
                    tracing::warn!(pipeline = %self.pipeline, worker = self.index, events = batch.len(),
                        "shutdown cut delivery short; these events are not acknowledged");
                    drop(batch);
                }
            }
        }
    }

    /// Applies the processors; returns how many events they dropped.
    fn process(&self, events: &mut Vec<Event>) -> u64 {
        let mut dropped_total = 0;
        for p in self.processors.iter() {
            let started = Instant::now();
            let before = events.len();
            let (mut seen, mut dropped, mut failed) = (0u64, 0u64, 0u64);
            events.retain_mut(|e| {
                if let Some(c) = &p.condition
                    && !c.eval(e)
                {
                    return true;
                }
                seen += 1;
                match p.processor.process(e) {
                    Verdict::Keep => true,
                    Verdict::Drop => {
                        dropped += 1;
                        false
                    }
                    Verdict::Failed => {
                        failed += 1;
                        true
                    }
                }
            });
            debug_assert_eq!(before - events.len(), dropped as usize);
            p.metrics.events_in.add(seen);
            p.metrics.events_out.add(seen - dropped);
            p.metrics.dropped.add(dropped);
            p.metrics.failed.add(failed);
            p.metrics.duration.observe(started.elapsed());
            dropped_total += dropped;
            if events.is_empty() {
                break;
            }
        }
        dropped_total
    }

    /// Sends to every output; returns the number of rejected events, or `None` if aborted.
    async fn deliver(&self, events: &[Event]) -> Option<u64> {
        let mut rejected_total = 0;
        for o in self.outputs.iter() {
            let selected: Vec<&Event> = match &o.condition {
                None => events.iter().collect(),
                Some(c) => events.iter().filter(|e| c.eval(e)).collect(),
            };
            if selected.is_empty() {
                continue;
            }
            let started = Instant::now();
            o.metrics.events_in.add(selected.len() as u64);
            let delivery = o.output.send(&selected).await.ok()?;
            let rejected = delivery.rejected.len() as u64;
            o.metrics.events_out.add(selected.len() as u64 - rejected);
            o.metrics.failed.add(rejected);
            o.metrics.duration.observe(started.elapsed());
            if let Some(first) = delivery.rejected.first() {
                tracing::error!(pipeline = %self.pipeline, output = %o.id, rejected, reason = %first.reason,
                    "output rejected events for good");
            }
            rejected_total += rejected;
        }
        Some(rejected_total)
    }
}
