//! The `dead_letter_queue` input's settings (which queue, from where, what to do with what was
//! read), their defaults and checks.

use std::path::PathBuf;

use serde::Deserialize;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_dlq::ReadFrom;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DeadLetterQueueInputConfig {
    /// Reads this pipeline's queue at `<data_dir>/dlq/<pipeline>`.
    pub pipeline: Option<String>,
    /// Reads the queue in this directory.
    pub path: Option<PathBuf>,
    #[serde(default = "default_start")]
    pub start_from: String,
    #[serde(default = "yes")]
    pub commit_offsets: bool,
    #[serde(default)]
    pub clean_consumed: bool,
    #[serde(default = "yes")]
    pub follow: bool,
    #[serde(default = "default_batch")]
    pub batch_size: usize,
}

fn yes() -> bool {
    true
}
fn default_start() -> String {
    "beginning".to_string()
}
fn default_batch() -> usize {
    250
}

/// Where the queue is: a pipeline's default directory, or a directory of its own.
pub(super) enum Source {
    Pipeline(String),
    Path(PathBuf),
}

/// The settings once checked.
pub(super) struct Settings {
    pub source: Source,
    pub start: ReadFrom,
    pub commit_offsets: bool,
    pub clean_consumed: bool,
    pub follow: bool,
    pub batch_size: usize,
}

/// Reads and checks the input's settings: one of `pipeline` and `path`, a readable `start_from`.
pub(super) fn read(spec: &ComponentSpec) -> Result<Settings, ConfigError> {
    let c: DeadLetterQueueInputConfig = spec.settings()?;
    let source = match (c.pipeline, c.path) {
        (Some(p), None) if !p.is_empty() => Source::Pipeline(p),
        (None, Some(p)) if !p.as_os_str().is_empty() => Source::Path(p),
        (Some(_), Some(_)) => return Err(spec.error("give `pipeline` or `path`, not both")),
        (Some(_), None) => return Err(spec.key_error("pipeline", "must not be empty")),
        (None, Some(_)) => return Err(spec.key_error("path", "must not be empty")),
        (None, None) => {
            return Err(spec.error("give `pipeline` (whose dead letter queue to read) or `path` (its directory)"));
        }
    };
    let start = parse_start(&c.start_from).map_err(|e| spec.key_error("start_from", e))?;
    if c.batch_size == 0 {
        return Err(spec.key_error("batch_size", "must be at least 1"));
    }
    Ok(Settings {
        source,
        start,
        commit_offsets: c.commit_offsets,
        clean_consumed: c.clean_consumed,
        follow: c.follow,
        batch_size: c.batch_size,
    })
}

/// `beginning`, or an RFC 3339 time such as `2026-11-21T08:00:00Z`.
pub(super) fn parse_start(text: &str) -> Result<ReadFrom, String> {
    if text == "beginning" {
        return Ok(ReadFrom::Beginning);
    }
    let t = chrono::DateTime::parse_from_rfc3339(text)
        .map_err(|e| format!("`{text}` is neither `beginning` nor an RFC 3339 time like 2026-11-21T08:00:00Z ({e})"))?;
    t.timestamp_nanos_opt().map(ReadFrom::Time).ok_or_else(|| format!("`{text}` is out of range"))
}
