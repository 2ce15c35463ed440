//! What building a pipeline makes: its components ready to run, with their conditions and
//! figures. The runtime (workers, running pipelines) takes these; it never builds anything, so
//! it depends on this module and not on [`crate::build`].

use std::sync::Arc;

use sluice_config::model::PipelineSpec;
use sluice_core::Queue;
use sluice_core::metrics::{ComponentMetrics, PipelineMetrics};
use sluice_expr::Condition;
use sluice_inputs::Input;
use sluice_outputs::Output;
use sluice_processors::Processor;
use tokio_util::sync::CancellationToken;

pub struct BuiltInput {
    pub id: String,
    pub input: Box<dyn Input>,
    pub metrics: Arc<ComponentMetrics>,
}

pub struct BuiltProcessor {
    pub id: String,
    pub processor: Arc<dyn Processor>,
    pub condition: Option<Condition>,
    pub metrics: Arc<ComponentMetrics>,
}

pub struct BuiltOutput {
    pub id: String,
    pub output: Arc<dyn Output>,
    pub condition: Option<Condition>,
    pub metrics: Arc<ComponentMetrics>,
}

/// A pipeline with every component built, ready to start.
pub struct BuiltPipeline {
    pub spec: PipelineSpec,
    pub metrics: Arc<PipelineMetrics>,
    pub queue: Arc<dyn Queue>,
    pub inputs: Vec<BuiltInput>,
    pub processors: Arc<Vec<BuiltProcessor>>,
    pub outputs: Arc<Vec<BuiltOutput>>,
    /// Cancelled when the drain timeout runs out, to cut output retries short.
    pub abort: CancellationToken,
    /// The first processor that declares identification keys, and its keys: in cluster mode
    /// the forwarding stage runs just before it.
    pub keyed: Option<(usize, sluice_core::KeySpec)>,
}
