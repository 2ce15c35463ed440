//! One running pipeline: its input tasks, its workers, and how it drains.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sluice_config::model::PipelineSpec;
use sluice_core::Queue;
use sluice_core::bus::PipelineBus;
use sluice_core::health::Lifecycle;
use sluice_core::metrics::{ComponentKind, ComponentMetrics, PipelineMetrics};
use sluice_inputs::InputContext;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::built::{BuiltOutput, BuiltPipeline};
use crate::dead_letter::{DeadLetterSink, OpenDeadLetterQueue, StatsSource};
use crate::inbound::InboundQueue;
use crate::stateful::Emitters;
use crate::worker::{Stages, Worker};

/// How long an input may take to bind its address before the start is given up.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// Cluster mode: the queue of events peers forwarded to this pipeline, and its workers.
struct Forwarded {
    cluster: sluice_cluster::Cluster,
    queue: Arc<dyn Queue>,
    workers: Vec<JoinHandle<()>>,
}

pub struct RunningPipeline {
    pub spec: PipelineSpec,
    pub metrics: Arc<PipelineMetrics>,
    queue: Arc<dyn Queue>,
    /// Stops the inputs events enter by from outside the node.
    input_stop: CancellationToken,
    /// Stops the `pipeline` inputs, which other pipelines feed: they stop last, once the
    /// pipelines upstream have stopped sending.
    internal_input_stop: CancellationToken,
    inputs: Vec<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
    outputs: Arc<Vec<BuiltOutput>>,
    abort: CancellationToken,
    stages: Arc<Stages>,
    emitters: Option<Emitters>,
    forwarded: Option<Forwarded>,
    /// Inputs still running that are not fed by other pipelines.
    pub external_inputs: Arc<AtomicUsize>,
    /// Inputs that stopped with an error.
    pub input_errors: Arc<AtomicUsize>,
    /// Inputs that bind an address as they start (see [`RunningPipeline::started`]).
    listening: Vec<Arc<ComponentMetrics>>,
    /// Closed by `stop` unless a reload took it for the pipeline's next version.
    dead_letter_queue: Option<OpenDeadLetterQueue>,
    has_dead_letter_queue: bool,
}

/// The one-line account of a pipeline printed at shutdown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelineSummary {
    pub name: String,
    /// Accepted from inputs.
    pub events_in: u64,
    /// Passed the processors and were handed to every output.
    pub events_out: u64,
    /// Dropped on purpose by processors.
    pub dropped: u64,
    /// Rejected for good by outputs and not handed to a dead letter queue (included in
    /// `events_out`).
    pub failed: u64,
    /// Events processors failed on (unparsable JSON, no pattern matched) and tagged, and that
    /// went on tagged (those sent to the dead letter queue are in `dead_lettered`).
    pub tagged: u64,
    /// Accepted but not handled when the drain timeout ran out (lost with a memory queue).
    pub unfinished: u64,
    /// Left in a persisted queue, to be delivered after the next start.
    pub queued: Option<u64>,
    /// With a dead letter queue: events written to it (from processors and outputs).
    pub dead_lettered: Option<u64>,
    /// With stateful processors: events they consumed into groups, and events they emitted.
    pub consumed_emitted: Option<(u64, u64)>,
    /// In cluster mode: events forwarded to the nodes that own them, and received from peers.
    pub forwarded_received: Option<(u64, u64)>,
    pub seconds_millis: u64,
    pub input_errors: usize,
    /// Already logged (by the reload that stopped the pipeline).
    pub reported: bool,
}

impl PipelineSummary {
    /// The summary as one log event with a field per figure (for `log.format: json`, and for a
    /// pipeline a reload stops).
    pub fn log(&self, message: &str) {
        let (consumed, emitted) = self.consumed_emitted.unwrap_or_default();
        let (forwarded, received) = self.forwarded_received.unwrap_or_default();
        tracing::info!(
            pipeline = %self.name,
            events_in = self.events_in,
            events_out = self.events_out,
            dropped = self.dropped,
            failed = self.failed,
            tagged = self.tagged,
            unfinished = self.unfinished,
            queued = self.queued.unwrap_or(0),
            dead_lettered = self.dead_lettered.unwrap_or(0),
            consumed,
            emitted,
            forwarded,
            received,
            seconds = self.seconds_millis as f64 / 1000.0,
            input_errors = self.input_errors,
            "{message}"
        );
    }
}

impl fmt::Display for PipelineSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pipeline {}: in={} out={} dropped={} failed={} tagged={} unfinished={}",
            self.name, self.events_in, self.events_out, self.dropped, self.failed, self.tagged, self.unfinished
        )?;
        if let Some(q) = self.queued {
            write!(f, " queued={q}")?;
        }
        if let Some(d) = self.dead_lettered {
            write!(f, " dead_lettered={d}")?;
        }
        if let Some((c, e)) = self.consumed_emitted {
            write!(f, " consumed={c} emitted={e}")?;
        }
        if let Some((fw, r)) = self.forwarded_received {
            write!(f, " forwarded={fw} received={r}")?;
        }
        write!(f, " seconds={}.{:03}", self.seconds_millis / 1000, self.seconds_millis % 1000)
    }
}

/// What the node's pipelines share: the bus between them, the data directory, the registry
/// of input positions, the memory budget, and the cluster in cluster mode.
pub struct NodeServices<'a> {
    pub bus: &'a Arc<PipelineBus>,
    pub data_dir: &'a std::path::Path,
    pub registry: &'a Arc<sluice_registry::Registry>,
    pub memory: &'a Arc<sluice_core::MemoryBudget>,
    /// Notified when an input ends.
    pub inputs_changed: &'a Arc<Notify>,
    pub cluster: Option<&'a sluice_cluster::Cluster>,
}

impl RunningPipeline {
    /// Opens the dead letter queue (or takes over `reuse`, the one of the pipeline's previous
    /// version), opens the queue, then starts workers and inputs. Fails only if a queue cannot
    /// open.
    pub async fn start(
        built: BuiltPipeline,
        node: &NodeServices<'_>,
        reuse: Option<OpenDeadLetterQueue>,
    ) -> Result<RunningPipeline, String> {
        let &NodeServices { bus, data_dir, registry, memory, inputs_changed, cluster } = node;
        let BuiltPipeline { spec, metrics, queue, inputs, processors, outputs, abort, keyed } = built;
        let dead_letter_queue = match reuse {
            Some(d) => Some(d),
            None => OpenDeadLetterQueue::open(&spec, data_dir)?,
        };
        if let Err(e) = queue.start().await {
            if let Some(d) = &dead_letter_queue {
                d.close(&spec.name);
            }
            return Err(format!("pipeline {}: {e}", spec.name));
        }
        if let Some(d) = &dead_letter_queue {
            let _ = metrics.dead_letter_queue.set(Arc::new(StatsSource(d.clone())));
        }
        let sink = Arc::new(DeadLetterSink::new(
            &spec.name,
            dead_letter_queue.as_ref().map(|d| d.queue.clone()),
            metrics.clone(),
            abort.clone(),
        ));
        let input_stop = CancellationToken::new();
        let internal_input_stop = CancellationToken::new();
        let external_inputs = Arc::new(AtomicUsize::new(0));
        let input_errors = Arc::new(AtomicUsize::new(0));

        let mut input_tasks = Vec::new();
        let mut listening = Vec::new();
        for i in inputs {
            let external = !i.input.is_internal();
            if external {
                external_inputs.fetch_add(1, Ordering::SeqCst);
            }
            let ctx = InputContext {
                pipeline: spec.name.clone(),
                id: i.id.clone(),
                queue: queue.clone(),
                metrics: i.metrics.clone(),
                shutdown: if external { input_stop.clone() } else { internal_input_stop.clone() },
                bus: bus.clone(),
                data_dir: data_dir.to_path_buf(),
                registry: registry.clone(),
                memory: memory.clone(),
            };
            let (pipeline, id) = (spec.name.clone(), i.id.clone());
            let (counter, errors, changed) = (external_inputs.clone(), input_errors.clone(), inputs_changed.clone());
            let component = i.metrics.clone();
            if i.input.listens() {
                listening.push(i.metrics.clone());
            } else {
                component.health.running();
            }
            input_tasks.push(tokio::spawn(async move {
                match i.input.run(ctx).await {
                    Ok(()) => component.health.stopped(),
                    Err(e) => {
                        tracing::error!(pipeline = %pipeline, input = %id, error = %e, "input stopped");
                        component.health.failed(e.to_string());
                        errors.fetch_add(1, Ordering::SeqCst);
                    }
                }
                if external {
                    counter.fetch_sub(1, Ordering::SeqCst);
                }
                changed.notify_waiters();
            }));
        }

        let router = match (cluster, &keyed) {
            (Some(c), Some((k, keys))) => Some((*k, c.router(&spec.name, keys.clone()), c.clone(), keys.clone())),
            _ => None,
        };
        let stages = Arc::new(Stages {
            pipeline: spec.name.clone(),
            processors: processors.clone(),
            outputs: outputs.clone(),
            metrics: metrics.clone(),
            dead_letters: sink.clone(),
            router: router.as_ref().map(|(k, r, _, _)| (*k, r.clone())),
            abort: abort.clone(),
        });
        let keeps_order = spec.keeps_order();
        let in_flight = crate::worker::batches_in_flight(keeps_order, &stages);
        let start_workers =
            |queue: &Arc<dyn Queue>, from: usize, route: bool, delay: Duration| -> Vec<JoinHandle<()>> {
                (0..spec.workers)
                    .map(|index| {
                        let w = Worker {
                            index,
                            queue: queue.clone(),
                            stages: stages.clone(),
                            from,
                            route,
                            batch_size: spec.batch.size,
                            batch_delay: delay,
                            batches_in_flight: in_flight,
                        };
                        tokio::spawn(w.run())
                    })
                    .collect()
            };
        let forwarded = match router {
            Some((k, _, cluster, keys)) => {
                let fq = sluice_queue::build_forwarded(&spec.queue, &spec.name, data_dir).map_err(|e| e.to_string())?;
                fq.start().await.map_err(|e| format!("pipeline {}: forwarded-events queue: {e}", spec.name))?;
                let _ = metrics.forwarded_queue.set(fq.clone());
                let inbound = InboundQueue { queue: fq.clone(), memory: memory.clone(), metrics: metrics.clone() };
                cluster.register_inbound(&spec.name, keys, Arc::new(inbound));
                // A forwarded batch is already a batch: it is processed as it arrives, never
                // held back waiting for more.
                let workers = start_workers(&fq, k, false, Duration::ZERO);
                Some(Forwarded { cluster, queue: fq, workers })
            }
            None => None,
        };
        let workers = start_workers(&queue, 0, true, spec.batch.delay.0);
        let emitters =
            stages.processors.iter().any(|p| p.processor.stateful().is_some()).then(|| Emitters::start(&stages));

        for c in metrics.components.read().iter().filter(|c| c.kind != ComponentKind::Input) {
            c.health.running();
        }
        tracing::info!(pipeline = %spec.name, workers = spec.workers, batch_size = spec.batch.size,
            queue = %spec.queue.type_name, ordered = keeps_order,
            batches_in_flight = in_flight, "pipeline started");
        if spec.ordered == sluice_config::model::Ordered::Auto && !keeps_order {
            tracing::info!(pipeline = %spec.name, workers = spec.workers,
                "events of different batches may leave this pipeline in another order than they came in \
                 (several workers, or a persisted queue with several shards); `ordered: true` keeps them in order");
        }
        Ok(RunningPipeline {
            spec,
            metrics,
            queue,
            input_stop,
            internal_input_stop,
            inputs: input_tasks,
            workers,
            outputs,
            abort,
            stages,
            emitters,
            forwarded,
            external_inputs,
            input_errors,
            listening,
            has_dead_letter_queue: dead_letter_queue.is_some(),
            dead_letter_queue,
        })
    }

    /// Waits (at most [`START_TIMEOUT`]) until every input that binds an address has bound
    /// it; the reason of each that could not, naming the pipeline, the input and its type.
    pub async fn started(&self) -> Result<(), Vec<String>> {
        let mut failures = Vec::new();
        for c in &self.listening {
            let why = match tokio::time::timeout(START_TIMEOUT, c.health.settled()).await {
                Ok(Lifecycle::Failed(reason)) => reason,
                Ok(_) => continue,
                Err(_) => format!("it did not start within {START_TIMEOUT:?}"),
            };
            failures
                .push(format!("pipeline `{}`: input `{}` ({}) cannot start: {why}", self.spec.name, c.id, c.type_name));
        }
        if failures.is_empty() { Ok(()) } else { Err(failures) }
    }

    /// Hands the open dead letter queue over (for the pipeline's next version, when its
    /// settings did not change); `stop` will then leave it open.
    pub fn take_dead_letter_queue(&mut self) -> Option<OpenDeadLetterQueue> {
        self.dead_letter_queue.take()
    }

    pub fn dead_letter_queue(&self) -> Option<&OpenDeadLetterQueue> {
        self.dead_letter_queue.as_ref()
    }

    /// Stops the inputs, lets the workers empty the queue through the outputs for at most
    /// `timeout`, then closes the outputs. A persisted queue is emptied only if `drain`;
    /// otherwise what it holds stays on disk for the next start.
    pub async fn stop(self, timeout: Duration, drain: bool) -> PipelineSummary {
        self.stop_by(tokio::time::Instant::now() + timeout, drain).await
    }

    /// Stops the inputs that events enter by from outside (not the `pipeline` inputs other
    /// pipelines feed): the first step of a node's stop, taken by every pipeline at once.
    pub fn stop_accepting(&self) {
        self.input_stop.cancel();
    }

    /// [`RunningPipeline::stop`], every wait of it bounded by one `deadline`, so that however
    /// many pipelines stop at once, the node's stop takes one drain timeout.
    pub async fn stop_by(mut self, deadline: tokio::time::Instant, drain: bool) -> PipelineSummary {
        let name = self.spec.name.clone();
        let timeout = time_left(deadline);
        self.input_stop.cancel();
        self.internal_input_stop.cancel();
        let inputs_done = tokio::time::timeout_at(deadline, join_finished(&mut self.inputs)).await;
        if inputs_done.is_err() {
            tracing::warn!(pipeline = %name, "inputs did not stop in time; aborting them");
            self.inputs.iter().for_each(JoinHandle::abort);
        }
        self.queue.inputs_ended();
        if drain && self.queue.persistent() {
            let emptied = tokio::time::timeout_at(deadline, async {
                while self.queue.stats().bytes > 0 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await;
            if emptied.is_err() {
                tracing::warn!(pipeline = %name, "the persisted queue did not empty within the drain timeout; the rest stays on disk");
            }
        }
        self.queue.close();
        let drained = tokio::time::timeout_at(deadline, join_finished(&mut self.workers)).await;
        if drained.is_err() {
            let left = self.queue.stats().events;
            tracing::error!(pipeline = %name, timeout = ?timeout, events_left = left,
                "drain timeout reached; aborting deliveries in progress");
            self.abort.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(5), join_finished(&mut self.workers)).await;
            self.workers.iter().for_each(JoinHandle::abort);
        }
        self.queue.shutdown().await;
        // Cluster mode: what this pipeline forwarded is acknowledged by its owners (or the
        // time is up); then the events peers forwarded here are drained like the queue's.
        if let Some(mut f) = self.forwarded.take() {
            let left = f.cluster.drain(time_left(deadline)).await;
            if left > 0 {
                tracing::warn!(pipeline = %name, bytes = left, "events forwarded to peers were not all acknowledged within the drain timeout; their inputs will see them again");
            }
            f.cluster.unregister_inbound(&name);
            f.queue.inputs_ended();
            f.queue.close();
            if tokio::time::timeout_at(deadline, join_finished(&mut f.workers)).await.is_err() {
                tracing::error!(pipeline = %name, "drain timeout reached on forwarded events; aborting deliveries in progress");
                self.abort.cancel();
                let _ = tokio::time::timeout(Duration::from_secs(5), join_finished(&mut f.workers)).await;
                f.workers.iter().for_each(JoinHandle::abort);
            }
            f.queue.shutdown().await;
        }
        // Every group is concluded and what it emits delivered before the outputs close.
        if let Some(e) = self.emitters.take()
            && tokio::time::timeout_at(deadline, e.finish(&self.stages)).await.is_err()
        {
            tracing::error!(pipeline = %name, "concluding the stateful processors' groups did not finish within the drain timeout");
        }
        for o in self.outputs.iter() {
            o.output.close().await;
        }
        for c in self.metrics.components.read().iter() {
            c.health.stopped();
        }
        // After the workers: nothing writes to it any more.
        if let Some(d) = self.dead_letter_queue.take() {
            d.close(&name);
        }
        // Printed once, by whoever stopped it: the process at shutdown, the engine at a reload.
        self.summary()
    }

    pub fn summary(&self) -> PipelineSummary {
        let m = &self.metrics;
        // The same figure as `in` at /stats and /metrics.
        let events_in = m.events_in();
        // Emitted events are counted out but never came in; consumed and forwarded ones are
        // handled elsewhere; received ones came in through no input.
        let handled = (m.events_out.get()
            + m.dropped.get()
            + m.diverted_to_dead_letter_queue.get()
            + m.consumed.get()
            + m.forwarded.get())
        .saturating_sub(m.emitted.get() + m.received.get());
        let queued = self.queue.persistent().then(|| self.queue.stats().events);
        PipelineSummary {
            name: self.spec.name.clone(),
            events_in,
            events_out: m.events_out.get(),
            dropped: m.dropped.get(),
            failed: m.failed.get(),
            tagged: m
                .components
                .read()
                .iter()
                .filter(|c| c.kind == ComponentKind::Processor)
                .map(|c| c.failed.get())
                .sum::<u64>()
                .saturating_sub(m.diverted_to_dead_letter_queue.get()),
            unfinished: events_in.saturating_sub(handled + queued.unwrap_or(0)),
            queued,
            dead_lettered: self.has_dead_letter_queue.then(|| m.dead_lettered.get()),
            consumed_emitted: self
                .stages
                .processors
                .iter()
                .any(|p| p.processor.stateful().is_some())
                .then(|| (m.consumed.get(), m.emitted.get())),
            forwarded_received: self.stages.router.is_some().then(|| (m.forwarded.get(), m.received.get())),
            seconds_millis: m.started.elapsed().as_millis() as u64,
            input_errors: self.input_errors.load(Ordering::SeqCst),
            reported: false,
        }
    }
}

/// What is left of the time until `deadline`.
fn time_left(deadline: tokio::time::Instant) -> Duration {
    deadline.saturating_duration_since(tokio::time::Instant::now())
}

/// Waits for every task, dropping each handle once it has finished: cut short (by a timeout)
/// and called again, it waits only for the tasks still running. A finished handle must not be
/// awaited twice (tokio panics), which awaiting them all in place would do after a timeout that
/// came while a later task was still running.
async fn join_finished(handles: &mut Vec<JoinHandle<()>>) {
    while let Some(first) = handles.first_mut() {
        let _ = first.await;
        handles.remove(0);
    }
}
