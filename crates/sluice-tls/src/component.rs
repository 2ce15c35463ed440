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
