//! The `http` output's settings (where and how to send, headers, timeouts, retries, TLS), their
//! defaults and checks. Headers and the `tls:` files are read by the caller.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::Url;
use serde::Deserialize;
use sluice_config::model::ComponentSpec;
use sluice_config::{ConfigError, HumanDuration};

use crate::retry::RetryConfig;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum HttpMethod {
    #[default]
    Post,
    Put,
}

/// `post` or `put`, in any case: HTTP spells methods in capitals, and so do many configs.
impl<'de> Deserialize<'de> for HttpMethod {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match text.to_ascii_lowercase().as_str() {
            "post" => Ok(HttpMethod::Post),
            "put" => Ok(HttpMethod::Put),
            _ => Err(serde::de::Error::unknown_variant(&text, &["post", "put"])),
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(super) enum Format {
    /// One JSON object per line (`application/x-ndjson`).
    #[default]
    Ndjson,
    /// One JSON array of objects (`application/json`).
    JsonArray,
}

#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(super) enum Compression {
    #[default]
    None,
    Gzip,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HttpConfig {
    pub url: String,
    #[serde(default)]
    pub method: HttpMethod,
    #[serde(default)]
    pub format: Format,
    #[serde(default)]
    pub compression: Compression,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    pub auth_token: Option<String>,
    #[serde(default = "default_timeout")]
    pub timeout: HumanDuration,
    #[serde(default = "default_batch_max")]
    pub batch_max_events: usize,
    #[serde(default)]
    pub retry: RetryConfig,
    #[serde(default = "yes")]
    pub isolate_refused: bool,
    /// TLS for `https://` URLs: `ca`, a client `cert`/`key`, `server_name`, `verify`.
    pub tls: Option<sluice_tls::TlsConfig>,
}

fn yes() -> bool {
    true
}

fn default_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}
fn default_batch_max() -> usize {
    1000
}

/// Reads and checks the output's settings; the URL comes back parsed.
pub(super) fn read(spec: &ComponentSpec) -> Result<(Url, HttpConfig), ConfigError> {
    let c: HttpConfig = spec.settings()?;
    let url = Url::parse(&c.url).map_err(|e| spec.key_error("url", format!("`{}` is not a URL: {e}", c.url)))?;
    if !matches!(url.scheme(), "http" | "https") || !url.has_host() {
        return Err(spec.key_error("url", format!("`{}` must be an http:// or https:// URL with a host", c.url)));
    }
    if c.batch_max_events == 0 {
        return Err(spec.key_error("batch_max_events", "must be at least 1"));
    }
    if c.timeout.0.is_zero() {
        return Err(spec.key_error("timeout", "must be more than 0"));
    }
    Ok((url, c))
}
