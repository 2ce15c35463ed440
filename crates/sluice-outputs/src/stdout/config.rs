//! The `stdout` output's settings: `codec` and `retry`.

use serde::Deserialize;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;

use crate::retry::RetryConfig;

#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(super) enum StdoutCodec {
    /// One JSON object per line.
    #[default]
    Json,
    /// The `message` field (or the event as JSON when it has none), one per line.
    Text,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StdoutConfig {
    #[serde(default)]
    pub codec: StdoutCodec,
    #[serde(default)]
    pub retry: RetryConfig,
}

/// Reads the output's settings.
pub(super) fn read(spec: &ComponentSpec) -> Result<StdoutConfig, ConfigError> {
    spec.settings()
}
