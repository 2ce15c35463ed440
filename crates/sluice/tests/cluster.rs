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
//! - DNS discovery from the hosts file, with a member leaving while traffic flows (root only).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

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
}

fn config(n: &NodeSpec) -> String {
    format!(
        "data_dir: '{{dir}}/data'
api: {{address: '127.0.0.1:0'}}
shutdown_timeout: 30s
cluster:
  listen: '{cluster}'
  advertise: '{cluster}'
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

    fn stats(&self) -> serde_json::Value {
        get_json(&self.api, "/stats")
    }

    fn cluster_stats(&self) -> serde_json::Value {
        self.stats()["cluster"].clone()
    }

    /// Events the pipeline's inputs accepted.
    fn accepted(&self) -> u64 {
        let stats = self.stats();
        let components = stats["pipelines"]["web"]["components"].as_array().cloned().unwrap_or_default();
        components.iter().filter(|c| c["kind"] == "input").map(|c| c["events"]["out"].as_u64().unwrap_or(0)).sum()
    }

    fn output(&self) -> std::path::PathBuf {
        self.s.path("agg.log")
    }

    fn output_len(&self) -> u64 {
        std::fs::metadata(self.output()).map(|m| m.len()).unwrap_or(0)
    }

    fn pid(&self) -> u32 {
        self.s.child.id()
    }
}

/// `count` per user in one node's output, and how many aggregate lines each user has there.
fn counts(path: &Path) -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{}: not JSON ({e}): {line}", path.display()));
        let user = v["user"].as_str().unwrap_or_else(|| panic!("{}: no /user in {line}", path.display()));
        let count = v["count"].as_u64().unwrap_or_else(|| panic!("{}: no /count in {line}", path.display()));
        *out.entry(user.to_string()).or_insert(0) += count;
    }
    out
}

fn total(nodes: &[&Node]) -> u64 {
    nodes.iter().map(|n| counts(&n.output()).values().sum::<u64>()).sum()
}

/// Waits for `f` up to `timeout`; false if it never held (the caller's assertions say why).
fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while started.elapsed() < timeout {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
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

/// Starts `n` nodes on 127.0.0.1 with tcp inputs and a static membership.
fn start_static(n: usize, cluster_extra: &str, queue: &str, group_duration: &str) -> Vec<Node> {
    let members = cluster_addresses(n);
    let mut nodes = Vec::new();
    for m in &members {
        let port = free_port();
        let spec = NodeSpec {
            cluster: m.clone(),
            discovery: static_discovery(&members),
            cluster_extra: cluster_extra.to_string(),
            queue: queue.to_string(),
            input: tcp_input(port),
            group_duration: group_duration.to_string(),
        };
        nodes.push(Node::start(config(&spec), port, m));
    }
    nodes
}

/// Every user's aggregates are on exactly one node; returns the sum of all counts.
fn assert_each_user_on_one_node(nodes: &[&Node]) -> u64 {
    let mut owners: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut sum = 0;
    for n in nodes {
        for (user, c) in counts(&n.output()) {
            owners.entry(user).or_default().insert(n.cluster.clone());
            sum += c;
        }
    }
    let split: Vec<_> = owners.iter().filter(|(_, o)| o.len() != 1).collect();
    assert!(split.is_empty(), "users aggregated on more than one node: {split:?}");
    let per_node: BTreeMap<&String, usize> =
        nodes.iter().map(|n| (&n.cluster, owners.values().filter(|o| o.contains(&n.cluster)).count())).collect();
    eprintln!("users per node: {per_node:?}");
    assert_eq!(owners.len() as u64, USERS, "every user appears in some node's output");
    sum
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
    let settled = eventually(Duration::from_secs(60), || total(&all) >= sent);
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
        assert!(s["forwarded"] > 0 && s["received"] > 0, "{}: summary {s:?}", n.cluster);
        assert_eq!(s["unfinished"], 0, "{}: {log}", n.cluster);
    }
    let all: Vec<&Node> = nodes.iter().collect();
    let sum = assert_each_user_on_one_node(&all);
    eprintln!("sent {sent}, counts summed {sum} (settled before shutdown: {settled})");
    assert_eq!(sum, sent, "the counts across nodes add up to the events sent");
}
