//! TLS on every network path between two real `sluice` processes: a shipper sends over HTTPS
//! (with a client certificate and a bearer token) and over TLS TCP to a receiver that requires
//! client certificates; the receiver's certificate is rotated on disk and re-read on SIGHUP;
//! `sluice validate` names a key that is not its certificate's.

use crate::common;

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

#[test]
fn validate_warns_that_ca_without_client_auth_requires_client_certificates() {
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &["a"]);
    let config = |extra: &str| {
        format!(
            "pipelines:\n  main:\n    inputs: [{{type: tcp, address: '127.0.0.1:1', tls: {{cert: '{}', key: '{}', ca: '{}'{extra}}}}}]\n    outputs: [{{type: stdout}}]\n",
            p(&certs.cert("a")),
            p(&certs.key("a")),
            p(&certs.ca_cert)
        )
    };
    let (ok, text) = validate(&config(""));
    assert!(ok, "a warning does not fail validation: {text}");
    assert!(
        text.contains("warning: ")
            && text.contains("pipelines.main.inputs[0].tls")
            && text.contains("`ca` is set without `client_auth`"),
        "{text}"
    );
    for explicit in ["required", "optional", "none"] {
        let (ok, text) = validate(&config(&format!(", client_auth: {explicit}")));
        assert!(ok && !text.contains("warning"), "client_auth: {explicit}: {text}");
    }
}

/// Sends `rounds` connections of `lines` lines each over TLS 1.3 to each port, as a client
/// that only writes: Python's `ssl`, which closes without reading (and without
/// `close_notify`).
const WRITE_ONLY_CLIENT: &str = r#"
import socket, ssl, struct, sys
ca, rounds, lines = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ports = [int(p) for p in sys.argv[4:]]
context = ssl.create_default_context(cafile=ca)
context.minimum_version = ssl.TLSVersion.TLSv1_3
for port in ports:
    for r in range(rounds):
        s = context.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="localhost")
        for i in range(lines):
            s.sendall(("<13>Nov 26 07:16:16 host app: python port=%d round=%d line=%d\n" % (port, r, i)).encode())
        s.close()
"#;

/// Sends one line over TLS 1.3, waits for a line on stdin, and ends the connection with a
/// reset (`SO_LINGER` 0).
const RESETTING_CLIENT: &str = r#"
import socket, ssl, struct, sys
context = ssl.create_default_context(cafile=sys.argv[1])
s = context.wrap_socket(socket.create_connection(("127.0.0.1", int(sys.argv[2]))), server_hostname="localhost")
s.sendall(b"<13>Nov 26 07:16:16 host app: about to reset\n")
sys.stdin.readline()
s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
s.close()
"#;

/// The `tcp` and `syslog` inputs over TLS lose nothing of a client that only writes and closes
/// without reading: the server sends it nothing unasked (no session tickets), which the
/// client's kernel would answer with a reset that throws away what the input had not read yet.
/// Python's `ssl` closes without reading; `openssl s_client` is killed once it has written.
/// A connection that does end with a reset is logged at warn and counted.
#[test]
fn a_tls_client_that_only_writes_and_closes_loses_nothing() {
    let certs_dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(certs_dir.path(), &["receiver"]);
    let (tcp_port, syslog_port) = (free_port(), free_port());
    let tls = format!("{{cert: '{}', key: '{}'}}", p(&certs.cert("receiver")), p(&certs.key("receiver")));
    let mut receiver = Sluice::start(&format!(
        "api: {{address: '127.0.0.1:0'}}
pipelines:
  main:
    inputs:
      - {{type: tcp, address: '127.0.0.1:{tcp_port}', tls: {tls}}}
      - {{type: syslog, mode: tcp, address: '127.0.0.1:{syslog_port}', tls: {tls}}}
    outputs:
      - {{type: file, path: '{{dir}}/received.log'}}
"
    ));
    receiver.wait_port(tcp_port);
    receiver.wait_port(syslog_port);
    let api = receiver.api();
    let received = receiver.path("received.log");
    let count = |needle: &str| {
        std::fs::read_to_string(&received).unwrap_or_default().lines().filter(|l| l.contains(needle)).count()
    };

    let (rounds, per_round) = (5, 200);
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(WRITE_ONLY_CLIENT)
        .args([p(&certs.ca_cert), rounds.to_string(), per_round.to_string()])
        .args([tcp_port.to_string(), syslog_port.to_string()])
        .output()
        .expect("python3 runs the write-only client");
    assert!(out.status.success(), "the python client failed: {}", String::from_utf8_lossy(&out.stderr));
    for port in [tcp_port, syslog_port] {
        let needle = format!("python port={port} ");
        let want = rounds * per_round;
        let all = common::eventually(Duration::from_secs(20), || count(&needle) >= want);
        assert!(all, "port {port}: {} of {want} lines arrived:\n{}", count(&needle), receiver.log());
    }

    // `openssl s_client`, killed (not closed) once its lines are out: each round's lines are
    // one write, so the first of them arriving means all were sent.
    const SHORT_LINES: usize = 80;
    for port in [tcp_port, syslog_port] {
        for r in 0..rounds {
            let mut client = std::process::Command::new("openssl")
                .args(["s_client", "-quiet", "-tls1_3", "-connect", &format!("127.0.0.1:{port}")])
                .args(["-CAfile", &p(&certs.ca_cert), "-servername", "localhost"])
                .stdin(Stdio::piped())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("openssl s_client runs");
            // Less than PIPE_BUF, so s_client reads it all at once.
            let text: String =
                (0..SHORT_LINES).map(|i| format!("<13>x: s_client port={port} round={r} line={i}\n")).collect();
            assert!(text.len() < 4096);
            use std::io::Write;
            client.stdin.as_mut().unwrap().write_all(text.as_bytes()).unwrap();
            client.stdin.as_mut().unwrap().flush().unwrap();
            let first = format!("s_client port={port} round={r} line=0\"");
            let sent = common::eventually(Duration::from_secs(20), || count(&first) > 0);
            let _ = client.kill();
            let _ = client.wait();
            assert!(sent, "s_client's first line to port {port} never arrived:\n{}", receiver.log());
            let needle = format!("s_client port={port} round={r} ");
            let all = common::eventually(Duration::from_secs(20), || count(&needle) >= SHORT_LINES);
            assert!(all, "port {port} round {r}: {} of {SHORT_LINES} lines from s_client arrived", count(&needle));
        }
    }

    // Nothing twice, and the one reset connection logged and counted.
    let text = std::fs::read_to_string(&received).unwrap();
    let mut seen = std::collections::HashSet::new();
    for line in text.lines().filter(|l| l.contains("port=")) {
        let at = line.find("port=").unwrap();
        let key = (line.contains("s_client port="), line[at..].split('"').next().unwrap().to_string());
        assert!(seen.insert(key.clone()), "twice: {key:?}");
    }
    // A reset once its line is in: the connection's read fails with it.
    let mut resetting = std::process::Command::new("python3")
        .arg("-c")
        .arg(RESETTING_CLIENT)
        .args([p(&certs.ca_cert), tcp_port.to_string()])
        .stdin(Stdio::piped())
        .spawn()
        .expect("python3 runs the resetting client");
    wait_until("the resetting client's line", Duration::from_secs(20), || count("about to reset") > 0);
    {
        use std::io::Write;
        resetting.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    }
    assert!(resetting.wait().unwrap().success());
    let resets = || {
        let metrics = common::http(&api, "GET", "/metrics", &[], b"").1;
        metrics
            .lines()
            .filter(|l| l.starts_with("sluice_component_connections_reset_total{") && l.contains("type=\"tcp\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    assert!(common::eventually(Duration::from_secs(10), || resets() >= 1.0), "the reset is not counted");
    assert_eq!(resets(), 1.0, "no other connection ended with a reset");
    let (status, log) = receiver.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("tcp connection reset by the client"), "the reset is logged above debug:\n{log}");
    assert!(!log.contains("syslog connection reset"), "no syslog connection was reset:\n{log}");
}
