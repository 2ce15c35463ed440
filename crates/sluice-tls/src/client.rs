//! The client end: a rustls `ClientConfig` and a connector that verifies the server against
//! `server_name` or the host dialled.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::config::{TlsConfig, provider};
use crate::error::TlsError;
use crate::load;

impl TlsConfig {
    /// The rustls client configuration: the server verified against `ca` (or not at all with
    /// `verify: false`), `cert` and `key` presented when the server asks, TLS from
    /// `min_version` up.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>, TlsError> {
        self.check_enabled()?;
        let identity = self.identity_paths()?;
        self.checked_server_name()?;
        let provider = provider();
        let verifier: Arc<dyn ServerCertVerifier> = if self.verify {
            let Some(ca) = &self.ca else {
                return Err(TlsError::config(
                    "ca",
                    "a TLS client needs `ca`, the CA bundle the server's certificate is verified against \
                     (or `verify: false`, which is unsafe)",
                ));
            };
            let roots = load::roots(ca)?;
            WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone()).build().map_err(|e| {
                TlsError::Unusable { key: "ca", what: "CA bundle", path: ca.clone(), detail: e.to_string() }
            })?
        } else {
            tracing::warn!(
                "TLS client with `verify: false`: the server's certificate is not checked, so anyone in the \
                 path can read and change the traffic"
            );
            Arc::new(NoVerification(provider.signature_verification_algorithms))
        };
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(self.protocol_versions())
            .map_err(|e| TlsError::config("min_version", format!("`min_version` cannot be used: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        let config = match identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let identity = load::identity(cert, key, &provider)?;
                builder.with_client_auth_cert(identity.chain, identity.key).map_err(|e| load::unusable_cert(cert, e))?
            }
        };
        Ok(Arc::new(config))
    }

    /// A connector over [`TlsConfig::client_config`].
    pub fn connector(&self) -> Result<TlsConnector, TlsError> {
        Ok(TlsConnector {
            inner: tokio_rustls::TlsConnector::from(self.client_config()?),
            server_name: self.checked_server_name()?,
        })
    }

    fn checked_server_name(&self) -> Result<Option<ServerName<'static>>, TlsError> {
        let Some(name) = &self.server_name else { return Ok(None) };
        parse_server_name(name).map(Some).map_err(|_| {
            TlsError::config("server_name", format!("`server_name: {name}` is neither a DNS name nor an IP address"))
        })
    }
}

/// `host` as a server name: a DNS name, or an IP address (`127.0.0.1`, `::1` or `[::1]`).
fn parse_server_name(host: &str) -> Result<ServerName<'static>, rustls_pki_types::InvalidDnsNameError> {
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    ServerName::try_from(host.to_string())
}

/// Opens TLS sessions over connected streams (see [`TlsConfig::connector`]).
#[derive(Clone)]
pub struct TlsConnector {
    inner: tokio_rustls::TlsConnector,
    server_name: Option<ServerName<'static>>,
}

impl TlsConnector {
    #[cfg(test)]
    pub(crate) fn from_config(config: Arc<ClientConfig>, server_name: Option<ServerName<'static>>) -> TlsConnector {
        TlsConnector { inner: tokio_rustls::TlsConnector::from(config), server_name }
    }

    /// The handshake over `stream`, dialled to `host` (a DNS name or an IP address, without the
    /// port). The server's certificate must carry `server_name` when it is configured, `host`
    /// when it is not. Failures are `io::Error`s; [`crate::describe_handshake_error`] says why.
    pub async fn connect<S>(&self, host: &str, stream: S) -> io::Result<tokio_rustls::client::TlsStream<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let name = match &self.server_name {
            Some(name) => name.clone(),
            None => parse_server_name(host).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("`{host}` is neither a DNS name nor an IP address to verify the server against"),
                )
            })?,
        };
        self.inner.connect(name, stream).await
    }

    /// The rustls client configuration it uses.
    pub fn config(&self) -> &Arc<ClientConfig> {
        self.inner.config()
    }
}

impl std::fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConnector").field("server_name", &self.server_name).finish_non_exhaustive()
    }
}

/// Watches the connection for `window` after a TLS 1.3 handshake for the server's verdict on
/// the client's certificate, and fails with the server's alert when it refused it.
///
/// In TLS 1.3 the client's handshake is over before the server has checked the client's
/// certificate (or noticed there is none): a server that refuses it says so with an alert that
/// the client sees only at its next read. A client that only writes, such as the `tcp` output,
/// would otherwise take its writes into a session the server already dropped for delivered.
/// A server that accepts says nothing (a sluice input sends no session tickets, see
/// [`TlsConfig::server_config`]), so silence for `window` counts as accepted; session tickets
/// (OpenSSL and Go servers send them by default) end the wait at once. Its limit: a server that
/// takes longer than `window` to refuse (a slow revocation check, a window shorter than the
/// round trip) is taken as accepting, and the refusal shows at the client's next check of the
/// connection. Use a few round trips (see [`verdict_window`]). `Ok` at once over TLS 1.2, whose
/// handshake ends with the server's `Finished`, sent after it checked the client's certificate.
/// Data the server sends meanwhile is read and thrown away: call it only for a client that
/// expects none. The error goes through [`crate::describe_handshake_error`] like a failed
/// handshake's.
pub async fn confirm_accepted<S>(stream: &mut tokio_rustls::client::TlsStream<S>, window: Duration) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    if stream.get_ref().1.protocol_version() != Some(rustls::ProtocolVersion::TLSv1_3) {
        return Ok(());
    }
    let verdict = std::future::poll_fn(|cx| {
        let mut scratch = [0u8; 1024];
        loop {
            if stream.get_ref().1.tls13_tickets_received() > 0 {
                return Poll::Ready(Ok(()));
            }
            let mut buf = ReadBuf::new(&mut scratch);
            match Pin::new(&mut *stream).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if buf.filled().is_empty() => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the server closed the connection right after the handshake",
                    )));
                }
                Poll::Ready(Ok(())) => continue,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                // The records read so far (tickets, if any) are taken; the loop's check decides.
                Poll::Pending if stream.get_ref().1.tls13_tickets_received() > 0 => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    });
    tokio::time::timeout(window, verdict).await.unwrap_or(Ok(()))
}

/// The shortest window [`verdict_window`] gives: a refusal is one round trip away, plus the
/// server's own delays on a busy machine.
pub const MIN_VERDICT_WINDOW: Duration = Duration::from_millis(250);

/// How long to watch for the server's verdict ([`confirm_accepted`]) after a handshake that
/// took `handshake` from connecting: four times that (it spans about two round trips, the
/// refusal comes one after), at least [`MIN_VERDICT_WINDOW`] and at most `at_most`.
pub fn verdict_window(handshake: Duration, at_most: Duration) -> Duration {
    (handshake * 4).max(MIN_VERDICT_WINDOW).min(at_most)
}

/// `verify: false`: any server certificate is accepted; handshake signatures are still checked,
/// so the session is at least with the holder of the certificate's key.
#[derive(Debug)]
struct NoVerification(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_take_ips_and_brackets() {
        assert!(matches!(parse_server_name("127.0.0.1"), Ok(ServerName::IpAddress(_))));
        assert!(matches!(parse_server_name("[::1]"), Ok(ServerName::IpAddress(_))));
        assert!(matches!(parse_server_name("node-1.example"), Ok(ServerName::DnsName(_))));
        assert!(parse_server_name("not a name").is_err());
    }
}
