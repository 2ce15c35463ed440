//! `mutate`: not built yet.

use std::sync::Arc;

use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;

use crate::Processor;

pub(crate) fn build(spec: &ComponentSpec) -> Result<Arc<dyn Processor>, ConfigError> {
    Err(spec.error("the `mutate` processor is not built yet"))
}
