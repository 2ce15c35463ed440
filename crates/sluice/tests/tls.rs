//! TLS on every network path between two real `sluice` processes: a shipper sends over HTTPS
//! (with a client certificate and a bearer token) and over TLS TCP to a receiver that requires
//! client certificates; the receiver's certificate is rotated on disk and re-read on SIGHUP;
//! `sluice validate` names a key that is not its certificate's.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::{Sluice, free_port, validate, wait_until};
use sluice_tls::TlsConfig;
use sluice_tls::testing::CertSet;

fn p(path: &Path) -> String {
    path.display().to_string()
}

fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// A TLS handshake and one line to `port`, trusting `ca`; `Err` with the reason on failure.
fn send_line(port: u16, client: &TlsConfig, line: &str) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.map_err(|e| e.to_string())?;
        let connector = client.connector().map_err(|e| e.to_string())?;
        let mut tls =
            connector.connect("localhost", tcp).await.map_err(|e| sluice_tls::describe_handshake_error(&e))?;
        tls.write_all(format!("{line}\n").as_bytes()).await.map_err(|e| e.to_string())?;
        tls.flush().await.map_err(|e| e.to_string())?;
        // With TLS 1.3 a refused client certificate shows at the first read.
        let mut buf = [0u8; 1];
        if let Ok(Err(e)) = tokio::time::timeout(Duration::from_millis(300), tls.read(&mut buf)).await {
            return Err(sluice_tls::describe_handshake_error(&e));
        }
        tls.shutdown().await.map_err(|e| e.to_string())
    })
}

#[test]
fn https_and_tls_tcp_between_two_nodes_with_client_certificates_and_a_rotation_on_sighup() {
    let certs_dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(certs_dir.path(), &["receiver", "shipper"]);
    let other = CertSet::generate_other_ca(certs_dir.path(), &["receiver", "shipper"]);
    let live = certs_dir.path().join("live");
    std::fs::create_dir(&live).unwrap();
    std::fs::copy(certs.cert("receiver"), live.join("receiver.crt")).unwrap();
    std::fs::copy(certs.key("receiver"), live.join("receiver.key")).unwrap();
    let (http_port, tcp_port) = (free_port(), free_port());
    let server_tls = format!(
        "{{cert: '{}', key: '{}', ca: '{}', client_auth: required}}",
        p(&live.join("receiver.crt")),
        p(&live.join("receiver.key")),
        p(&certs.ca_cert)
    );
    let mut receiver = Sluice::start(&format!(
        "pipelines:
  main:
    inputs:
      - {{type: http, address: '127.0.0.1:{http_port}', auth: {{bearer: t0ken}}, tls: {server_tls}}}
      - {{type: tcp, address: '127.0.0.1:{tcp_port}', codec: json_lines, tls: {server_tls}}}
    outputs:
      - {{type: file, path: '{{dir}}/received.log'}}
"
    ));
    receiver.wait_port(http_port);
    receiver.wait_port(tcp_port);

    let client_tls = format!(
        "{{ca: '{}', cert: '{}', key: '{}'}}",
        p(&certs.ca_cert),
        p(&certs.cert("shipper")),
        p(&certs.key("shipper"))
    );
    let events: String = (0..500).map(|i| format!("{{\"n\":{i}}}\n")).collect();
    let stdin_file = certs_dir.path().join("events.ndjson");
    std::fs::write(&stdin_file, &events).unwrap();
    let mut shipper = Sluice::start_with(
        &format!(
            "pipelines:
  main:
    inputs: [{{type: stdin, codec: json_lines}}]
    outputs:
      - {{type: http, url: 'https://localhost:{http_port}/', auth_token: t0ken, batch_max_events: 100, tls: {client_tls}}}
      - {{type: tcp, address: 'localhost:{tcp_port}', tls: {client_tls}}}
"
        ),
        Stdio::from(std::fs::File::open(&stdin_file).unwrap()),
    );
    let (status, log) = shipper.wait(Duration::from_secs(60));
    assert!(status.success(), "the shipper failed:\n{log}");
    let received = receiver.path("received.log");
    wait_until("1,000 events at the receiver", Duration::from_secs(20), || lines(&received).len() >= 1000);
    let mut seen = std::collections::BTreeMap::<u64, u32>::new();
    for e in lines(&received) {
        *seen.entry(e["n"].as_u64().unwrap()).or_default() += 1;
    }
    assert_eq!(seen.len(), 500);
    assert!(seen.values().all(|&c| c == 2), "each event once over HTTPS and once over TLS TCP");

    // Refused: a client certificate from another CA, and no client certificate at all.
    let trusting_first = TlsConfig { ca: Some(certs.ca_cert.clone()), ..TlsConfig::default() };
    let mut stranger = other.tls("shipper");
    stranger.ca = Some(certs.ca_cert.clone());
    assert!(send_line(tcp_port, &stranger, "{\"n\":-1}").is_err(), "a certificate from another CA is refused");
    assert!(send_line(tcp_port, &trusting_first, "{\"n\":-2}").is_err(), "no client certificate is refused");
    let log = receiver.log();
    assert!(log.contains("TLS handshake failed"), "refusals are logged:\n{log}");

    // Rotation: the receiver's certificate on disk is replaced by one from the other CA; after
    // SIGHUP, clients trusting the other CA get in and those trusting the first do not.
    std::fs::copy(other.cert("receiver"), live.join("receiver.crt")).unwrap();
    std::fs::copy(other.key("receiver"), live.join("receiver.key")).unwrap();
    let shipper_cert = certs.tls("shipper");
    send_line(tcp_port, &shipper_cert, "{\"n\":1000}").expect("before SIGHUP the first certificate is still served");
    receiver.signal("HUP");
    receiver.wait_log("TLS certificates re-read", Duration::from_secs(10));
    let mut rotated = certs.tls("shipper");
    rotated.ca = Some(other.ca_cert.clone());
    let refused = send_line(tcp_port, &shipper_cert, "{\"n\":1001}").unwrap_err();
    assert!(refused.contains("certificate"), "{refused}");
    send_line(tcp_port, &rotated, "{\"n\":1002}").expect("the rotated certificate is served after SIGHUP");
    wait_until("the events sent around the rotation", Duration::from_secs(10), || {
        let ns: Vec<u64> = lines(&received).iter().filter_map(|e| e["n"].as_u64()).collect();
        ns.contains(&1000) && ns.contains(&1002)
    });
    let ns: Vec<u64> = lines(&received).iter().filter_map(|e| e["n"].as_u64()).collect();
    assert!(!ns.contains(&1001));
    let (status, log) = receiver.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn validate_names_a_missing_file_and_a_key_that_is_not_the_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &["a", "b"]);
    let (ok, text) = validate(&format!(
        "pipelines:\n  main:\n    inputs: [{{type: tcp, address: '127.0.0.1:1', tls: {{cert: '{}', key: '{}'}}}}]\n    outputs: [{{type: stdout}}]\n",
        p(&certs.cert("a")),
        p(&certs.key("b"))
    ));
    assert!(!ok, "{text}");
    assert!(text.contains("pipelines.main.inputs[0].tls.") && text.contains("does not match key"), "{text}");
    let (ok, text) = validate(&format!(
        "pipelines:\n  main:\n    inputs: [{{type: stdin}}]\n    outputs: [{{type: http, url: 'https://localhost:1/', tls: {{ca: '{}'}}}}]\n",
        p(&dir.path().join("nope.crt"))
    ));
    assert!(!ok, "{text}");
    assert!(text.contains("pipelines.main.outputs[0].tls.ca") && text.contains("nope.crt"), "{text}");
}
