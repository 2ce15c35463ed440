//! The `http` input's settings: the shared listener keys ([`Listener`]) and its own, with their
//! defaults and checks. Credentials and `tls:` files are read by the caller.

use std::time::Duration;

use serde::Deserialize;
use sluice_config::model::ComponentSpec;
use sluice_config::{ByteSize, ConfigError, HumanDuration};

use super::auth::AuthConfig;
use crate::listener::Listener;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HttpConfig {
    #[serde(default = "default_path")]
    pub path: String,
    #[serde(default = "default_max_body")]
    pub max_body_bytes: ByteSize,
    /// Shorthand for `auth: {bearer: TOKEN}`.
    pub auth_token: Option<String>,
    pub auth: Option<AuthConfig>,
    #[serde(default = "default_max_events")]
    pub max_events_per_request: usize,
    #[serde(default = "default_header_timeout")]
    pub header_timeout: HumanDuration,
    #[serde(default = "default_body_timeout")]
    pub body_timeout: HumanDuration,
    #[serde(default = "default_request_timeout")]
    pub request_timeout: HumanDuration,
}

fn default_path() -> String {
    "/".to_string()
}
fn default_max_body() -> ByteSize {
    ByteSize(10 << 20)
}
fn default_max_events() -> usize {
    100_000
}
fn default_header_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(10))
}
fn default_body_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
fn default_request_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}

/// Reads and checks the input's settings.
pub(super) fn read(spec: &ComponentSpec) -> Result<(Listener, HttpConfig), ConfigError> {
    let (listener, config): (Listener, HttpConfig) = Listener::read(spec, DEFAULT_IDLE_TIMEOUT)?;
    if !config.path.starts_with('/') {
        return Err(spec.key_error("path", format!("`{}` must start with `/`", config.path)));
    }
    if config.max_body_bytes.0 == 0 {
        return Err(spec.key_error("max_body_bytes", "must be at least 1 byte"));
    }
    if config.max_events_per_request == 0 {
        return Err(spec.key_error("max_events_per_request", "must be at least 1"));
    }
    for (key, value) in [("body_timeout", config.body_timeout), ("request_timeout", config.request_timeout)] {
        if value.0.is_zero() {
            return Err(spec.key_error(key, "must be more than 0"));
        }
    }
    Ok((listener, config))
}
