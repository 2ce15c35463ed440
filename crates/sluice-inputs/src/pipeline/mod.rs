//! `pipeline` input: receives what other pipelines' `pipeline` outputs send to its address.
//! The sending output waits until this pipeline has handled each batch, so acknowledgements
//! cross the link.

use async_trait::async_trait;
use serde::Deserialize;
use sluice_config::model::ComponentSpec;
use sluice_config::{ConfigError, Link};
use sluice_core::bus::BusTarget;

use crate::{Input, InputContext, InputError};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PipelineInputConfig {
    address: String,
}

struct PipelineInput {
    address: String,
}

/// The address it serves (an unreadable section links nothing; building it reports why).
pub(crate) fn links(spec: &ComponentSpec) -> Vec<Link> {
    match spec.settings::<PipelineInputConfig>() {
        Ok(c) => vec![Link::Serves { address: c.address, key: "address" }],
        Err(_) => Vec::new(),
    }
}

pub(crate) fn build(spec: &ComponentSpec) -> Result<Box<dyn Input>, ConfigError> {
    let c: PipelineInputConfig = spec.settings()?;
    if c.address.is_empty() {
        return Err(spec.key_error("address", "must not be empty"));
    }
    Ok(Box::new(PipelineInput { address: c.address }))
}

#[async_trait]
impl Input for PipelineInput {
    async fn run(self: Box<Self>, ctx: InputContext) -> Result<(), InputError> {
        let target =
            BusTarget { pipeline: ctx.pipeline.clone(), queue: ctx.queue.clone(), metrics: ctx.metrics.clone() };
        ctx.bus.register(&self.address, target).map_err(|e| InputError(e.to_string()))?;
        ctx.metrics.health.running();
        ctx.shutdown.cancelled().await;
        ctx.bus.unregister(&self.address, &ctx.pipeline);
        Ok(())
    }

    fn is_internal(&self) -> bool {
        true
    }

    fn listens(&self) -> bool {
        true
    }
}
