//! Inputs: where events enter a pipeline.
//!
//! An input is built from its config section (every setting checked before anything starts),
//! then run as one task that pushes batches into its pipeline's queue through an
//! [`InputContext`]. A full queue makes the push wait, which is how backpressure reaches a
//! socket or a file. Inputs stop when the context's shutdown token is cancelled, after pushing
//! what they have already read. Inputs that must answer their peer only once events are safe
//! (HTTP), or that keep a position (the `file` input, through the registry), attach an
//! [`sluice_core::Acker`] to each batch.
//!
//! Network line inputs share [`framing::LineFramer`] (newline splitting with a length cap that
//! truncates and tags instead of stalling); `syslog` has its own framer for octet counting
//! (RFC 6587) and `beats` its own frame decoder (Lumberjack v2); the `file` input has its own
//! framing with exact byte offsets, any delimiter and any encoding. All use [`codec::Codec`]
//! (text or JSON lines). The stream inputs share their accept loop, connection limits and TLS
//! handshake ([`limits`]); `kafka` reads through librdkafka's consumer group and commits only
//! what reached the ack point.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::bus::PipelineBus;
use sluice_core::metrics::ComponentMetrics;
use sluice_core::{Batch, MemoryBudget, MemoryCharge, Queue, QueueClosed};
use tokio_util::sync::CancellationToken;

pub mod admission;
mod beats;
pub mod codec;
pub mod dead_letter_queue;
mod file;
pub mod framing;
mod generator;
mod http;
mod kafka;
pub mod limits;
pub mod listener;
mod pipeline;
mod stdin;
mod syslog;
mod tcp;

#[doc(hidden)]
pub use beats::decode_for_fuzzing as beats_decode_for_fuzzing;
#[doc(hidden)]
pub use http::parse_body_for_fuzzing;

/// Why an input stopped before it was asked to.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InputError(pub String);

impl InputError {
    pub fn io(what: impl std::fmt::Display, e: std::io::Error) -> InputError {
        InputError(format!("{what}: {e}"))
    }
}

#[async_trait]
pub trait Input: Send {
    /// Runs until the input is exhausted (a fixed count, end of stdin) or shutdown is asked.
    async fn run(self: Box<Self>, ctx: InputContext) -> Result<(), InputError>;

    /// True for inputs fed by other pipelines: the process ends when every other input has.
    fn is_internal(&self) -> bool {
        false
    }

    /// True for inputs that resume from positions kept in [`InputContext::registry`] (files, a
    /// DLQ reader): the engine then opens the durable registry in `data_dir/registry`. When no
    /// input of a process says so, the registry is an in-memory one and no directory is touched.
    fn uses_registry(&self) -> bool {
        false
    }

    /// True for inputs that bind an address when they run: they mark their component
    /// running (`ctx.metrics.health`) once bound, and the pipeline's start waits for that, so
    /// a taken port stops the start. The others count as running from their first poll.
    fn listens(&self) -> bool {
        false
    }
}

/// What a running input is given.
#[derive(Clone)]
pub struct InputContext {
    pub pipeline: String,
    pub id: String,
    pub queue: Arc<dyn Queue>,
    pub metrics: Arc<ComponentMetrics>,
    pub shutdown: CancellationToken,
    pub bus: Arc<PipelineBus>,
    pub data_dir: PathBuf,
    /// The process's registry of input positions (`data_dir/registry`): inputs that resume
    /// where they stopped take a cursor per key and commit to it on acknowledgement. Durable
    /// only if some input's [`Input::uses_registry`] is true; otherwise in memory.
    pub registry: Arc<sluice_registry::Registry>,
    /// The node's memory budget for events in flight: an input takes from it before it decodes
    /// more and attaches the charge to the batch it sends (see [`InputContext::reserve`]).
    pub memory: Arc<MemoryBudget>,
}

impl InputContext {
    /// Waits until `bytes` of the memory budget are free and takes them; `None` if shutdown
    /// came first. A streaming input calls this with an estimate before it decodes a chunk,
    /// then trues the charge up to the decoded events' size ([`MemoryCharge::true_up`]). An
    /// estimate larger than the whole budget waits for the whole budget.
    pub async fn reserve(&self, bytes: usize) -> Option<MemoryCharge> {
        let bytes = bytes.min(self.memory.limit());
        if let Some(c) = self.memory.try_charge(bytes) {
            return Some(c);
        }
        tokio::select! {
            biased;
            _ = self.shutdown.cancelled() => None,
            c = self.memory.charge(bytes, None) => c.ok(),
        }
    }

    /// Binds the input's TCP listener and marks the input running (see [`Input::listens`]);
    /// the error names the input's type and the address.
    pub async fn listen_tcp(&self, address: &str) -> Result<tokio::net::TcpListener, InputError> {
        let listener = limits::listen(address)
            .await
            .map_err(|e| InputError(format!("{} input cannot listen on {address}: {e}", self.metrics.type_name)))?;
        self.metrics.health.running();
        Ok(listener)
    }

    /// Pushes a batch into the pipeline's queue, waiting while it is full. A shutdown while
    /// waiting gives the batch up (its acknowledgement reports it abandoned) and fails. The
    /// batch's ackers are stamped first, so the pipeline's acknowledgement latency covers any
    /// wait for room in the queue: a client waiting for its acknowledgement waits that too.
    pub async fn send(&self, batch: Batch) -> Result<(), QueueClosed> {
        let n = batch.len() as u64;
        if !batch.acks.is_empty()
            && let Some(histogram) = self.metrics.ack_latency.get()
        {
            batch.acks.time_into(histogram, std::time::Instant::now());
        }
        tokio::select! {
            biased;
            r = self.queue.push(batch) => r?,
            _ = self.shutdown.cancelled() => return Err(QueueClosed),
        }
        self.metrics.events_in.add(n);
        self.metrics.events_out.add(n);
        Ok(())
    }
}

/// The input types this build knows, for messages.
pub const TYPES: &[&str] =
    &["beats", "dead_letter_queue", "file", "generator", "http", "kafka", "pipeline", "stdin", "syslog", "tcp"];

/// Builds an input from its config section; nothing is opened or bound until it runs.
pub fn build(spec: &ComponentSpec) -> Result<Box<dyn Input>, ConfigError> {
    match spec.type_name.as_str() {
        "beats" => beats::build(spec),
        "dead_letter_queue" => dead_letter_queue::build(spec),
        "file" => file::build(spec),
        "generator" => generator::build(spec),
        "http" => http::build(spec),
        "kafka" => kafka::build(spec),
        "pipeline" => pipeline::build(spec),
        "stdin" => stdin::build(spec),
        "syslog" => syslog::build(spec),
        "tcp" => tcp::build(spec),
        other => Err(spec.error(format!(
            "unknown input type `{other}`, expected one of {}",
            TYPES.iter().map(|t| format!("`{t}`")).collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// The address a `pipeline` input serves, if `spec` is one (for checking pipeline links).
pub fn pipeline_address(spec: &ComponentSpec) -> Option<String> {
    (spec.type_name == "pipeline").then(|| spec.settings.get("address")?.as_str().map(str::to_string)).flatten()
}
