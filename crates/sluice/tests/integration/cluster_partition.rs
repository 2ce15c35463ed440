//! Cluster mode across a network partition: two `sluice` nodes, one in the root network
//! namespace and one in a namespace of its own, joined by a veth pair. Taking the root side of
//! the pair down cuts the peer off for real: no reset, no refused connection, the open TCP
//! connection just stalls. Each test sends JSON events to the first node (about half of the
//! users belong to the other) and sums the `count` fields of both nodes' aggregate outputs:
//!
//! - with `hold`, the first node pushes back while the peer is cut off and loses nothing once
//!   the link returns;
//! - with `local`, it marks the peer down and keeps processing the peer's keys itself;
//! - over a lossy link (the kernel's netem, or nftables where it has no netem) everything is
//!   still delivered, each event taken once by its owner.
//!
//! The tests need root and the `ip` command (and `tc` or `nft`); without them they fail saying
//! why (unless `SLUICE_SKIP_ROOT_TESTS=1` skips them, see `sluice_testkit::root`).

use crate::common;

use std::collections::BTreeSet;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;

/// Distinct values of `/user` in every test.
const USERS: u64 = 500;

/// How long the link stays down at least.
const CUT: Duration = Duration::from_secs(3);

/// Runs `ip` (or, with `netns`, `ip netns exec NETNS <args>`); the error says what failed.
fn run(netns: Option<&str>, args: &[&str]) -> Result<(), String> {
    let mut cmd = Command::new("ip");
    if let Some(ns) = netns {
        cmd.args(["netns", "exec", ns, "ip"]);
    }
    let out = cmd.args(args).stdin(Stdio::null()).output().map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {} {}", args.join(" "), out.status, String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// A network namespace joined to the root namespace by a veth pair, with a /30 between them.
/// Dropped, it deletes the namespace and the pair, however the test ends.
struct Netns {
    name: String,
    /// The pair's end in the root namespace.
    outside: String,
    /// The root side's address, and the namespace side's.
    outside_ip: String,
    inside_ip: String,
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

impl Netns {
    /// Sets one up, or says why it could not.
    fn create() -> Result<Netns, String> {
        let uid = Command::new("id").arg("-u").output().map_err(|e| format!("id -u: {e}"))?;
        if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
            return Err("not running as root (network namespaces need it)".into());
        }
        let pid = std::process::id();
        let counter = NEXT.fetch_add(1, Ordering::SeqCst);
        assert!(counter < 4, "at most four namespaces per test process");
        let n = (pid % 100_000) as usize * 10 + counter;
        let y = (pid % 60) as usize * 4 + counter;
        let net = Netns {
            name: format!("slc{n}"),
            outside: format!("slv{n}a"),
            outside_ip: format!("10.213.{y}.1"),
            inside_ip: format!("10.213.{y}.2"),
        };
        let inside = format!("slv{n}b");
        run(None, &["netns", "add", &net.name])?;
        // From here on, dropping `net` undoes what was done.
        run(None, &["link", "add", &net.outside, "type", "veth", "peer", "name", &inside])?;
        run(None, &["link", "set", &inside, "netns", &net.name])?;
        run(None, &["addr", "add", &format!("{}/30", net.outside_ip), "dev", &net.outside])?;
        run(Some(&net.name), &["addr", "add", &format!("{}/30", net.inside_ip), "dev", &inside])?;
        run(None, &["link", "set", &net.outside, "up"])?;
        run(Some(&net.name), &["link", "set", &inside, "up"])?;
        run(Some(&net.name), &["link", "set", "lo", "up"])?;
        Ok(net)
    }

    /// The pair's end inside the namespace.
    fn inside(&self) -> String {
        format!("{}b", self.outside.strip_suffix('a').unwrap())
    }

    /// Takes the root side of the pair down (a partition) or up again.
    fn link(&self, up: bool) {
        run(None, &["link", "set", &self.outside, if up { "up" } else { "down" }]).unwrap();
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run(None, &["link", "del", &self.outside]);
        let _ = run(None, &["netns", "del", &self.name]);
    }
}

/// The namespace for one test. Where it cannot be made the test fails saying why, or, under
/// `SLUICE_SKIP_ROOT_TESTS=1`, is reported skipped and gets `None` (it then checks nothing).
fn netns(test: &str) -> Option<Netns> {
    match Netns::create() {
        Ok(net) => Some(net),
        Err(why) => {
            sluice_testkit::root::root_unavailable(&format!("a network namespace for {test}"), &why);
            None
        }
    }
}

fn config(n: &NodeSpec) -> String {
    format!(
        "data_dir: '{{dir}}/data'
api: {{address: '{api}'}}
shutdown_timeout: 30s
cluster:
  listen: '{cluster}'
  advertise: '{cluster}'
  discovery: {{static: ['{a}', '{b}']}}
  on_peer_failure: {mode}
  forwarding: {{request_timeout: 1s, retry_backoff: 50ms, retry_backoff_max: 200ms, failures_before_down: 2, batch_bytes: 32KiB, max_in_flight: 256KiB}}
pipelines:
  web:
    workers: 2
    batch: {{size: 500, delay: 5ms}}
    queue: {{type: memory, max_events: 2000}}
    inputs: [{{type: tcp, address: '{input}', codec: json_lines}}]
    processors:
      - {{type: aggregate, identification_keys: [/user], group_duration: 500ms, action: count}}
    outputs: [{{type: file, path: '{{dir}}/agg.log'}}]
",
        api = n.api,
        cluster = n.cluster,
        a = n.members[0],
        b = n.members[1],
        mode = n.mode,
        input = n.input,
    )
}

struct NodeSpec<'a> {
    api: String,
    cluster: String,
    members: [&'a str; 2],
    mode: &'a str,
    input: String,
}

/// A running node: its process, its monitoring API, its input's and its cluster address.
struct Node {
    s: Sluice,
    api: String,
    input: String,
    cluster: String,
}

/// Waits until something listens at `addr`.
fn wait_listening(s: &mut Sluice, addr: &str) {
    let target: SocketAddr = addr.parse().unwrap();
    let started = Instant::now();
    while TcpStream::connect_timeout(&target, Duration::from_millis(500)).is_err() {
        if let Ok(Some(status)) = s.child.try_wait() {
            panic!("sluice exited ({status}) at start:\n{}", s.log());
        }
        assert!(started.elapsed() < Duration::from_secs(30), "{addr} did not come up:\n{}", s.log());
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Node {
    fn cluster_stats(&self) -> serde_json::Value {
        cluster_stats(&self.api)
    }

    /// Events the pipeline's inputs accepted.
    fn accepted(&self) -> u64 {
        accepted(&self.api, "web")
    }

    /// How this node sees `peer` (`connecting`, `up`, `down`, `probing`).
    fn peer_state(&self, peer: &str) -> String {
        peer_state(&self.api, peer)
    }

    fn output(&self) -> std::path::PathBuf {
        self.s.path("agg.log")
    }

    fn output_len(&self) -> u64 {
        std::fs::metadata(self.output()).map(|m| m.len()).unwrap_or(0)
    }
}

/// Node A in the root namespace on the pair's outside address (api and input on loopback),
/// node B inside the namespace on its inside address (api and input there too).
fn start_pair(net: &Netns, mode: &str) -> (Node, Node) {
    let a_cluster = format!("{}:7100", net.outside_ip);
    let b_cluster = format!("{}:7100", net.inside_ip);
    let members = [a_cluster.as_str(), b_cluster.as_str()];
    let b_input = format!("{}:5000", net.inside_ip);
    let spec = NodeSpec {
        api: format!("{}:0", net.inside_ip),
        cluster: b_cluster.clone(),
        members,
        mode,
        input: b_input.clone(),
    };
    let mut s =
        Sluice::start_wrapped(tempfile::tempdir().unwrap(), &config(&spec), &["ip", "netns", "exec", &net.name]);
    let api = s.api();
    wait_listening(&mut s, &b_input);
    let b = Node { s, api, input: b_input, cluster: b_cluster.clone() };
    let a_input = format!("127.0.0.1:{}", free_port());
    let spec =
        NodeSpec { api: "127.0.0.1:0".into(), cluster: a_cluster.clone(), members, mode, input: a_input.clone() };
    let mut s = Sluice::start_in(tempfile::tempdir().unwrap(), &config(&spec), Stdio::null());
    let api = s.api();
    wait_listening(&mut s, &a_input);
    (Node { s, api, input: a_input, cluster: a_cluster }, b)
}

fn total(nodes: &[&Node]) -> u64 {
    nodes.iter().map(|n| aggregate_counts(&n.output()).values().sum::<u64>()).sum()
}

/// Every user's aggregates are on exactly one node; returns the sum of all counts.
fn assert_each_user_on_one_node(nodes: &[&Node]) -> u64 {
    let outputs: Vec<(String, std::path::PathBuf)> = nodes.iter().map(|n| (n.cluster.clone(), n.output())).collect();
    each_user_on_one_node(&outputs, USERS)
}

/// SIGTERM to both nodes at once, then waits for each to drain; prints their summaries.
fn stop_both(a: &mut Node, b: &mut Node) {
    a.s.signal("TERM");
    b.s.signal("TERM");
    for n in [a, b] {
        let (status, log) = n.s.wait(Duration::from_secs(90));
        eprintln!("{}: {status} {:?}", n.cluster, summary(&log, "web"));
        // What the links and the cluster port said: the first thing to read when a test fails.
        for line in log.lines().filter(|l| l.contains("WARN sluice_cluster")).take(20) {
            eprintln!("  {line}");
        }
    }
}

fn event(n: u64, pad: usize) -> String {
    format!("{{\"user\":\"u{}\",\"n\":{n},\"pad\":\"{}\"}}\n", n % USERS, "x".repeat(pad))
}

/// Sends numbered events on one connection in chunks until told to stop; returns how many.
fn steady_sender(addr: String, stop: Arc<AtomicBool>, sent: Arc<AtomicU64>) -> u64 {
    let mut conn = TcpStream::connect(addr).unwrap();
    let mut next = 0;
    while !stop.load(Ordering::SeqCst) {
        let chunk: String = (next..next + 250).map(|n| event(n, 20)).collect();
        conn.write_all(chunk.as_bytes()).unwrap();
        next += 250;
        sent.store(next, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(20));
    }
    conn.shutdown(std::net::Shutdown::Write).unwrap();
    next
}

struct Traffic {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<u64>,
}

impl Traffic {
    fn start(addr: &str) -> Traffic {
        let (stop, sent) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let (addr, flag, n) = (addr.to_string(), stop.clone(), sent.clone());
        let thread = std::thread::spawn(move || steady_sender(addr, flag, n));
        Traffic { stop, sent, thread }
    }

    fn sent_so_far(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }

    fn finish(self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap()
    }
}

/// Waits until the peer took part in the traffic, so that the link is up before the cut.
fn wait_forwarding(a: &Node, b: &Node) {
    assert!(
        eventually(Duration::from_secs(30), || b.cluster_stats()["events"]["received"].as_u64() > Some(0)
            && a.peer_state(&b.cluster) == "up"),
        "nothing reached the peer before the cut: {}",
        a.cluster_stats()
    );
}

#[test]
fn a_peer_cut_off_with_hold_loses_nothing_once_the_link_returns() {
    let Some(net) = netns("a_peer_cut_off_with_hold_loses_nothing_once_the_link_returns") else { return };
    let (mut a, mut b) = start_pair(&net, "hold");
    let traffic = Traffic::start(&a.input);
    wait_forwarding(&a, &b);
    net.link(false);
    let cut = Instant::now();
    let mut states = BTreeSet::new();
    let left_up = eventually(Duration::from_secs(15), || {
        let state = a.peer_state(&b.cluster);
        states.insert(state.clone());
        state != "up"
    });
    assert!(left_up, "the cut-off peer is still `up`: {}", a.cluster_stats());
    // Backpressure: the window fills, then the queue, then the input stops taking events.
    std::thread::sleep(Duration::from_secs(2).saturating_sub(cut.elapsed()));
    let before = a.accepted();
    std::thread::sleep(Duration::from_secs(1));
    let after = a.accepted();
    let c = a.cluster_stats();
    let state = c["peers"][&b.cluster]["state"].as_str().unwrap_or("?").to_string();
    states.insert(state.clone());
    eprintln!(
        "while {} is cut off: accepted {before} then {after} of {} sent; states seen {states:?}; peer {}",
        b.cluster,
        traffic.sent_so_far(),
        c["peers"][&b.cluster]
    );
    assert_ne!(state, "up", "{c}");
    assert_eq!(before, after, "the node kept accepting with its peer cut off (no backpressure)");
    assert!(after < traffic.sent_so_far(), "the node took everything although its peer was cut off");
    assert!(c["peers"][&b.cluster]["bytes_in_flight"].as_u64().unwrap() > 0, "{c}");
    std::thread::sleep(CUT.saturating_sub(cut.elapsed()));
    net.link(true);
    eprintln!("link up again after {:?}", cut.elapsed());
    assert!(
        eventually(Duration::from_secs(30), || a.peer_state(&b.cluster) == "up"),
        "the peer did not come back up after the link did: {}",
        a.cluster_stats()
    );
    std::thread::sleep(Duration::from_secs(1));
    let sent = traffic.finish();
    let both = [&a, &b];
    let settled = eventually(Duration::from_secs(60), || total(&both) >= sent);
    stop_both(&mut a, &mut b);
    let sum = assert_each_user_on_one_node(&[&a, &b]);
    eprintln!(
        "sent {sent}, counts summed {sum}, duplicates {} (settled before shutdown: {settled})",
        sum as i64 - sent as i64
    );
    assert_eq!(sum, sent, "with `hold` every event is counted once");
}

#[test]
fn a_peer_cut_off_with_local_keeps_flowing() {
    let Some(net) = netns("a_peer_cut_off_with_local_keeps_flowing") else { return };
    let (mut a, mut b) = start_pair(&net, "local");
    let traffic = Traffic::start(&a.input);
    wait_forwarding(&a, &b);
    net.link(false);
    let cut = Instant::now();
    let mut states = BTreeSet::new();
    let down = eventually(Duration::from_secs(15), || {
        let state = a.peer_state(&b.cluster);
        states.insert(state.clone());
        matches!(state.as_str(), "down" | "probing")
    });
    assert!(down, "the cut-off peer is not marked down (states seen {states:?}): {}", a.cluster_stats());
    assert!(
        eventually(Duration::from_secs(15), || a.cluster_stats()["events"]["local_fallback"].as_u64() > Some(0)),
        "no event of the cut-off peer was processed here: {}",
        a.cluster_stats()
    );
    let (len, sent_then) = (a.output_len(), traffic.sent_so_far());
    assert!(
        eventually(Duration::from_secs(15), || a.output_len() > len && traffic.sent_so_far() > sent_then),
        "the output stopped growing (or the client stopped sending) while the peer was cut off"
    );
    let c = a.cluster_stats();
    states.insert(c["peers"][&b.cluster]["state"].as_str().unwrap_or("?").to_string());
    eprintln!("while {} is cut off ({:?} in): states seen {states:?}; {c}", b.cluster, cut.elapsed());
    let wait_max = c["worker_wait_max_seconds"].as_f64().unwrap();
    assert!(wait_max < 2.0, "a worker waited {wait_max}s on the cut-off peer (request_timeout is 1s)");
    std::thread::sleep(CUT.saturating_sub(cut.elapsed()));
    net.link(true);
    eprintln!("link up again after {:?}", cut.elapsed());
    assert!(
        eventually(Duration::from_secs(30), || a.peer_state(&b.cluster) == "up"),
        "the peer did not come back up after the link did: {}",
        a.cluster_stats()
    );
    std::thread::sleep(Duration::from_secs(1));
    let sent = traffic.finish();
    let both = [&a, &b];
    let settled = eventually(Duration::from_secs(60), || total(&both) >= sent);
    stop_both(&mut a, &mut b);
    let sum = total(&[&a, &b]);
    eprintln!(
        "sent {sent}, counts summed {sum}, duplicates {} (settled before shutdown: {settled})",
        sum as i64 - sent as i64
    );
    assert!(sum >= sent, "events were lost: sent {sent}, counted {sum}");
}

/// Over a lossy link frames time out, their connections are given up on and they are sent
/// again, some after the peer took them (their answers lost with the connection): while both
/// nodes run, every event is still taken once, by its owner. The test waits for the first
/// node to have had every answer before it stops both: a node that stops while a peer owes it
/// answers, and that peer stops too, processes those frames itself (at least once; see
/// docs/cluster.md, "Answers lost as nodes stop"), which is not what this test is about.
#[test]
fn a_lossy_link_delivers_everything() {
    let Some(net) = netns("a_lossy_link_delivers_everything") else { return };
    // 20% of the packets lost, each way: by netem on both ends of the pair where the kernel
    // has it, else by nftables inside the namespace (its input and output hooks are the two
    // directions of the pair).
    let tc = |netns: Option<&str>, dev: &str| -> Result<(), String> {
        let args = ["qdisc", "add", "dev", dev, "root", "netem", "loss", "20%"];
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, "tc"]);
                c
            }
            None => Command::new("tc"),
        };
        let out = cmd.args(args).output().map_err(|e| format!("tc: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("tc {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
        }
    };
    let nft = |netns: &str| -> Result<(), String> {
        const RULES: &str = "table inet sluice_loss {
  chain in { type filter hook input priority 0; policy accept; numgen random mod 5 == 0 drop; }
  chain out { type filter hook output priority 0; policy accept; numgen random mod 5 == 0 drop; }
}
";
        let mut child = Command::new("ip")
            .args(["netns", "exec", netns, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("nft: {e}"))?;
        child.stdin.take().expect("piped").write_all(RULES.as_bytes()).map_err(|e| format!("nft: {e}"))?;
        let out = child.wait_with_output().map_err(|e| format!("nft: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("nft -f: {}", String::from_utf8_lossy(&out.stderr).trim()))
        }
    };
    let lossy = match tc(Some(&net.name), &net.inside()) {
        Ok(()) => tc(None, &net.outside),
        Err(no_netem) => nft(&net.name).map_err(|no_nft| format!("{no_netem}; {no_nft}")),
    };
    if let Err(why) = lossy {
        let what = "a lossy link: the kernel's netem (tc) or nftables (the `nft` command), as root";
        sluice_testkit::root::root_unavailable(what, &why);
        return;
    }
    let (mut a, mut b) = start_pair(&net, "hold");
    const SENT: u64 = 10_000;
    let mut conn = TcpStream::connect(&a.input).unwrap();
    let text: String = (0..SENT).map(|n| event(n, 0)).collect();
    conn.write_all(text.as_bytes()).unwrap();
    conn.shutdown(std::net::Shutdown::Write).unwrap();
    let both = [&a, &b];
    // Every event aggregated, and every frame answered (nothing left for a stop to decide).
    let answered = || a.cluster_stats()["peers"][&b.cluster]["bytes_in_flight"].as_u64() == Some(0);
    let settled = eventually(Duration::from_secs(60), || total(&both) >= SENT && answered());
    let (c, received) = (a.cluster_stats(), b.cluster_stats()["events"]["received"].as_u64().unwrap());
    let peer = &c["peers"][&b.cluster];
    eprintln!("over the lossy link: peer {peer}; it took {received} events");
    assert!(settled, "not everything was aggregated and answered within 60 s: {peer}");
    // Frames sent again after the peer took them are answered, not taken twice.
    assert_eq!(peer["events_forwarded"].as_u64(), Some(received), "the peer took a frame twice: {peer}");
    stop_both(&mut a, &mut b);
    let sum = assert_each_user_on_one_node(&[&a, &b]);
    eprintln!("sent {SENT}, counts summed {sum}, duplicates {}", sum as i64 - SENT as i64);
    assert_eq!(sum, SENT, "with `hold` every event is counted once");
}
