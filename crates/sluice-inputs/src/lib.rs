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
use sluice_config::model::ComponentSpec;
use sluice_config::{ConfigError, Link, no_links};
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

/// One kind of input: its `type`, how it is built, and what it links to beyond its pipeline.
pub struct InputKind {
    pub name: &'static str,
    /// Builds it from its config section; nothing is opened or bound until it runs.
    pub build: fn(&ComponentSpec) -> Result<Box<dyn Input>, ConfigError>,
    /// What its settings make of other pipelines and the process (see [`Link`]).
    pub links: fn(&ComponentSpec) -> Vec<Link>,
}

/// Every input this build knows, by `type`, in the order messages list them. Adding an input
/// is its module, one line here, and its section in `docs/inputs.md` (a test checks it).
pub const KINDS: &[InputKind] = &[
    InputKind { name: "beats", build: beats::build, links: no_links },
    InputKind { name: "dead_letter_queue", build: dead_letter_queue::build, links: dead_letter_queue::links },
    InputKind { name: "file", build: file::build, links: no_links },
    InputKind { name: "generator", build: generator::build, links: no_links },
    InputKind { name: "http", build: http::build, links: no_links },
    InputKind { name: "kafka", build: kafka::build, links: no_links },
    InputKind { name: "pipeline", build: pipeline::build, links: pipeline::links },
    InputKind { name: "stdin", build: stdin::build, links: stdin::links },
    InputKind { name: "syslog", build: syslog::build, links: no_links },
    InputKind { name: "tcp", build: tcp::build, links: no_links },
];

/// The kind of input `spec` is; an unknown `type` is an error listing the known ones.
pub fn kind(spec: &ComponentSpec) -> Result<&'static InputKind, ConfigError> {
    KINDS.iter().find(|k| k.name == spec.type_name).ok_or_else(|| {
        spec.error(format!(
            "unknown input type `{}`, expected one of {}",
            spec.type_name,
            KINDS.iter().map(|k| format!("`{}`", k.name)).collect::<Vec<_>>().join(", ")
        ))
    })
}

/// Builds an input from its config section; nothing is opened or bound until it runs.
pub fn build(spec: &ComponentSpec) -> Result<Box<dyn Input>, ConfigError> {
    (kind(spec)?.build)(spec)
}

/// What an input's settings link to (none for an unknown `type`, which [`build`] refuses).
pub fn links(spec: &ComponentSpec) -> Vec<Link> {
    kind(spec).map(|k| (k.links)(spec)).unwrap_or_default()
}
