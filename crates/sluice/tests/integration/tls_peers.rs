//! Every TLS end of `sluice` against a real peer that is not Sluice: Debian's `openssl s_client`
//! and `openssl s_server`, and `curl` with client certificates.
//!
//! - `tcp` input with mutual TLS: `openssl s_client` with a certificate from the configured CA
//!   gets its lines in; one with a certificate from another CA, or with none, is refused and the
//!   log names the peer and the cause; plain text to the TLS port is answered by a log line
//!   (`does not speak TLS`) and a closed connection within seconds, not a hang.
//! - `http` input with mutual TLS and basic authentication: `curl` with the client certificate
//!   and the password gets 200 and its events arrive; a wrong password gets 401; no client
//!   certificate fails the handshake; plain `http://` to the HTTPS port is refused and logged.
//! - `syslog` input (`mode: tcp`) with TLS: RFC 5424 messages sent by `openssl s_client`, newline
//!   framed and octet counted (RFC 5425), arrive parsed, with the client certificate's subject.
//! - `tcp` output with TLS to `openssl s_server -Verify 1` (which prints what it receives): the
//!   events arrive; without a client certificate (which the server refuses only after the
//!   output's side of the TLS 1.3 handshake is over) and against a server certificate from
//!   another CA, the output logs the cause and keeps retrying, delivering nothing and counting
//!   nothing delivered; `verify: false` connects to the latter anyway, with its warning.
//! - `http` output with TLS to `openssl s_server` as the HTTPS server: no mode of `s_server`
//!   answers a POST (`-www`, `-WWW` and `-HTTP` serve GET only), so the server is `s_server`'s
//!   plain mode, which prints the decrypted request, and the test types the HTTP answer into its
//!   standard input. The request, its headers and its events are checked at the server, and
//!   the node exits 0 only once the answer acknowledged them. A server certificate from another
//!   CA is refused with a log line naming the cause.
//!
//! The `beats` input's TLS is checked against a real go-lumber client in the `beats` module.
//!
//! `openssl` (Debian package `openssl`) and `curl` (package `curl`) must be installed: a test
//! that needs one fails, naming the package, when it is missing.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::{Sluice, free_port, get_json, wait_until};
use sluice_tls::testing::CertSet;

/// The path of `program`, looked up in `PATH` and the system directories; fails the test,
/// naming the Debian package to install, when it is not there.
fn require(program: &str, package: &str) -> PathBuf {
    let path = std::env::var("PATH").unwrap_or_default();
    let dirs = path.split(':').map(PathBuf::from).chain(["/usr/bin", "/bin"].map(PathBuf::from));
    for dir in dirs {
        let candidate = dir.join(program);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!(
        "`{program}` is not installed, and this test needs it as a real TLS peer: install Debian's package \
         `{package}` (apt-get install -y --no-install-recommends {package})"
    );
}

fn openssl() -> PathBuf {
    require("openssl", "openssl")
}

fn curl() -> PathBuf {
    require("curl", "curl")
}

fn p(path: &Path) -> String {
    path.display().to_string()
}

/// The JSON lines of a file output, the last one only once it is complete.
fn lines(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let complete = text.rfind('\n').map_or("", |end| &text[..=end]);
    complete.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

fn messages(path: &Path) -> Vec<String> {
    lines(path).iter().filter_map(|e| e["message"].as_str().map(str::to_string)).collect()
}

/// The first line of `log` holding every one of `needles`.
fn log_line(log: &str, needles: &[&str]) -> Option<String> {
    log.lines().find(|l| needles.iter().all(|n| l.contains(n))).map(str::to_string)
}

/// Waits until the node logs a line holding every one of `needles`, and returns it.
fn wait_line(node: &mut Sluice, needles: &[&str], timeout: Duration) -> String {
    let started = Instant::now();
    loop {
        if let Some(line) = log_line(&node.log(), needles) {
            return line;
        }
        if let Ok(Some(status)) = node.child.try_wait() {
            panic!("sluice exited ({status}) before logging a line with {needles:?}:\n{}", node.log());
        }
        assert!(
            started.elapsed() < timeout,
            "sluice logged no line with {needles:?} within {timeout:?}:\n{}",
            node.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A figure of the first component of `kind` (`input`, `output`) in the node's `/stats`.
fn component_figure(api: &str, kind: &str, figure: &str) -> u64 {
    let stats = get_json(api, "/stats");
    let components = stats["pipelines"]["main"]["components"].as_array().cloned().unwrap_or_default();
    let component = components.iter().find(|c| c["kind"] == kind).unwrap_or_else(|| panic!("no {kind} in {stats}"));
    component[figure].as_u64().unwrap_or_else(|| panic!("no `{figure}` figure in {component}"))
}

/// What a finished client run gave: its exit status (`None`: killed at the timeout), its
/// output, and how long it took.
struct Ran {
    status: Option<ExitStatus>,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl Ran {
    fn succeeded(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

/// Runs `program` with `args`, `input` on its standard input (then closed), for at most
/// `timeout` (then it is killed).
fn run(program: &Path, args: &[String], input: &[u8], timeout: Duration) -> Ran {
    let started = Instant::now();
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()));
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut out = Vec::new();
            let _ = r.read_to_end(&mut out);
            String::from_utf8_lossy(&out).into_owned()
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = started.elapsed();
    let _ = writer.join();
    Ran { status, stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap(), took }
}

/// `openssl s_client` to `127.0.0.1:port` with `extra` arguments (a certificate and key, or
/// none), verifying the server against `ca`; sends `input` and closes when it ends.
fn s_client(port: u16, ca: &Path, extra: &[String], input: &str) -> Ran {
    let mut args: Vec<String> =
        ["s_client", "-connect", &format!("127.0.0.1:{port}"), "-servername", "localhost"].map(String::from).to_vec();
    args.extend(["-CAfile".to_string(), p(ca), "-verify_return_error".into()]);
    args.extend(extra.iter().cloned());
    // `-quiet` alone implies `-ign_eof` (it would wait for the server forever once its input
    // ends); `-no_ign_eof` after it closes the session at the end of the input.
    args.extend(["-quiet".to_string(), "-no_ign_eof".into()]);
    run(&openssl(), &args, input.as_bytes(), Duration::from_secs(15))
}

/// `-cert` and `-key` arguments for `name`'s certificate in `certs`.
fn cert_args(certs: &CertSet, name: &str) -> Vec<String> {
    vec!["-cert".into(), p(&certs.cert(name)), "-key".into(), p(&certs.key(name))]
}

/// `openssl s_server` on a free port with `name`'s certificate from `certs`, requiring a client
/// certificate from `client_ca` (`-Verify 1`). What it receives, decrypted, goes to a file;
/// what is written to its standard input goes to the client. Killed when dropped.
struct SServer {
    child: Child,
    stdin: ChildStdin,
    port: u16,
    received: PathBuf,
    errors: PathBuf,
    _dir: tempfile::TempDir,
}

impl SServer {
    fn start(certs: &CertSet, name: &str, client_ca: &Path) -> SServer {
        let dir = tempfile::tempdir().unwrap();
        let (received, errors) = (dir.path().join("received"), dir.path().join("errors"));
        let port = free_port();
        let mut child = Command::new(openssl())
            .args(["s_server", "-accept", &port.to_string()])
            .args(["-cert", &p(&certs.cert(name)), "-key", &p(&certs.key(name))])
            .args(["-CAfile", &p(client_ca), "-Verify", "1", "-quiet"])
            // Its standard input stays open: at its end s_server drops each client unread.
            .stdin(Stdio::piped())
            .stdout(std::fs::File::create(&received).unwrap())
            .stderr(std::fs::File::create(&errors).unwrap())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let server = SServer { child, stdin, port, received, errors, _dir: dir };
        // Up once it accepts: a bare connection, closed at once, costs s_server one failed
        // handshake and it goes on accepting.
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "openssl s_server did not listen:\n{}",
                server.errors()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        server
    }

    /// Everything the server received from its clients, decrypted.
    fn received(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.received).unwrap_or_default()).into_owned()
    }

    fn errors(&self) -> String {
        std::fs::read_to_string(&self.errors).unwrap_or_default()
    }

    /// Sends `bytes` to the client connected now.
    fn answer(&mut self, bytes: &[u8]) {
        self.stdin.write_all(bytes).unwrap();
        self.stdin.flush().unwrap();
    }
}

impl Drop for SServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A node with one input and a file output (`out.log`), its monitoring API on a free port.
fn start_node(input: &str, processors: &str) -> (Sluice, String) {
    let mut node = Sluice::start(&format!(
        "api: {{address: '127.0.0.1:0'}}
pipelines:
  main:
    inputs:
      - {input}
    processors: [{processors}]
    outputs:
      - {{type: file, path: '{{dir}}/out.log'}}
"
    ));
    let api = node.api();
    (node, api)
}

/// A server `tls:` section for `name` from `certs`, requiring client certificates from it.
fn server_tls(certs: &CertSet, name: &str) -> String {
    format!(
        "{{cert: '{}', key: '{}', ca: '{}', client_auth: required}}",
        p(&certs.cert(name)),
        p(&certs.key(name)),
        p(&certs.ca_cert)
    )
}

#[test]
fn tcp_input_takes_lines_from_openssl_s_client_and_refuses_strangers_and_plain_text_with_a_reason() {
    openssl();
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &["sluice", "shipper"]);
    let other = CertSet::generate_other_ca(dir.path(), &["shipper"]);
    let port = free_port();
    let (mut node, api) =
        start_node(&format!("{{type: tcp, address: '127.0.0.1:{port}', tls: {}}}", server_tls(&certs, "sluice")), "");
    node.wait_port(port);
    let out = node.path("out.log");

    // A client certificate from the configured CA: the lines arrive.
    let ran = s_client(port, &certs.ca_cert, &cert_args(&certs, "shipper"), "good 1\ngood 2\ngood 3\n");
    assert!(ran.succeeded(), "s_client with the right certificate failed: {}", ran.stderr);
    wait_until("the three lines sent by s_client", Duration::from_secs(10), || messages(&out).len() >= 3);
    assert_eq!(messages(&out), ["good 1", "good 2", "good 3"]);

    // A client certificate from another CA: refused, and the log names the peer and the cause.
    let ran = s_client(port, &certs.ca_cert, &cert_args(&other, "shipper"), "stranger 1\n");
    let line = wait_line(
        &mut node,
        &["tcp input closed a connection", "not signed by the configured CA"],
        Duration::from_secs(10),
    );
    assert!(line.contains("TLS handshake failed") && line.contains("peer=127.0.0.1:"), "{line}");
    eprintln!("another CA: s_client said {:?}; sluice logged: {line}", ran.stderr.lines().last());

    // No client certificate at all.
    let ran = s_client(port, &certs.ca_cert, &[], "anonymous 1\n");
    let line =
        wait_line(&mut node, &["tcp input closed a connection", "sent no client certificate"], Duration::from_secs(10));
    assert!(line.contains("peer=127.0.0.1:"), "{line}");
    eprintln!("no certificate: s_client said {:?}; sluice logged: {line}", ran.stderr.lines().last());

    // Plain text to the TLS port: a clear line and a closed connection within seconds.
    let mut plain = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let me = plain.local_addr().unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let started = Instant::now();
    plain.write_all(b"plain text line\n").unwrap();
    let mut answer = Vec::new();
    match plain.read_to_end(&mut answer) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the TLS port kept a plain-text client hanging ({e}) after {:?}", started.elapsed()),
    }
    assert!(started.elapsed() < Duration::from_secs(5), "closed only after {:?}", started.elapsed());
    let line = wait_line(&mut node, &["does not speak TLS", &format!("peer={me}")], Duration::from_secs(5));
    assert!(line.contains("tcp input closed a connection"), "{line}");

    // None of the refused clients' lines got in; each refusal is counted.
    assert_eq!(messages(&out), ["good 1", "good 2", "good 3"]);
    assert!(component_figure(&api, "input", "refused") >= 3, "{}", get_json(&api, "/stats"));
    let (status, log) = node.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn http_input_takes_curl_with_a_client_certificate_and_a_password_and_refuses_the_rest() {
    let curl = curl();
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &["sluice", "shipper"]);
    let port = free_port();
    let (mut node, api) = start_node(
        &format!(
            "{{type: http, address: '127.0.0.1:{port}', auth: {{basic: {{user: shipper, password: s3cret}}}}, tls: {}}}",
            server_tls(&certs, "sluice")
        ),
        "",
    );
    node.wait_port(port);
    let out = node.path("out.log");
    let events = dir.path().join("events.ndjson");
    std::fs::write(&events, "{\"n\":1,\"via\":\"curl\"}\n{\"n\":2,\"via\":\"curl\"}\n{\"n\":3,\"via\":\"curl\"}\n")
        .unwrap();
    let url = format!("https://localhost:{port}/");
    let post = |extra: &[&str], url: &str| {
        let mut args: Vec<String> =
            ["-sS", "--max-time", "15", "-o", "-", "-w", "\n%{http_code}", "--data-binary"].map(String::from).to_vec();
        args.push(format!("@{}", p(&events)));
        args.extend(extra.iter().map(|a| a.to_string()));
        args.push(url.to_string());
        let ran = run(&curl, &args, b"", Duration::from_secs(20));
        let code = ran.stdout.lines().last().unwrap_or("").to_string();
        (ran, code)
    };
    let (ca, cert, key) = (p(&certs.ca_cert), p(&certs.cert("shipper")), p(&certs.key("shipper")));
    let with_cert = ["--cacert", &ca, "--cert", &cert, "--key", &key];

    // The right certificate and password: 200 once the events are handled, and they arrived.
    let (ran, code) = post(&[&with_cert[..], &["-u", "shipper:s3cret"]].concat(), &url);
    assert_eq!(code, "200", "curl: {} {}", ran.stdout, ran.stderr);
    assert!(ran.stdout.contains("\"accepted\":3"), "{}", ran.stdout);
    let ns: Vec<u64> = lines(&out).iter().filter_map(|e| e["n"].as_u64()).collect();
    assert_eq!(ns, [1, 2, 3], "the events are in the output once 200 is answered");

    // The right certificate, a wrong password: 401, nothing more arrives.
    let (ran, code) = post(&[&with_cert[..], &["-u", "shipper:wrong"]].concat(), &url);
    assert_eq!(code, "401", "curl: {} {}", ran.stdout, ran.stderr);

    // No client certificate: the handshake fails (curl gets the server's alert), no HTTP answer.
    let (ran, code) = post(&["--cacert", &ca, "-u", "shipper:s3cret"], &url);
    assert!(!ran.succeeded() && code == "000", "curl without a certificate got in: {} {}", ran.stdout, ran.stderr);
    assert!(ran.stderr.to_ascii_lowercase().contains("certificate"), "curl's reason: {}", ran.stderr);
    let line = wait_line(
        &mut node,
        &["http input closed a connection", "sent no client certificate"],
        Duration::from_secs(10),
    );
    assert!(line.contains("peer=127.0.0.1:"), "{line}");
    eprintln!("no certificate: curl said {}; sluice logged: {line}", ran.stderr.trim());

    // Plain HTTP to the HTTPS port: refused at once and logged.
    let (ran, code) = post(&["-u", "shipper:s3cret"], &format!("http://localhost:{port}/"));
    assert!(!ran.succeeded() && code == "000", "plain HTTP got an answer: {} {}", ran.stdout, ran.stderr);
    assert!(ran.took < Duration::from_secs(5), "plain HTTP was answered only after {:?}", ran.took);
    let line = wait_line(&mut node, &["http input closed a connection", "does not speak TLS"], Duration::from_secs(5));
    assert!(line.contains("peer=127.0.0.1:"), "{line}");
    eprintln!("plain HTTP: curl said {}; sluice logged: {line}", ran.stderr.trim());

    assert_eq!(lines(&out).len(), 3, "only the authorised request's events arrived");
    assert!(component_figure(&api, "input", "refused") >= 2, "{}", get_json(&api, "/stats"));
    let (status, log) = node.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn syslog_input_parses_rfc5424_sent_by_openssl_s_client_over_tls_in_both_framings() {
    openssl();
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &["sluice", "relay"]);
    let port = free_port();
    let (mut node, _api) = start_node(
        &format!("{{type: syslog, mode: tcp, address: '127.0.0.1:{port}', tls: {}}}", server_tls(&certs, "sluice")),
        "{type: mutate, copy: {/@metadata/tls_peer/subject: /client}}",
    );
    node.wait_port(port);
    let out = node.path("out.log");

    // Newline framing, as rsyslog's default TCP framing.
    let newline = "<34>1 2003-10-11T22:14:15.003Z mymachine.example.com su - ID47 - 'su root' failed for lonvick\n\
                   <165>1 2003-08-24T05:14:15.000003-07:00 192.0.2.1 myproc 8710 - - %% It's time to make the do-nothing logs.\n";
    let ran = s_client(port, &certs.ca_cert, &cert_args(&certs, "relay"), newline);
    assert!(ran.succeeded(), "s_client failed: {}", ran.stderr);
    // Octet counting, the framing of RFC 5425 (syslog over TLS).
    let counted: String = [
        "<13>1 2026-11-26T07:16:16Z host-a app-a 42 - [exampleSDID@32473 iut=\"3\" eventSource=\"Application\"] octet counted",
        "<86>1 2026-11-26T07:16:17.5+01:00 host-b sshd - AUTH - accepted \u{e9}",
    ]
    .iter()
    .map(|m| format!("{} {m}", m.len()))
    .collect();
    let ran = s_client(port, &certs.ca_cert, &cert_args(&certs, "relay"), &counted);
    assert!(ran.succeeded(), "s_client failed: {}", ran.stderr);

    wait_until("four syslog events", Duration::from_secs(10), || lines(&out).len() >= 4);
    let events = lines(&out);
    assert_eq!(events.len(), 4, "{events:#?}");
    let by_message = |m: &str| {
        events
            .iter()
            .find(|e| e["message"] == m)
            .unwrap_or_else(|| panic!("no event with message {m:?} in {events:#?}"))
    };
    let su = by_message("'su root' failed for lonvick");
    assert_eq!(su["hostname"], "mymachine.example.com");
    assert_eq!(su["appname"], "su");
    assert_eq!(su["msgid"], "ID47");
    assert_eq!((su["facility"].as_str(), su["severity"].as_str()), (Some("auth"), Some("crit")));
    assert_eq!((su["facility_code"].as_u64(), su["severity_code"].as_u64()), (Some(4), Some(2)));
    assert_eq!(su["version"], 1);
    assert!(su.get("procid").is_none(), "a nil PROCID is left out: {su}");
    assert!(su["@timestamp"].as_str().unwrap_or("").starts_with("2003-10-11T22:14:15.003"), "{su}");
    assert_eq!(su["client"], "relay", "the client certificate's subject: {su}");

    let proc_ = by_message("%% It's time to make the do-nothing logs.");
    assert_eq!((proc_["facility"].as_str(), proc_["severity"].as_str()), (Some("local4"), Some("notice")));
    assert_eq!((proc_["hostname"].as_str(), proc_["procid"].as_u64()), (Some("192.0.2.1"), Some(8710)));

    let sd = by_message("octet counted");
    assert_eq!(sd["structured_data"]["exampleSDID@32473"]["iut"], "3", "{sd}");
    assert_eq!(sd["structured_data"]["exampleSDID@32473"]["eventSource"], "Application", "{sd}");
    assert_eq!((sd["appname"].as_str(), sd["procid"].as_u64()), (Some("app-a"), Some(42)));
    assert_eq!((sd["facility"].as_str(), sd["severity"].as_str()), (Some("user"), Some("notice")));

    let ssh = by_message("accepted \u{e9}");
    assert_eq!((ssh["facility"].as_str(), ssh["severity"].as_str()), (Some("authpriv"), Some("info")));
    assert_eq!((ssh["appname"].as_str(), ssh["msgid"].as_str()), (Some("sshd"), Some("AUTH")));
    assert_eq!(ssh["client"], "relay");
    assert!(events.iter().all(|e| e.get("tags").is_none()), "nothing failed to parse: {events:#?}");
    let (status, log) = node.stop();
    assert!(status.success(), "{log}");
}

/// `count` events `{"n": i, "to": "s_server"}` as JSON lines, in a file for a node's stdin.
fn events_file(dir: &Path, count: u64) -> PathBuf {
    let path = dir.join(format!("events-{count}.ndjson"));
    let text: String = (0..count).map(|i| format!("{{\"n\":{i},\"to\":\"s_server\"}}\n")).collect();
    std::fs::write(&path, text).unwrap();
    path
}

/// The `n` of every JSON line `{"n": ..}` in what a server received.
fn numbers_received(text: &str) -> Vec<u64> {
    text.lines()
        .filter(|l| l.starts_with('{'))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?["n"].as_u64())
        .collect()
}

/// A shipper reading `events` on stdin with one output, its monitoring API on a free port.
fn start_shipper(events: &Path, output: &str) -> Sluice {
    Sluice::start_with(
        &format!(
            "api: {{address: '127.0.0.1:0'}}
pipelines:
  main:
    inputs: [{{type: stdin, codec: json_lines}}]
    outputs:
      - {output}
"
        ),
        Stdio::from(std::fs::File::open(events).unwrap()),
    )
}

/// A shipper with one `kind` output (`settings`, and `tls` inside braces) that retries fast, its
/// standard input kept open so that it keeps running rather than draining, one event written to
/// it; and its monitoring API.
fn retrying_shipper(kind: &str, settings: &str, tls: &str) -> (Sluice, String) {
    let mut shipper = Sluice::start_with(
        &format!(
            "api: {{address: '127.0.0.1:0'}}
pipelines:
  main:
    inputs: [{{type: stdin, codec: json_lines}}]
    outputs:
      - {{type: {kind}, {settings}, retry: {{initial_backoff: 50ms, max_backoff: 300ms}}, tls: {{{tls}}}}}
"
        ),
        Stdio::piped(),
    );
    shipper.child.stdin.as_mut().unwrap().write_all(b"{\"n\":100}\n").unwrap();
    let api = shipper.api();
    (shipper, api)
}

#[test]
fn tcp_output_delivers_to_openssl_s_server_and_refuses_a_server_from_another_ca_unless_verify_is_off() {
    openssl();
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &["collector", "shipper"]);
    let other = CertSet::generate_other_ca(dir.path(), &["collector"]);
    let client = format!(
        "ca: '{}', cert: '{}', key: '{}'",
        p(&certs.ca_cert),
        p(&certs.cert("shipper")),
        p(&certs.key("shipper"))
    );
    let events = events_file(dir.path(), 20);

    // A collector with a certificate from the CA the output trusts, requiring the output's own.
    let server = SServer::start(&certs, "collector", &certs.ca_cert);
    let mut shipper =
        start_shipper(&events, &format!("{{type: tcp, address: 'localhost:{}', tls: {{{client}}}}}", server.port));
    let (status, log) = shipper.wait(Duration::from_secs(30));
    assert!(status.success(), "{log}");
    wait_until("20 events at openssl s_server", Duration::from_secs(10), || {
        numbers_received(&server.received()).len() >= 20
    });
    assert_eq!(numbers_received(&server.received()), (0..20).collect::<Vec<_>>(), "{}", server.received());

    // No client certificate: s_server refuses it after the output's side of the TLS 1.3
    // handshake is over. The output must see that refusal, not write into the dropped session
    // and count its batches delivered.
    let anonymous = format!("ca: '{}'", p(&certs.ca_cert));
    let (mut shipper, api) = retrying_shipper("tcp", &format!("address: 'localhost:{}'", server.port), &anonymous);
    let line =
        wait_line(&mut shipper, &["tcp output failed", "TLS handshake with localhost:"], Duration::from_secs(10));
    assert!(line.contains("the peer requires a client certificate and none was sent"), "{line}");
    wait_until("several retries", Duration::from_secs(10), || component_figure(&api, "output", "retries") >= 3);
    assert!(shipper.child.try_wait().unwrap().is_none(), "the node gave up:\n{}", shipper.log());
    assert!(!numbers_received(&server.received()).contains(&100), "{}", server.received());
    eprintln!("no client certificate: sluice logged: {line}");
    drop(shipper);
    drop(server);

    // A collector whose certificate comes from another CA: a clear handshake error, and the
    // output retries (the node neither delivers nor dies).
    let stranger = SServer::start(&other, "collector", &certs.ca_cert);
    let (mut shipper, api) = retrying_shipper("tcp", &format!("address: 'localhost:{}'", stranger.port), &client);
    let line =
        wait_line(&mut shipper, &["tcp output failed", "TLS handshake with localhost:"], Duration::from_secs(10));
    assert!(line.contains("the peer's certificate is not signed by the configured CA (UnknownIssuer)"), "{line}");
    wait_until("several retries", Duration::from_secs(10), || component_figure(&api, "output", "retries") >= 3);
    assert!(shipper.child.try_wait().unwrap().is_none(), "the node gave up:\n{}", shipper.log());
    assert!(numbers_received(&stranger.received()).is_empty(), "{}", stranger.received());
    eprintln!("another CA: sluice logged: {line}");
    drop(shipper);

    // `verify: false` accepts that server all the same, and says it is unsafe.
    let unverified =
        format!("verify: false, cert: '{}', key: '{}'", p(&certs.cert("shipper")), p(&certs.key("shipper")));
    let mut shipper = start_shipper(
        &events,
        &format!("{{type: tcp, address: 'localhost:{}', tls: {{{unverified}}}}}", stranger.port),
    );
    let (status, log) = shipper.wait(Duration::from_secs(30));
    assert!(status.success(), "{log}");
    assert!(log_line(&log, &["WARN", "verify: false", "not checked"]).is_some(), "the warning:\n{log}");
    wait_until("20 events at the unverified server", Duration::from_secs(10), || {
        numbers_received(&stranger.received()).len() >= 20
    });
    assert_eq!(numbers_received(&stranger.received()), (0..20).collect::<Vec<_>>());
}

#[test]
fn http_output_posts_over_tls_to_openssl_s_server_and_refuses_a_server_from_another_ca() {
    openssl();
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &["collector", "shipper"]);
    let other = CertSet::generate_other_ca(dir.path(), &["collector"]);
    let client = format!(
        "ca: '{}', cert: '{}', key: '{}'",
        p(&certs.ca_cert),
        p(&certs.cert("shipper")),
        p(&certs.key("shipper"))
    );
    let events = events_file(dir.path(), 5);

    // openssl s_server prints the decrypted request; each complete request is answered 200 by
    // writing the response to its standard input. The node exits 0 only once every event was
    // acknowledged, that is once the answers came back over the TLS session.
    let mut server = SServer::start(&certs, "collector", &certs.ca_cert);
    let mut shipper = start_shipper(
        &events,
        &format!(
            "{{type: http, url: 'https://localhost:{}/ingest', headers: {{X-Source: sluice}}, tls: {{{client}}}}}",
            server.port
        ),
    );
    let started = Instant::now();
    let mut answered = 0;
    let status = loop {
        if let Some(status) = shipper.child.try_wait().unwrap() {
            break status;
        }
        let received = server.received();
        // A request is complete once its body is in: NDJSON, which ends with an object's line.
        let requests = received.matches("POST /ingest HTTP/1.1").count();
        if requests > answered && received.ends_with("}\n") {
            server.answer(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}");
            answered += 1;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the node did not finish; the server received:\n{received}\nthe node logged:\n{}",
            shipper.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{}", shipper.log());
    let received = server.received();
    let head = received.to_ascii_lowercase();
    assert!(head.starts_with("post /ingest http/1.1\r\n"), "{received}");
    assert!(
        head.contains("content-type: application/x-ndjson\r\n") && head.contains("x-source: sluice\r\n"),
        "{received}"
    );
    assert!(head.contains(&format!("host: localhost:{}\r\n", server.port)), "{received}");
    assert_eq!(numbers_received(&received), (0..5).collect::<Vec<_>>(), "{received}");
    drop(server);

    // A server certificate from another CA: refused, logged with the cause, retried.
    let stranger = SServer::start(&other, "collector", &certs.ca_cert);
    let (mut shipper, api) = retrying_shipper("http", &format!("url: 'https://localhost:{}/'", stranger.port), &client);
    let line = wait_line(&mut shipper, &["WARN", "https://localhost:", "UnknownIssuer"], Duration::from_secs(10));
    assert!(line.contains("certificate"), "{line}");
    wait_until("several retries", Duration::from_secs(10), || component_figure(&api, "output", "retries") >= 3);
    assert!(shipper.child.try_wait().unwrap().is_none(), "the node gave up:\n{}", shipper.log());
    assert!(!stranger.received().contains("POST"), "{}", stranger.received());
    eprintln!("another CA: sluice logged: {line}");
}
