//! Handshakes over real sockets with certificates made for each test, and the errors of bad
//! files and settings.

mod files;
mod handshake;
mod reload;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::{TlsConfig, TlsConnector, describe_handshake_error, peer_certificate_subject};

/// What the server end saw: the line it echoed and the name in the client's certificate.
#[derive(Debug)]
struct Served {
    line: String,
    client: Option<String>,
}

/// Accepts one connection on 127.0.0.1, does the TLS handshake and echoes one line.
async fn serve_once(acceptor: tokio_rustls::TlsAcceptor) -> (SocketAddr, JoinHandle<io::Result<Served>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await?;
        let tls = acceptor.accept(tcp).await?;
        let client = peer_certificate_subject(tls.get_ref().1);
        let line = echo_line(tls).await?;
        Ok(Served { line, client })
    });
    (addr, task)
}

async fn echo_line<S: AsyncRead + AsyncWrite + Unpin>(stream: S) -> io::Result<String> {
    let mut stream = BufReader::new(stream);
    let mut line = String::new();
    stream.read_line(&mut line).await?;
    stream.get_mut().write_all(line.as_bytes()).await?;
    stream.get_mut().shutdown().await?;
    Ok(line)
}

/// Dials `addr`, does the handshake naming `host`, sends one line and reads the echo. Returns
/// the echo and the name in the server's certificate.
async fn client_echo(connector: &TlsConnector, host: &str, addr: SocketAddr) -> io::Result<(String, Option<String>)> {
    let tcp = TcpStream::connect(addr).await?;
    let tls = connector.connect(host, tcp).await?;
    let server = peer_certificate_subject(tls.get_ref().1);
    let mut tls = BufReader::new(tls);
    tls.get_mut().write_all(b"hello over tls\n").await?;
    tls.get_mut().flush().await?;
    let mut echo = String::new();
    tls.read_line(&mut echo).await?;
    if echo.is_empty() {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "no echo"));
    }
    Ok((echo, server))
}

/// One exchange between `server` and `client`: both ends' outcomes.
async fn exchange(
    server: &TlsConfig,
    client: &TlsConfig,
    host: &str,
) -> (io::Result<Served>, io::Result<(String, Option<String>)>) {
    let (addr, task) = serve_once(server.acceptor().unwrap()).await;
    let connector = client.connector().unwrap();
    exchange_with(task, &connector, host, addr).await
}

async fn exchange_with(
    task: JoinHandle<io::Result<Served>>,
    connector: &TlsConnector,
    host: &str,
    addr: SocketAddr,
) -> (io::Result<Served>, io::Result<(String, Option<String>)>) {
    let client = tokio::time::timeout(std::time::Duration::from_secs(10), client_echo(connector, host, addr))
        .await
        .expect("the client finishes");
    let server =
        tokio::time::timeout(std::time::Duration::from_secs(10), task).await.expect("the server finishes").unwrap();
    (server, client)
}

/// The readable cause of a failed end; panics if it did not fail.
fn cause<T: std::fmt::Debug>(end: &str, r: io::Result<T>) -> String {
    match r {
        Ok(v) => panic!("the {end} should have failed, got {v:?}"),
        Err(e) => describe_handshake_error(&e),
    }
}

fn connector_from(config: rustls::ClientConfig) -> TlsConnector {
    TlsConnector::from_config(Arc::new(config), None)
}
