//! `http` input: not built yet.

use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;

use crate::Input;

pub(crate) fn build(spec: &ComponentSpec) -> Result<Box<dyn Input>, ConfigError> {
    Err(spec.error("the `http` input is not built yet"))
}
