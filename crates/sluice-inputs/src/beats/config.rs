//! The `beats` input's settings: the shared listener keys ([`Listener`]) and its own, with
//! their defaults (Logstash's where it has one) and checks. Nothing is bound or opened here.

use std::time::Duration;

use serde::Deserialize;
use sluice_config::model::ComponentSpec;
use sluice_config::{ByteSize, ConfigError, HumanDuration};

use crate::listener::Listener;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BeatsConfig {
    #[serde(default = "default_max_frame")]
    pub max_frame_bytes: ByteSize,
    #[serde(default = "default_max_window")]
    pub max_window_size: u32,
    #[serde(default = "default_keepalive")]
    pub keepalive_interval: HumanDuration,
    #[serde(default = "default_write_timeout")]
    pub write_timeout: HumanDuration,
}

fn default_max_frame() -> ByteSize {
    ByteSize(64 << 20)
}
fn default_max_window() -> u32 {
    65_536
}
/// Logstash's `client_inactivity_timeout`.
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Logstash's beats input sends a keep-alive after 5 s without writing while a batch waits.
fn default_keepalive() -> HumanDuration {
    HumanDuration(Duration::from_secs(5))
}
fn default_write_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}

/// Reads and checks the input's settings; the `tls:` files are read by the caller.
pub(super) fn read(spec: &ComponentSpec) -> Result<(Listener, BeatsConfig), ConfigError> {
    let (listener, config): (Listener, BeatsConfig) = Listener::read(spec, DEFAULT_IDLE_TIMEOUT)?;
    if config.max_frame_bytes.0 < 1024 || config.max_frame_bytes.0 > 1 << 30 {
        return Err(spec.key_error("max_frame_bytes", "must be between 1KiB and 1GiB"));
    }
    if config.max_window_size == 0 {
        return Err(spec.key_error("max_window_size", "must be at least 1"));
    }
    if config.keepalive_interval.0.is_zero() {
        return Err(spec.key_error("keepalive_interval", "must be more than 0"));
    }
    if config.write_timeout.0.is_zero() {
        return Err(spec.key_error("write_timeout", "must be more than 0"));
    }
    Ok((listener, config))
}
