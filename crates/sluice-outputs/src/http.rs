//! `http` output: not built yet.

use std::sync::Arc;

use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;

use crate::{Output, OutputContext};

pub(crate) fn build(spec: &ComponentSpec, _ctx: OutputContext) -> Result<Arc<dyn Output>, ConfigError> {
    Err(spec.error("the `http` output is not built yet"))
}
