//! `pipeline` input: receives what other pipelines' `pipeline` outputs send to its address.
//! The sending output waits until this pipeline has handled each batch, so acknowledgements
//! cross the link.

mod config;

use async_trait::async_trait;
use sluice_config::model::ComponentSpec;
use sluice_config::{ConfigError, Link};
use sluice_core::bus::BusTarget;

use crate::{Input, InputContext, InputError};

struct PipelineInput {
    address: String,
}

/// The address it serves (an unreadable section links nothing; building it reports why).
pub(crate) fn links(spec: &ComponentSpec) -> Vec<Link> {
    match spec.settings::<config::PipelineInputConfig>() {
        Ok(c) => vec![Link::Serves { address: c.address, key: "address" }],
        Err(_) => Vec::new(),
    }
}

pub(crate) fn build(spec: &ComponentSpec) -> Result<Box<dyn Input>, ConfigError> {
    Ok(Box::new(PipelineInput { address: config::read(spec)?.address }))
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

#[cfg(test)]
mod tests;
