//! The one `tls:` shape, read with `sluice_config::from_node`, and the checks of its
//! combinations that do not depend on any file.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use serde::Deserialize;

use crate::error::TlsError;

/// The `tls:` section of a network input, output or the cluster transport.
///
/// ```yaml
/// tls:
///   cert: ./certs/node.crt
///   key: ./certs/node.key
///   ca: ./certs/ca.crt
///   client_auth: required
///   min_version: "1.2"
/// ```
///
/// One section serves both ends: a server reads `cert`, `key`, `ca` and `client_auth`; a client
/// reads `cert` and `key` (its own certificate, sent when the server asks for one), `ca`,
/// `server_name` and `verify`. Keys meant for the other end are ignored, so the cluster
/// transport, which both listens and dials, takes one section. Relative paths are taken from
/// the working directory, like every path in a Sluice config; the files are read when the
/// server or client configuration is built (at start and at each reload).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// Whether TLS is used at all. Default `true`, so that `tls: {enabled: false}` keeps a
    /// section in the file but switches it off; nothing else in it is checked then.
    pub enabled: bool,
    /// The PEM certificate chain to present, leaf first. Required on a server; on a client,
    /// needed when the server asks for a client certificate. No default.
    pub cert: Option<PathBuf>,
    /// The PEM private key of `cert` (PKCS#8 `PRIVATE KEY`, PKCS#1 `RSA PRIVATE KEY` or SEC1
    /// `EC PRIVATE KEY`, unencrypted). Required whenever `cert` is set. No default.
    pub key: Option<PathBuf>,
    /// The PEM CA bundle the other side's certificate must chain to. On a server it verifies
    /// client certificates (see `client_auth`); on a client it verifies the server, and is
    /// required unless `verify: false`: there is no built-in trust store. No default.
    pub ca: Option<PathBuf>,
    /// Server side: whether to ask for a client certificate, verified against `ca`. Default:
    /// `required` when `ca` is set, `none` when it is not.
    pub client_auth: Option<ClientAuth>,
    /// Client side: the name the server's certificate must carry (a DNS name or an IP
    /// address); also sent as SNI when it is a DNS name. Default: the host dialled.
    pub server_name: Option<String>,
    /// Client side: `false` accepts any server certificate. Unsafe (anyone in the path can
    /// read and change the traffic); a warning is logged whenever such a client is built.
    /// Default `true`.
    pub verify: bool,
    /// The oldest TLS version accepted, `"1.2"` or `"1.3"`. Default `"1.2"`.
    pub min_version: TlsVersion,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            enabled: true,
            cert: None,
            key: None,
            ca: None,
            client_auth: None,
            server_name: None,
            verify: true,
            min_version: TlsVersion::V1_2,
        }
    }
}

/// Whether a server asks for client certificates (`client_auth:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuth {
    /// No client certificate is asked for.
    None,
    /// A client may send a certificate; if it does, it must chain to `ca`.
    Optional,
    /// A client must send a certificate that chains to `ca`.
    Required,
}

/// The oldest TLS version accepted (`min_version:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub enum TlsVersion {
    #[serde(rename = "1.2")]
    V1_2,
    #[serde(rename = "1.3")]
    V1_3,
}

impl TlsConfig {
    /// The `client_auth` in force: as set, or `required` when `ca` is set and `none` when not.
    pub fn effective_client_auth(&self) -> ClientAuth {
        match (self.client_auth, &self.ca) {
            (Some(auth), _) => auth,
            (None, Some(_)) => ClientAuth::Required,
            (None, None) => ClientAuth::None,
        }
    }

    pub(crate) fn check_enabled(&self) -> Result<(), TlsError> {
        if self.enabled { Ok(()) } else { Err(TlsError::Disabled) }
    }

    /// `cert` and `key`, both or neither; each must not be empty.
    pub(crate) fn identity_paths(&self) -> Result<Option<(&Path, &Path)>, TlsError> {
        for (key, path) in [("cert", &self.cert), ("key", &self.key), ("ca", &self.ca)] {
            if path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
                return Err(TlsError::config(key, format!("`{key}` must not be empty")));
            }
        }
        match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => Ok(Some((cert, key))),
            (None, None) => Ok(None),
            (Some(cert), None) => Err(TlsError::config(
                "key",
                format!("`cert` is set ({}) but `key` is not: a certificate needs its private key", cert.display()),
            )),
            (None, Some(key)) => Err(TlsError::config(
                "cert",
                format!("`key` is set ({}) but `cert` is not: a private key needs its certificate", key.display()),
            )),
        }
    }

    pub(crate) fn protocol_versions(&self) -> &'static [&'static rustls::SupportedProtocolVersion] {
        static FROM_1_2: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13, &rustls::version::TLS12];
        static FROM_1_3: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];
        match self.min_version {
            TlsVersion::V1_2 => FROM_1_2,
            TlsVersion::V1_3 => FROM_1_3,
        }
    }
}

/// The crypto provider every configuration is built with: ring, passed explicitly, so nothing
/// depends on a process-wide default.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_config::{from_node, parse_yaml};

    fn read(text: &str) -> Result<TlsConfig, sluice_config::ConfigError> {
        let root = parse_yaml(text, "t.yml").unwrap();
        from_node(&root, "tls")
    }

    #[test]
    fn reads_every_key() {
        let c = read(
            "cert: ./certs/node.crt\nkey: ./certs/node.key\nca: ./certs/ca.crt\nclient_auth: optional\n\
             server_name: node-1.example\nverify: false\nmin_version: 1.3\nenabled: true\n",
        )
        .unwrap();
        assert_eq!(c.cert.as_deref(), Some(Path::new("./certs/node.crt")));
        assert_eq!(c.key.as_deref(), Some(Path::new("./certs/node.key")));
        assert_eq!(c.ca.as_deref(), Some(Path::new("./certs/ca.crt")));
        assert_eq!(c.client_auth, Some(ClientAuth::Optional));
        assert_eq!(c.server_name.as_deref(), Some("node-1.example"));
        assert!(!c.verify);
        assert_eq!(c.min_version, TlsVersion::V1_3);
        assert_eq!(read("min_version: \"1.2\"\n").unwrap().min_version, TlsVersion::V1_2);
    }

    #[test]
    fn defaults() {
        let c = read("{}\n").unwrap();
        assert_eq!(c, TlsConfig::default());
        assert!(c.enabled && c.verify);
        assert_eq!(c.min_version, TlsVersion::V1_2);
        assert_eq!(c.effective_client_auth(), ClientAuth::None);
        let c = read("ca: ca.crt\n").unwrap();
        assert_eq!(c.effective_client_auth(), ClientAuth::Required);
        let c = read("ca: ca.crt\nclient_auth: none\n").unwrap();
        assert_eq!(c.effective_client_auth(), ClientAuth::None);
        assert!(!read("enabled: false\n").unwrap().enabled);
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let e = read("cert: a.crt\ncerts: b.crt\n").unwrap_err();
        assert_eq!(e.path, "tls.certs");
        assert!(e.to_string().starts_with("t.yml:2:1: tls.certs: unknown field `certs`"), "{e}");
        let e = read("client_auth: always\n").unwrap_err();
        assert_eq!(e.path, "tls.client_auth");
        assert!(e.message.contains("unknown variant `always`"), "{e}");
        let e = read("min_version: 1.1\n").unwrap_err();
        assert_eq!(e.path, "tls.min_version");
        let e = read("verify: maybe\n").unwrap_err();
        assert_eq!(e.path, "tls.verify");
    }

    #[test]
    fn cert_and_key_go_together() {
        let e = read("cert: a.crt\n").unwrap().identity_paths().unwrap_err();
        assert_eq!(e.key(), "key");
        assert!(e.to_string().contains("`cert` is set (a.crt) but `key` is not"), "{e}");
        let e = read("key: a.key\n").unwrap().identity_paths().unwrap_err();
        assert_eq!(e.key(), "cert");
        let e = read("cert: ''\nkey: a.key\n").unwrap().identity_paths().unwrap_err();
        assert_eq!(e.to_string(), "`cert` must not be empty");
    }
}
