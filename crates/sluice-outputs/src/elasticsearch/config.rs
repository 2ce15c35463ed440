//! The `elasticsearch` (also `opensearch`) output's settings, read and checked when the output
//! is built.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use sluice_config::{ByteSize, HumanDuration};

use super::bulk::Action;
use crate::retry::RetryConfig;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ElasticsearchConfig {
    /// Base URLs of the engine's nodes, taken in turn.
    pub hosts: Vec<String>,
    /// Index name template: `%{/field}` and `%{+%Y.%m.%d}` (from the event's `@timestamp`).
    #[serde(default = "default_index")]
    pub index: String,
    /// Document id template; unset lets the engine choose (then a resend is a duplicate).
    /// (`id` names the component itself, as everywhere in a Sluice config.)
    pub document_id: Option<String>,
    #[serde(default)]
    pub action: Action,
    pub routing: Option<String>,
    /// Ingest pipeline template; a template that renders empty names none.
    pub pipeline: Option<String>,
    /// A 409 on `create` (the document is already there): `refuse` (dead letter) or `delivered`.
    #[serde(default)]
    pub create_conflict: ConflictPolicy,
    #[serde(default = "default_batch_max_events")]
    pub batch_max_events: usize,
    #[serde(default = "default_batch_max_bytes")]
    pub batch_max_bytes: ByteSize,
    /// Bulk requests in flight at once, across the pipeline's workers.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    #[serde(default = "default_compression")]
    pub compression: Compression,
    #[serde(default = "default_timeout")]
    pub timeout: HumanDuration,
    #[serde(default)]
    pub retry: RetryConfig,
    pub auth: Option<AuthConfig>,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    pub tls: Option<sluice_tls::TlsConfig>,
    pub template: Option<TemplateConfig>,
}

#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ConflictPolicy {
    #[default]
    Refuse,
    Delivered,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    None,
    Gzip,
}

/// `auth:`: exactly one of `basic`, `api_key` or `bearer`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    pub basic: Option<BasicAuth>,
    /// `id:key`, or its base64 form as the engine hands it out.
    pub api_key: Option<String>,
    pub bearer: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasicAuth {
    pub user: String,
    pub password: String,
}

/// `template:`: an index template installed before the first bulk request.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateConfig {
    pub name: String,
    /// A JSON file with the template's body (`index_patterns`, `template`, `priority`, ...).
    pub file: PathBuf,
    /// Replace a template of that name that is already there. Default `false`.
    #[serde(default)]
    pub overwrite: bool,
}

fn default_index() -> String {
    "sluice-%{+%Y.%m.%d}".to_string()
}
fn default_batch_max_events() -> usize {
    1000
}
fn default_batch_max_bytes() -> ByteSize {
    ByteSize(10 << 20)
}
fn default_max_in_flight() -> usize {
    4
}
fn default_compression() -> Compression {
    Compression::Gzip
}
fn default_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(60))
}
