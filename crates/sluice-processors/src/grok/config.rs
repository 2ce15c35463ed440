//! The `grok` processor's settings (`match`, `pattern_definitions`, capture options, failure
//! handling) and their defaults; the patterns are compiled by the caller.

use serde::Deserialize;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::FieldPath;

use crate::common::{OnFailure, OneOrMany, OrderedMap};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GrokConfig {
    #[serde(rename = "match")]
    pub matches: OrderedMap<FieldPath, OneOrMany>,
    #[serde(default)]
    pub pattern_definitions: OrderedMap<String, String>,
    #[serde(default = "yes")]
    pub break_on_match: bool,
    #[serde(default = "yes")]
    pub named_captures_only: bool,
    #[serde(default)]
    pub keep_empty_captures: bool,
    #[serde(default)]
    pub overwrite: Vec<String>,
    #[serde(default = "default_tags")]
    pub tag_on_failure: Vec<String>,
    #[serde(default)]
    pub on_failure: OnFailure,
}

fn yes() -> bool {
    true
}

fn default_tags() -> Vec<String> {
    vec!["_grokparsefailure".to_string()]
}

/// Reads the processor's settings; at least one field must be matched.
pub(super) fn read(spec: &ComponentSpec) -> Result<GrokConfig, ConfigError> {
    let c: GrokConfig = spec.settings()?;
    if c.matches.0.is_empty() {
        return Err(spec.key_error("match", "give at least one `field: pattern`"));
    }
    Ok(c)
}
