//! The `blackhole` output's one setting, `print_interval`.

use serde::Deserialize;
use sluice_config::model::ComponentSpec;
use sluice_config::{ConfigError, HumanDuration};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BlackholeConfig {
    /// Logs the event rate this often; absent means never.
    pub print_interval: Option<HumanDuration>,
}

/// Reads the output's settings.
pub(super) fn read(spec: &ComponentSpec) -> Result<BlackholeConfig, ConfigError> {
    spec.settings()
}
