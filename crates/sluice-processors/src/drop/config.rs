//! The `drop` processor's settings: it has none of its own, so any key but `if:` is refused.

use serde::Deserialize;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct DropConfig {}

/// Reads the processor's settings.
pub(super) fn read(spec: &ComponentSpec) -> Result<DropConfig, ConfigError> {
    spec.settings()
}
