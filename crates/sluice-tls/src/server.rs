//! The server end: a rustls `ServerConfig` and a tokio acceptor from a [`TlsConfig`].
//!
//! The server sends nothing its client did not ask for (no session tickets): a client that only
//! writes and then closes leaves nothing unread, so its close is a clean one and every byte it
//! wrote is read.

use std::sync::Arc;

use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;

use crate::config::{ClientAuth, TlsConfig, provider};
use crate::error::TlsError;
use crate::load;

impl TlsConfig {
    /// The rustls server configuration: `cert` and `key` (required, checked to match),
    /// client certificates per `client_auth` verified against `ca`, TLS from `min_version` up,
    /// and no TLS 1.3 session tickets.
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, TlsError> {
        self.check_enabled()?;
        let Some((cert, key)) = self.identity_paths()? else {
            return Err(TlsError::config(
                "cert",
                "a TLS server needs `cert` (its certificate chain) and `key` (its private key); neither is set",
            ));
        };
        let provider = provider();
        let identity = load::identity(cert, key, &provider)?;
        let verifier = self.client_verifier(&provider)?;
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(self.protocol_versions())
            .map_err(|e| TlsError::config("min_version", format!("`min_version` cannot be used: {e}")))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(identity.chain, identity.key)
            .map_err(|e| load::unusable_cert(cert, e))?;
        // A log shipper that only writes never reads the tickets sent after the handshake, so
        // its close becomes a reset and the kernel throws away what this end had not read yet.
        // Our clients keep one connection open and do not resume sessions: tickets buy nothing.
        config.send_tls13_tickets = 0;
        Ok(Arc::new(config))
    }

    /// A tokio acceptor over [`TlsConfig::server_config`].
    pub fn acceptor(&self) -> Result<tokio_rustls::TlsAcceptor, TlsError> {
        Ok(tokio_rustls::TlsAcceptor::from(self.server_config()?))
    }

    fn client_verifier(
        &self,
        provider: &Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
        let auth = self.effective_client_auth();
        if auth == ClientAuth::None {
            return Ok(WebPkiClientVerifier::no_client_auth());
        }
        let Some(ca) = &self.ca else {
            let name = if auth == ClientAuth::Required { "required" } else { "optional" };
            return Err(TlsError::config(
                "ca",
                format!("`client_auth: {name}` needs `ca`, the CA bundle client certificates are verified against"),
            ));
        };
        let roots = load::roots(ca)?;
        let mut builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
        if auth == ClientAuth::Optional {
            builder = builder.allow_unauthenticated();
        }
        builder.build().map_err(|e| TlsError::Unusable {
            key: "ca",
            what: "CA bundle",
            path: ca.clone(),
            detail: e.to_string(),
        })
    }
}
