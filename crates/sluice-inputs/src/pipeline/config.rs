//! The `pipeline` input's settings: the `address` it serves, which must not be empty.

use serde::Deserialize;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PipelineInputConfig {
    pub address: String,
}

/// Reads and checks the input's settings.
pub(super) fn read(spec: &ComponentSpec) -> Result<PipelineInputConfig, ConfigError> {
    let c: PipelineInputConfig = spec.settings()?;
    if c.address.is_empty() {
        return Err(spec.key_error("address", "must not be empty"));
    }
    Ok(c)
}
