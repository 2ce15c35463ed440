//! The `date` processor's settings (`source`, `formats`, `timezone`, `target`, failure handling)
//! and their defaults; the formats and the zone are parsed by the caller.

use serde::Deserialize;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::FieldPath;

use crate::common::{OnFailure, OneOrMany};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DateConfig {
    #[serde(default = "default_source")]
    pub source: FieldPath,
    pub formats: OneOrMany,
    #[serde(default)]
    pub timezone: Option<String>,
    #[serde(default = "default_target")]
    pub target: FieldPath,
    #[serde(default = "default_tags")]
    pub tag_on_failure: Vec<String>,
    #[serde(default)]
    pub on_failure: OnFailure,
}

fn default_source() -> FieldPath {
    FieldPath::field("timestamp")
}

fn default_target() -> FieldPath {
    FieldPath::field("@timestamp")
}

fn default_tags() -> Vec<String> {
    vec!["_dateparsefailure".to_string()]
}

/// Reads the processor's settings; at least one format must be given.
pub(super) fn read(spec: &ComponentSpec) -> Result<DateConfig, ConfigError> {
    let config: DateConfig = spec.settings()?;
    if config.formats.0.is_empty() {
        return Err(spec.key_error("formats", "give at least one format, like ISO8601, UNIX or `%d/%b/%Y:%H:%M:%S %z`"));
    }
    Ok(config)
}
