//! Certificates re-read by `reload_all`: a rotated certificate is served at the next handshake,
//! and a rotation that leaves unusable files keeps the certificate in force.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use tokio::net::TcpListener;

use super::{client_echo, echo_line};
use crate::testing::CertSet;
use crate::{ServerStream, ServerTls, TlsConfig, reload_all};

/// Serves echo over `tls` on 127.0.0.1 until the test ends.
async fn serve(tls: Arc<ServerTls>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let tls = tls.clone();
            tokio::spawn(async move {
                if let Ok(stream) = ServerStream::accept(Some(&tls), tcp).await {
                    let _ = echo_line(stream).await;
                }
            });
        }
    });
    addr
}

fn install(from: &CertSet, name: &str, live: &Path) {
    std::fs::copy(from.cert(name), live.join("server.crt")).unwrap();
    std::fs::copy(from.key(name), live.join("server.key")).unwrap();
}

fn trusting(certs: &CertSet) -> crate::TlsConnector {
    TlsConfig { ca: Some(certs.ca_cert.clone()), ..TlsConfig::default() }.connector().unwrap()
}

#[tokio::test]
async fn a_rotated_certificate_is_served_after_reload_and_a_broken_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let first = CertSet::generate(dir.path(), &["node-1"]);
    let second = CertSet::generate_other_ca(dir.path(), &["node-1"]);
    let live = dir.path().join("live");
    std::fs::create_dir(&live).unwrap();
    install(&first, "node-1", &live);
    let config =
        TlsConfig { cert: Some(live.join("server.crt")), key: Some(live.join("server.key")), ..TlsConfig::default() };
    let tls = ServerTls::new(&config, "test listener").unwrap();
    let addr = serve(tls.clone()).await;
    client_echo(&trusting(&first), "127.0.0.1", addr).await.expect("the first certificate is served");

    // Rotated on disk: still the old one until a reload.
    install(&second, "node-1", &live);
    client_echo(&trusting(&first), "127.0.0.1", addr).await.expect("no reload yet");
    let summary = reload_all();
    assert!(summary.reloaded >= 1, "{summary:?}");
    client_echo(&trusting(&second), "127.0.0.1", addr).await.expect("the rotated certificate is served");
    assert!(client_echo(&trusting(&first), "127.0.0.1", addr).await.is_err(), "the old CA no longer verifies");

    // A key that is not the certificate's: the reload fails, naming the files, and the
    // certificate in force stays.
    std::fs::copy(first.key("node-1"), live.join("server.key")).unwrap();
    let err = tls.reload().unwrap_err().to_string();
    assert!(err.contains("does not match key") && err.contains("server.key"), "{err}");
    assert!(reload_all().failed >= 1);
    client_echo(&trusting(&second), "127.0.0.1", addr).await.expect("the certificate in force is kept");
}

#[test]
fn a_dropped_listener_is_not_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &["node-1"]);
    let config = TlsConfig { cert: Some(certs.cert("node-1")), key: Some(certs.key("node-1")), ..TlsConfig::default() };
    let tls = ServerTls::new(&config, "short-lived").unwrap();
    std::fs::write(certs.key("node-1"), "not a key").unwrap();
    assert!(tls.reload().is_err());
    drop(tls);
    assert_eq!(crate::reload::live_count_for("short-lived"), 0, "a dropped listener is forgotten");
}
