//! Cluster mode through the real binary: several `sluice` processes on loopback form a ring,
//! and every pipeline's events are forwarded, before its `aggregate` processor, to the node
//! that owns their `/user`. Each test sends JSON events with a few hundred distinct users and
//! reads the aggregates (`count` per user) the nodes wrote to their output files:
//!
//! - every user's aggregates come out on one node, and the counts add up to what was sent;
//! - a node killed with SIGKILL and started again loses no event its `http` input acknowledged;
//! - a hung peer (SIGSTOP): with `hold` the others push back and lose nothing once it returns;
//!   with `local` they mark it down and keep processing its keys themselves;
//! - mutual TLS between nodes, and a node whose certificate another CA signed is refused;
//! - DNS discovery from the hosts file, with a member leaving and coming back while traffic
//!   flows (root only).

use crate::common;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::*;

/// Distinct values of `/user` in every test.
const USERS: u64 = 500;

/// What one node is started with.
struct NodeSpec {
    /// The cluster address: `listen` and `advertise`.
    cluster: String,
    /// The `discovery:` mapping, inline.
    discovery: String,
    /// More lines of the `cluster:` section (each starting with two spaces).
    cluster_extra: String,
    /// The pipeline's `queue:` mapping, inline.
    queue: String,
    /// The pipeline's one input, inline.
    input: String,
    group_duration: String,
    /// The cluster's name when not the one derived from `discovery`.
    cluster_name: Option<String>,
}

/// A name of the test's own for its cluster, from its membership: tests run side by side, and a
/// port one test's node let go of may be taken by another test's node, which its peers must
/// refuse (HELLO checks the cluster name) rather than forward to.
fn cluster_name(discovery: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    discovery.hash(&mut h);
    format!("test-{:016x}", h.finish())
}

fn config(n: &NodeSpec) -> String {
    format!(
        "data_dir: '{{dir}}/data'
api: {{address: '127.0.0.1:0'}}
shutdown_timeout: 30s
cluster:
  listen: '{cluster}'
  advertise: '{cluster}'
  cluster_name: '{name}'
  discovery: {discovery}
{extra}
pipelines:
  web:
    workers: 2
    batch: {{size: 500, delay: 5ms}}
    queue: {queue}
    inputs: [{input}]
    processors:
      - {{type: aggregate, identification_keys: [/user], group_duration: {group}, action: count}}
    outputs: [{{type: file, path: '{{dir}}/agg.log'}}]
",
        cluster = n.cluster,
        name = n.cluster_name.clone().unwrap_or_else(|| cluster_name(&n.discovery)),
        discovery = n.discovery,
        extra = n.cluster_extra,
        queue = n.queue,
        input = n.input,
        group = n.group_duration,
    )
}

/// A running node: its process, its monitoring API and its input's port.
struct Node {
    s: Sluice,
    api: String,
    port: u16,
    cluster: String,
    config: String,
}

impl Node {
    fn start(config: String, port: u16, cluster: &str) -> Node {
        Node::start_in(tempfile::tempdir().unwrap(), config, port, cluster)
    }

    fn start_in(dir: tempfile::TempDir, config: String, port: u16, cluster: &str) -> Node {
        let mut s = Sluice::start_in(dir, &config, Stdio::null());
        let api = s.api();
        s.wait_port(port);
        Node { s, api, port, cluster: cluster.to_string(), config }
    }

    fn cluster_stats(&self) -> serde_json::Value {
        cluster_stats(&self.api)
    }

    /// Events the pipeline's inputs accepted.
    fn accepted(&self) -> u64 {
        accepted(&self.api, "web")
    }

    fn output(&self) -> std::path::PathBuf {
        self.s.path("agg.log")
    }

    fn output_len(&self) -> u64 {
        std::fs::metadata(self.output()).map(|m| m.len()).unwrap_or(0)
    }
}

fn total(nodes: &[&Node]) -> u64 {
    nodes.iter().map(|n| aggregate_counts(&n.output()).values().sum::<u64>()).sum()
}

/// SIGTERM to every node at once, then waits for each to drain; returns their logs.
fn stop_all(nodes: &mut [&mut Node]) -> Vec<String> {
    for n in nodes.iter() {
        n.s.signal("TERM");
    }
    nodes.iter_mut().map(|n| n.s.wait(Duration::from_secs(90)).1).collect()
}

fn event(n: u64, pad: usize) -> String {
    format!("{{\"user\":\"u{}\",\"n\":{n},\"pad\":\"{}\"}}\n", n % USERS, "x".repeat(pad))
}

/// Sends events `first..first + count` as JSON lines on one connection, then closes it.
fn send_tcp(port: u16, first: u64, count: u64, pad: usize) {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut buf = String::new();
    for n in first..first + count {
        buf.push_str(&event(n, pad));
        if buf.len() > 64 << 10 {
            conn.write_all(buf.as_bytes()).unwrap();
            buf.clear();
        }
    }
    conn.write_all(buf.as_bytes()).unwrap();
    conn.shutdown(std::net::Shutdown::Write).unwrap();
}

fn static_discovery(members: &[String]) -> String {
    let list: Vec<String> = members.iter().map(|m| format!("'{m}'")).collect();
    format!("{{static: [{}]}}", list.join(", "))
}

fn tcp_input(port: u16) -> String {
    format!("{{type: tcp, address: '127.0.0.1:{port}', codec: json_lines}}")
}

/// Cluster addresses on 127.0.0.1, one per node.
fn cluster_addresses(n: usize) -> Vec<String> {
    (0..n).map(|_| format!("127.0.0.1:{}", free_port())).collect()
}

/// Starts one node per cluster address, with `extra(i)` as more of node `i`'s `cluster:`
/// section and `input(port)` as its one input on a free port.
fn start_nodes(
    members: &[String],
    discovery: &str,
    extra: impl Fn(usize) -> String,
    queue: &str,
    group_duration: &str,
    input: fn(u16) -> String,
) -> Vec<Node> {
    let mut nodes = Vec::new();
    for (i, m) in members.iter().enumerate() {
        let port = free_port();
        let spec = NodeSpec {
            cluster: m.clone(),
            discovery: discovery.to_string(),
            cluster_extra: extra(i),
            queue: queue.to_string(),
            input: input(port),
            group_duration: group_duration.to_string(),
            cluster_name: None,
        };
        nodes.push(Node::start(config(&spec), port, m));
    }
    nodes
}

/// Starts `n` nodes on 127.0.0.1 with tcp inputs and a static membership.
fn start_static(n: usize, cluster_extra: &str, queue: &str, group_duration: &str) -> Vec<Node> {
    let members = cluster_addresses(n);
    start_nodes(&members, &static_discovery(&members), |_| cluster_extra.to_string(), queue, group_duration, tcp_input)
}

/// Every user's aggregates are on exactly one node; returns the sum of all counts.
fn assert_each_user_on_one_node(nodes: &[&Node]) -> u64 {
    let outputs: Vec<(String, std::path::PathBuf)> = nodes.iter().map(|n| (n.cluster.clone(), n.output())).collect();
    each_user_on_one_node(&outputs, USERS)
}

#[test]
fn three_nodes_aggregate_every_key_on_exactly_one_node() {
    let mut nodes = start_static(3, "  on_peer_failure: hold", "{type: memory}", "1s");
    const PER_CLIENT: u64 = 10_000;
    // Two clients per node, each with its own range of event numbers (and so every user).
    let mut clients = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        for j in 0..2u64 {
            let (port, first) = (n.port, (i as u64 * 2 + j) * PER_CLIENT);
            clients.push(std::thread::spawn(move || send_tcp(port, first, PER_CLIENT, 0)));
        }
    }
    for c in clients {
        c.join().unwrap();
    }
    let sent = PER_CLIENT * 6;
    let all: Vec<&Node> = nodes.iter().collect();
    assert!(
        eventually(Duration::from_secs(60), || all.iter().map(|n| n.accepted()).sum::<u64>() == sent),
        "the nodes' inputs did not accept all {sent} events"
    );
    // The groups conclude a second after they opened; then every forwarded batch is answered.
    // Stopping before that would leave batches in flight, which each node then handles itself.
    let settled = eventually(Duration::from_secs(120), || total(&all) >= sent);
    eprintln!("settled before shutdown: {settled} ({} of {sent} counted)", total(&all));
    for n in &nodes {
        let c = n.cluster_stats();
        eprintln!("{}: members={} events={}", n.cluster, c["members"], c["events"]);
        assert_eq!(c["members"].as_array().map(Vec::len), Some(3), "{c}");
        assert!(c["events"]["forwarded"].as_u64().unwrap() > 0, "{}: nothing forwarded: {c}", n.cluster);
        assert!(c["events"]["received"].as_u64().unwrap() > 0, "{}: nothing received: {c}", n.cluster);
    }
    let logs = stop_all(&mut nodes.iter_mut().collect::<Vec<_>>());
    for (n, log) in nodes.iter().zip(&logs) {
        let s = summary(log, "web");
        eprintln!("{}: {s:?}", n.cluster);
        for l in log.lines().filter(|l| l.contains("WARN") || l.contains("ERROR")) {
            eprintln!("  {l}");
        }
        assert!(s["forwarded"] > 0 && s["received"] > 0, "{}: summary {s:?}", n.cluster);
        assert_eq!(s["unfinished"], 0, "{}: {log}", n.cluster);
    }
    let all: Vec<&Node> = nodes.iter().collect();
    let sum = assert_each_user_on_one_node(&all);
    eprintln!("sent {sent}, counts summed {sum} (settled before shutdown: {settled})");
    assert_eq!(sum, sent, "the counts across nodes add up to the events sent");
}

fn http_input(port: u16) -> String {
    format!("{{type: http, address: '127.0.0.1:{port}'}}")
}

/// Events per request of the `http` clients.
const HTTP_BATCH: u64 = 100;

/// Posts batches of numbered events until told to stop or `limit` events were sent, going on
/// past refused connections (a node being restarted); returns the numbers answered 200.
fn http_client(port: u16, first: u64, limit: u64, stop: Arc<AtomicBool>) -> Vec<u64> {
    let addr = format!("127.0.0.1:{port}");
    let mut acked = Vec::new();
    let mut next = first;
    while !stop.load(Ordering::SeqCst) && next < first + limit {
        let body: String = (next..next + HTTP_BATCH).map(|n| event(n, 0)).collect();
        match try_http(&addr, "POST", "/", &[], body.as_bytes()) {
            // Paced, so that the load lasts through a kill and a restart.
            Ok((200, _)) => {
                acked.extend(next..next + HTTP_BATCH);
                std::thread::sleep(Duration::from_millis(10));
            }
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
        next += HTTP_BATCH;
    }
    acked
}

#[test]
fn a_killed_node_loses_no_acknowledged_event() {
    let extra = "  on_peer_failure: hold\n  forwarding: {retry_backoff: 50ms, retry_backoff_max: 500ms}";
    let queue = "{type: persisted, shards: 2, segment_bytes: 256KiB, max_bytes: 64MiB, checkpoint_interval: 50ms}";
    let members = cluster_addresses(3);
    let mut nodes =
        start_nodes(&members, &static_discovery(&members), |_| extra.to_string(), queue, "500ms", http_input);
    const LIMIT: u64 = 40_000;
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let (port, stop) = (n.port, stop.clone());
            std::thread::spawn(move || http_client(port, i as u64 * LIMIT, LIMIT, stop))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let victim = nodes.remove(1);
    let accepted: Vec<u64> = nodes.iter().map(Node::accepted).collect();
    eprintln!("SIGKILL {} after {} events accepted (the others: {accepted:?})", victim.cluster, victim.accepted());
    let Node { s, port, cluster, config, .. } = victim;
    let dir = s.kill_into_dir();
    std::thread::sleep(Duration::from_millis(500));
    nodes.insert(1, Node::start_in(dir, config, port, &cluster));
    std::thread::sleep(Duration::from_millis(2000));
    stop.store(true, Ordering::SeqCst);
    assert!(nodes[1].accepted() > 0, "the restarted node took no events");
    let acked: Vec<u64> = clients.into_iter().flat_map(|c| c.join().unwrap()).collect();
    let acknowledged = acked.len() as u64;
    assert!(acknowledged > 0, "no request was answered 200");
    let all: Vec<&Node> = nodes.iter().collect();
    let settled = eventually(Duration::from_secs(90), || total(&all) >= acknowledged);
    let logs = stop_all(&mut nodes.iter_mut().collect::<Vec<_>>());
    for (n, log) in nodes.iter().zip(&logs) {
        eprintln!("{}: {:?}", n.cluster, summary(log, "web"));
    }
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for n in &acked {
        *expected.entry(format!("u{}", n % USERS)).or_insert(0) += 1;
    }
    let mut got: BTreeMap<String, u64> = BTreeMap::new();
    for n in &nodes {
        for (user, c) in aggregate_counts(&n.output()) {
            *got.entry(user).or_insert(0) += c;
        }
    }
    let sum: u64 = got.values().sum();
    eprintln!(
        "acknowledged {acknowledged}, counts summed {sum}, duplicates {} (settled before shutdown: {settled})",
        sum as i64 - acknowledged as i64
    );
    let short: Vec<_> = expected
        .iter()
        .filter(|(u, want)| got.get(*u).copied().unwrap_or(0) < **want)
        .map(|(u, want)| (u, *want, got.get(u).copied().unwrap_or(0)))
        .collect();
    assert!(short.is_empty(), "users counted fewer times than acknowledged (user, acknowledged, counted): {short:?}");
    assert!(sum >= acknowledged);
}

/// Sends numbered events on one connection in chunks until told to stop; returns how many.
fn steady_sender(port: u16, first: u64, stop: Arc<AtomicBool>, sent: Arc<AtomicU64>) -> u64 {
    let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut next = first;
    while !stop.load(Ordering::SeqCst) {
        let chunk: String = (next..next + 500).map(|n| event(n, 0)).collect();
        conn.write_all(chunk.as_bytes()).unwrap();
        next += 500;
        sent.store(next - first, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(20));
    }
    conn.shutdown(std::net::Shutdown::Write).unwrap();
    next - first
}

fn peer<'a>(cluster: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    &cluster["peers"][name]
}

#[test]
fn a_hung_peer_with_hold_loses_nothing_once_it_returns() {
    let extra = "  on_peer_failure: hold
  forwarding: {request_timeout: 60s, retry_backoff: 50ms, retry_backoff_max: 500ms, batch_bytes: 32KiB, max_in_flight: 256KiB}";
    let mut nodes = start_static(2, extra, "{type: memory, max_events: 2000}", "250ms");
    // Warm up: both nodes take part, the link is connected.
    const WARM: u64 = 2_000;
    send_tcp(nodes[0].port, 0, WARM, 0);
    let all: Vec<&Node> = nodes.iter().collect();
    assert!(eventually(Duration::from_secs(30), || total(&all) == WARM), "the warm-up events were not all aggregated");
    let hung = nodes[1].cluster.clone();
    nodes[1].s.signal("STOP");
    const LOAD: u64 = 40_000;
    let port = nodes[0].port;
    let sender = std::thread::spawn(move || send_tcp(port, WARM, LOAD, 20));
    std::thread::sleep(Duration::from_secs(2));
    let before = nodes[0].accepted();
    std::thread::sleep(Duration::from_secs(1));
    let after = nodes[0].accepted();
    let c = nodes[0].cluster_stats();
    eprintln!("while {hung} is stopped: accepted {before} then {after} of {}; peer {}", WARM + LOAD, peer(&c, &hung));
    assert_eq!(before, after, "the node kept accepting with its peer's window full");
    assert!(after < WARM + LOAD, "the node took everything although its peer was stopped (no backpressure)");
    assert!(peer(&c, &hung)["bytes_in_flight"].as_u64().unwrap() > 0, "{c}");
    nodes[1].s.signal("CONT");
    sender.join().unwrap();
    let sent = WARM + LOAD;
    let all: Vec<&Node> = nodes.iter().collect();
    let settled = eventually(Duration::from_secs(90), || total(&all) >= sent);
    let logs = stop_all(&mut nodes.iter_mut().collect::<Vec<_>>());
    for (n, log) in nodes.iter().zip(&logs) {
        eprintln!("{}: {:?}", n.cluster, summary(log, "web"));
    }
    let all: Vec<&Node> = nodes.iter().collect();
    let sum = assert_each_user_on_one_node(&all);
    eprintln!("sent {sent}, counts summed {sum} (settled before shutdown: {settled})");
    assert_eq!(sum, sent, "with `hold` every event is counted once");
}

#[test]
fn a_hung_peer_with_local_keeps_flowing() {
    let extra = "  on_peer_failure: local
  forwarding: {request_timeout: 1s, failures_before_down: 1, retry_backoff: 50ms, retry_backoff_max: 500ms, batch_bytes: 16KiB, max_in_flight: 64KiB}";
    let mut nodes = start_static(2, extra, "{type: memory, max_events: 2000}", "250ms");
    let (stop, counter) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let (port, flag, n) = (nodes[0].port, stop.clone(), counter.clone());
    let sender = std::thread::spawn(move || steady_sender(port, 0, flag, n));
    let all: Vec<&Node> = nodes.iter().collect();
    assert!(
        eventually(Duration::from_secs(30), || nodes[1].cluster_stats()["events"]["received"].as_u64() > Some(0)),
        "nothing reached the second node before it was stopped"
    );
    let hung = nodes[1].cluster.clone();
    nodes[1].s.signal("STOP");
    let down = eventually(Duration::from_secs(15), || {
        matches!(peer(&nodes[0].cluster_stats(), &hung)["state"].as_str(), Some("down" | "probing"))
    });
    let c = nodes[0].cluster_stats();
    assert!(down, "the stopped peer is not marked down: {c}");
    assert!(
        eventually(Duration::from_secs(15), || nodes[0].cluster_stats()["events"]["local_fallback"].as_u64() > Some(0)),
        "no event of the stopped peer was processed here: {}",
        nodes[0].cluster_stats()
    );
    let (len, sent_then) = (nodes[0].output_len(), counter.load(Ordering::SeqCst));
    assert!(
        eventually(Duration::from_secs(15), || nodes[0].output_len() > len
            && counter.load(Ordering::SeqCst) > sent_then),
        "the output stopped growing (or the client stopped sending) while the peer was stopped"
    );
    let c = nodes[0].cluster_stats();
    eprintln!("while {hung} is stopped: {c}");
    let wait_max = c["worker_wait_max_seconds"].as_f64().unwrap();
    assert!(wait_max < 2.0, "a worker waited {wait_max}s on the stopped peer (request_timeout is 1s)");
    nodes[1].s.signal("CONT");
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::SeqCst);
    let sent = sender.join().unwrap();
    let settled = eventually(Duration::from_secs(90), || total(&all) >= sent);
    let logs = stop_all(&mut nodes.iter_mut().collect::<Vec<_>>());
    for (n, log) in nodes.iter().zip(&logs) {
        eprintln!("{}: {:?}", n.cluster, summary(log, "web"));
    }
    let all: Vec<&Node> = nodes.iter().collect();
    let sum = total(&all);
    eprintln!(
        "sent {sent}, counts summed {sum}, duplicates {} (settled before shutdown: {settled})",
        sum as i64 - sent as i64
    );
    assert!(sum >= sent, "events were lost: sent {sent}, counted {sum}");
}

fn tls_extra(cert: &Path, key: &Path, ca: &Path) -> String {
    format!(
        "  on_peer_failure: hold\n  tls: {{cert: '{}', key: '{}', ca: '{}', client_auth: required}}",
        cert.display(),
        key.display(),
        ca.display()
    )
}

#[test]
fn mutual_tls_between_nodes() {
    let certs_dir = tempfile::tempdir().unwrap();
    let certs = sluice_tls::testing::CertSet::generate(certs_dir.path(), &["node-a", "node-b"]);
    let names = ["node-a", "node-b"];
    let members = cluster_addresses(2);
    let mut nodes = start_nodes(
        &members,
        &static_discovery(&members),
        |i| tls_extra(&certs.cert(names[i]), &certs.key(names[i]), &certs.ca_cert),
        "{type: memory}",
        "500ms",
        tcp_input,
    );
    const PER_NODE: u64 = 20_000;
    for (i, n) in nodes.iter().enumerate() {
        send_tcp(n.port, i as u64 * PER_NODE, PER_NODE, 0);
    }
    let sent = PER_NODE * 2;
    let all: Vec<&Node> = nodes.iter().collect();
    let settled = eventually(Duration::from_secs(60), || total(&all) >= sent);
    for (i, n) in nodes.iter().enumerate() {
        let c = n.cluster_stats();
        let other = &nodes[1 - i].cluster;
        assert_eq!(peer(&c, other)["state"], "up", "{c}");
        assert!(c["events"]["forwarded"].as_u64().unwrap() > 0 && c["events"]["received"].as_u64().unwrap() > 0, "{c}");
    }
    let logs = stop_all(&mut nodes.iter_mut().collect::<Vec<_>>());
    for (n, log) in nodes.iter().zip(&logs) {
        let s = summary(log, "web");
        eprintln!("{}: {s:?}", n.cluster);
        assert!(s["forwarded"] > 0 && s["received"] > 0, "{}: {log}", n.cluster);
    }
    let all: Vec<&Node> = nodes.iter().collect();
    let sum = assert_each_user_on_one_node(&all);
    eprintln!("sent {sent}, counts summed {sum} (settled before shutdown: {settled})");
    assert_eq!(sum, sent);
}

#[test]
fn a_node_with_a_certificate_from_another_ca_is_refused() {
    let certs_dir = tempfile::tempdir().unwrap();
    let good = sluice_tls::testing::CertSet::generate(certs_dir.path(), &["node-a"]);
    let rogue = sluice_tls::testing::CertSet::generate_other_ca(certs_dir.path(), &["node-b"]);
    let members = cluster_addresses(2);
    let mut nodes = start_nodes(
        &members,
        &static_discovery(&members),
        |i| match i {
            0 => tls_extra(&good.cert("node-a"), &good.key("node-a"), &good.ca_cert),
            _ => tls_extra(&rogue.cert("node-b"), &rogue.key("node-b"), &rogue.ca_cert),
        },
        "{type: memory}",
        "500ms",
        tcp_input,
    );
    // Events for both to forward, so that each dials the other.
    for (i, n) in nodes.iter().enumerate() {
        send_tcp(n.port, i as u64 * 1000, 1000, 0);
    }
    let tls_problem = |log: &str| {
        log.lines().any(|l| {
            (l.contains("certificate") || l.contains("TLS") || l.contains("handshake"))
                && (l.contains("CA") || l.contains("UnknownIssuer") || l.contains("not signed"))
        })
    };
    let both = eventually(Duration::from_secs(30), || nodes.iter().all(|n| tls_problem(&n.s.log())));
    for n in &nodes {
        let log = n.s.log();
        let lines: Vec<&str> = log.lines().filter(|l| l.contains("certificate") || l.contains("TLS")).take(4).collect();
        eprintln!("{}:\n  {}", n.cluster, lines.join("\n  "));
    }
    assert!(both, "not both nodes logged the certificate problem:\n{}\n---\n{}", nodes[0].s.log(), nodes[1].s.log());
    let c = nodes[0].cluster_stats();
    let state = peer(&c, &nodes[1].cluster)["state"].clone();
    eprintln!("the good node sees the rogue peer as {state}; handshakes refused {}", c["handshakes_refused"]);
    assert_ne!(state, "up", "{c}");
    // Neither can deliver what it holds for the other; the processes are killed on drop.
    for n in nodes.iter_mut() {
        let _ = n.s.child.kill();
    }
}

/// The hosts file as it was, put back when the test ends, however it ends.
struct HostsGuard {
    original: String,
}

const HOSTS: &str = "/etc/hosts";
const NAME: &str = "sluice-test-cluster";

impl HostsGuard {
    /// The original text followed by `ips` for the test's name. Changed in place and never
    /// emptied, not rewritten: the other tests in this process, and the servers they start,
    /// resolve names through this file meanwhile, and must always find its original lines.
    fn set(&self, ips: &[&str]) {
        use std::os::unix::fs::FileExt;
        let mut tail = String::new();
        if !self.original.ends_with('\n') {
            tail.push('\n');
        }
        for ip in ips {
            tail.push_str(&format!("{ip} {NAME}\n"));
        }
        let file = std::fs::OpenOptions::new().write(true).open(HOSTS).unwrap();
        file.set_len(self.original.len() as u64).unwrap();
        file.write_all_at(tail.as_bytes(), self.original.len() as u64).unwrap();
    }
}

impl Drop for HostsGuard {
    fn drop(&mut self) {
        if let Ok(file) = std::fs::OpenOptions::new().write(true).open(HOSTS) {
            let _ = file.set_len(self.original.len() as u64);
        }
    }
}

fn members_of(n: &Node) -> usize {
    n.cluster_stats()["members"].as_array().map(Vec::len).unwrap_or(0)
}

#[test]
fn dns_discovery_from_the_hosts_file() {
    if let Err(e) = std::fs::OpenOptions::new().append(true).open(HOSTS) {
        let why = format!("{HOSTS} is not writable ({e}); the test adds a name resolving to 127.0.0.1 and 127.0.0.2");
        sluice_testkit::root::root_unavailable(&format!("write access to {HOSTS}"), &why);
        return;
    }
    if let Err(e) = std::net::TcpListener::bind("127.0.0.2:0") {
        panic!("cannot listen on 127.0.0.2 ({e}): Linux routes all of 127.0.0.0/8 to the loopback device");
    }
    let original = std::fs::read_to_string(HOSTS).unwrap();
    assert!(!original.contains(NAME), "{HOSTS} still has {NAME} from an earlier run: remove it");
    let hosts = HostsGuard { original };
    hosts.set(&["127.0.0.1", "127.0.0.2"]);
    // One cluster port on both addresses.
    let port = loop {
        let p = free_port();
        if std::net::TcpListener::bind(("127.0.0.2", p)).is_ok() {
            break p;
        }
    };
    let members = vec![format!("127.0.0.1:{port}"), format!("127.0.0.2:{port}")];
    let discovery = format!("{{dns: {{name: {NAME}, port: {port}, refresh: 500ms}}}}");
    let mut nodes = start_nodes(
        &members,
        &discovery,
        |_| "  on_peer_failure: hold".to_string(),
        "{type: memory}",
        "250ms",
        tcp_input,
    );
    assert!(
        eventually(Duration::from_secs(20), || nodes.iter().all(|n| members_of(n) == 2)),
        "the nodes did not find each other by name: {} / {}",
        nodes[0].cluster_stats(),
        nodes[1].cluster_stats()
    );
    let (stop, counter) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let (port1, flag, n) = (nodes[0].port, stop.clone(), counter.clone());
    let sender = std::thread::spawn(move || steady_sender(port1, 0, flag, n));
    assert!(
        eventually(Duration::from_secs(20), || nodes[0].cluster_stats()["events"]["forwarded"].as_u64() > Some(0)
            && nodes[1].cluster_stats()["events"]["received"].as_u64() > Some(0)),
        "nothing was forwarded between the nodes: {}",
        nodes[0].cluster_stats()
    );
    // The second node leaves the name while events flow.
    hosts.set(&["127.0.0.1"]);
    let left = eventually(Duration::from_secs(10), || members_of(&nodes[0]) == 1);
    assert!(left, "the first node still has {} members: {}", members_of(&nodes[0]), nodes[0].cluster_stats());
    let (len, sent_then) = (nodes[0].output_len(), counter.load(Ordering::SeqCst));
    assert!(
        eventually(Duration::from_secs(15), || nodes[0].output_len() > len
            && counter.load(Ordering::SeqCst) > sent_then),
        "the first node's output stopped growing once the second left its ring"
    );
    // And joins it again: the first node forwards to it again.
    let forwarded = |n: &Node| n.cluster_stats()["events"]["forwarded"].as_u64().unwrap_or(0);
    let before = forwarded(&nodes[0]);
    hosts.set(&["127.0.0.1", "127.0.0.2"]);
    assert!(
        eventually(Duration::from_secs(15), || members_of(&nodes[0]) == 2 && forwarded(&nodes[0]) > before),
        "the second node, back under the name, did not rejoin the first node's ring: {}",
        nodes[0].cluster_stats()
    );
    stop.store(true, Ordering::SeqCst);
    let sent = sender.join().unwrap();
    let all: Vec<&Node> = nodes.iter().collect();
    let settled = eventually(Duration::from_secs(60), || total(&all) >= sent);
    let c = nodes[0].cluster_stats();
    let logs = stop_all(&mut nodes.iter_mut().collect::<Vec<_>>());
    for (n, log) in nodes.iter().zip(&logs) {
        eprintln!("{}: {:?}", n.cluster, summary(log, "web"));
    }
    let all: Vec<&Node> = nodes.iter().collect();
    let sum = total(&all);
    eprintln!(
        "sent {sent}, counts summed {sum}, duplicates {} (settled before shutdown: {settled}); first node at the end: {c}",
        sum as i64 - sent as i64
    );
    assert!(sum >= sent, "events were lost: sent {sent}, counted {sum}");
    drop(hosts);
}

/// Waits until no link holds anything (true), or until no link has had a frame answered for
/// `quiet` while some still hold frames (false): frames left unanswered for good.
fn drained_or_stuck(nodes: &[&Node], quiet: Duration) -> bool {
    let answered = |nodes: &[&Node]| -> u64 {
        nodes
            .iter()
            .flat_map(|n| {
                let c = n.cluster_stats();
                c["peers"]
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(_, p)| p["batches_forwarded"].as_u64().unwrap_or(0))
                    .collect::<Vec<_>>()
            })
            .sum()
    };
    let mut last = (answered(nodes), std::time::Instant::now());
    // A bound of its own, far above any drain seen, so that the test ends whatever happens.
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(600) {
        if bytes_in_flight(nodes) == 0 {
            return true;
        }
        let now = answered(nodes);
        if now != last.0 {
            last = (now, std::time::Instant::now());
        } else if last.1.elapsed() >= quiet {
            return false;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

/// Bytes every node's links hold for their peers, unanswered.
fn bytes_in_flight(nodes: &[&Node]) -> u64 {
    nodes
        .iter()
        .flat_map(|n| {
            let c = n.cluster_stats();
            c["peers"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(_, p)| p["bytes_in_flight"].as_u64().unwrap_or(0))
                .collect::<Vec<_>>()
        })
        .sum()
}

/// A peer stopped (SIGSTOP) long enough for its peers to give up on their connections, then
/// resumed, while the others forward to it with full pipelines on its side: the frames it had
/// read from the connections its peers gave up on, and not yet taken, are taken when sent
/// again. Nothing stays unanswered: every link empties, no event is missing from the outputs,
/// and no node stops with events unfinished.
#[test]
fn a_peer_stopped_and_resumed_leaves_no_frame_unanswered() {
    let extra = "  on_peer_failure: hold
  forwarding: {request_timeout: 1s, retry_backoff: 50ms, retry_backoff_max: 200ms, failures_before_down: 2, batch_bytes: 16KiB, max_in_flight: 4MiB}";
    // The stopped node has a small queue whose records stay until their groups conclude: when
    // it resumes, its takers wait for room while its peers give up on connections (as with a
    // node behind on its work); the others have room for the load.
    let small = "{type: persisted, shards: 1, segment_bytes: 64KiB, max_bytes: 256KiB, checkpoint_interval: 50ms}";
    let large = "{type: persisted, shards: 2, segment_bytes: 1MiB, max_bytes: 64MiB, checkpoint_interval: 50ms}";
    let members = cluster_addresses(3);
    let discovery = static_discovery(&members);
    let mut nodes: Vec<Node> = members
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let port = free_port();
            let spec = NodeSpec {
                cluster: m.clone(),
                discovery: discovery.clone(),
                cluster_extra: extra.to_string(),
                queue: if i == 1 { small } else { large }.to_string(),
                input: http_input(port),
                group_duration: "1s".to_string(),
                cluster_name: None,
            };
            Node::start(config(&spec), port, m)
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    // Enough clients at once that the stalled node's share fills many frames.
    let clients: Vec<_> = (0..16u64)
        .map(|i| {
            let (port, stop) = (nodes[0].port, stop.clone());
            std::thread::spawn(move || http_client(port, i * 10_000_000, 10_000_000, stop))
        })
        .collect();
    assert!(
        eventually(Duration::from_secs(30), || nodes[1].cluster_stats()["events"]["received"].as_u64() > Some(0)),
        "nothing reached the second node before it was stopped"
    );
    for round in 0..2 {
        nodes[1].s.signal("STOP");
        std::thread::sleep(Duration::from_secs(4));
        nodes[1].s.signal("CONT");
        std::thread::sleep(Duration::from_secs(3));
        eprintln!("after stall {round}: {}", nodes[0].cluster_stats()["peers"]);
    }
    stop.store(true, Ordering::SeqCst);
    let acked: Vec<u64> = clients.into_iter().flat_map(|c| c.join().unwrap()).collect();
    let acknowledged = acked.len() as u64;
    assert!(acknowledged > 0, "no request was answered 200");
    let all: Vec<&Node> = nodes.iter().collect();
    // The resumed node works through its peers' backlog slowly (its small queue), and each
    // request timeout resends it all: wait while answers still come, and no longer once they
    // have stopped coming with frames still held.
    let emptied = drained_or_stuck(&all, Duration::from_secs(20));
    let stats: Vec<serde_json::Value> = nodes.iter().map(Node::cluster_stats).collect();
    let settled = eventually(Duration::from_secs(120), || total(&all) >= acknowledged);
    let logs = stop_all(&mut nodes.iter_mut().collect::<Vec<_>>());
    let mut unfinished = Vec::new();
    for (n, log) in nodes.iter().zip(&logs) {
        let s = summary(log, "web");
        eprintln!("{}: {s:?}", n.cluster);
        if s["unfinished"] != 0 {
            unfinished.push((n.cluster.clone(), s["unfinished"]));
        }
    }
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for n in &acked {
        *expected.entry(format!("u{}", n % USERS)).or_insert(0) += 1;
    }
    let mut got: BTreeMap<String, u64> = BTreeMap::new();
    for n in &nodes {
        for (user, c) in aggregate_counts(&n.output()) {
            *got.entry(user).or_insert(0) += c;
        }
    }
    let sum: u64 = got.values().sum();
    eprintln!("acknowledged {acknowledged}, counted {sum} (settled before shutdown: {settled})");
    assert!(emptied, "frames stayed unanswered after the load stopped: {stats:?}");
    assert!(unfinished.is_empty(), "nodes stopped with events unfinished: {unfinished:?}");
    let short: Vec<_> = expected
        .iter()
        .filter(|(u, want)| got.get(*u).copied().unwrap_or(0) < **want)
        .map(|(u, want)| (u, *want, got.get(u).copied().unwrap_or(0)))
        .collect();
    assert!(short.is_empty(), "users counted fewer times than acknowledged (user, acknowledged, counted): {short:?}");
}

/// Starts one node per `(cluster address, discovery, cluster_extra)`, each with a tcp input,
/// all in one cluster named after the first's discovery.
fn start_each(specs: &[(String, String, String)], queue: &str) -> Vec<Node> {
    let name = cluster_name(&specs[0].1);
    specs
        .iter()
        .map(|(cluster, discovery, extra)| {
            let port = free_port();
            let spec = NodeSpec {
                cluster: cluster.clone(),
                discovery: discovery.clone(),
                cluster_extra: extra.clone(),
                queue: queue.to_string(),
                input: tcp_input(port),
                group_duration: "250ms".to_string(),
                cluster_name: Some(name.clone()),
            };
            Node::start(config(&spec), port, cluster)
        })
        .collect()
}

/// Lines of `log` that contain `needle`.
fn lines_with(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

/// Connections to the cluster port that never begin their TLS handshake: at most
/// `max_pending_handshakes` are held, the others are closed to make room or time out, every one
/// is counted, the log gets a line now and then rather than one per connection, and a real
/// peer joins in the middle of it.
#[test]
fn connections_that_never_handshake_are_capped_counted_and_quiet() {
    let certs_dir = tempfile::tempdir().unwrap();
    let names = ["node-a", "node-b"];
    let certs = sluice_tls::testing::CertSet::generate(certs_dir.path(), &names);
    let members = cluster_addresses(2);
    let discovery = static_discovery(&members);
    let extra = |i: usize| {
        format!(
            "{}\n  max_pending_handshakes: 32\n  handshake_timeout: 2s",
            tls_extra(&certs.cert(names[i]), &certs.key(names[i]), &certs.ca_cert)
        )
    };
    let mut first = start_each(&[(members[0].clone(), discovery.clone(), extra(0))], "{type: memory}");
    let target: std::net::SocketAddr = members[0].parse().unwrap();
    // About 250 connections a second for 6 s, each left open and silent a while.
    let stop = Arc::new(AtomicBool::new(false));
    let flood = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut open = std::collections::VecDeque::new();
            let mut opened = 0u64;
            while !stop.load(Ordering::SeqCst) {
                if let Ok(c) = TcpStream::connect_timeout(&target, Duration::from_secs(1)) {
                    opened += 1;
                    open.push_back(c);
                }
                if open.len() > 300 {
                    open.pop_front();
                }
                std::thread::sleep(Duration::from_millis(4));
            }
            (opened, open)
        })
    };
    std::thread::sleep(Duration::from_secs(2));
    let c = first[0].cluster_stats();
    eprintln!("during the flood: {c}");
    assert!(c["handshakes_pending"].as_u64().unwrap() <= 32, "{c}");
    // A real peer joins while the flood goes on.
    let mut second = start_each(&[(members[1].clone(), discovery.clone(), extra(1))], "{type: memory}");
    for (i, n) in [&first[0], &second[0]].into_iter().enumerate() {
        send_tcp(n.port, i as u64 * 2_000, 2_000, 0);
    }
    let joined = eventually(Duration::from_secs(30), || {
        first[0].cluster_stats()["events"]["received"].as_u64() > Some(0)
            && second[0].cluster_stats()["events"]["received"].as_u64() > Some(0)
    });
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::SeqCst);
    // The last ones stay open (a connection closed before a word is no handshake), and time out.
    let (opened, still_open) = flood.join().unwrap();
    let settled = eventually(Duration::from_secs(10), || first[0].cluster_stats()["handshakes_pending"] == 0);
    drop(still_open);
    let c = first[0].cluster_stats();
    let log = first[0].s.log();
    let (evicted, timed_out) = (c["handshakes_evicted"].as_u64().unwrap(), c["handshakes_timed_out"].as_u64().unwrap());
    let lines = lines_with(&log, "ended in its handshake");
    eprintln!(
        "{opened} silent connections: evicted {evicted}, timed out {timed_out}, refused {}, {lines} log lines; {c}",
        c["handshakes_refused"]
    );
    assert!(joined, "the real peer did not join during the flood: {c}\n{}", second[0].s.log());
    assert!(settled, "connections still handshaking long after the flood: {c}");
    assert!(opened > 500, "the flood opened only {opened} connections");
    assert!(evicted + timed_out >= opened - 5, "not every silent connection was counted: {c}");
    assert!(timed_out > 0, "no handshake timed out: {c}");
    assert!(lines <= 3, "{lines} log lines for {opened} silent connections:\n{log}");
    assert_eq!(lines_with(&log, "cluster connection from a peer ended"), 0, "{log}");
    let metrics = http(&first[0].api, "GET", "/metrics", &[], b"").1;
    assert_eq!(metric(&metrics, "sluice_cluster_handshakes_evicted_total"), evicted as f64);
    assert_eq!(metric(&metrics, "sluice_cluster_handshakes_timed_out_total"), timed_out as f64);
    let mut all = [first.remove(0), second.remove(0)];
    let logs = stop_all(&mut all.iter_mut().collect::<Vec<_>>());
    for (n, log) in all.iter().zip(&logs) {
        assert_eq!(summary(log, "web")["unfinished"], 0, "{}: {log}", n.cluster);
    }
    let refs: Vec<&Node> = all.iter().collect();
    assert_eq!(total(&refs), 4_000);
}

/// A node without `cluster.tls` among nodes with it: both sides say which one lacks TLS,
/// instead of "bad magic" or a corrupt message.
#[test]
fn a_node_without_tls_facing_a_tls_peer_says_so() {
    let certs_dir = tempfile::tempdir().unwrap();
    let certs = sluice_tls::testing::CertSet::generate(certs_dir.path(), &["node-a"]);
    let members = cluster_addresses(2);
    let discovery = static_discovery(&members);
    let mut nodes = start_each(
        &[
            (
                members[0].clone(),
                discovery.clone(),
                tls_extra(&certs.cert("node-a"), &certs.key("node-a"), &certs.ca_cert),
            ),
            (members[1].clone(), discovery.clone(), "  on_peer_failure: hold".to_string()),
        ],
        "{type: memory}",
    );
    // Events for both to forward, so that each dials the other.
    for (i, n) in nodes.iter().enumerate() {
        send_tcp(n.port, i as u64 * 1000, 1000, 0);
    }
    let with_tls_says = |log: &str| log.contains("the peer has no `cluster.tls`");
    let without_says = |log: &str| log.contains("has `cluster.tls` and this node has none");
    let said =
        eventually(Duration::from_secs(30), || with_tls_says(&nodes[0].s.log()) && without_says(&nodes[1].s.log()));
    for n in &nodes {
        let log = n.s.log();
        let lines: Vec<&str> = log.lines().filter(|l| l.contains("tls") || l.contains("magic")).take(4).collect();
        eprintln!("{}:\n  {}", n.cluster, lines.join("\n  "));
    }
    assert!(said, "the nodes did not say which lacks TLS:\n{}\n---\n{}", nodes[0].s.log(), nodes[1].s.log());
    for n in &nodes {
        assert!(!n.s.log().contains("bad magic"), "{}", n.s.log());
    }
    assert!(nodes[0].cluster_stats()["handshakes_refused"].as_u64() > Some(0));
    for n in nodes.iter_mut() {
        let _ = n.s.child.kill();
    }
}

/// Two nodes whose member lists differ (one lists a third node the other does not): each warns,
/// once the rings have differed longer than a membership change takes, that the peer routes
/// with another ring.
#[test]
fn nodes_whose_member_lists_differ_say_so() {
    let members = cluster_addresses(3);
    let two = static_discovery(&members[..2]);
    let three = static_discovery(&members);
    let extra = "  on_peer_failure: hold".to_string();
    let specs = [(members[0].clone(), two, extra.clone()), (members[1].clone(), three, extra)];
    let mut nodes = start_each(&specs, "{type: memory}");
    let stop = Arc::new(AtomicBool::new(false));
    let senders: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let (port, stop, sent) = (n.port, stop.clone(), Arc::new(AtomicU64::new(0)));
            std::thread::spawn(move || steady_sender(port, i as u64 * 100_000_000, stop, sent))
        })
        .collect();
    let warning = "a peer routes with another ring than this node's";
    let both = eventually(Duration::from_secs(40), || nodes.iter().all(|n| n.s.log().contains(warning)));
    stop.store(true, Ordering::SeqCst);
    for s in senders {
        s.join().unwrap();
    }
    for n in &nodes {
        let log = n.s.log();
        eprintln!("{}: {:?}", n.cluster, log.lines().find(|l| l.contains(warning)));
        assert!(lines_with(&log, warning) <= 1, "the warning is repeated at most once a minute:\n{log}");
    }
    assert!(both, "not both nodes warned:\n{}\n---\n{}", nodes[0].s.log(), nodes[1].s.log());
    // The second node holds events for a member that does not exist.
    for n in nodes.iter_mut() {
        let _ = n.s.child.kill();
    }
}
