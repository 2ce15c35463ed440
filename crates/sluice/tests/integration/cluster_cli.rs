//! `sluice cluster ring`, `sluice cluster route` and `sluice validate` on cluster configs.

use crate::common;

use std::process::Command;

use common::{BIN, validate};

const PIPELINE: &str = "pipelines:\n  web:\n    inputs: [{type: generator, count: 1}]\n    processors:\n      - {type: aggregate, identification_keys: [/user, /host], group_duration: 1s, action: count}\n    outputs: [{type: blackhole}]\n";

fn config(cluster: &str) -> String {
    format!("{cluster}{PIPELINE}")
}

const THREE: &str =
    "cluster:\n  listen: 127.0.0.1:7100\n  discovery: {static: [127.0.0.1:7100, 127.0.0.1:7101, 127.0.0.1:7102]}\n";

fn run(args: &[&str], config: &str) -> (bool, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.yml");
    std::fs::write(&path, config).unwrap();
    let mut full: Vec<&str> = vec!["cluster"];
    full.extend_from_slice(&args[..1]);
    full.extend(["-c", path.to_str().unwrap()]);
    full.extend_from_slice(&args[1..]);
    let out = Command::new(BIN).args(&full).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn ring_lists_every_member_and_shares_that_add_up() {
    let (ok, out, err) = run(&["ring", "--json"], &config(THREE));
    assert!(ok, "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let members = doc["members"].as_array().unwrap();
    assert_eq!(members.len(), 3);
    let total: f64 = members.iter().map(|m| m["share"].as_f64().unwrap()).sum();
    assert!((total - 1.0).abs() < 1e-9, "{out}");
    assert!(members.iter().all(|m| m["share"].as_f64().unwrap() > 0.2), "uneven: {out}");
    assert_eq!(members.iter().filter(|m| m["this_node"] == true).count(), 1);
    let (ok, text, _) = run(&["ring"], &config(THREE));
    assert!(
        ok && text.contains("127.0.0.1:7101") && text.contains("% of the keys") && text.contains("(this node)"),
        "{text}"
    );
}

#[test]
fn route_names_one_owner_the_same_from_every_node_and_spreads_keys() {
    let mut owners = std::collections::BTreeSet::new();
    for user in ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi"] {
        let key = format!("user={user}");
        let mut seen = Vec::new();
        for listen in ["127.0.0.1:7100", "127.0.0.1:7102"] {
            let cluster = THREE.replace("listen: 127.0.0.1:7100", &format!("listen: {listen}"));
            let (ok, out, err) = run(&["route", &key, "/host=web-1"], &config(&cluster));
            assert!(ok, "{err}");
            seen.push(out.trim().to_string());
        }
        assert_eq!(seen[0], seen[1], "two nodes disagree on the owner of {key}");
        assert!(seen[0].starts_with("127.0.0.1:710"), "{seen:?}");
        owners.insert(seen[0].clone());
    }
    assert!(owners.len() >= 2, "eight keys all went to one node: {owners:?}");
    // A number and the same digits as a string are two keys; a key left out is said so.
    let (_, _, err) = run(&["route", "user=5"], &config(THREE));
    assert!(err.contains("without /host"), "{err}");
    let (ok, _, err) = run(&["route", "port=5"], &config(THREE));
    assert!(!ok && err.contains("`/port` is not an identification key"), "{err}");
}

#[test]
fn cluster_config_errors_name_their_key() {
    let (ok, text) = validate(&config("cluster:\n  listen: nowhere\n  discovery: {static: [127.0.0.1:7100]}\n"));
    assert!(!ok && text.contains("cluster.listen") && text.contains("`nowhere` is not an address"), "{text}");
    let (ok, text) = validate(&config("cluster:\n  listen: 127.0.0.1:7100\n  discovery: {static: [127.0.0.1:7101]}\n"));
    assert!(!ok && text.contains("cluster.discovery") && text.contains("is not in the `static` list"), "{text}");
    let (ok, text) = validate(&config("cluster:\n  listen: 127.0.0.1:7100\n  discovery: {}\n"));
    assert!(!ok && text.contains("give `static: [host:port, ...]` or `dns: {name, port}`"), "{text}");
    let (ok, text) = validate(&config(
        "cluster:\n  listen: 127.0.0.1:7100\n  discovery: {static: [127.0.0.1:7100]}\n  on_peer_failure: drop\n",
    ));
    assert!(!ok && text.contains("on_peer_failure"), "{text}");
    let (ok, text) = validate(&config(
        "cluster:\n  listen: 127.0.0.1:7100\n  discovery: {static: [127.0.0.1:7100]}\n  forwarding: {batch_bytes: 8MiB, max_in_flight: 1MiB}\n",
    ));
    assert!(!ok && text.contains("`max_in_flight` (1MiB) must be at least `batch_bytes` (8MiB)"), "{text}");
    let (ok, text) = validate(&config(
        "cluster:\n  listen: 127.0.0.1:7100\n  discovery: {static: [127.0.0.1:7100]}\n  tls: {cert: /nonexistent/node.crt, key: /nonexistent/node.key, ca: /nonexistent/ca.crt}\n",
    ));
    assert!(!ok && text.contains("cluster.tls") && text.contains("/nonexistent/"), "{text}");
    let (ok, text) =
        validate(&config("cluster:\n  listen: 0.0.0.0:7100\n  discovery: {dns: {name: localhost, port: 7100}}\n"));
    assert!(!ok && text.contains("advertise"), "{text}");
    let (ok, text) = validate(&config(
        "cluster:\n  listen: 127.0.0.1:7100\n  discovery: {static: [127.0.0.1:7100]}\n  max_pending_handshakes: 0\n  handshake_timeout: 0s\n",
    ));
    assert!(!ok && text.contains("cluster.max_pending_handshakes") && text.contains("out of range"), "{text}");
    assert!(text.contains("cluster.handshake_timeout") && text.contains("more than 0"), "{text}");
    let (ok, text) = validate(&config(THREE));
    assert!(ok, "{text}");
}
