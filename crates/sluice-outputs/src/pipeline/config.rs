//! The `pipeline` output's one setting, `send_to`: one address or a list, none empty.

use serde::Deserialize;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PipelineOutputConfig {
    pub send_to: OneOrMany,
}

/// Reads and checks the output's settings: the addresses it sends to.
pub(super) fn read(spec: &ComponentSpec) -> Result<Vec<String>, ConfigError> {
    let c: PipelineOutputConfig = spec.settings()?;
    let send_to = match c.send_to {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    };
    if send_to.is_empty() || send_to.iter().any(String::is_empty) {
        return Err(spec.key_error("send_to", "needs at least one address, and no empty ones"));
    }
    Ok(send_to)
}
