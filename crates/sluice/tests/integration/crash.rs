//! Crash safety with the persisted queue, through the real binary: a client posts numbered
//! events to the `http` input (which answers 200 only once they are fsynced in the queue) while
//! the harness kills `sluice` with SIGKILL at random moments and starts it again. At the end,
//! every event that was answered 200 must be in the output; duplicates are counted and
//! reported. `SLUICE_CRASH_CYCLES` sets the number of kills (default 30).

use crate::common;

use std::collections::BTreeSet;

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;

const BATCH: u64 = 40;

fn config(port: u16, direct_io: bool) -> String {
    format!(
        "data_dir: '{{dir}}/data'
api: {{address: '127.0.0.1:0'}}
pipelines:
  p:
    workers: 2
    batch: {{size: 200, delay: 5ms}}
    queue: {{type: persisted, shards: 2, sync: commit, segment_bytes: 256KiB, max_bytes: 64MiB, checkpoint_interval: 50ms, direct_io: {direct_io}}}
    inputs: [{{type: http, address: '127.0.0.1:{port}'}}]
    outputs: [{{type: file, path: '{{dir}}/out.log'}}]
"
    )
}

/// Posts batches until told to stop or the server goes away; returns the ids answered 200.
fn client(port: u16, first: u64, stop: Arc<AtomicBool>) -> (Vec<u64>, u64) {
    let addr = format!("127.0.0.1:{port}");
    let mut acked = Vec::new();
    let mut next = first;
    while !stop.load(Ordering::SeqCst) {
        let body: String =
            (next..next + BATCH).map(|n| format!("{{\"n\":{n},\"message\":\"crash test event {n}\"}}\n")).collect();
        next += BATCH;
        let ok = matches!(try_http(&addr, "POST", "/", &[], body.as_bytes()), Ok((200, _)));
        if !ok {
            break;
        }
        acked.extend(next - BATCH..next);
    }
    (acked, next)
}

#[test]
fn sigkill_at_random_moments_loses_no_acknowledged_event() {
    sigkill_cycles(false);
}

/// With `direct_io` a write rewrites the last partial block: a kill in the middle of it must
/// not damage the acknowledged frames that block already held.
#[test]
fn sigkill_under_direct_io_loses_no_acknowledged_event() {
    sigkill_cycles(true);
}

fn sigkill_cycles(direct_io: bool) {
    let cycles = crash_cycles();
    let mut rng = Rng::from_env();
    let seed = rng.seed();
    let port = free_port();
    let cfg = config(port, direct_io);
    let mut dir = tempfile::tempdir().unwrap();
    let mut acked: Vec<u64> = Vec::new();
    let mut next = 0u64;
    for _ in 0..cycles {
        let mut s = Sluice::start_in(dir, &cfg, Stdio::null());
        s.wait_port(port);
        let stop = Arc::new(AtomicBool::new(false));
        let (first, flag) = (next, stop.clone());
        let c = std::thread::spawn(move || client(port, first, flag));
        std::thread::sleep(Duration::from_millis(20 + rng.next_u64() % 250));
        dir = s.kill_into_dir();
        stop.store(true, Ordering::SeqCst);
        let (ids, n) = c.join().unwrap();
        acked.extend(ids);
        next = n;
    }
    // A last run to deliver what the queue still holds, then a clean stop.
    let mut s = Sluice::start_in(dir, &cfg, Stdio::null());
    let api = s.api();
    wait_until("the queue to empty", Duration::from_secs(60), || {
        get_json(&api, "/stats")["pipelines"]["p"]["queue"]["bytes"].as_u64() == Some(0)
    });
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    let seen = numbers_after(&s.path("out.log"), r#""n":"#);
    let missing: Vec<u64> = acked.iter().copied().filter(|n| !seen.contains_key(n)).collect();
    let duplicates: u32 = seen.values().map(|c| c - 1).sum();
    eprintln!(
        "crash test (direct_io {direct_io}, seed {seed}): {cycles} kills, {} events acknowledged, {} delivered, {duplicates} duplicates, {} missing",
        acked.len(),
        seen.len(),
        missing.len()
    );
    assert!(acked.len() as u64 > 10 * BATCH, "the client got events through ({} acked)", acked.len());
    assert!(
        missing.is_empty(),
        "acknowledged events missing from the output (seed {seed}): {:?}",
        &missing[..missing.len().min(20)]
    );
    let unknown: BTreeSet<u64> = seen.keys().copied().filter(|n| *n >= next).collect();
    assert!(unknown.is_empty(), "events nobody sent: {unknown:?}");
}

#[test]
fn persisted_queue_metrics_are_exported() {
    // stdin stays open, so the process runs on after the generator is done.
    let mut s = Sluice::start_with(
        "data_dir: '{dir}/data'
api: {address: '127.0.0.1:0'}
pipelines:
  m:
    queue: {type: persisted, shards: 2}
    inputs:
      - {type: generator, count: 3000}
      - {type: stdin}
    outputs: [{type: blackhole}]
",
        Stdio::piped(),
    );
    let api = s.api();
    wait_until("all events", Duration::from_secs(30), || {
        get_json(&api, "/stats")["pipelines"]["m"]["events"]["out"].as_u64() == Some(3000)
    });
    let stats = get_json(&api, "/stats");
    let q = &stats["pipelines"]["m"]["queue"];
    assert_eq!(q["kind"], "persisted");
    assert_eq!(q["shards"].as_array().unwrap().len(), 2);
    // With direct I/O the workers may deliver a group before its write (and fdatasync), which
    // follows within milliseconds.
    wait_until("the queue's first fdatasync", Duration::from_secs(10), || {
        get_json(&api, "/stats")["pipelines"]["m"]["queue"]["fsyncs"].as_u64() > Some(0)
    });
    wait_until("acks to settle", Duration::from_secs(10), || {
        get_json(&api, "/stats")["pipelines"]["m"]["queue"]["bytes"].as_u64() == Some(0)
    });
    let (_, text) = http(&api, "GET", "/metrics", &[], b"");
    assert!(metric(&text, "sluice_queue_fsyncs_total{pipeline=\"m\"}") > 0.0);
    assert_eq!(metric(&text, "sluice_queue_shard_bytes{pipeline=\"m\",shard=\"0\"}"), 0.0);
    assert_eq!(metric(&text, "sluice_queue_corrupt_frames_total{pipeline=\"m\"}"), 0.0);
    assert_eq!(metric(&text, "sluice_queue_unstored_events_total{pipeline=\"m\"}"), 0.0);
    assert!(metric(&text, "sluice_queue_commit_duration_seconds_count{pipeline=\"m\"}") > 0.0);
    // Every event was handed to the workers once, from memory or read back.
    let handed = metric(&text, "sluice_queue_events_from_memory_total{pipeline=\"m\"}")
        + metric(&text, "sluice_queue_events_read_back_total{pipeline=\"m\"}");
    assert_eq!(handed, 3000.0, "{text}");
    assert_eq!(q["events_from_memory"].as_u64().unwrap() + q["events_read_back"].as_u64().unwrap(), 3000, "{q}");
}
