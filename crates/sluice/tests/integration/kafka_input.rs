//! The `kafka` input against a real Kafka 4.3 broker (KRaft) started from Maven Central jars
//! (`servers/kafka/run`), through the real binary with a persisted queue and a file output:
//! - every record of a 3-partition topic arrives once, with its topic, partition, offset, key
//!   and timestamp where configured, and a clean restart resumes exactly at the committed
//!   offsets;
//! - SIGKILL at random moments while consuming loses nothing (duplicates are counted and
//!   printed);
//! - two processes in one group share the partitions, and when one stops the other takes its
//!   partitions over;
//! - the broker stopped and started mid-load loses nothing;
//! - a pipeline held full for longer than `max.poll.interval.ms` pauses the consumer
//!   (subscribed by a `^regex`), which keeps its partitions and loses nothing.
//!
//! A test that cannot start the broker fails and says why. `SLUICE_CRASH_CYCLES` sets the
//! number of kills (default 30).

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use sluice_testkit::kafka::Kafka;

/// A node: persisted queue, the kafka input (JSON records, from the earliest offset), a file
/// output. `extra` is added to the input's settings.
fn config(kafka: &Kafka, topic: &str, group: &str, extra: &str) -> String {
    format!(
        "data_dir: '{{dir}}/data'
api: {{address: '127.0.0.1:0'}}
pipelines:
  p:
    workers: 2
    batch: {{size: 500, delay: 5ms}}
    queue: {{type: persisted, shards: 2, max_bytes: 256MiB, checkpoint_interval: 50ms}}
    inputs:
      - {{type: kafka, bootstrap_servers: '{}', topics: [{topic}], group_id: {group}, codec: json,
          auto_offset_reset: earliest, commit_interval: 200ms{extra}}}
    outputs: [{{type: file, path: '{{dir}}/out.log'}}]
",
        kafka.bootstrap()
    )
}

/// Writes records `{"n": i, ...}` for every `i` of `ids`, keyed so that they spread over the
/// partitions.
fn produce(kafka: &Kafka, topic: &str, ids: std::ops::Range<u64>, pad: usize) {
    let pad = "x".repeat(pad);
    let owned: Vec<(String, String)> = ids
        .map(|i| (format!("key-{}", i % 101), format!("{{\"n\":{i},\"message\":\"record {i}\",\"pad\":\"{pad}\"}}")))
        .collect();
    let records: Vec<(Option<&[u8]>, &[u8])> = owned.iter().map(|(k, v)| (Some(k.as_bytes()), v.as_bytes())).collect();
    kafka.produce(topic, &records);
}

/// How often each record number appears in the output files.
fn seen(outputs: &[&Path]) -> BTreeMap<u64, u32> {
    let mut all = BTreeMap::new();
    for path in outputs {
        for (n, c) in numbers_after(path, r#""n":"#) {
            *all.entry(n).or_insert(0) += c;
        }
    }
    all
}

/// Waits until every record number below `n` is in the outputs; panics with what is missing.
fn wait_for_all(outputs: &[&Path], n: u64, timeout: Duration, what: &str) -> BTreeMap<u64, u32> {
    let mut s = BTreeMap::new();
    if eventually(timeout, || {
        s = seen(outputs);
        (0..n).all(|i| s.contains_key(&i))
    }) {
        return s;
    }
    let missing: Vec<u64> = (0..n).filter(|i| !s.contains_key(i)).collect();
    panic!(
        "{what}: {} of {n} records missing after {timeout:?}, such as {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
}

fn duplicates(s: &BTreeMap<u64, u32>) -> u32 {
    s.values().map(|c| c - 1).sum()
}

/// The kafka input's `state` in `/stats`.
fn input_state(api: &str) -> serde_json::Value {
    let stats = get_json(api, "/stats");
    let components = stats["pipelines"]["p"]["components"].as_array().cloned().unwrap_or_default();
    components.into_iter().find(|c| c["type"] == "kafka").map(|c| c["state"].clone()).unwrap_or_default()
}

/// The sum of a per-partition figure (`committed_offset`, `lag`) over the partitions.
fn per_partition_sum(state: &serde_json::Value, name: &str) -> u64 {
    state[name].as_array().map(|rows| rows.iter().filter_map(|r| r["value"].as_u64()).sum()).unwrap_or(0)
}

/// The partitions of the last assignment the node logged (`logs/0,logs/2`), empty if none yet.
fn last_assignment(log: &str) -> String {
    log.lines()
        .rev()
        .find(|l| l.contains("kafka input assigned partitions"))
        .and_then(|l| l.split("partitions=").nth(1))
        .map(|rest| rest.split_whitespace().next().unwrap_or("").trim_matches('"').to_string())
        .unwrap_or_default()
}

#[test]
fn every_record_of_a_three_partition_topic_arrives_and_a_restart_resumes_at_the_commit() {
    let kafka = Kafka::start_or_panic(&[]);
    kafka.create_topic("logs", 3);
    let n = 50_000;
    produce(&kafka, "logs", 0..n, 40);
    // The record's facts moved out of @metadata, so that the output shows them.
    let cfg = config(
        &kafka,
        "logs",
        "sluice",
        ", topic_field: /kafka/topic, partition_field: /kafka/partition, offset_field: /kafka/offset, \
         key_field: /kafka/key, timestamp_field: /kafka/timestamp",
    );
    let mut s = Sluice::start(&cfg);
    let api = s.api();
    let out = s.path("out.log");
    let started = Instant::now();
    let got = wait_for_all(&[&out], n, Duration::from_secs(90), "first run");
    eprintln!("{n} records consumed and written in {:?}", started.elapsed());
    assert_eq!(duplicates(&got), 0, "a single member with no failure reads each record once");
    // Each record once by its coordinates, with its topic, key and timestamp.
    let text = std::fs::read_to_string(&out).unwrap();
    let mut coordinates = std::collections::BTreeSet::new();
    for line in text.lines() {
        let e: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let k = &e["kafka"];
        assert_eq!(k["topic"], "logs", "{line}");
        assert_eq!(k["key"], format!("key-{}", e["n"].as_u64().unwrap() % 101), "{line}");
        assert!(k["timestamp"].is_string(), "{line}");
        let at = (k["partition"].as_u64().unwrap(), k["offset"].as_u64().unwrap());
        assert!(at.0 < 3 && coordinates.insert(at), "{line}");
    }
    assert_eq!(coordinates.len() as u64, n);
    // Every offset committed once acknowledged: the sum of the partitions' committed offsets
    // is the number of records, and the lag is 0.
    let committed = eventually(Duration::from_secs(20), || {
        let state = input_state(&api);
        per_partition_sum(&state, "committed_offset") == n && per_partition_sum(&state, "lag") == 0
    });
    let state = input_state(&api);
    assert!(committed, "every offset committed, the lag 0: {state}\n{}", s.log());
    assert_eq!(state["records_consumed"], n, "{state}");
    assert_eq!(state["partitions_assigned"], 3, "{state}");
    // Received bytes: the records' values as produced (keys not counted).
    let values: usize =
        (0..n).map(|i| format!("{{\"n\":{i},\"message\":\"record {i}\",\"pad\":\"{}\"}}", "x".repeat(40)).len()).sum();
    let stats = get_json(&api, "/stats");
    let input = &stats["pipelines"]["p"]["components"][0];
    assert_eq!(
        (&input["type"], &input["bytes_in"]),
        (&serde_json::json!("kafka"), &serde_json::json!(values)),
        "{input}"
    );
    assert!(state["offset_commits"].as_u64() > Some(0), "{state}");
    assert_eq!(state["offset_commit_failures"], 0, "{state}");
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("kafka input gave up partitions (shutdown)"), "{log}");

    // A clean restart resumes at the committed offsets: only the new records arrive.
    produce(&kafka, "logs", n..n + 1000, 40);
    let dir = s.into_dir();
    let mut s = Sluice::start_in(dir, &cfg, Stdio::null());
    let api = s.api();
    let got = wait_for_all(&[&out], n + 1000, Duration::from_secs(60), "after the restart");
    assert_eq!(duplicates(&got), 0, "nothing read twice after a clean stop");
    wait_until("the new records counted", Duration::from_secs(10), || input_state(&api)["records_consumed"] == 1000);
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn sigkill_while_consuming_loses_no_record() {
    let kafka = Kafka::start_or_panic(&[]);
    kafka.create_topic("crash", 3);
    let cycles = crash_cycles();
    let mut rng = Rng::from_env();
    let seed = rng.seed();
    // Static membership: a restarted process takes its predecessor's place at once, instead of
    // waiting for the killed member's session to time out.
    let cfg = config(&kafka, "crash", "crashers", ", librdkafka_options: {group.instance.id: sluice-crash-test}");
    // Records keep arriving while the node is killed and started again.
    let kafka = Arc::new(kafka);
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (kafka, stop) = (kafka.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut next = 0u64;
            while !stop.load(Ordering::SeqCst) {
                produce(&kafka, "crash", next..next + 4000, 100);
                next += 4000;
            }
            next
        })
    };
    let mut dir = tempfile::tempdir().unwrap();
    let mut killed_while_consuming = 0;
    for _ in 0..cycles {
        let out = dir.path().join("out.log");
        let before = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
        let mut s = Sluice::start_in(dir, &cfg, Stdio::null());
        // Until it writes something new (or a few seconds: the producer may be between calls).
        let grew =
            eventually(Duration::from_secs(5), || std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0) > before);
        std::thread::sleep(Duration::from_millis(rng.next_u64() % 800));
        if let Ok(Some(status)) = s.child.try_wait() {
            panic!("sluice exited ({status}) before it was killed:\n{}", s.log());
        }
        killed_while_consuming += usize::from(grew);
        dir = s.kill_into_dir();
    }
    stop.store(true, Ordering::SeqCst);
    let produced = producer.join().unwrap();
    // A last run delivers what the queue holds and reads the rest, then stops cleanly.
    let mut s = Sluice::start_in(dir, &cfg, Stdio::null());
    let api = s.api();
    let out = s.path("out.log");
    let got = wait_for_all(&[&out], produced, Duration::from_secs(90), "after the kills");
    let last_run = input_state(&api)["records_consumed"].as_u64().unwrap_or(0);
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    let unknown: Vec<u64> = got.keys().copied().filter(|n| *n >= produced).collect();
    eprintln!(
        "kafka crash test (seed {seed}): {cycles} kills ({killed_while_consuming} after new output), {produced} records \
         produced, {} delivered, {} duplicates, 0 missing; the last run read {last_run}",
        got.len(),
        duplicates(&got)
    );
    assert!(unknown.is_empty(), "records nobody produced: {unknown:?}");
    assert!(last_run < produced, "the killed runs committed offsets: the last run read {last_run} of {produced}");
    assert!(
        killed_while_consuming * 2 >= cycles,
        "most kills hit a node that was consuming ({killed_while_consuming})"
    );
}

#[test]
fn two_processes_share_the_partitions_and_one_takes_over_when_the_other_stops() {
    let kafka = Kafka::start_or_panic(&[]);
    kafka.create_topic("shared", 3);
    let cfg = config(&kafka, "shared", "pair", "");
    let mut a = Sluice::start(&cfg);
    let mut b = Sluice::start(&cfg);
    // Both members are in the group and own partitions.
    wait_until("both members to own partitions", Duration::from_secs(60), || {
        let (la, lb) = (last_assignment(&a.log()), last_assignment(&b.log()));
        !la.is_empty() && !lb.is_empty() && la.split(',').count() + lb.split(',').count() == 3
    });
    eprintln!("a owns {}, b owns {}", last_assignment(&a.log()), last_assignment(&b.log()));
    let half = 20_000;
    produce(&kafka, "shared", 0..half, 40);
    let (out_a, out_b) = (a.path("out.log"), b.path("out.log"));
    wait_for_all(&[&out_a, &out_b], half, Duration::from_secs(60), "with two members");
    let (on_a, on_b) = (seen(&[&out_a]).len(), seen(&[&out_b]).len());
    eprintln!("records on a: {on_a}, on b: {on_b}");
    assert!(on_a > 0 && on_b > 0, "both members got records (a {on_a}, b {on_b})");

    // b stops cleanly: it commits and leaves the group, and a takes every partition over.
    let (status, log_b) = b.stop();
    assert!(status.success(), "{log_b}");
    assert!(log_b.contains("kafka input gave up partitions"), "{log_b}");
    wait_until("a to own all three partitions", Duration::from_secs(60), || {
        last_assignment(&a.log()).split(',').count() == 3
    });
    assert!(a.log().contains("kafka input gave up partitions (revoked by a rebalance)"), "{}", a.log());
    produce(&kafka, "shared", half..2 * half, 40);
    let after: Vec<u64> = (half..2 * half).collect();
    let missing = || {
        let s = seen(&[&out_a]);
        after.iter().filter(|n| !s.contains_key(n)).count()
    };
    let all = eventually(Duration::from_secs(60), || missing() == 0);
    assert!(all, "a is missing {} of the records written after b left", missing());
    let got = wait_for_all(&[&out_a, &out_b], 2 * half, Duration::from_secs(10), "in all");
    let (status, log_a) = a.stop();
    assert!(status.success(), "{log_a}");
    eprintln!("two members: {} records, {} duplicates, 0 missing", got.len(), duplicates(&got));
}

#[test]
fn the_broker_stopped_and_started_mid_load_loses_nothing() {
    let mut kafka = Kafka::start_or_panic(&[]);
    kafka.create_topic("outage", 3);
    let first = 25_000;
    produce(&kafka, "outage", 0..first, 300);
    let cfg = config(&kafka, "outage", "outage", "");
    let mut s = Sluice::start(&cfg);
    let api = s.api();
    let out = s.path("out.log");
    wait_until("the first records", Duration::from_secs(60), || !seen(&[&out]).is_empty());
    kafka.stop();
    let during = seen(&[&out]).len();
    eprintln!("broker stopped with {during} of {first} records written");
    std::thread::sleep(Duration::from_secs(3));
    if let Ok(Some(status)) = s.child.try_wait() {
        panic!("sluice exited ({status}) while the broker was down:\n{}", s.log());
    }
    kafka.restart_or_panic();
    produce(&kafka, "outage", first..2 * first, 300);
    let got = wait_for_all(&[&out], 2 * first, Duration::from_secs(120), "after the outage");
    let state = input_state(&api);
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    eprintln!(
        "broker outage: {} records, {} duplicates, 0 missing; commit failures {}, rebalances {}",
        got.len(),
        duplicates(&got),
        state["offset_commit_failures"],
        state["rebalances"]
    );
}

#[test]
fn a_full_pipeline_pauses_the_consumer_which_keeps_its_partitions() {
    let kafka = Kafka::start_or_panic(&[]);
    kafka.create_topic("slow", 3);
    let n = 15_000;
    produce(&kafka, "slow", 0..n, 40);
    // An endpoint that answers 503 (retried: the pipeline waits) until it is opened.
    let open = Arc::new(AtomicBool::new(false));
    let received = Arc::new(Mutex::new(BTreeMap::<u64, u32>::new()));
    let url = {
        let (open, received) = (open.clone(), received.clone());
        serve_http(move |body| {
            if !open.load(Ordering::SeqCst) {
                return "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n".into();
            }
            let text = String::from_utf8_lossy(body);
            let mut r = received.lock().unwrap();
            for piece in text.split(r#""n":"#).skip(1) {
                let digits: String = piece.chars().take_while(char::is_ascii_digit).collect();
                *r.entry(digits.parse().unwrap()).or_insert(0) += 1;
            }
            "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".into()
        })
    };
    let cfg = format!(
        "api: {{address: '127.0.0.1:0'}}
pipelines:
  p:
    queue: {{type: memory, max_events: 1000}}
    inputs:
      - {{type: kafka, bootstrap_servers: '{}', topics: ['^sl.w$'], group_id: slow, codec: json, auto_offset_reset: earliest,
          commit_interval: 200ms, revoke_timeout: 3s,
          librdkafka_options: {{session.timeout.ms: '6000', max.poll.interval.ms: '7000'}}}}
    outputs: [{{type: http, url: 'http://{url}/', retry: {{initial_backoff: 100ms, max_backoff: 500ms}}}}]
",
        kafka.bootstrap()
    );
    let mut s = Sluice::start(&cfg);
    let api = s.api();
    wait_until("the consumer to pause", Duration::from_secs(60), || input_state(&api)["paused"] == 1);
    // Held full for longer than max.poll.interval.ms: a member that stopped polling would be
    // expelled from the group here.
    std::thread::sleep(Duration::from_secs(10));
    let state = input_state(&api);
    assert_eq!(state["paused"], 1, "{state}");
    assert_eq!(state["rebalances"], 1, "one assignment, no rebalance while paused: {state}");
    assert!(!s.log().contains("lost its partitions"), "{}", s.log());
    let consumed_while_paused = state["records_consumed"].as_u64().unwrap_or(0);
    assert!(consumed_while_paused < n, "consumption stopped while paused: {state}");
    open.store(true, Ordering::SeqCst);
    wait_until("every record delivered", Duration::from_secs(60), || {
        let r = received.lock().unwrap();
        (0..n).all(|i| r.contains_key(&i))
    });
    let state = input_state(&api);
    assert_eq!(state["rebalances"], 1, "{state}");
    assert_eq!(state["paused"], 0, "{state}");
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    let dups: u32 = received.lock().unwrap().values().map(|c| c - 1).sum();
    eprintln!(
        "paused consumer: {consumed_while_paused} records polled before the pause held, {n} delivered, {dups} duplicates, \
         pauses {}",
        state["pauses"]
    );
    assert_eq!(dups, 0, "a pause reads nothing twice");
}
