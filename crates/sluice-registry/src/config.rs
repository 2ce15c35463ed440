//! The `registry:` section of the config file: how often positions are written and when the op
//! log is compacted.
//!
//! Guarantees: one set of defaults, those of [`RegistryOptions::default`]; an error names the
//! key path and the line (`sluice.yml:2:18: registry.flush_interval: ...`), and every problem of
//! the section is reported at once.

use serde::Deserialize;
use sluice_config::{ByteSize, ConfigError, ConfigErrors, HumanDuration, Node, from_node};

use crate::RegistryOptions;

/// The smallest `compact_after` taken: below it compaction would run after almost every flush.
pub const MIN_COMPACT_AFTER: u64 = 4096;

impl RegistryOptions {
    /// Reads the `registry:` section (`None` or null: the defaults).
    pub fn from_section(section: Option<&Node>) -> Result<RegistryOptions, ConfigErrors> {
        let Some(n) = section.filter(|n| !n.is_null()) else { return Ok(RegistryOptions::default()) };
        let s: Section = from_node(n, "registry")?;
        if s.compact_after.0 < MIN_COMPACT_AFTER {
            let mark = n.get("compact_after").unwrap_or(n).mark.clone();
            return Err(ConfigError::at(
                format!(
                    "`compact_after` of {} is too small; use at least {}",
                    s.compact_after,
                    ByteSize(MIN_COMPACT_AFTER)
                ),
                "registry.compact_after",
                mark,
            )
            .into());
        }
        Ok(RegistryOptions { flush_interval: s.flush_interval.0, compact_after_bytes: s.compact_after.0 })
    }
}

/// The section's keys as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct Section {
    /// How often acknowledged positions are written and fsynced; `0` after every batch of updates.
    flush_interval: HumanDuration,
    /// Op log size past which it is compacted into the snapshot.
    compact_after: ByteSize,
}

impl Default for Section {
    fn default() -> Self {
        let o = RegistryOptions::default();
        Section { flush_interval: HumanDuration(o.flush_interval), compact_after: ByteSize(o.compact_after_bytes) }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn read(text: &str) -> Result<RegistryOptions, ConfigErrors> {
        let root = sluice_config::parse_yaml(text, "g.yml").unwrap();
        RegistryOptions::from_section(root.get("registry"))
    }

    #[test]
    fn defaults_and_keys() {
        assert_eq!(read("other: 1\n").unwrap(), RegistryOptions::default());
        assert_eq!(read("registry:\n").unwrap(), RegistryOptions::default());
        assert_eq!(RegistryOptions::default().flush_interval, Duration::from_secs(1));
        let o = read("registry: {flush_interval: 0, compact_after: 1MiB}\n").unwrap();
        assert_eq!((o.flush_interval, o.compact_after_bytes), (Duration::ZERO, 1 << 20));
        let o = read("registry: {flush_interval: 5s}\n").unwrap();
        assert_eq!((o.flush_interval, o.compact_after_bytes), (Duration::from_secs(5), 16 << 20));
    }

    #[test]
    fn errors_name_the_key_and_line() {
        let e = read("registry: {flush_intervall: 5s}\n").unwrap_err().to_string();
        assert!(e.contains("flush_intervall") && e.contains("registry") && e.contains("g.yml:1"), "{e}");
        let e = read("registry:\n  flush_interval: 5\n").unwrap_err().to_string();
        assert!(e.contains("registry.flush_interval") && e.contains("g.yml:2"), "{e}");
        let e = read("registry:\n  compact_after: 10\n").unwrap_err().to_string();
        assert!(e.starts_with("g.yml:2:18: registry.compact_after: `compact_after` of 10B is too small"), "{e}");
    }
}
