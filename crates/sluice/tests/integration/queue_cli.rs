//! `sluice queue stats` and `sluice queue verify` on a queue left by a real run: a generator
//! feeds an `http` output pointed at a closed port, so nothing is acknowledged, and SIGTERM
//! keeps the persisted queue's backlog on disk.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::*;

fn queue(args: &[&str]) -> Output {
    Command::new(BIN).arg("queue").args(args).output().unwrap()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn segments(queue_dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for shard in std::fs::read_dir(queue_dir).unwrap() {
        let shard = shard.unwrap().path();
        if shard.is_dir() {
            for f in std::fs::read_dir(&shard).unwrap() {
                let f = f.unwrap().path();
                if f.extension().is_some_and(|x| x == "seg") {
                    out.push(f);
                }
            }
        }
    }
    out
}

#[test]
fn stats_and_verify_a_queue_left_by_sigterm() {
    let port = free_port(); // nothing listens there: the output retries forever
    let config = format!(
        "data_dir: '{{dir}}/data'
api: {{address: '127.0.0.1:0'}}
shutdown_timeout: 1s
pipelines:
  p:
    queue: {{type: persisted, shards: 2, segment_bytes: 256KiB}}
    inputs: [{{type: generator, rate: 20000}}]
    outputs: [{{type: http, url: 'http://127.0.0.1:{port}/', retry: {{initial_backoff: 50ms, max_backoff: 200ms}}}}]
"
    );
    let mut s = Sluice::start(&config);
    s.wait_log("pipeline started", Duration::from_secs(20));
    std::thread::sleep(Duration::from_secs(1));
    let (_, log) = s.stop();
    let counts = summary(&log, "p");
    assert!(counts["queued"] > 0, "events left in the queue:\n{log}");
    // The batches the workers held when the drain timeout aborted their retries are counted as
    // `unfinished`, yet their range was never checkpointed: they are still on disk, unacked.
    let queued = counts["queued"] + counts["unfinished"];
    let dir = s.path("data/queue/p");
    let dir_arg = dir.to_str().unwrap();

    let out = queue(&["stats", dir_arg, "--json"]);
    assert!(out.status.success(), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["totals"]["unacked_events"], queued, "{report:#}\n{log}");
    assert_eq!(report["totals"]["damaged"], 0, "{report:#}");
    assert_eq!(report["shards"].as_array().unwrap().len(), 2);
    assert_eq!(report["in_use"], false);

    let out = queue(&["stats", dir_arg]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(&format!("unacked {queued} events")), "{}", text(&out));
    assert!(text(&out).contains("checksums verified"), "{}", text(&out));

    let out = queue(&["verify", dir_arg]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));

    // A byte flipped in the middle of the live data of the segment with the most.
    let (seg, live) = report["shards"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["segments"].as_array().unwrap())
        .map(|g| (PathBuf::from(g["file"].as_str().unwrap()), g["live_bytes"].as_u64().unwrap()))
        .max_by_key(|(_, live)| *live)
        .unwrap();
    assert!(segments(&dir).contains(&seg));
    let mut bytes = std::fs::read(&seg).unwrap();
    let at = live as usize / 2;
    bytes[at] ^= 0x20;
    std::fs::write(&seg, &bytes).unwrap();
    let out = queue(&["verify", dir_arg]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("{} offset ", seg.display())), "{}", text(&out));
    let out = queue(&["verify", dir_arg, "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let damage: Vec<&serde_json::Value> = report["shards"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["segments"].as_array().unwrap())
        .flat_map(|g| g["damage"].as_array().unwrap())
        .collect();
    assert_eq!(damage.len(), 1, "{report:#}");
    assert_eq!(damage[0]["file"], seg.to_str().unwrap());
    assert!(damage[0]["offset"].as_u64().unwrap() <= at as u64);

    // Not a queue directory: exit 2, naming the path.
    let data = s.path("data");
    let out = queue(&["verify", data.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains(data.to_str().unwrap()), "{}", text(&out));
    assert!(text(&out).contains("not a persisted queue directory"), "{}", text(&out));
}
