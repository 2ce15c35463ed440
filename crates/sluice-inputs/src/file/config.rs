//! The `file` input's settings: its keys and defaults, and their checks (globs compiled,
//! encoding and multiline patterns resolved), made into what the reader thread needs. Every
//! error names its key, nested ones (`multiline.start_pattern`) included.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use regex::Regex;
use serde::Deserialize;
use sluice_config::model::ComponentSpec;
use sluice_config::{ByteSize, ConfigError, HumanDuration};
use sluice_core::{FieldPath, Str};

use super::decode::TextEncoding;
use super::discovery::Patterns;
use super::events::Shape;
use super::framing::Framing;
use super::multiline::{Multiline, Rule};
use crate::codec::Codec;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub(super) enum ReadFrom {
    #[default]
    Beginning,
    End,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct MultilineConfig {
    start_pattern: Option<String>,
    continuation_pattern: Option<String>,
    #[serde(default)]
    negate: bool,
    #[serde(default = "default_max_lines")]
    max_lines: usize,
    #[serde(default = "default_multiline_timeout")]
    timeout: HumanDuration,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    include: Vec<String>,
    #[serde(default)]
    exclude: Vec<String>,
    #[serde(default = "default_scan_interval")]
    scan_interval: HumanDuration,
    #[serde(default)]
    read_from: ReadFrom,
    ignore_older: Option<HumanDuration>,
    #[serde(default = "default_close_inactive")]
    close_inactive: HumanDuration,
    #[serde(default = "default_max_open_files")]
    max_open_files: usize,
    #[serde(default = "default_max_line")]
    max_line_bytes: ByteSize,
    #[serde(default = "default_delimiter")]
    delimiter: String,
    multiline: Option<MultilineConfig>,
    #[serde(default = "default_encoding")]
    encoding: String,
    #[serde(default = "default_clean_removed_after")]
    clean_removed_after: HumanDuration,
    #[serde(default)]
    codec: Codec,
    #[serde(default = "default_read_buffer")]
    read_buffer: ByteSize,
    #[serde(default = "default_path_field")]
    path_field: Option<FieldPath>,
    #[serde(default = "default_offset_field")]
    offset_field: Option<FieldPath>,
    #[serde(default = "default_host_field")]
    host_field: Option<FieldPath>,
}

fn default_max_lines() -> usize {
    500
}
fn default_multiline_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(5))
}
fn default_scan_interval() -> HumanDuration {
    HumanDuration(Duration::from_secs(10))
}
fn default_close_inactive() -> HumanDuration {
    HumanDuration(Duration::from_secs(300))
}
fn default_max_open_files() -> usize {
    1024
}
fn default_max_line() -> ByteSize {
    ByteSize(1 << 20)
}
fn default_delimiter() -> String {
    "\n".into()
}
fn default_encoding() -> String {
    "utf-8".into()
}
fn default_clean_removed_after() -> HumanDuration {
    HumanDuration(Duration::from_secs(24 * 3600))
}
fn default_read_buffer() -> ByteSize {
    // Small enough that one turn's batch (and so what is in flight) stays small, large enough
    // that the system call per read is noise.
    ByteSize(64 << 10)
}
fn default_path_field() -> Option<FieldPath> {
    FieldPath::parse("/log/file/path").ok()
}
fn default_offset_field() -> Option<FieldPath> {
    FieldPath::parse("/log/offset").ok()
}
fn default_host_field() -> Option<FieldPath> {
    FieldPath::parse("/host/name").ok()
}

/// What the reader thread needs, checked.
pub(super) struct Settings {
    pub(super) patterns: Patterns,
    pub(super) scan_interval: Duration,
    pub(super) read_from: ReadFrom,
    pub(super) ignore_older: Option<Duration>,
    pub(super) close_inactive: Duration,
    pub(super) max_open_files: usize,
    pub(super) clean_removed_after: Duration,
    pub(super) read_buffer: usize,
    pub(super) shape: Arc<Shape>,
    pub(super) include: Vec<String>,
}

/// The node of a nested key, for error positions (`multiline.start_pattern`).
fn nested_error(spec: &ComponentSpec, keys: &[&str], message: String) -> ConfigError {
    let mut node = Some(&spec.settings);
    for k in keys {
        node = node.and_then(|n| n.get(k));
    }
    let mark = node.map(|n| n.mark.clone()).unwrap_or_else(|| spec.mark.clone());
    ConfigError::at(message, &format!("{}.{}", spec.path, keys.join(".")), mark)
}

/// Reads and checks the input's settings; nothing is opened here.
pub(super) fn read(spec: &ComponentSpec) -> Result<Settings, ConfigError> {
    let c: FileConfig = spec.settings()?;
    if c.include.is_empty() {
        return Err(spec.key_error("include", "needs at least one glob pattern, like /var/log/*.log"));
    }
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
    let patterns = Patterns::new(&c.include, &c.exclude, &cwd).map_err(|(is_include, bad)| {
        let key = if is_include { "include" } else { "exclude" };
        let list = if is_include { &c.include } else { &c.exclude };
        let text = list.get(bad.index).map(String::as_str).unwrap_or("");
        spec.key_error(key, format!("bad glob pattern `{text}`: {}", bad.message))
    })?;
    if c.max_line_bytes.0 == 0 {
        return Err(spec.key_error("max_line_bytes", "must be at least 1 byte"));
    }
    if c.max_open_files == 0 {
        return Err(spec.key_error("max_open_files", "must be at least 1"));
    }
    if c.read_buffer.0 < 4096 || c.read_buffer.0 > 64 << 20 {
        return Err(spec.key_error("read_buffer", "must be between 4KiB and 64MiB"));
    }
    if c.scan_interval.0 < Duration::from_millis(10) {
        return Err(spec.key_error("scan_interval", "must be at least 10ms"));
    }
    if c.delimiter.is_empty() {
        return Err(spec.key_error("delimiter", "cannot be empty"));
    }
    let encoding = TextEncoding::for_label(&c.encoding).ok_or_else(|| {
        spec.key_error(
            "encoding",
            format!("unknown encoding `{}`; use a label like utf-8, utf-16le, utf-16be, latin1", c.encoding),
        )
    })?;
    let multiline = match &c.multiline {
        None => None,
        Some(m) => {
            let compile = |key: &str, p: &str| {
                Regex::new(p)
                    .map_err(|e| nested_error(spec, &["multiline", key], format!("bad regular expression: {e}")))
            };
            let rule = match (&m.start_pattern, &m.continuation_pattern) {
                (Some(p), None) => Rule::Start(compile("start_pattern", p)?),
                (None, Some(p)) => Rule::Continuation(compile("continuation_pattern", p)?),
                _ => {
                    return Err(
                        spec.key_error("multiline", "needs exactly one of `start_pattern` or `continuation_pattern`")
                    );
                }
            };
            if m.max_lines == 0 {
                return Err(nested_error(spec, &["multiline", "max_lines"], "must be at least 1".into()));
            }
            Some(Multiline {
                rule,
                negate: m.negate,
                max_lines: m.max_lines,
                timeout: m.timeout.0,
                max_bytes: c.max_line_bytes.as_usize(),
            })
        }
    };
    let meta_overlaps_text = [&c.path_field, &c.offset_field, &c.host_field]
        .into_iter()
        .flatten()
        .any(|p| matches!(p.segments()[0].as_str(), "message" | "@timestamp" | "tags"));
    let shape = Shape {
        meta_overlaps_text,
        framing: Framing::new(&c.delimiter, encoding, c.max_line_bytes.as_usize()),
        codec: c.codec,
        encoding,
        multiline,
        path_field: c.path_field,
        offset_field: c.offset_field,
        host_field: c.host_field,
        host: Str::from(hostname()),
    };
    let settings = Settings {
        patterns,
        scan_interval: c.scan_interval.0,
        read_from: c.read_from,
        ignore_older: c.ignore_older.map(|d| d.0).filter(|d| !d.is_zero()),
        close_inactive: c.close_inactive.0,
        max_open_files: c.max_open_files,
        clean_removed_after: c.clean_removed_after.0,
        read_buffer: c.read_buffer.as_usize(),
        shape: Arc::new(shape),
        include: c.include,
    };
    Ok(settings)
}

fn hostname() -> String {
    gethostname::gethostname().to_string_lossy().into_owned()
}
