//! The `json` processor's settings (`source`, `target`, `remove_source`, failure handling) and
//! their defaults.

use serde::Deserialize;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::FieldPath;

use crate::common::OnFailure;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct JsonConfig {
    #[serde(default = "default_source")]
    pub source: FieldPath,
    #[serde(default)]
    pub target: Option<FieldPath>,
    #[serde(default)]
    pub remove_source: bool,
    #[serde(default = "default_tags")]
    pub tag_on_failure: Vec<String>,
    #[serde(default)]
    pub on_failure: OnFailure,
}

fn default_source() -> FieldPath {
    FieldPath::field("message")
}

fn default_tags() -> Vec<String> {
    vec!["_jsonparsefailure".to_string()]
}

/// Reads the processor's settings.
pub(super) fn read(spec: &ComponentSpec) -> Result<JsonConfig, ConfigError> {
    spec.settings()
}
