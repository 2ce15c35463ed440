//! The `generator` input's settings (what to make, how many, how fast), their defaults and checks.

use std::path::PathBuf;

use serde::Deserialize;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;

use crate::codec::Codec;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GeneratorConfig {
    /// Events to make; 0 means forever.
    #[serde(default)]
    pub count: u64,
    /// Events per second; 0 means as fast as the queue accepts them.
    #[serde(default)]
    pub rate: u64,
    pub message: Option<String>,
    pub lines: Option<Vec<String>>,
    pub file: Option<PathBuf>,
    #[serde(default)]
    pub codec: Codec,
    /// Adds a `sequence` field numbering the events from 0.
    #[serde(default = "yes")]
    pub sequence: bool,
    #[serde(default = "default_batch")]
    pub batch_size: usize,
}

fn yes() -> bool {
    true
}
fn default_batch() -> usize {
    1000
}

/// Reads and checks the input's settings; a `file` must be readable now.
pub(super) fn read(spec: &ComponentSpec) -> Result<GeneratorConfig, ConfigError> {
    let config: GeneratorConfig = spec.settings()?;
    let sources = [config.message.is_some(), config.lines.is_some(), config.file.is_some()];
    if sources.iter().filter(|s| **s).count() > 1 {
        return Err(spec.error("give one of `message`, `lines` or `file`, not several"));
    }
    if config.lines.as_ref().is_some_and(|l| l.is_empty()) {
        return Err(spec.key_error("lines", "needs at least one line"));
    }
    if let Some(f) = &config.file
        && let Err(e) = std::fs::metadata(f)
    {
        return Err(spec.key_error("file", format!("cannot read {}: {e}", f.display())));
    }
    if config.batch_size == 0 {
        return Err(spec.key_error("batch_size", "must be at least 1"));
    }
    Ok(config)
}
