//! Connections between nodes: plain TCP, or TLS (mutual TLS optional) through the one TLS
//! module, `sluice-tls`, whose certificates are re-read on SIGHUP like every listener's.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite, ReadHalf, WriteHalf};
use tokio::net::TcpStream;

pub trait AsyncStream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> AsyncStream for T {}

pub type BoxStream = Box<dyn AsyncStream>;

pub fn split_stream(s: BoxStream) -> (ReadHalf<BoxStream>, WriteHalf<BoxStream>) {
    tokio::io::split(s)
}

/// Dials peers.
#[derive(Clone)]
pub struct Connector {
    tls: Option<Arc<sluice_tls::ClientTls>>,
}

impl Connector {
    pub fn new(tls: Option<&sluice_tls::TlsConfig>) -> Result<Connector, String> {
        let tls = match tls {
            Some(t) => Some(
                sluice_tls::ClientTls::new(t, "cluster (dialling peers)").map_err(|e| format!("cluster.tls: {e}"))?,
            ),
            None => None,
        };
        Ok(Connector { tls })
    }

    /// Connects to `host:port` (a name is resolved by the system resolver).
    pub async fn connect(&self, address: &str) -> Result<BoxStream, String> {
        let tcp = TcpStream::connect(address).await.map_err(|e| format!("connecting to {address}: {e}"))?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            None => Ok(Box::new(tcp)),
            Some(tls) => {
                let host = address.rsplit_once(':').map(|(h, _)| h).unwrap_or(address);
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let stream = tls.connect(host, tcp).await.map_err(|e| {
                    // A node without `cluster.tls` reads the TLS hello as a bad frame and
                    // closes: all this side sees is the connection going away.
                    let hint = match e.kind() {
                        std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset => {
                            " (a peer without `cluster.tls` closes a TLS handshake so: its log says whether it has none)"
                        }
                        _ => "",
                    };
                    format!("TLS handshake with {address}: {}{hint}", sluice_tls::describe_handshake_error(&e))
                })?;
                Ok(Box::new(stream))
            }
        }
    }
}

/// Accepts peers.
#[derive(Clone)]
pub struct Acceptor {
    tls: Option<Arc<sluice_tls::ServerTls>>,
}

impl Acceptor {
    pub fn new(tls: Option<&sluice_tls::TlsConfig>) -> Result<Acceptor, String> {
        let tls = match tls {
            Some(t) => Some(
                sluice_tls::ServerTls::new(t, "cluster (accepting peers)").map_err(|e| format!("cluster.tls: {e}"))?,
            ),
            None => None,
        };
        Ok(Acceptor { tls })
    }

    /// Whether peers must speak TLS here.
    pub fn has_tls(&self) -> bool {
        self.tls.is_some()
    }

    pub async fn accept(&self, tcp: TcpStream) -> Result<BoxStream, String> {
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            None => Ok(Box::new(tcp)),
            Some(tls) => {
                let stream = tls
                    .accept(tcp)
                    .await
                    .map_err(|e| format!("TLS handshake: {}", sluice_tls::describe_handshake_error(&e)))?;
                Ok(Box::new(stream))
            }
        }
    }
}
