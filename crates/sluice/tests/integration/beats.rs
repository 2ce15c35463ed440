//! The `beats` input against the client Beats use: `tests/beats-client` is a small Go program
//! on go-lumber's v2 client (what Filebeat's Logstash output is built on) that sends numbered
//! events in windows, sends a window again on a new connection until it is ACKed whole, and
//! records which events were ACKed. These tests build it with `go build` (Go is required: the
//! tests fail, naming what is missing, without it), run it against the real `sluice` binary,
//! and check the file output against what the client was told.

use crate::common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::*;

/// The client, built once per test run into the cargo target directory.
fn client_binary() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/beats-client");
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("beats-client");
        let built = Command::new("go").args(["build", "-o"]).arg(&out).arg(".").current_dir(&source).output();
        match built {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
                "the beats tests need Go (1.21 or newer, https://go.dev/dl/) to build their client, a go-lumber \
                 program in crates/sluice/tests/beats-client: `go` is not on PATH"
            ),
            Err(e) => panic!("cannot run `go build` for the beats test client: {e}"),
            Ok(o) if !o.status.success() => panic!(
                "`go build` of the beats test client failed (it fetches github.com/elastic/go-lumber v0.1.0 \
                 through the Go module proxy the first time):\n{}",
                String::from_utf8_lossy(&o.stderr)
            ),
            Ok(_) => out,
        }
    })
}

/// Runs the client to its end with `args`; its output.
fn run_client(args: &[String]) -> Output {
    let started = Instant::now();
    let out = Command::new(client_binary()).args(args).stdin(Stdio::null()).output().unwrap();
    eprintln!(
        "beats-client {} -> {} in {:?}: {}{}",
        args.join(" "),
        out.status,
        started.elapsed(),
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).lines().take(5).collect::<Vec<_>>().join(" | ")
    );
    out
}

fn args(port: u16, first: u64, n: u64, window: u64, compress: u32, inflight: u32, acked: &Path) -> Vec<String> {
    [
        format!("-addr=127.0.0.1:{port}"),
        format!("-first={first}"),
        format!("-n={n}"),
        format!("-window={window}"),
        format!("-compress={compress}"),
        format!("-inflight={inflight}"),
        format!("-acked={}", acked.display()),
        "-timeout=10s".to_string(),
    ]
    .into()
}

/// The ids of the windows the client recorded as ACKed (`first last` per line).
fn acked_ids(path: &Path) -> Vec<u64> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut ids = Vec::new();
    for line in text.lines() {
        let (a, b) = line.split_once(' ').unwrap_or_else(|| panic!("bad line `{line}` in {}", path.display()));
        ids.extend(a.parse::<u64>().unwrap()..=b.parse::<u64>().unwrap());
    }
    ids
}

/// Each delivered event's id and how often it was delivered; every line is checked whole.
fn delivered(path: &Path) -> BTreeMap<u64, u32> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut seen = BTreeMap::new();
    for line in text.lines() {
        let e: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|err| panic!("{err}: {line}"));
        let id = e["id"].as_u64().unwrap_or_else(|| panic!("no id: {line}"));
        assert_eq!(e["message"].as_str().unwrap().trim_end_matches('x'), format!("beats test event {id}"), "{line}");
        assert_eq!(e["log"]["offset"].as_u64(), Some(id * 100), "{line}");
        assert_eq!(e["log"]["file"]["path"], "/var/log/beats-test.log", "{line}");
        assert_eq!((&e["host"]["name"], &e["agent"]["type"]), (&"beats-client-host".into(), &"filebeat".into()));
        assert_eq!(e["input"]["type"], "filestream", "{line}");
        let ts = e["@timestamp"].as_str().unwrap_or_else(|| panic!("no @timestamp: {line}"));
        assert!(ts.len() == 24 && ts.ends_with('Z'), "{line}");
        assert!(e.get("@metadata").is_none(), "@metadata is not written out: {line}");
        assert!(e.get("tags").is_none(), "{line}");
        *seen.entry(id).or_insert(0) += 1;
    }
    seen
}

/// The value of the first series of `name` in a /metrics text.
fn series(text: &str, name: &str) -> f64 {
    let line = text
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with('{'))
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

fn config(port: u16, queue: &str, tls: &str) -> String {
    format!(
        "data_dir: '{{dir}}/data'
api: {{address: '127.0.0.1:0'}}
pipelines:
  beats:
    workers: 2
    batch: {{size: 1000, delay: 2ms}}
    queue: {queue}
    inputs: [{{type: beats, address: '127.0.0.1:{port}'{tls}}}]
    outputs: [{{type: file, path: '{{dir}}/out.log'}}]
"
    )
}

#[test]
fn every_event_of_the_real_client_arrives_once_whatever_the_windows() {
    client_binary();
    let port = free_port();
    let mut s = Sluice::start(&config(port, "{type: memory}", ""));
    let api = s.api();
    s.wait_port(port);
    // Four clients at once, 20,000 events: windows of several sizes, compressed or not,
    // one at a time or pipelined.
    let runs: [(u64, u64, u32, u32); 4] =
        [(0, 100, 0, 1), (5000, 1000, 3, 1), (10_000, 37, 1, 4), (15_000, 2048, 0, 2)];
    let clients: Vec<_> = runs
        .iter()
        .map(|&(first, window, compress, inflight)| {
            let a = args(port, first, 5000, window, compress, inflight, &s.path(&format!("acked-{first}")));
            std::thread::spawn(move || run_client(&a))
        })
        .collect();
    for c in clients {
        let out = c.join().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains("events=5000 resent=0"));
    }
    // A window is ACKed only once the file output has it: everything is there already.
    let seen = delivered(&s.path("out.log"));
    let acked: Vec<u64> = runs.iter().flat_map(|r| acked_ids(&s.path(&format!("acked-{}", r.0)))).collect();
    assert_eq!(acked.len(), 20_000);
    assert_eq!(seen.len(), 20_000, "every event delivered");
    assert!(seen.keys().copied().eq(0..20_000));
    assert!(seen.values().all(|&n| n == 1), "no duplicates");
    let (_, metrics) = http(&api, "GET", "/metrics", &[], b"");
    let windows = runs.iter().map(|r| 5000u64.div_ceil(r.1)).sum::<u64>() as f64;
    assert_eq!(series(&metrics, "sluice_component_beats_windows_total"), windows);
    assert!(series(&metrics, "sluice_component_beats_acks_total") >= windows);
    assert_eq!(series(&metrics, "sluice_component_beats_protocol_errors_total"), 0.0);
    // The four clients, and the probe that waited for the port.
    assert_eq!(series(&metrics, "sluice_component_beats_connections_total"), 5.0);
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    assert_eq!(summary(&log, "beats")["in"], 20_000);
}

#[test]
fn tls_clients_need_a_certificate_from_the_ca_when_client_auth_is_required() {
    client_binary();
    let dir = tempfile::tempdir().unwrap();
    let certs = sluice_tls::testing::CertSet::generate(dir.path(), &["server", "client"]);
    let rogue = sluice_tls::testing::CertSet::generate_other_ca(dir.path(), &["client"]);
    let port = free_port();
    let tls = format!(
        ", tls: {{cert: '{}', key: '{}', ca: '{}', client_auth: required}}",
        certs.cert("server").display(),
        certs.key("server").display(),
        certs.ca_cert.display()
    );
    let mut s = Sluice::start(&config(port, "{type: memory}", &tls));
    s.wait_port(port);
    let ca = format!("-ca={}", certs.ca_cert.display());
    let with = |cert: PathBuf, key: PathBuf| {
        [ca.clone(), format!("-cert={}", cert.display()), format!("-key={}", key.display())]
    };

    let mut good = args(port, 0, 3000, 500, 3, 2, &s.path("acked"));
    good.extend(with(certs.cert("client"), certs.key("client")));
    let out = run_client(&good);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(acked_ids(&s.path("acked")).len(), 3000);
    let seen = delivered(&s.path("out.log"));
    assert!(seen.len() == 3000 && seen.values().all(|&n| n == 1));

    // A certificate from another CA, and none at all: refused, nothing delivered.
    let mut rogue_args = args(port, 5000, 10, 5, 0, 1, &s.path("acked-rogue"));
    rogue_args.extend(with(rogue.cert("client"), rogue.key("client")));
    let mut anonymous = args(port, 6000, 10, 5, 0, 1, &s.path("acked-anonymous"));
    anonymous.push(ca.clone());
    for refused in [rogue_args, anonymous] {
        // With TLS 1.3 the client learns of it on its first read or write after the handshake.
        let out = run_client(&refused);
        assert!(!out.status.success(), "a client without a trusted certificate got through");
    }
    assert!(acked_ids(&s.path("acked-rogue")).is_empty() && acked_ids(&s.path("acked-anonymous")).is_empty());
    wait_until("the refusals in the log", Duration::from_secs(5), || {
        s.log()
            .lines()
            .filter(|l| l.contains("beats input closed a connection") && l.contains("peer=127.0.0.1:"))
            .count()
            >= 2
    });
    let log = s.log();
    let refusals: Vec<&str> = log.lines().filter(|l| l.contains("beats input closed a connection")).collect();
    assert!(refusals.iter().all(|l| l.contains("TLS handshake failed")), "{refusals:#?}");
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    assert_eq!(delivered(&s.path("out.log")).len(), 3000);
}

#[test]
fn sigkill_mid_stream_loses_no_acked_event_and_the_client_resends_the_rest() {
    client_binary();
    let port = free_port();
    let queue = "{type: persisted, shards: 2, sync: commit, segment_bytes: 1MiB, checkpoint_interval: 50ms}";
    let cfg = config(port, queue, "");
    let total = 20_000u64;
    let work = tempfile::tempdir().unwrap();
    let acked_path = work.path().join("acked");
    let mut a = args(port, 0, total, 250, 3, 2, &acked_path);
    a.push("-retry-for=60s".into());
    a.push("-pad=200".into());
    let mut s = Sluice::start(&cfg);
    s.wait_port(port);
    let client = std::thread::spawn(move || run_client(&a));
    // Two kills while the client is under way, each once some windows were ACKed.
    let mut dir;
    for round in 1..=2 {
        let before = acked_ids(&acked_path).len();
        wait_until("windows ACKed before the kill", Duration::from_secs(30), || {
            acked_ids(&acked_path).len() >= before + 2000
        });
        dir = s.kill_into_dir();
        eprintln!("kill {round}: {} events ACKed so far", acked_ids(&acked_path).len());
        std::thread::sleep(Duration::from_millis(300));
        s = Sluice::start_in(dir, &cfg, Stdio::null());
        s.wait_port(port);
    }
    let out = client.join().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let api = s.api();
    wait_until("the queue to empty", Duration::from_secs(30), || {
        get_json(&api, "/stats")["pipelines"]["beats"]["queue"]["bytes"].as_u64() == Some(0)
    });
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    let acked = acked_ids(&acked_path);
    let seen = delivered(&s.path("out.log"));
    let missing: Vec<u64> = acked.iter().copied().filter(|id| !seen.contains_key(id)).collect();
    let duplicates: u32 = seen.values().map(|n| n - 1).sum();
    eprintln!(
        "beats sigkill test: 2 kills, {} events ACKed, {} delivered, {duplicates} duplicates, {} missing; client: {}",
        acked.len(),
        seen.len(),
        missing.len(),
        stdout.trim()
    );
    assert_eq!(acked.len() as u64, total, "the client got every window ACKed in the end");
    assert!(missing.is_empty(), "ACKed events missing from the output: {:?}", &missing[..missing.len().min(20)]);
    assert!(seen.keys().all(|id| *id < total));
    assert!(
        stdout.contains("reconnects=") && !stdout.contains("resent=0"),
        "the kills made the client send again: {stdout}"
    );
}

/// Sends `bytes` on a fresh connection; the connection's local address, and whether the server
/// closed it within a few seconds.
fn hostile(port: u16, bytes: &[u8]) -> (String, bool) {
    let mut c = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let local = c.local_addr().unwrap().to_string();
    c.write_all(bytes).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut rest = Vec::new();
    let closed = match c.read_to_end(&mut rest) {
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    };
    (local, closed)
}

#[test]
fn hostile_windows_and_frames_close_the_connection_and_the_node_serves_the_next_client() {
    client_binary();
    let port = free_port();
    let mut s = Sluice::start(&config(port, "{type: memory}", ""));
    let api = s.api();
    s.wait_port(port);
    let window: &[u8] = &[b'2', b'W', 0x80, 0, 0, 0];
    let (peer, closed) = hostile(port, window);
    assert!(closed, "a window of 2^31 events was kept open");
    s.wait_log(
        &format!("closed the connection of {peer}: the client announced a window of 2147483648"),
        Duration::from_secs(5),
    );
    assert!(s.log().contains("max_window_size (65536)"));
    // A frame of 4 GiB, inside a sane window.
    let frame: &[u8] = &[b'2', b'W', 0, 0, 0, 1, b'2', b'J', 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff];
    let (peer, closed) = hostile(port, frame);
    assert!(closed, "a 4 GiB frame was kept open");
    s.wait_log(
        &format!("closed the connection of {peer}: the client announced a JSON data frame of 4294967295 bytes"),
        Duration::from_secs(5),
    );
    let (peer, closed) = hostile(port, b"1W\0\0\0\x01");
    assert!(closed);
    s.wait_log(
        &format!("closed the connection of {peer}: the client speaks Lumberjack protocol version 1"),
        Duration::from_secs(5),
    );
    // The node is up and serves the next client.
    let out = run_client(&args(port, 0, 500, 100, 3, 1, &s.path("acked")));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(delivered(&s.path("out.log")).len(), 500);
    let (_, metrics) = http(&api, "GET", "/metrics", &[], b"");
    assert_eq!(series(&metrics, "sluice_component_beats_protocol_errors_total"), 3.0);
    assert_eq!(series(&metrics, "sluice_component_beats_connections_open"), 0.0);
    let stats = get_json(&api, "/stats");
    let input = common::component(&stats, "beats", "type", "beats");
    assert!(!input.is_null(), "no beats component in {stats}");
    assert_eq!(input["state"]["beats_protocol_errors"], 3, "{input}");
    assert_eq!(input["refused"], 2, "the window and the frame past their limits: {input}");
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn validate_reads_the_tls_files_and_checks_the_limits() {
    let (ok, text) = validate(
        "pipelines:
  p:
    inputs: [{type: beats, address: '127.0.0.1:5044', tls: {cert: missing.crt, key: missing.key}}]
    outputs: [{type: stdout}]
",
    );
    assert!(!ok && text.contains("missing.crt") && text.contains("inputs[0].tls.cert"), "{text}");
    let (ok, text) = validate(
        "pipelines:
  p:
    inputs: [{type: beats, address: '127.0.0.1:5044', max_window_size: 0, keepalive_interval: 0s}]
    outputs: [{type: stdout}]
",
    );
    assert!(!ok && text.contains("max_window_size"), "{text}");
}

/// Clients started with [`spawn_client`]; killed if the test ends before they do.
struct Clients(Vec<std::process::Child>);

impl Drop for Clients {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts the client with `args` and hands it back running.
fn spawn_client(args: &[String]) -> std::process::Child {
    Command::new(client_binary())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The process's peak resident set size, in MiB (Linux).
fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
    kb.unwrap_or(0) >> 10
}

#[test]
fn big_compressed_windows_from_many_clients_fit_a_small_budget_and_other_inputs_are_served() {
    client_binary();
    let (port, http_port) = (free_port(), free_port());
    let budget = 16u64 << 20;
    // Eight clients, two pipelined windows each of 4096 events of about 900 bytes, each window
    // one compressed frame of about 3.7 MB inflated: about 60 MB in all, nearly four budgets.
    // One window's decoding fits the budget on its own; all of them at once do not.
    let mut s = Sluice::start(&format!(
        "data_dir: '{{dir}}/data'
api: {{address: '127.0.0.1:0'}}
memory: {{budget: 16MiB}}
pipelines:
  beats:
    workers: 2
    batch: {{size: 1000, delay: 2ms}}
    queue: {{type: memory}}
    inputs: [{{type: beats, address: '127.0.0.1:{port}'}}]
    outputs: [{{type: file, path: '{{dir}}/out.log'}}]
  other:
    inputs: [{{type: http, address: '127.0.0.1:{http_port}', request_timeout: 10s}}]
    outputs: [{{type: file, path: '{{dir}}/other.log'}}]
"
    ));
    let api = s.api();
    s.wait_port(port);
    s.wait_port(http_port);
    let (n_clients, per_client, window) = (8u64, 8192u64, 4096u64);
    let mut clients = Clients(
        (0..n_clients)
            .map(|i| {
                let mut a = args(port, i * per_client, per_client, window, 3, 2, &s.path(&format!("acked-{i}")));
                a.push("-pad=550".into());
                spawn_client(&a)
            })
            .collect(),
    );
    // While the windows arrive: the node's figures, and another input of the node posted to.
    let (mut peak_used, mut peak_waiting, mut posts) = (0u64, 0u64, 0);
    let started = Instant::now();
    let mut done = vec![false; clients.0.len()];
    while done.iter().any(|d| !d) {
        let (_, metrics) = http(&api, "GET", "/metrics", &[], b"");
        let (used, waiting) = (metric(&metrics, "sluice_memory_used_bytes"), metric(&metrics, "sluice_memory_waiting"));
        peak_used = peak_used.max(used as u64);
        peak_waiting = peak_waiting.max(waiting as u64);
        let figures = || {
            format!(
                "memory used {used} of {budget} bytes (peak {peak_used}), {waiting} waiting for it (peak {peak_waiting}), \
                 {} ACKs sent, peak RSS {} MiB",
                series(&metrics, "sluice_component_beats_acks_total"),
                peak_rss_mib(s.child.id())
            )
        };
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the beats clients were not all ACKed within 120 s: {}",
            figures()
        );
        if series(&metrics, "sluice_component_beats_windows_total") >= n_clients as f64 && posts < 5 {
            let body = format!("{{\"post\":{posts}}}");
            let (status, answer) = http(&format!("127.0.0.1:{http_port}"), "POST", "/", &[], body.as_bytes());
            assert_eq!(
                status,
                200,
                "the http input was not served while the beats windows were decoded: {answer}; {}",
                figures()
            );
            posts += 1;
        }
        for (c, d) in clients.0.iter_mut().zip(done.iter_mut()) {
            *d = *d || c.try_wait().unwrap().is_some();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for (i, c) in std::mem::take(&mut clients.0).into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "client {i}: {stdout} {}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains(&format!("events={per_client} resent=0")), "client {i}: {stdout}");
    }
    eprintln!(
        "beats budget test: {} events in {:?}, memory used peak {peak_used} of {budget} bytes ({:.2}), at most {peak_waiting} \
         waiting, peak RSS {} MiB, {posts} http posts served meanwhile",
        n_clients * per_client,
        started.elapsed(),
        peak_used as f64 / budget as f64,
        peak_rss_mib(s.child.id())
    );
    let acked: usize = (0..n_clients).map(|i| acked_ids(&s.path(&format!("acked-{i}"))).len()).sum();
    assert_eq!(acked as u64, n_clients * per_client, "every window ACKed");
    let seen = delivered(&s.path("out.log"));
    assert!(seen.keys().copied().eq(0..n_clients * per_client), "every event delivered: {} of them", seen.len());
    assert!(seen.values().all(|&n| n == 1), "no duplicates");
    assert!(posts > 0, "the http input was posted to while the windows were decoded");
    // Charges trued up past their estimate may go over a little; nothing holds and waits.
    assert!(peak_used <= budget + budget / 8, "memory used peaked at {peak_used} of {budget} bytes");
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    assert_eq!(std::fs::read_to_string(s.path("other.log")).unwrap().lines().count(), posts);
}

/// A connection from a socket whose receive buffer is `rcvbuf` bytes, for a client that never
/// reads.
fn connect_with_small_buffers(port: u16, rcvbuf: u32) -> TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
    let stream = rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(rcvbuf).unwrap();
        socket.set_send_buffer_size(64 << 10).unwrap();
        socket.connect(([127, 0, 0, 1], port).into()).await.unwrap()
    });
    let stream = stream.into_std().unwrap();
    stream.set_nonblocking(false).unwrap();
    stream
}

#[test]
fn a_client_that_never_reads_its_acks_makes_the_server_keep_few_windows_and_is_timed_out() {
    let port = free_port();
    let mut s = Sluice::start(&format!(
        "data_dir: '{{dir}}/data'
api: {{address: '127.0.0.1:0'}}
pipelines:
  beats:
    queue: {{type: memory}}
    inputs: [{{type: beats, address: '127.0.0.1:{port}', write_timeout: 3s}}]
    outputs: [{{type: blackhole}}]
"
    ));
    let api = s.api();
    s.wait_port(port);
    let mut c = connect_with_small_buffers(port, 4096);
    let peer = c.local_addr().unwrap().to_string();
    // Windows of one event each, as fast as the server takes them, and never an ACK read.
    let mut chunk = Vec::new();
    for _ in 0..10_000 {
        chunk.extend_from_slice(&[b'2', b'W', 0, 0, 0, 1, b'2', b'J', 0, 0, 0, 1, 0, 0, 0, 2, b'{', b'}']);
    }
    c.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    let most = 4_000_000 / 10_000;
    let mut sent = 0;
    while sent < most && c.write_all(&chunk).is_ok() {
        sent += 1;
    }
    // The server stopped reading (or is done with them all), and gives up on the client.
    wait_until("the write timeout", Duration::from_secs(60), || {
        let (_, metrics) = http(&api, "GET", "/metrics", &[], b"");
        series(&metrics, "sluice_component_beats_write_timeouts_total") >= 1.0
    });
    let (_, metrics) = http(&api, "GET", "/metrics", &[], b"");
    let windows = series(&metrics, "sluice_component_beats_windows_total") as u64;
    let acks = series(&metrics, "sluice_component_beats_acks_total") as u64;
    let stats = get_json(&api, "/stats");
    let input = common::component(&stats, "beats", "type", "beats");
    assert!(!input.is_null(), "no beats component in {stats}");
    eprintln!(
        "beats ACK-reading test: client sent {} windows, server opened {windows}, wrote {acks} ACKs, peak RSS {} MiB",
        sent * 10_000,
        peak_rss_mib(s.child.id())
    );
    assert!(
        windows - acks <= 256,
        "the server opened {windows} windows and wrote {acks} ACKs: {} kept for a client that reads none",
        windows - acks
    );
    assert_eq!(series(&metrics, "sluice_component_beats_write_timeouts_total"), 1.0);
    assert_eq!(input["state"]["beats_write_timeouts"], 1, "{input}");
    s.wait_log(
        &format!("beats input closed the connection of {peer}: the client did not read its ACKs"),
        Duration::from_secs(5),
    );
    assert_eq!(series(&metrics, "sluice_component_beats_connections_open"), 0.0);
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
}
