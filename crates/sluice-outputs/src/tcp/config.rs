//! The `tcp` output's settings (where, how lines are written, timeouts, retries, TLS), their
//! defaults and checks. The `tls:` files are read by the caller.

use std::time::Duration;

use serde::Deserialize;
use sluice_config::model::ComponentSpec;
use sluice_config::{ConfigError, HumanDuration};

use crate::retry::RetryConfig;

#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(super) enum TcpCodec {
    /// One JSON object per line.
    #[default]
    Json,
    /// The `message` field (or the event as JSON when it has none), one per line.
    Text,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TcpConfig {
    pub address: String,
    #[serde(default)]
    pub codec: TcpCodec,
    #[serde(default = "default_connect_timeout")]
    pub connect_timeout: HumanDuration,
    #[serde(default)]
    pub retry: RetryConfig,
    /// TLS to the server: `ca`, a client `cert`/`key`, `server_name`, `verify`.
    pub tls: Option<sluice_tls::TlsConfig>,
}

fn default_connect_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(10))
}

/// Reads and checks the output's settings.
pub(super) fn read(spec: &ComponentSpec) -> Result<TcpConfig, ConfigError> {
    let c: TcpConfig = spec.settings()?;
    match c.address.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0) => {}
        _ => {
            return Err(spec.key_error("address", format!("`{}` is not a `host:port` address", c.address)));
        }
    }
    if c.connect_timeout.0.is_zero() {
        return Err(spec.key_error("connect_timeout", "must be more than 0"));
    }
    Ok(c)
}
