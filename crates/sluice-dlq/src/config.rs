//! A pipeline's `dead_letter_queue:` section: its keys, its checks, and where the queue lives.
//!
//! Guarantees:
//! - One set of defaults: those of [`DlqOptions::default`]; the section only says what differs.
//! - Every problem of the section is reported at once, each naming the key path and the line
//!   (`sluice.yml:14:23: pipelines.web.dead_letter_queue.storage_policy: ...`).
//! - A section that could not be read still tells whether the queue is enabled
//!   ([`DeadLetterQueueConfig::assumed`]), so checks that depend on it do not add errors that
//!   only follow from the first.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use sluice_config::model::PipelineSpec;
use sluice_config::{ByteSize, ConfigError, ConfigErrors, HumanDuration, Node, from_node};

use crate::{DlqOptions, DlqSync, MIN_SEGMENT_BYTES, StoragePolicy};

/// A pipeline's dead letter queue as its section asks for it (by default: disabled).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadLetterQueueConfig {
    pub enabled: bool,
    /// As written; by default the queue is at [`default_dir`].
    pub path: Option<PathBuf>,
    /// The store's settings, `segment_bytes` already capped at `max_bytes`.
    pub options: DlqOptions,
}

/// The directory of a pipeline's dead letter queue when its section gives no `path`.
pub fn default_dir(data_dir: &Path, pipeline: &str) -> PathBuf {
    data_dir.join("dlq").join(pipeline)
}

impl DeadLetterQueueConfig {
    /// Reads a pipeline's section as written.
    pub fn of(spec: &PipelineSpec) -> Result<DeadLetterQueueConfig, ConfigErrors> {
        Self::read(spec.dead_letter_queue.as_ref(), &section_path(spec))
    }

    /// Reads a pipeline's section, or when it has errors (reported elsewhere) what it
    /// [assumes](Self::assumed).
    pub fn of_or_assumed(spec: &PipelineSpec) -> DeadLetterQueueConfig {
        Self::of(spec).unwrap_or_else(|_| Self::assumed(spec.dead_letter_queue.as_ref(), &section_path(spec)))
    }

    /// Where this pipeline's queue lives: `path`, or `<data_dir>/dlq/<pipeline>`.
    pub fn dir(&self, data_dir: &Path, pipeline: &str) -> PathBuf {
        self.path.clone().unwrap_or_else(|| default_dir(data_dir, pipeline))
    }

    /// Reads a `dead_letter_queue:` section (`None` or null: disabled, the defaults) whose
    /// dotted place is `place`.
    pub fn read(section: Option<&Node>, place: &str) -> Result<DeadLetterQueueConfig, ConfigErrors> {
        let Some(n) = section.filter(|n| !n.is_null()) else {
            return Ok(DeadLetterQueueConfig::default());
        };
        let c = from_node::<Section>(n, place)?;
        let mut errors = ConfigErrors::default();
        let at = |key: &str| n.get(key).map(|v| v.mark.clone()).unwrap_or_else(|| n.mark.clone());
        let mut check = |bad: bool, key: &str, message: String| {
            if bad {
                errors.push(ConfigError::at(message, &format!("{place}.{key}"), at(key)));
            }
        };
        // A frame header and a small event need a few hundred bytes; less cannot hold an entry.
        let smallest = ByteSize(MIN_SEGMENT_BYTES);
        check(c.max_bytes.0 < smallest.0, "max_bytes", format!("must be at least {smallest}"));
        check(c.segment_bytes.0 < smallest.0, "segment_bytes", format!("must be at least {smallest}"));
        check(
            c.segment_bytes.0 > c.max_bytes.0 && n.get("segment_bytes").is_some(),
            "segment_bytes",
            format!("({}) must not be more than max_bytes ({})", c.segment_bytes, c.max_bytes),
        );
        check(c.retain_age.is_some_and(|a| a.0.is_zero()), "retain_age", "must be more than 0".to_string());
        check(c.sync_interval.0.is_zero(), "sync_interval", "must be more than 0".to_string());
        check(c.seal_idle.0.is_zero(), "seal_idle", "must be more than 0".to_string());
        check(
            n.get("sync_interval").is_some() && c.sync != SyncMode::Interval,
            "sync_interval",
            "applies only with `sync: interval`".to_string(),
        );
        check(c.path.as_ref().is_some_and(|p| p.as_os_str().is_empty()), "path", "must not be empty".to_string());
        errors.into_result(c.into_config())
    }

    /// What a section that [`read`](Self::read) refused still says: whether the queue is
    /// enabled (when in doubt, enabled), with the defaults.
    pub fn assumed(section: Option<&Node>, place: &str) -> DeadLetterQueueConfig {
        let enabled = section
            .filter(|n| !n.is_null())
            .and_then(|n| n.get("enabled"))
            .map(|v| from_node::<bool>(v, place).unwrap_or(true))
            .unwrap_or(false);
        DeadLetterQueueConfig { enabled, ..DeadLetterQueueConfig::default() }
    }
}

fn section_path(spec: &PipelineSpec) -> String {
    format!("pipelines.{}.dead_letter_queue", spec.name)
}

/// `sync:` as written; `interval` takes its period from `sync_interval`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum SyncMode {
    /// fdatasync before each write returns (one fsync for concurrent writes). Dead letters are
    /// rare, so this costs little, and nothing acknowledged is lost even to a power cut.
    Commit,
    /// A write returns once written; fdatasync every `sync_interval`. A machine crash can lose
    /// up to one interval of entries whose events were already acknowledged.
    Interval,
    /// Never fdatasync: a write returns once the bytes are handed to the operating system.
    None,
}

/// What happens to a new entry when the queue is at `max_bytes`, as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Policy {
    DropNewer,
    DropOlder,
}

/// The section's keys as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Section {
    enabled: bool,
    path: Option<PathBuf>,
    max_bytes: ByteSize,
    /// A segment is sealed (and a new one started) once it holds this much.
    segment_bytes: ByteSize,
    storage_policy: Policy,
    /// Segments whose newest entry is older than this are deleted.
    retain_age: Option<HumanDuration>,
    sync: SyncMode,
    /// With `sync: interval`: the longest a write waits to be made durable.
    sync_interval: HumanDuration,
    /// A segment that has had no write for this long is sealed.
    seal_idle: HumanDuration,
}

/// The period of `sync: interval` when `sync_interval` is not written.
const DEFAULT_SYNC_INTERVAL: Duration = Duration::from_secs(1);

impl Default for Section {
    fn default() -> Self {
        let o = DlqOptions::default();
        Section {
            enabled: false,
            path: None,
            max_bytes: ByteSize(o.max_bytes),
            segment_bytes: ByteSize(o.segment_bytes),
            storage_policy: match o.storage_policy {
                StoragePolicy::DropNewer => Policy::DropNewer,
                StoragePolicy::DropOlder => Policy::DropOlder,
            },
            retain_age: o.retain_age.map(HumanDuration),
            sync: match o.sync {
                DlqSync::Commit => SyncMode::Commit,
                DlqSync::Interval(_) => SyncMode::Interval,
                DlqSync::None => SyncMode::None,
            },
            sync_interval: HumanDuration(match o.sync {
                DlqSync::Interval(d) => d,
                _ => DEFAULT_SYNC_INTERVAL,
            }),
            seal_idle: HumanDuration(o.seal_idle),
        }
    }
}

impl Section {
    fn into_config(self) -> DeadLetterQueueConfig {
        DeadLetterQueueConfig {
            enabled: self.enabled,
            path: self.path,
            options: DlqOptions {
                max_bytes: self.max_bytes.0,
                // A segment never holds more than the whole queue may.
                segment_bytes: self.segment_bytes.0.min(self.max_bytes.0),
                storage_policy: match self.storage_policy {
                    Policy::DropNewer => StoragePolicy::DropNewer,
                    Policy::DropOlder => StoragePolicy::DropOlder,
                },
                retain_age: self.retain_age.map(|d| d.0),
                sync: match self.sync {
                    SyncMode::Commit => DlqSync::Commit,
                    SyncMode::Interval => DlqSync::Interval(self.sync_interval.0),
                    SyncMode::None => DlqSync::None,
                },
                seal_idle: self.seal_idle.0,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_config::parse_yaml;

    fn read(text: &str) -> Result<DeadLetterQueueConfig, ConfigErrors> {
        let root = parse_yaml(text, "d.yml").unwrap();
        DeadLetterQueueConfig::read(root.get("dead_letter_queue"), "pipelines.web.dead_letter_queue")
    }

    #[test]
    fn defaults_are_the_stores() {
        let c = read("other: 1\n").unwrap();
        assert_eq!(c, DeadLetterQueueConfig::default());
        assert!(!c.enabled);
        let c = read("dead_letter_queue: {enabled: true}\n").unwrap();
        assert_eq!(c.options, DlqOptions::default());
        assert_eq!(c.options.max_bytes, 1 << 30);
        assert_eq!(c.options.sync, DlqSync::Commit);
        assert_eq!(c.dir(Path::new("/d"), "web"), PathBuf::from("/d/dlq/web"));
    }

    #[test]
    fn reads_every_key() {
        let c = read(
            "dead_letter_queue: {enabled: true, path: /x/dlq, max_bytes: 4MiB, storage_policy: drop_older, \
             retain_age: 1h, sync: interval, sync_interval: 200ms, seal_idle: 2s}\n",
        )
        .unwrap();
        assert!(c.enabled);
        assert_eq!(c.options.storage_policy, StoragePolicy::DropOlder);
        assert_eq!(c.options.segment_bytes, 4 << 20, "capped at max_bytes");
        assert_eq!(c.options.retain_age, Some(Duration::from_secs(3600)));
        assert_eq!(c.options.sync, DlqSync::Interval(Duration::from_millis(200)));
        assert_eq!(c.options.seal_idle, Duration::from_secs(2));
        assert_eq!(c.dir(Path::new("/d"), "web"), PathBuf::from("/x/dlq"));
        c.options.validate().unwrap();
    }

    #[test]
    fn errors_name_the_key_and_line() {
        let all = read("dead_letter_queue:\n  enabled: true\n  storage_policy: newest\n").unwrap_err().to_string();
        assert!(all.starts_with("d.yml:3:19: pipelines.web.dead_letter_queue.storage_policy:"), "{all}");
        assert!(all.contains("drop_newer"), "{all}");
        let all = read("dead_letter_queue:\n  colour: red\n").unwrap_err().to_string();
        assert!(all.contains("d.yml:2:3: pipelines.web.dead_letter_queue.colour: unknown field"), "{all}");
        let errors = read("dead_letter_queue:\n  max_bytes: 10\n  sync: none\n  sync_interval: 1s\n").unwrap_err();
        let all = errors.to_string();
        assert_eq!(errors.0.len(), 2, "{all}");
        assert!(all.contains("d.yml:2:14: pipelines.web.dead_letter_queue.max_bytes: must be at least 1KiB"), "{all}");
        assert!(!all.contains("segment_bytes"), "the default segment size is capped, not refused: {all}");
        assert!(all.contains("dead_letter_queue.sync_interval: applies only with `sync: interval`"), "{all}");
        let all = read("dead_letter_queue: {max_bytes: 1MiB, segment_bytes: 2MiB, seal_idle: 0s, retain_age: 0s}\n")
            .unwrap_err()
            .to_string();
        for key in
            ["segment_bytes: (2MiB) must not be more than max_bytes", "seal_idle: must be", "retain_age: must be"]
        {
            assert!(all.contains(key), "{key}: {all}");
        }
        let all = read("dead_letter_queue: {path: ''}\n").unwrap_err().to_string();
        assert!(all.contains("dead_letter_queue.path"), "{all}");
    }

    #[test]
    fn a_refused_section_keeps_what_enabled_says() {
        let root =
            parse_yaml("a: {enabled: false, colour: red}\nb: {colour: red}\nc: {enabled: maybe}\n", "d.yml").unwrap();
        let assumed = |key: &str| DeadLetterQueueConfig::assumed(root.get(key), key).enabled;
        assert!(!assumed("a"));
        assert!(!assumed("b"));
        assert!(assumed("c"), "in doubt, enabled");
        assert!(!DeadLetterQueueConfig::assumed(None, "x").enabled);
    }
}
