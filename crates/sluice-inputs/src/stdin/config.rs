//! The `stdin` input's settings (`codec`, `max_line_bytes`) and their defaults.

use serde::Deserialize;
use sluice_config::model::ComponentSpec;
use sluice_config::{ByteSize, ConfigError};

use crate::codec::Codec;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StdinConfig {
    #[serde(default)]
    pub codec: Codec,
    #[serde(default = "default_max_line")]
    pub max_line_bytes: ByteSize,
}

fn default_max_line() -> ByteSize {
    ByteSize(1 << 20)
}

/// Reads the input's settings.
pub(super) fn read(spec: &ComponentSpec) -> Result<StdinConfig, ConfigError> {
    spec.settings()
}
