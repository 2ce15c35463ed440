//! The `mutate` processor's settings (one key per operation, applied in a fixed order) and their
//! defaults.

use serde::Deserialize;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::FieldPath;
use sluice_expr::Template;

use crate::common::OrderedMap;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MutateConfig {
    #[serde(default)]
    pub rename: OrderedMap<FieldPath, FieldPath>,
    #[serde(default)]
    pub copy: OrderedMap<FieldPath, FieldPath>,
    #[serde(default)]
    pub add: OrderedMap<FieldPath, Template>,
    #[serde(default)]
    pub remove: Vec<FieldPath>,
    #[serde(default)]
    pub convert: OrderedMap<FieldPath, Conversion>,
    #[serde(default)]
    pub lowercase: Vec<FieldPath>,
    #[serde(default)]
    pub uppercase: Vec<FieldPath>,
    #[serde(default)]
    pub split: OrderedMap<FieldPath, String>,
    #[serde(default)]
    pub merge: OrderedMap<FieldPath, FieldPath>,
    #[serde(default)]
    pub add_tag: Vec<Template>,
    #[serde(default)]
    pub remove_tag: Vec<String>,
    #[serde(default = "default_tags")]
    pub tag_on_failure: Vec<String>,
}

fn default_tags() -> Vec<String> {
    vec!["_mutate_error".to_string()]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Conversion {
    #[serde(alias = "integer")]
    Int,
    Float,
    #[serde(alias = "boolean")]
    Bool,
    String,
}

/// Reads the processor's settings; no `split` separator may be empty.
pub(super) fn read(spec: &ComponentSpec) -> Result<MutateConfig, ConfigError> {
    let c: MutateConfig = spec.settings()?;
    if let Some((field, _)) = c.split.0.iter().find(|(_, sep)| sep.is_empty()) {
        return Err(spec.key_error("split", format!("the separator for {field} is empty")));
    }
    Ok(c)
}
