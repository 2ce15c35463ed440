//! The `file` output's keys and their defaults.

use std::path::PathBuf;

use serde::Deserialize;
use sluice_expr::Template;

use crate::retry::RetryConfig;

#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FileCodec {
    /// One JSON object per line.
    #[default]
    Json,
    /// The `message` field (or the event as JSON when it has none), one per line.
    Text,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileConfig {
    pub path: Template,
    pub root: Option<PathBuf>,
    #[serde(default)]
    pub codec: FileCodec,
    #[serde(default = "yes")]
    pub create_dirs: bool,
    #[serde(default)]
    pub fsync: bool,
    #[serde(default = "default_max_open")]
    pub max_open_files: usize,
    #[serde(default)]
    pub retry: RetryConfig,
}

fn yes() -> bool {
    true
}
fn default_max_open() -> usize {
    256
}
