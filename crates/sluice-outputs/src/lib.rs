//! Outputs: where handled events leave a pipeline.
//!
//! One output instance serves every worker of its pipeline, so `send` takes `&self` and an
//! output serialises internally only what must be serialised (a file handle, a socket).
//! `send` returns once the events are delivered — or rejected for good, each with a reason,
//! which the worker counts.
//!
//! Every failure is either the event's fault or the environment's:
//! - The **event's fault**: the destination refused the event itself (an HTTP 400, a file path
//!   the event renders to that can never be used: outside its root, too long, a directory), so
//!   sending it again would fail again. It is rejected *permanent* at once, and the worker hands
//!   it to the pipeline's dead letter queue when it has one; the rest of the batch goes on.
//! - The **environment's fault** (a full disk, a permission, a peer down or overloaded: timeouts,
//!   refused connections, HTTP 429 and 5xx): retried inside the output with exponential backoff,
//!   which holds the pipeline back (backpressure), counted in the component's `retries` and
//!   logged at warn at most once per interval ([`retry::StallLog`], which also keeps the
//!   output's state, `retrying` then `down`, and its last error); delivery resumes by itself
//!   when the failure clears. Only with a `retry.max_retries` limit does the output *give up*:
//!   those events are counted as failed and never go to the dead letter queue, since they are
//!   not at fault.
//!
//! [`Aborted`] means shutdown cut the send short: those events were not delivered and are not
//! acknowledged.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sluice_config::model::ComponentSpec;
use sluice_config::{ConfigError, Link, no_links};
use sluice_core::Event;
use sluice_core::bus::PipelineBus;
use sluice_core::metrics::ComponentMetrics;
use tokio_util::sync::CancellationToken;

mod blackhole;
mod elasticsearch;
mod file;
mod http;
mod http_client;
mod kafka;
mod pipeline;
pub mod retry;
mod stdout;
mod tcp;

/// One event an output will never deliver, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// Index into the slice given to `send`.
    pub index: usize,
    pub reason: String,
    /// Attempts made to deliver it, the last one included.
    pub attempts: u32,
    /// True when the destination refused the event itself (it goes to the dead letter queue);
    /// false when the output gave up on a retriable failure.
    pub permanent: bool,
}

impl Rejected {
    /// The destination refused the event for good.
    pub fn refused(index: usize, reason: impl Into<String>, attempts: u32) -> Rejected {
        Rejected { index, reason: reason.into(), attempts, permanent: true }
    }

    /// The output gave up after retrying a failure that was not the event's fault.
    pub fn gave_up(index: usize, reason: impl Into<String>, attempts: u32) -> Rejected {
        Rejected { index, reason: reason.into(), attempts, permanent: false }
    }
}

/// What became of a `send`: everything not listed in `rejected` was delivered.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub rejected: Vec<Rejected>,
}

impl Delivery {
    pub fn all_delivered() -> Delivery {
        Delivery::default()
    }

    /// Every event given up for the same reason after `attempts` attempts (not their fault).
    pub fn all_gave_up(count: usize, reason: &str, attempts: u32) -> Delivery {
        Delivery { rejected: (0..count).map(|index| Rejected::gave_up(index, reason, attempts)).collect() }
    }
}

/// Shutdown cut the send short; nothing in it counts as delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("send aborted by shutdown")]
pub struct Aborted;

#[async_trait]
pub trait Output: Send + Sync {
    async fn send(&self, events: &[&Event]) -> Result<Delivery, Aborted>;

    /// How many batches one worker may have in this output's `send` at once (at least 1).
    ///
    /// More than 1 pays off where a `send` spends its time waiting on the network (a broker's
    /// acknowledgements), not working: a worker then takes its next batches while earlier ones
    /// are still being delivered. The worker honours it only where the pipeline allows it (not
    /// under `ordered: true`, nor `auto` with one worker and one shard, nor with a stateful
    /// processor or cluster forwarding); the largest value among a pipeline's outputs applies.
    /// Every worker already calls `send` concurrently with the others, so this brings no new
    /// kind of concurrency to an output, only more of it. A batch in flight keeps its memory
    /// charge until it is acknowledged, so with a memory queue the node's memory budget still
    /// bounds what is held; a persisted queue's batches gave their charge back once written,
    /// and are bounded by this number times the workers and `batch.size`.
    fn batches_in_flight(&self) -> usize {
        1
    }

    /// Flushes buffers and closes connections at shutdown, after the last `send`.
    async fn close(&self) {}
}

/// What an output is given when it is built.
#[derive(Clone)]
pub struct OutputContext {
    pub pipeline: String,
    pub id: String,
    pub metrics: Arc<ComponentMetrics>,
    pub bus: Arc<PipelineBus>,
    /// Cancelled when the drain timeout of a shutdown runs out: retry loops give up then.
    pub abort: CancellationToken,
}

/// How an output is built from its config section and context.
pub type BuildOutput = fn(&ComponentSpec, OutputContext) -> Result<Arc<dyn Output>, ConfigError>;

/// One kind of output: its `type`, how it is built, what it links to beyond its pipeline, and
/// what `sluice validate` warns about in its settings.
pub struct OutputKind {
    pub name: &'static str,
    /// Builds it from its config section; network outputs connect lazily, on first send.
    pub build: BuildOutput,
    /// What its settings make of other pipelines (see [`Link`]).
    pub links: fn(&ComponentSpec) -> Vec<Link>,
    /// Settings that build but are risky.
    pub warnings: fn(&ComponentSpec) -> Vec<ConfigError>,
}

/// Every output this build knows, by `type`, in the order messages list them. Adding an output
/// is its module, one line here, and its section in `docs/outputs.md` (a test checks it).
pub const KINDS: &[OutputKind] = &[
    OutputKind { name: "blackhole", build: blackhole::build, links: no_links, warnings: no_warnings },
    OutputKind { name: "elasticsearch", build: elasticsearch::build, links: no_links, warnings: no_warnings },
    OutputKind { name: "file", build: file::build, links: no_links, warnings: file::warnings },
    OutputKind { name: "http", build: http::build, links: no_links, warnings: no_warnings },
    OutputKind { name: "kafka", build: kafka::build, links: no_links, warnings: no_warnings },
    OutputKind { name: "opensearch", build: elasticsearch::build, links: no_links, warnings: no_warnings },
    OutputKind { name: "pipeline", build: pipeline::build, links: pipeline::links, warnings: no_warnings },
    OutputKind { name: "stdout", build: stdout::build, links: no_links, warnings: no_warnings },
    OutputKind { name: "tcp", build: tcp::build, links: no_links, warnings: no_warnings },
];

fn no_warnings(_: &ComponentSpec) -> Vec<ConfigError> {
    Vec::new()
}

/// The kind of output `spec` is; an unknown `type` is an error listing the known ones.
pub fn kind(spec: &ComponentSpec) -> Result<&'static OutputKind, ConfigError> {
    KINDS.iter().find(|k| k.name == spec.type_name).ok_or_else(|| {
        spec.error(format!(
            "unknown output type `{}`, expected one of {}",
            spec.type_name,
            KINDS.iter().map(|k| format!("`{}`", k.name)).collect::<Vec<_>>().join(", ")
        ))
    })
}

/// Builds an output from its config section. Network outputs connect lazily, on first send.
pub fn build(spec: &ComponentSpec, ctx: OutputContext) -> Result<Arc<dyn Output>, ConfigError> {
    (kind(spec)?.build)(spec, ctx)
}

/// What `sluice validate` should warn about in an output's config (it builds either way).
pub fn warnings(spec: &ComponentSpec) -> Vec<ConfigError> {
    kind(spec).map(|k| (k.warnings)(spec)).unwrap_or_default()
}

/// What an output's settings link to (none for an unknown `type`, which [`build`] refuses).
pub fn links(spec: &ComponentSpec) -> Vec<Link> {
    kind(spec).map(|k| (k.links)(spec)).unwrap_or_default()
}

/// Newline-delimited JSON of the events, for outputs that write lines.
pub fn encode_json_lines(events: &[&Event], out: &mut Vec<u8>) {
    for e in events {
        e.write_json(out);
        out.push(b'\n');
    }
}

/// The default pause before the first retry, doubled each time up to the maximum.
pub const DEFAULT_RETRY_INITIAL: Duration = Duration::from_millis(100);
pub const DEFAULT_RETRY_MAX: Duration = Duration::from_secs(30);

/// What the outputs' unit tests share: a context, and a spec from a line of YAML.
#[cfg(test)]
pub(crate) mod test_support {
    use std::sync::Arc;

    use sluice_config::model::ComponentSpec;
    use sluice_core::bus::PipelineBus;
    use sluice_core::metrics::{ComponentKind, ComponentMetrics};
    use tokio_util::sync::CancellationToken;

    use crate::OutputContext;

    /// A context for an output `out` of type `type_name` in pipeline `pipeline`.
    pub fn context(pipeline: &str, type_name: &str) -> OutputContext {
        OutputContext {
            pipeline: pipeline.into(),
            id: "out".into(),
            metrics: Arc::new(ComponentMetrics::new("out", ComponentKind::Output, type_name)),
            bus: Arc::new(PipelineBus::default()),
            abort: CancellationToken::new(),
        }
    }

    /// The spec of an output written as a YAML flow mapping.
    pub fn spec(yaml: &str) -> ComponentSpec {
        let text = format!("pipelines:\n  p:\n    inputs: [{{type: stdin}}]\n    outputs:\n      - {yaml}\n");
        let root = sluice_config::model::load_str(&text, "test.yml").unwrap_or_else(|e| panic!("{e}"));
        root.pipelines.into_iter().next().unwrap().outputs.remove(0)
    }
}
