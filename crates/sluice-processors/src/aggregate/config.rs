//! The `aggregate` processor's settings (keys, group lifetime and limit, condition, action) and
//! their defaults; the action's own settings are read by `actions`.

use std::time::Duration;

use serde::Deserialize;
use sluice_config::model::ComponentSpec;
use sluice_config::{ConfigError, HumanDuration};
use sluice_core::FieldPath;
use sluice_expr::Condition;

use super::actions::ActionConfig;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AggregateConfig {
    pub identification_keys: Vec<FieldPath>,
    #[serde(default = "default_duration")]
    pub group_duration: HumanDuration,
    #[serde(default)]
    pub aggregate_when: Option<Condition>,
    #[serde(default = "default_max_groups")]
    pub max_groups: usize,
    pub action: ActionConfig,
}

/// Groups live in memory: a year is far beyond any use, and keeps instants from overflowing.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

fn default_duration() -> HumanDuration {
    HumanDuration(Duration::from_secs(180))
}

fn default_max_groups() -> usize {
    100_000
}

/// Reads and checks the processor's settings; the action is checked by the caller.
pub(super) fn read(spec: &ComponentSpec) -> Result<AggregateConfig, ConfigError> {
    let c: AggregateConfig = spec.settings()?;
    if c.identification_keys.is_empty() {
        return Err(spec.key_error("identification_keys", "give at least one field, like [/user, /host]"));
    }
    let duration = c.group_duration.0;
    if duration.is_zero() || duration > MAX_DURATION {
        return Err(spec.key_error("group_duration", "must be more than 0 and at most 365 days"));
    }
    if c.max_groups == 0 {
        return Err(spec.key_error("max_groups", "must be at least 1"));
    }
    Ok(c)
}
