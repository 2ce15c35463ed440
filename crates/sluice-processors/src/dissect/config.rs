//! The `dissect` processor's settings (`mapping`, `convert_datatype`, `append_separator`,
//! failure handling) and their defaults; the patterns are compiled by the caller.

use serde::Deserialize;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::FieldPath;

use crate::common::{OnFailure, OrderedMap};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DissectConfig {
    pub mapping: OrderedMap<FieldPath, String>,
    #[serde(default)]
    pub convert_datatype: OrderedMap<String, String>,
    #[serde(default = "default_separator")]
    pub append_separator: String,
    #[serde(default = "default_tags")]
    pub tag_on_failure: Vec<String>,
    #[serde(default)]
    pub on_failure: OnFailure,
}

fn default_separator() -> String {
    " ".to_string()
}

fn default_tags() -> Vec<String> {
    vec!["_dissectfailure".to_string()]
}

/// Reads the processor's settings; at least one mapping must be given.
pub(super) fn read(spec: &ComponentSpec) -> Result<DissectConfig, ConfigError> {
    let c: DissectConfig = spec.settings()?;
    if c.mapping.0.is_empty() {
        return Err(spec.key_error("mapping", "give at least one `field: pattern`"));
    }
    Ok(c)
}
