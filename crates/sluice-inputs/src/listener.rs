//! The keys every network input shares: `address`, `max_connections`, `idle_timeout` and `tls`,
//! written flat among the input's own keys and declared once here.
//!
//! Guarantees: every input that listens reads them through [`Listener::read`], so they take the
//! same forms, defaults (but `idle_timeout`, whose default is the input's: a protocol's clients
//! keep connections idle for different spans) and checks, and their errors name the key and its
//! line like any other key's. Nothing is bound or opened here: the address is checked for form
//! and resolved when the input runs; the `tls:` files are read by [`Listener::server_tls`].

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use sluice_config::model::ComponentSpec;
use sluice_config::{ConfigError, HumanDuration};
use sluice_tls::{ServerTls, TlsConfig};

/// The most connections an input keeps open when its config does not say.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;

/// The keys as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Keys {
    /// `host:port` to listen on.
    address: String,
    /// Connections open at once; see [`crate::limits`] for what happens at the limit.
    max_connections: Option<usize>,
    /// A connection that sends nothing for this long is closed; `0` never.
    idle_timeout: Option<HumanDuration>,
    /// TLS, with client certificates per `client_auth` (see docs/tls.md).
    tls: Option<TlsConfig>,
}

/// A network input's listener, checked.
#[derive(Debug, Clone)]
pub struct Listener {
    /// `host:port`, resolved when the input starts.
    pub address: String,
    pub max_connections: usize,
    /// `ZERO`: never.
    pub idle_timeout: Duration,
    /// The `tls:` section, when written (see [`Listener::server_tls`]).
    pub tls: Option<TlsConfig>,
    /// Which of the optional keys were written, for inputs where some apply only in one mode.
    written: Written,
}

#[derive(Debug, Clone, Copy)]
struct Written {
    max_connections: bool,
    idle_timeout: bool,
}

impl Listener {
    /// Reads an input's listener keys and its own keys `T` (which must not declare the
    /// listener's); `idle_timeout` is the input's default for that key.
    pub fn read<T: DeserializeOwned>(
        spec: &ComponentSpec,
        idle_timeout: Duration,
    ) -> Result<(Listener, T), ConfigError> {
        let (keys, own): (Keys, T) = spec.settings_with()?;
        check_address(&keys.address).map_err(|m| spec.key_error("address", m))?;
        if keys.max_connections == Some(0) {
            return Err(spec.key_error("max_connections", "must be at least 1"));
        }
        let listener = Listener {
            address: keys.address,
            max_connections: keys.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS),
            idle_timeout: keys.idle_timeout.map_or(idle_timeout, |d| d.0),
            tls: keys.tls,
            written: Written {
                max_connections: keys.max_connections.is_some(),
                idle_timeout: keys.idle_timeout.is_some(),
            },
        };
        Ok((listener, own))
    }

    /// The server end of the `tls:` section (`None` without one or with `enabled: false`); its
    /// files are read and checked now, so that `sluice validate` reports them.
    pub fn server_tls(&self, spec: &ComponentSpec) -> Result<Option<Arc<ServerTls>>, ConfigError> {
        ServerTls::for_component(spec, self.tls.as_ref())
    }

    /// The connection keys written, of `max_connections`, `idle_timeout` and `tls`: an input
    /// without connections (syslog over UDP) refuses them.
    pub fn connection_keys_written(&self) -> Vec<&'static str> {
        let written = [
            ("max_connections", self.written.max_connections),
            ("idle_timeout", self.written.idle_timeout),
            ("tls", self.tls.is_some()),
        ];
        written.into_iter().filter(|(_, w)| *w).map(|(k, _)| k).collect()
    }
}

/// `host:port` with a port that is a number; the host is resolved when the input starts.
pub(crate) fn check_address(address: &str) -> Result<(), String> {
    match address.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
        _ => Err(format!("`{address}` is not a `host:port` address (like 0.0.0.0:5000)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Own {
        #[serde(default)]
        colour: Option<String>,
    }

    fn spec(yaml: &str) -> ComponentSpec {
        let text = format!("pipelines:\n  p:\n    inputs:\n      - {yaml}\n    outputs: [{{type: stdout}}]\n");
        let root = sluice_config::model::load_str(&text, "l.yml").unwrap_or_else(|e| panic!("{e}"));
        root.pipelines.into_iter().next().unwrap().inputs.remove(0)
    }

    fn read(yaml: &str) -> Result<(Listener, Own), String> {
        Listener::read(&spec(yaml), Duration::from_secs(60)).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_own_keys() {
        let (l, own) = read("{type: x, address: '127.0.0.1:5000', colour: red}").unwrap();
        assert_eq!(l.address, "127.0.0.1:5000");
        assert_eq!((l.max_connections, l.idle_timeout), (DEFAULT_MAX_CONNECTIONS, Duration::from_secs(60)));
        assert!(l.tls.is_none() && l.connection_keys_written().is_empty());
        assert_eq!(own.colour.as_deref(), Some("red"));
        let (l, _) =
            read("{type: x, address: 'h:1', max_connections: '7', idle_timeout: 0s, tls: {enabled: false}}").unwrap();
        assert_eq!((l.max_connections, l.idle_timeout), (7, Duration::ZERO));
        assert_eq!(l.connection_keys_written(), ["max_connections", "idle_timeout", "tls"]);
        assert!(l.server_tls(&spec("{type: x}")).unwrap().is_none(), "enabled: false");
    }

    #[test]
    fn errors_name_the_key_and_line() {
        let e = read("{type: x, address: nowhere}").unwrap_err();
        assert!(e.starts_with("l.yml:4:28: pipelines.p.inputs[0].address: `nowhere` is not a `host:port`"), "{e}");
        let e = read("{type: x, address: 'h:1', max_connections: 0}").unwrap_err();
        assert!(e.contains("pipelines.p.inputs[0].max_connections: must be at least 1"), "{e}");
        let e = read("{type: x, address: 'h:1', idle_timeout: soon}").unwrap_err();
        assert!(e.starts_with("l.yml:4:49: pipelines.p.inputs[0].idle_timeout:"), "{e}");
        let e = read("{type: x, address: 'h:1', tls: {cert: 1, colour: red}}").unwrap_err();
        assert!(e.contains("pipelines.p.inputs[0].tls.colour: unknown field"), "{e}");
        let e = read("{type: x}").unwrap_err();
        assert!(e.contains("pipelines.p.inputs[0]: missing field `address`"), "{e}");
    }

    #[test]
    fn an_unknown_key_lists_both_kinds_of_keys() {
        let e = read("{type: x, address: 'h:1', colur: red}").unwrap_err();
        assert_eq!(
            e,
            "l.yml:4:35: pipelines.p.inputs[0].colur: unknown field `colur`, expected one of `colour`, `address`, \
             `max_connections`, `idle_timeout`, `tls`"
        );
    }
}
