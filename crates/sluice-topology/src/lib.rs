//! The runtime that turns a configuration into running pipelines.
//!
//! - [`build`]: every component of every pipeline is built before anything starts, so a bad
//!   config fails as a whole with every error listed (`sluice validate` is this step alone).
//!   Links between pipelines are checked here: each `pipeline` output's address is served by
//!   exactly one `pipeline` input, and pipelines do not feed each other in a loop.
//! - [`components`]: the component kinds of this build, through the table each component
//!   crate keeps (name, builder, links); nothing here reads a component's keys.
//! - [`built`]: what building makes, the components ready to run; the runtime below takes
//!   these and never depends on the builder.
//! - [`worker`]: the loop each worker runs — take a batch, apply processors (each behind its
//!   `if:`), hand the batch to every output (each behind its `if:`), then acknowledge it.
//! - [`pipeline`]: one running pipeline, and how it drains: inputs stop, the queue closes, the
//!   workers empty it through the outputs within the drain timeout.
//! - [`dead_letter`]: a pipeline's dead letter queue as workers use it: opened at start (kept
//!   across a reload when its settings did not change), closed after the workers stop; the loop
//!   guard for events replayed from a dead letter queue.
//! - [`engine`]: all pipelines of the process; reload replaces only the pipelines whose
//!   config changed, and shutdown drains upstream pipelines before the ones they feed.

pub mod build;
pub mod built;
pub mod components;
pub mod dead_letter;
pub mod engine;
pub mod inbound;
pub mod pipeline;
pub mod stateful;
pub mod worker;

pub use build::{BuiltPipeline, build_all};
pub use engine::{Engine, EngineOptions};
pub use pipeline::PipelineSummary;
