//! `drop`: drops every event it sees. With `if:` it drops the matching ones; dropped events
//! count as handled, so their inputs are acknowledged.

mod config;

use std::sync::Arc;

use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::Event;

use crate::{Processor, Verdict};

struct Drop;

impl Processor for Drop {
    fn process(&self, _event: &mut Event) -> Verdict {
        Verdict::Drop
    }
}

pub(crate) fn build(spec: &ComponentSpec) -> Result<Arc<dyn Processor>, ConfigError> {
    config::read(spec)?;
    Ok(Arc::new(Drop))
}

#[cfg(test)]
mod tests;
