//! The worker loop: queue → processors → outputs → acknowledgement.
//!
//! Per batch, not per event: one pop, one metrics update per component, one `Vec<&Event>` per
//! output, one acknowledgement call per input batch covered. Processors run in order, each on
//! the events its `if:` selects. Outputs run one after another; a batch is acknowledged after
//! every output has delivered or rejected its share. If shutdown aborts an output mid-send,
//! the batch is not acknowledged (its inputs will see it as abandoned).
//!
//! A worker may have several batches in flight ([`Worker::batches_in_flight`], from the
//! outputs' [`sluice_outputs::Output::batches_in_flight`]): it takes the next batch while
//! earlier ones wait in the outputs, all polled in its own task, each acknowledged on its own
//! once delivered. When its queue is closed and empty it still finishes every batch in flight
//! before it returns. Batches in flight keep their memory charge until they are done.
//!
//! With a dead letter queue: an event a processor fails on with `on_failure: dlq` leaves the
//! batch, and an event an output rejects *permanently* is kept for it; once every output is
//! done, the batch's entries are written in one call, and the batch is acknowledged only after
//! that write returned (durable per the queue's `sync`). A write the queue fails (a full disk,
//! an I/O error) is retried with backoff and holds the batch (backpressure) until it succeeds
//! or the drain timeout aborts it; entries the queue refuses by its policy (`drop_newer` when
//! full, larger than `max_bytes`) count as handled (counted and logged as lost). Events given up after
//! retries, and all rejections when there is no dead letter queue, are counted as failed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use sluice_cluster::Router;
use sluice_core::metrics::PipelineMetrics;
use sluice_core::{AckSet, Batch, Event, Queue};
use sluice_dlq::DeadLetter;
use sluice_processors::Verdict;
use tokio_util::sync::CancellationToken;

use crate::built::{BuiltOutput, BuiltProcessor};
use crate::dead_letter::DeadLetterSink;

/// Everything a batch goes through after the queue: processors (with the forwarding stage
/// before processor `forward_at`), outputs, the dead letter queue.
pub struct Stages {
    pub pipeline: String,
    pub processors: Arc<Vec<BuiltProcessor>>,
    pub outputs: Arc<Vec<BuiltOutput>>,
    pub metrics: Arc<PipelineMetrics>,
    pub dead_letters: Arc<DeadLetterSink>,
    /// Cluster mode: the forwarding stage, run before processor `forward_at`.
    pub router: Option<(usize, Router)>,
    /// Cancelled by the drain timeout: a wait for room in a peer's window gives up.
    pub abort: CancellationToken,
}

pub struct Worker {
    pub index: usize,
    pub queue: Arc<dyn Queue>,
    pub stages: Arc<Stages>,
    /// The processor batches start at (after the forwarding stage, for forwarded events).
    pub from: usize,
    /// Whether batches go through the forwarding stage (not forwarded events: never twice).
    pub route: bool,
    pub batch_size: usize,
    pub batch_delay: Duration,
    /// Batches taken from the queue and not yet done, at most; 1 to handle one at a time.
    pub batches_in_flight: usize,
}

/// How many batches one worker of a pipeline may have in flight: one where order or a
/// stateful stage depends on batches being handled one after another, else what the most
/// patient output allows.
pub fn batches_in_flight(keeps_order: bool, stages: &Stages) -> usize {
    if keeps_order || stages.splits_batches(0) {
        return 1;
    }
    stages.outputs.iter().map(|o| o.output.batches_in_flight()).max().unwrap_or(1).max(1)
}

impl Worker {
    pub async fn run(self) {
        let limit = self.batches_in_flight;
        if limit <= 1 {
            // One batch at a time (ordered pipelines, stateful stages, most outputs): no set of
            // futures to keep, and `handle` counts the busy time.
            while let Some(batch) = self.queue.pop(self.batch_size, self.batch_delay).await {
                self.stages.metrics.events_taken.add(batch.len() as u64);
                self.stages.handle(batch, self.from, self.route, self.index).await;
            }
            return;
        }
        let mut in_flight = FuturesUnordered::new();
        // A pop is not cancel-safe (it may hold events gathered while waiting for the batch to
        // fill), so once started it is kept until it yields, across batches finishing.
        let mut pop = None;
        // Busy time counts while at least one batch is in flight, not per batch, so that
        // overlapping batches do not add up to more than the worker's wall time.
        let mut busy_since: Option<Instant> = None;
        loop {
            if pop.is_none() && in_flight.len() < limit {
                pop = Some(self.queue.pop(self.batch_size, self.batch_delay));
            }
            let popped = match pop.as_mut() {
                Some(p) => tokio::select! {
                    popped = p => {
                        pop = None;
                        Some(popped)
                    }
                    Some(()) = in_flight.next(), if !in_flight.is_empty() => None,
                },
                None => {
                    in_flight.next().await;
                    None
                }
            };
            match popped {
                Some(Some(batch)) => {
                    self.stages.metrics.events_taken.add(batch.len() as u64);
                    busy_since.get_or_insert_with(Instant::now);
                    let (stages, from, route, index) = (&*self.stages, self.from, self.route, self.index);
                    in_flight.push(async move {
                        stages.run_batch(batch, from, route, index).await;
                    });
                }
                Some(None) => break,
                None => self.count_busy(&mut busy_since, in_flight.is_empty()),
            }
        }
        while in_flight.next().await.is_some() {
            self.count_busy(&mut busy_since, in_flight.is_empty());
        }
    }

    /// Adds the time since the last mark to the busy time, called as a batch finishes.
    fn count_busy(&self, since: &mut Option<Instant>, idle: bool) {
        if let Some(start) = since.take() {
            let now = Instant::now();
            self.stages.metrics.worker_busy_nanos.add(now.duration_since(start).as_nanos() as u64);
            if !idle {
                *since = Some(now);
            }
        }
    }
}

impl Stages {
    /// True when a batch may be split into parts handled in different places.
    fn splits_batches(&self, from: usize) -> bool {
        self.router.is_some()
            || self.processors[from.min(self.processors.len())..].iter().any(|p| p.processor.stateful().is_some())
    }

    /// Runs a batch from processor `from` to the outputs and acknowledges it; `route` says
    /// whether the forwarding stage applies (not to events forwarded here). Returns false if
    /// shutdown cut the delivery short (the batch was not acknowledged). Its time counts as
    /// busy time of the workers.
    pub async fn handle(&self, batch: Batch, from: usize, route: bool, worker: usize) -> bool {
        let started = Instant::now();
        let delivered = self.run_batch(batch, from, route, worker).await;
        self.metrics.worker_busy_nanos.add(started.elapsed().as_nanos() as u64);
        delivered
    }

    /// [`Stages::handle`] without counting busy time, which a worker with several batches in
    /// flight counts itself.
    async fn run_batch(&self, mut batch: Batch, from: usize, route: bool, worker: usize) -> bool {
        let started = Instant::now();
        if !batch.acks.is_empty() && self.splits_batches(from) {
            let n = batch.len();
            let inner = std::mem::take(&mut batch.acks);
            batch.acks = AckSet::single(sluice_cluster::join_acks(inner, n), n);
        }
        let mut dead_letters = Vec::new();
        let mut delivered = Some(0);
        let mut dropped = 0;
        let end = self.processors.len();
        match &self.router {
            Some((k, router)) if route && *k >= from => {
                dropped += self.process(from..*k, &mut batch, &mut dead_letters);
                if !batch.events.is_empty() {
                    let before = batch.len();
                    match router.route(&mut batch.events, &mut batch.acks, &mut batch.memory, &self.abort).await {
                        Ok(_) => self.metrics.forwarded.add((before - batch.len()) as u64),
                        Err(_) => delivered = None,
                    }
                }
                if delivered.is_some() {
                    dropped += self.process(*k..end, &mut batch, &mut dead_letters);
                }
            }
            _ => dropped += self.process(from..end, &mut batch, &mut dead_letters),
        }
        if delivered.is_some() {
            delivered = self.deliver(&batch.events, &mut dead_letters).await;
        }
        // Entries from processors are not in the batch any more: they are handled here. A
        // dead letter queue that cannot write (a full disk) holds the batch until it can;
        // a drain timeout meanwhile leaves the batch unacknowledged, like an output's.
        if delivered.is_some() && self.dead_letters.write(dead_letters).await.is_err() {
            delivered = None;
        }
        let elapsed = started.elapsed();
        // Batches of one worker in flight together each count their own whole duration.
        self.metrics.batch_duration.observe(elapsed);
        self.metrics.dropped.add(dropped);
        match delivered {
            Some(failed) => {
                self.metrics.events_out.add(batch.events.len() as u64);
                self.metrics.failed.add(failed);
                batch.complete();
                true
            }
            None => {
                tracing::warn!(pipeline = %self.pipeline, worker, events = batch.len(),
                    "shutdown cut delivery short; these events are not acknowledged");
                drop(batch);
                false
            }
        }
    }

    /// Applies processors `range`; returns how many events they dropped. Events sent to the
    /// dead letter queue leave the batch for `dead_letters`; events a stateful processor
    /// consumes leave it with their share of its acknowledgements.
    fn process(&self, range: std::ops::Range<usize>, batch: &mut Batch, dead_letters: &mut Vec<DeadLetter>) -> u64 {
        let mut dropped_total = 0;
        for p in &self.processors[range] {
            let started = Instant::now();
            if let Some(stateful) = p.processor.stateful() {
                let before = batch.len() as u64;
                let selected = |e: &Event| p.condition.as_ref().is_none_or(|c| c.eval(e));
                let c = stateful.consume(&mut batch.events, &selected, &mut batch.acks);
                p.metrics.events_in.add(before);
                p.metrics.events_out.add(before - c.consumed - c.dropped);
                p.metrics.dropped.add(c.dropped);
                p.metrics.duration.observe(started.elapsed());
                self.metrics.consumed.add(c.consumed);
                // What a stateful processor consumed gave its memory back with it: the share
                // of the batch's charge goes with the events that left.
                let left = batch.len();
                if (left as u64) < before {
                    drop(batch.memory.split_share((before as usize) - left, before as usize));
                }
                dropped_total += c.dropped;
                if batch.events.is_empty() {
                    break;
                }
                continue;
            }
            let events = &mut batch.events;
            let before = events.len();
            let (mut seen, mut dropped, mut failed, mut dead) = (0u64, 0u64, 0u64, 0u64);
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
                    Verdict::DeadLetter(reason) => {
                        failed += 1;
                        // Refused (no queue, or a replayed event failing again): it stays in
                        // the batch, tagged, as with `on_failure: tag`.
                        if !self.dead_letters.admits(e, &p.id, &reason) {
                            return true;
                        }
                        dead += 1;
                        let event = std::mem::take(e);
                        dead_letters.push(self.dead_letters.entry(event, reason, &p.id, &p.metrics.type_name, 1));
                        false
                    }
                }
            });
            debug_assert_eq!(before - events.len(), (dropped + dead) as usize);
            p.metrics.events_in.add(seen);
            p.metrics.events_out.add(seen - dropped - dead);
            p.metrics.dropped.add(dropped);
            p.metrics.failed.add(failed);
            p.metrics.duration.observe(started.elapsed());
            dropped_total += dropped;
            self.metrics.diverted_to_dead_letter_queue.add(dead);
            if events.is_empty() {
                break;
            }
        }
        dropped_total
    }

    /// Sends to every output; returns the number of events rejected and not kept for the dead
    /// letter queue, or `None` if aborted. Permanent rejections go to `dead_letters` when the
    /// pipeline has a dead letter queue.
    async fn deliver(&self, events: &[Event], dead_letters: &mut Vec<DeadLetter>) -> Option<u64> {
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
            let mut failed = 0u64;
            let mut first_reason: Option<String> = None;
            for r in delivery.rejected {
                let Some(&event) = selected.get(r.index) else {
                    failed += 1;
                    continue;
                };
                if r.permanent && self.dead_letters.admits(event, &o.id, &r.reason) {
                    let entry =
                        self.dead_letters.entry(event.clone(), r.reason, &o.id, &o.metrics.type_name, r.attempts);
                    dead_letters.push(entry);
                } else {
                    failed += 1;
                    first_reason.get_or_insert(r.reason);
                }
            }
            if let Some(reason) = first_reason {
                tracing::error!(pipeline = %self.pipeline, output = %o.id, rejected = failed, reason = %reason,
                    "output rejected events for good; they are counted as failed");
            }
            rejected_total += failed;
        }
        Some(rejected_total)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use async_trait::async_trait;
    use sluice_core::metrics::{ComponentKind, ComponentMetrics};
    use sluice_core::{AckSet, Acker, Batch, Value};
    use sluice_dlq::{DeadLetterQueue, DlqOptions};
    use sluice_outputs::{Aborted, Delivery, Output, Rejected};
    use sluice_queue::memory::MemoryQueue;

    use super::*;

    /// Refuses events whose `n` is odd for good; gives up on multiples of 4 (not their fault).
    struct Picky;

    #[async_trait]
    impl Output for Picky {
        async fn send(&self, events: &[&Event]) -> Result<Delivery, Aborted> {
            let n = |e: &Event| match e.fields.get("n") {
                Some(Value::Int(n)) => *n,
                _ => 0,
            };
            let mut rejected = Vec::new();
            for (i, e) in events.iter().enumerate() {
                if n(e) % 2 == 1 {
                    rejected.push(Rejected::refused(i, format!("HTTP 400: n={} is odd", n(e)), 3));
                } else if n(e) % 4 == 0 {
                    rejected.push(Rejected::gave_up(i, "HTTP 503: busy", 5));
                }
            }
            Ok(Delivery { rejected })
        }
    }

    fn event(n: i64) -> Event {
        let mut e = Event::from_message("x");
        e.fields.insert("n", Value::Int(n));
        e
    }

    /// One worker over a memory queue delivering to a single [`Picky`] output of pipeline "p".
    fn picky_worker(dlq: Option<Arc<DeadLetterQueue>>) -> (Worker, Arc<dyn Queue>, Arc<PipelineMetrics>) {
        let metrics = Arc::new(PipelineMetrics::new("p", 1));
        let queue: Arc<dyn Queue> = Arc::new(MemoryQueue::new(100, 1 << 20));
        let output = BuiltOutput {
            id: "out".to_string(),
            output: Arc::new(Picky),
            condition: None,
            metrics: Arc::new(ComponentMetrics::new("out", ComponentKind::Output, "picky")),
        };
        let stages = Stages {
            pipeline: "p".to_string(),
            processors: Arc::new(Vec::new()),
            outputs: Arc::new(vec![output]),
            metrics: metrics.clone(),
            dead_letters: Arc::new(DeadLetterSink::new("p", dlq, metrics.clone(), Default::default())),
            router: None,
            abort: CancellationToken::new(),
        };
        let worker = Worker {
            index: 0,
            queue: queue.clone(),
            stages: Arc::new(stages),
            from: 0,
            route: true,
            batch_size: 100,
            batch_delay: Duration::from_millis(1),
            batches_in_flight: 1,
        };
        (worker, queue, metrics)
    }

    /// Holds every `send` until released, counting the sends in progress.
    struct Gate {
        in_send: AtomicUsize,
        most_in_send: AtomicUsize,
        sends: AtomicUsize,
        release: tokio::sync::Semaphore,
        abort: CancellationToken,
    }

    #[async_trait]
    impl Output for Gate {
        async fn send(&self, _events: &[&Event]) -> Result<Delivery, Aborted> {
            let now = self.in_send.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_in_send.fetch_max(now, Ordering::SeqCst);
            self.sends.fetch_add(1, Ordering::SeqCst);
            let released = tokio::select! {
                p = self.release.acquire() => p.map(|p| p.forget()).is_ok(),
                _ = self.abort.cancelled() => false,
            };
            self.in_send.fetch_sub(1, Ordering::SeqCst);
            if released { Ok(Delivery::all_delivered()) } else { Err(Aborted) }
        }

        fn batches_in_flight(&self) -> usize {
            3
        }
    }

    /// One worker of a pipeline (ordered or not) over a memory queue holding six batches of
    /// two events, each acknowledged as delivered into `acks` (one entry each time); the queue is
    /// closed, so the worker returns once all six are done.
    async fn gated_worker(ordered: bool) -> (Worker, Arc<Gate>, Arc<parking_lot::Mutex<Vec<usize>>>) {
        let metrics = Arc::new(PipelineMetrics::new("p", 1));
        let queue: Arc<dyn Queue> = Arc::new(MemoryQueue::new(100, 1 << 20));
        let abort = CancellationToken::new();
        let gate = Arc::new(Gate {
            in_send: AtomicUsize::new(0),
            most_in_send: AtomicUsize::new(0),
            sends: AtomicUsize::new(0),
            release: tokio::sync::Semaphore::new(0),
            abort: abort.clone(),
        });
        let output = BuiltOutput {
            id: "out".to_string(),
            output: gate.clone(),
            condition: None,
            metrics: Arc::new(ComponentMetrics::new("out", ComponentKind::Output, "gate")),
        };
        let stages = Arc::new(Stages {
            pipeline: "p".to_string(),
            processors: Arc::new(Vec::new()),
            outputs: Arc::new(vec![output]),
            metrics: metrics.clone(),
            dead_letters: Arc::new(DeadLetterSink::new("p", None, metrics.clone(), Default::default())),
            router: None,
            abort,
        });
        let acks = Arc::new(parking_lot::Mutex::new(Vec::new()));
        for b in 0..6 {
            let acked = acks.clone();
            let acker = Acker::new(2, move |outcome| {
                if outcome == sluice_core::ack::AckOutcome::Handled {
                    acked.lock().push(b);
                }
            });
            queue
                .push(Batch::new(vec![event(2 * b as i64), event(2 * b as i64 + 1)], AckSet::single(acker, 2), 2))
                .await
                .unwrap();
        }
        queue.close();
        let worker = Worker {
            index: 0,
            queue,
            batches_in_flight: batches_in_flight(ordered, &stages),
            stages,
            from: 0,
            route: true,
            // One pushed batch per pop: the queue's batches are the worker's.
            batch_size: 2,
            batch_delay: Duration::ZERO,
        };
        (worker, gate, acks)
    }

    /// Waits until `sends` sends have started and `in_send` are in progress, failing after a
    /// few seconds.
    async fn until_sends(gate: &Gate, sends: usize, in_send: usize) {
        let now = || (gate.sends.load(Ordering::SeqCst), gate.in_send.load(Ordering::SeqCst));
        for _ in 0..500 {
            if now() == (sends, in_send) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("(sends, in progress) = {:?}, expected {:?}", now(), (sends, in_send));
    }

    #[tokio::test]
    async fn an_unordered_pipeline_keeps_as_many_batches_in_flight_as_its_output_allows() {
        let (worker, gate, acks) = gated_worker(false).await;
        assert_eq!(worker.batches_in_flight, 3);
        let run = tokio::spawn(worker.run());
        until_sends(&gate, 3, 3).await;
        // Given time, no fourth batch is taken while three wait.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!((gate.sends.load(Ordering::SeqCst), gate.in_send.load(Ordering::SeqCst)), (3, 3));
        assert!(acks.lock().is_empty(), "nothing acknowledged before it is delivered");
        gate.release.add_permits(1);
        // One done, one more taken.
        until_sends(&gate, 4, 3).await;
        assert_eq!(*acks.lock(), [0]);
        gate.release.add_permits(5);
        tokio::time::timeout(Duration::from_secs(5), run).await.expect("the worker finished").unwrap();
        assert_eq!(gate.most_in_send.load(Ordering::SeqCst), 3);
        let mut acked = acks.lock().clone();
        acked.sort();
        assert_eq!(acked, [0, 1, 2, 3, 4, 5], "every batch acknowledged exactly once");
    }

    #[tokio::test]
    async fn an_ordered_pipeline_keeps_one_batch_in_flight() {
        let (worker, gate, acks) = gated_worker(true).await;
        assert_eq!(worker.batches_in_flight, 1);
        let run = tokio::spawn(worker.run());
        until_sends(&gate, 1, 1).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(gate.sends.load(Ordering::SeqCst), 1);
        gate.release.add_permits(6);
        tokio::time::timeout(Duration::from_secs(5), run).await.expect("the worker finished").unwrap();
        assert_eq!(gate.most_in_send.load(Ordering::SeqCst), 1);
        assert_eq!(*acks.lock(), [0, 1, 2, 3, 4, 5], "in order, each once");
    }

    #[tokio::test]
    async fn shutdown_with_batches_in_flight_acknowledges_only_those_delivered() {
        let (worker, gate, acks) = gated_worker(false).await;
        let abort = worker.stages.abort.clone();
        let run = tokio::spawn(worker.run());
        until_sends(&gate, 3, 3).await;
        gate.release.add_permits(1);
        until_sends(&gate, 4, 3).await;
        // The drain timeout runs out with three batches in the output and two still queued.
        abort.cancel();
        tokio::time::timeout(Duration::from_secs(5), run).await.expect("the worker finished").unwrap();
        assert_eq!(*acks.lock(), [0], "only the delivered batch is acknowledged");
        assert_eq!(gate.in_send.load(Ordering::SeqCst), 0, "the worker waited for its sends to end");
    }

    #[tokio::test]
    async fn refused_events_are_durable_before_the_batch_is_acknowledged() {
        let dir = tempfile::tempdir().unwrap();
        let dlq = DeadLetterQueue::open(dir.path(), DlqOptions::default()).unwrap();
        let (worker, queue, metrics) = picky_worker(Some(dlq.clone()));
        let stored_at_ack = Arc::new(AtomicBool::new(false));
        let (seen, check) = (stored_at_ack.clone(), dlq.clone());
        let (acked_tx, acked_rx) = tokio::sync::oneshot::channel();
        let acker = Acker::new(8, move |_| {
            seen.store(check.stats().entries == 4, Ordering::SeqCst);
            let _ = acked_tx.send(());
        });
        let events: Vec<Event> = (0..8).map(event).collect();
        queue.push(Batch::new(events, AckSet::single(acker, 8), 8)).await.unwrap();
        queue.close();
        worker.run().await;
        acked_rx.await.unwrap();
        assert!(stored_at_ack.load(Ordering::SeqCst), "the four odd events were stored before the acknowledgement");
        assert_eq!(metrics.dead_lettered.get(), 4);
        assert_eq!(metrics.failed.get(), 2, "0 and 4 were given up on: counted as failed, not dead-lettered");
        dlq.close().unwrap();

        let mut reader = sluice_dlq::DlqReader::open(dir.path(), sluice_dlq::ReadFrom::Beginning).unwrap();
        let entries = reader.next_batch(10, false).await.unwrap();
        let odd: Vec<i64> = entries
            .iter()
            .map(|(e, _)| match e.event.fields.get("n") {
                Some(Value::Int(n)) => *n,
                _ => -1,
            })
            .collect();
        assert_eq!(odd, [1, 3, 5, 7]);
        let (first, _) = &entries[0];
        assert_eq!((first.reason.as_str(), first.plugin_id.as_str()), ("HTTP 400: n=1 is odd", "out"));
        assert_eq!((first.plugin_type.as_str(), first.pipeline.as_str(), first.attempts), ("picky", "p", 3));
    }

    #[tokio::test]
    async fn without_a_dead_letter_queue_every_rejection_counts_as_failed() {
        let (worker, queue, metrics) = picky_worker(None);
        queue.push(Batch::untracked((0..8).map(event).collect(), 8)).await.unwrap();
        queue.close();
        worker.run().await;
        assert_eq!((metrics.failed.get(), metrics.dead_lettered.get()), (6, 0));
    }

    #[tokio::test]
    async fn a_replayed_event_refused_again_is_not_written_back() {
        let dir = tempfile::tempdir().unwrap();
        let dlq = DeadLetterQueue::open(dir.path(), DlqOptions::default()).unwrap();
        let (worker, queue, metrics) = picky_worker(Some(dlq.clone()));
        let mut replayed = event(1);
        let reason = sluice_core::FieldPath::parse("/@metadata/dead_letter_queue/reason").unwrap();
        replayed.insert(&reason, Value::from("HTTP 400: n=1 is odd")).unwrap();
        queue.push(Batch::untracked(vec![replayed, event(3)], 2)).await.unwrap();
        queue.close();
        worker.run().await;
        assert_eq!(metrics.dead_letter_loop_rejected.get(), 1);
        assert_eq!((metrics.dead_lettered.get(), metrics.failed.get()), (1, 1), "only the fresh one is stored");
        assert_eq!(dlq.stats().entries, 1);
        dlq.close().unwrap();
    }
}
