//! The `tls:` section of an input or output: built when the component is built, so that
//! `sluice validate` and a reload check the files, with errors placed at `<component>.tls.<key>`.

use std::sync::Arc;

use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;

use crate::config::TlsConfig;
use crate::error::TlsError;
use crate::reload::{ClientTls, ServerTls};

fn placed(spec: &ComponentSpec, e: TlsError) -> ConfigError {
    spec.nested_key_error(&["tls", e.key()], e.to_string())
}

fn described(spec: &ComponentSpec) -> String {
    format!("{} ({} `{}`)", spec.path, spec.type_name, spec.id)
}

/// What a server's `tls:` section says only by implication: `ca` without `client_auth` makes
/// every client present a certificate signed by it (`required`), which a reader of the config
/// may take for "verify with this CA" and find out from refused clients. Said at
/// `<component>.tls.client_auth`, by `sluice validate` and at start.
pub fn server_warnings(spec: &ComponentSpec) -> Vec<ConfigError> {
    let Some(tls) = spec.settings.get("tls") else { return Vec::new() };
    let set = |key: &str| tls.get(key).is_some_and(|n| !n.is_null());
    let enabled = tls.get("enabled").and_then(|n| n.as_str()) != Some("false");
    if !enabled || !set("ca") || set("client_auth") {
        return Vec::new();
    }
    vec![spec.nested_key_error(
        &["tls", "client_auth"],
        "`ca` is set without `client_auth`, so every client must present a certificate signed by it \
         (`required`); write `client_auth: required`, `optional` or `none` to say which is meant",
    )]
}

impl ServerTls {
    /// The server end of an input's `tls:` section; `None` without one or with `enabled: false`.
    pub fn for_component(spec: &ComponentSpec, tls: Option<&TlsConfig>) -> Result<Option<Arc<ServerTls>>, ConfigError> {
        match tls {
            Some(tls) if tls.enabled => ServerTls::new(tls, described(spec)).map(Some).map_err(|e| placed(spec, e)),
            _ => Ok(None),
        }
    }
}

impl ClientTls {
    /// The client end of an output's `tls:` section; `None` without one or with `enabled: false`.
    pub fn for_component(spec: &ComponentSpec, tls: Option<&TlsConfig>) -> Result<Option<Arc<ClientTls>>, ConfigError> {
        match tls {
            Some(tls) if tls.enabled => ClientTls::new(tls, described(spec)).map(Some).map_err(|e| placed(spec, e)),
            _ => Ok(None),
        }
    }
}
