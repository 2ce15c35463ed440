//! Handshakes over real TCP sockets on 127.0.0.1.

use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;

use super::{cause, client_echo, connector_from, exchange, exchange_with, serve_once};
use crate::testing::CertSet;
use crate::{ClientAuth, TlsConfig, TlsVersion, describe_handshake_error};

fn server_only(certs: &CertSet, name: &str) -> TlsConfig {
    TlsConfig { cert: Some(certs.cert(name)), key: Some(certs.key(name)), ..TlsConfig::default() }
}

fn verifying_client(certs: &CertSet) -> TlsConfig {
    TlsConfig { ca: Some(certs.ca_cert.clone()), ..TlsConfig::default() }
}

#[tokio::test]
async fn echo_over_tls_to_an_ip_address_and_a_dns_name() {
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &["node-1"]);
    for host in ["127.0.0.1", "localhost", "node-1"] {
        let (server, client) = exchange(&server_only(&certs, "node-1"), &verifying_client(&certs), host).await;
        let served = server.unwrap();
        assert_eq!(served.line, "hello over tls\n");
        assert_eq!(served.client, None, "no client certificate was asked for");
        let (echo, server_name) = client.unwrap();
        assert_eq!(echo, "hello over tls\n");
        assert_eq!(server_name.as_deref(), Some("node-1"));
    }
}

#[tokio::test]
async fn mutual_tls_accepts_a_client_certificate_from_the_ca() {
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &["server", "client"]);
    let server = TlsConfig { client_auth: Some(ClientAuth::Required), ..certs.tls("server") };
    let (served, client) = exchange(&server, &certs.tls("client"), "127.0.0.1").await;
    let served = served.unwrap();
    assert_eq!(served.client.as_deref(), Some("client"));
    assert_eq!(client.unwrap().1.as_deref(), Some("server"));
    // `ca` alone makes client certificates required.
    assert_eq!(certs.tls("server").effective_client_auth(), ClientAuth::Required);
    let (served, _) = exchange(&certs.tls("server"), &certs.tls("client"), "localhost").await;
    assert_eq!(served.unwrap().client.as_deref(), Some("client"));
}

#[tokio::test]
async fn mutual_tls_refuses_a_client_without_a_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &["server"]);
    let (server, client) = exchange(&certs.tls("server"), &verifying_client(&certs), "127.0.0.1").await;
    assert_eq!(cause("server", server), "the peer sent no client certificate but one is required");
    let said = cause("client", client);
    assert!(said.starts_with("the peer requires a client certificate and none was sent"), "{said}");
}

#[tokio::test]
async fn mutual_tls_refuses_a_client_certificate_from_another_ca() {
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &["server"]);
    let other = CertSet::generate_other_ca(dir.path(), &["client"]);
    let client = TlsConfig { ca: Some(certs.ca_cert.clone()), ..other.tls("client") };
    let (server, client) = exchange(&certs.tls("server"), &client, "127.0.0.1").await;
    assert_eq!(cause("server", server), "the peer's certificate is not signed by the configured CA (UnknownIssuer)");
    let said = cause("client", client);
    assert!(said.starts_with("the peer refused our certificate"), "{said}");
}

#[tokio::test]
async fn optional_client_auth_takes_a_client_with_or_without_a_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &["server", "client"]);
    let other = CertSet::generate_other_ca(dir.path(), &["client"]);
    let server = TlsConfig { client_auth: Some(ClientAuth::Optional), ..certs.tls("server") };
    let (served, _) = exchange(&server, &verifying_client(&certs), "127.0.0.1").await;
    assert_eq!(served.unwrap().client, None);
    let (served, _) = exchange(&server, &certs.tls("client"), "127.0.0.1").await;
    assert_eq!(served.unwrap().client.as_deref(), Some("client"));
    // A certificate that is sent must still chain to `ca`.
    let rogue = TlsConfig { ca: Some(certs.ca_cert.clone()), ..other.tls("client") };
    let (served, _) = exchange(&server, &rogue, "127.0.0.1").await;
    assert!(cause("server", served).contains("UnknownIssuer"));
}

#[tokio::test]
async fn client_refuses_a_server_certificate_from_another_ca() {
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &[]);
    let other = CertSet::generate_other_ca(dir.path(), &["server"]);
    let (server, client) = exchange(&server_only(&other, "server"), &verifying_client(&certs), "127.0.0.1").await;
    assert_eq!(cause("client", client), "the peer's certificate is not signed by the configured CA (UnknownIssuer)");
    let said = cause("server", server);
    assert!(said.starts_with("the peer refused our certificate"), "{said}");
}

#[tokio::test]
async fn verify_false_accepts_a_server_from_another_ca() {
    let dir = tempfile::tempdir().unwrap();
    let other = CertSet::generate_other_ca(dir.path(), &["server"]);
    let client = TlsConfig { verify: false, ..TlsConfig::default() };
    let (server, client) = exchange(&server_only(&other, "server"), &client, "some.other.name").await;
    server.unwrap();
    assert_eq!(client.unwrap().1.as_deref(), Some("server"));
}

#[tokio::test]
async fn server_name_mismatch_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &["node-1"]);
    let client = TlsConfig { server_name: Some("node-2".into()), ..verifying_client(&certs) };
    let (server, client) = exchange(&server_only(&certs, "node-1"), &client, "127.0.0.1").await;
    let said = cause("client", client);
    assert!(said.starts_with("certificate name mismatch: expected node-2, the certificate is for node-1"), "{said}");
    assert!(cause("server", server).starts_with("the peer refused our certificate"));
    // Without `server_name`, the host dialled is the name checked: an IP address the
    // certificate does not carry is refused too.
    let (_, client) = exchange(&server_only(&certs, "node-1"), &verifying_client(&certs), "127.0.0.2").await;
    let said = cause("client", client);
    assert!(said.starts_with("certificate name mismatch: expected 127.0.0.2"), "{said}");
    // And `server_name` wins over the host when it matches.
    let client = TlsConfig { server_name: Some("node-1".into()), ..verifying_client(&certs) };
    let (_, client) = exchange(&server_only(&certs, "node-1"), &client, "elsewhere.example").await;
    client.unwrap();
}

#[tokio::test]
async fn min_version_1_3_refuses_a_tls_1_2_only_client() {
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &["server"]);
    let server = TlsConfig { min_version: TlsVersion::V1_3, ..server_only(&certs, "server") };
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(crate::load::certificates("ca", "CA bundle", &certs.ca_cert).unwrap());
    let tls12_only = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let (addr, task) = serve_once(server.acceptor().unwrap()).await;
    let (server_end, client_end) = exchange_with(task, &connector_from(tls12_only.clone()), "127.0.0.1", addr).await;
    let said = cause("server", server_end);
    assert!(said.contains("min_version"), "{said}");
    let said = cause("client", client_end);
    assert!(said.contains("min_version"), "{said}");
    // The same client is served by the default, 1.2 and up.
    let (addr, task) = serve_once(server_only(&certs, "server").acceptor().unwrap()).await;
    let (server_end, client_end) = exchange_with(task, &connector_from(tls12_only), "127.0.0.1", addr).await;
    server_end.unwrap();
    client_end.unwrap();
}

#[tokio::test]
async fn a_peer_that_does_not_speak_tls_is_named_on_both_ends() {
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &["server"]);
    // A plain-text client talking to a TLS server.
    let (addr, task) = serve_once(server_only(&certs, "server").acceptor().unwrap()).await;
    let mut plain = tokio::net::TcpStream::connect(addr).await.unwrap();
    plain.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let said = cause("server", task.await.unwrap());
    assert!(said.starts_with("the peer does not speak TLS"), "{said}");
    // A TLS client talking to a plain-text server.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let plain_server = tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        let _ = tcp.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n").await;
        let _ = tcp.shutdown().await;
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    });
    let connector = verifying_client(&certs).connector().unwrap();
    let err = client_echo(&connector, "127.0.0.1", addr).await.unwrap_err();
    let said = describe_handshake_error(&err);
    assert!(said.starts_with("the peer does not speak TLS"), "{said}");
    plain_server.await.unwrap();
}

/// A client that only writes learns of a refused certificate from `confirm_accepted`, not by
/// losing its writes; an accepted one once the window has passed in silence.
#[tokio::test]
async fn confirm_accepted_gives_the_servers_verdict_on_a_tls13_client_certificate() {
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &["server", "client"]);
    let other = CertSet::generate_other_ca(dir.path(), &["client"]);
    let acceptor = certs.tls("server").acceptor().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(mut tls) = acceptor.accept(tcp).await {
                    let _ = tokio::io::copy(&mut tls, &mut tokio::io::sink()).await;
                }
            });
        }
    });
    let confirm = |client: TlsConfig| async move {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        // The client's side of a TLS 1.3 handshake succeeds whatever the server thinks of it.
        let mut tls = client.connector().unwrap().connect("localhost", tcp).await.expect("the client's handshake");
        assert_eq!(tls.get_ref().1.protocol_version(), Some(rustls::ProtocolVersion::TLSv1_3));
        crate::confirm_accepted(&mut tls, Duration::from_secs(2)).await
    };

    confirm(certs.tls("client")).await.expect("a certificate from the CA is accepted");

    let said = cause("client without a certificate", confirm(verifying_client(&certs)).await);
    assert!(said.starts_with("the peer requires a client certificate and none was sent"), "{said}");

    let verdict = confirm(TlsConfig { ca: Some(certs.ca_cert.clone()), ..other.tls("client") }).await;
    let said = cause("client with a certificate from another CA", verdict);
    assert!(said.starts_with("the peer refused our certificate"), "{said}");
}

/// A server sends its client nothing after the handshake (no session tickets): a client that
/// only writes and closes without reading leaves nothing unread, so its close is no reset.
#[tokio::test]
async fn the_server_sends_nothing_after_the_handshake() {
    use std::time::Duration;
    use tokio::io::AsyncReadExt;
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &["server", "client"]);
    let acceptor = certs.tls("server").acceptor().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let mut tls = acceptor.accept(tcp).await.unwrap();
        let mut got = Vec::new();
        let _ = tls.read_to_end(&mut got).await;
        got
    });
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut tls = certs.tls("client").connector().unwrap().connect("localhost", tcp).await.unwrap();
    assert_eq!(tls.get_ref().1.protocol_version(), Some(rustls::ProtocolVersion::TLSv1_3));
    tls.write_all(b"hello\n").await.unwrap();
    tls.flush().await.unwrap();
    // Whatever the server sends unasked arrives within this; it is read, and would be counted.
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_millis(500), tls.read(&mut buf)).await;
    assert!(read.is_err(), "the server sent something after the handshake: {read:?}");
    assert_eq!(tls.get_ref().1.tls13_tickets_received(), 0, "session tickets were sent");
    tls.shutdown().await.unwrap();
    assert_eq!(server.await.unwrap(), b"hello\n");
}
