//! The `kafka` output against a real Kafka 4.3 broker (KRaft) started from Maven Central jars
//! (`servers/kafka/run`): every event exactly once in a 3-partition topic, keyed; records the
//! broker refuses (too large, unknown topic with auto-creation off) in the dead letter queue
//! with the broker's reason; several batches of a worker in flight at once, each record still
//! once and each key in order; the broker stopped and started mid-load with nothing lost that a
//! client was acknowledged for; with no broker at all, records waiting make the output
//! `retrying` at /stats. A test that cannot start the broker fails and says why.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::{Sluice, free_port, run_to_end, try_http};
use serde_json::Value;
use sluice_testkit::kafka::Kafka;

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(bytes)))
}

/// Runs `sluice run` over `config` with `input` (JSON lines) on stdin until it exits.
fn run_once(dir: &std::path::Path, config: &str, input: &str) -> (bool, String) {
    let input_path = dir.join("input.ndjson");
    std::fs::write(&input_path, input).unwrap();
    run_to_end(config, &input_path)
}

#[test]
fn every_event_once_in_a_three_partition_topic_keyed_by_host() {
    let kafka = Kafka::start_or_panic(&[("auto.create.topics.enable", "false")]);
    kafka.create_topic("logs-web", 3);
    let dir = tempfile::tempdir().unwrap();
    let n = 30_000;
    let input: String = (0..n)
        .map(|i| {
            format!(
                "{{\"event_id\":{i},\"service\":\"web\",\"host\":\"host-{}\",\"pad\":\"{}\"}}\n",
                i % 17,
                "x".repeat(150)
            )
        })
        .collect();
    let config = format!(
        "data_dir: '{}'
api: {{enabled: false}}
pipelines:
  main:
    workers: 2
    inputs: [{{type: stdin, codec: json_lines}}]
    outputs:
      - {{type: kafka, bootstrap_servers: '{}', topic: 'logs-%{{/service}}', key: '%{{/host}}', compression: zstd,
          headers: {{x-event-id: '%{{/event_id}}'}}}}
",
        dir.path().join("data").display(),
        kafka.bootstrap()
    );
    let (ok, log) = run_once(dir.path(), &config, &input);
    assert!(ok, "{log}");
    let records = kafka.consume_all("logs-web", n, Duration::from_secs(60));
    let mut seen = BTreeMap::<u64, u32>::new();
    let mut partitions_of_key = BTreeMap::<Vec<u8>, BTreeSet<i32>>::new();
    for (partition, _offset, key, value) in &records {
        let e = json(value);
        *seen.entry(e["event_id"].as_u64().unwrap()).or_default() += 1;
        let key = key.clone().expect("every record has a key");
        assert_eq!(key, e["host"].as_str().unwrap().as_bytes(), "the key is the host");
        partitions_of_key.entry(key).or_default().insert(*partition);
    }
    assert_eq!(seen.len(), n, "every event arrived");
    assert!(seen.values().all(|&c| c == 1), "and only once: {:?}", seen.iter().find(|(_, c)| **c > 1));
    assert_eq!(partitions_of_key.len(), 17);
    assert!(partitions_of_key.values().all(|p| p.len() == 1), "one partition per key");
    let used: BTreeSet<i32> = partitions_of_key.values().flatten().copied().collect();
    assert!(used.len() > 1, "keys spread over the partitions: {used:?}");
}

#[test]
fn with_batches_in_flight_every_record_arrives_once_and_each_key_in_order() {
    let kafka = Kafka::start_or_panic(&[("auto.create.topics.enable", "false")]);
    kafka.create_topic("flight", 3);
    let dir = tempfile::tempdir().unwrap();
    let n = 50_000;
    let input: String = (0..n)
        .map(|i| format!("{{\"seq\":{i},\"host\":\"host-{}\",\"pad\":\"{}\"}}\n", i % 11, "z".repeat(100)))
        .collect();
    // One worker, but no order promised: the worker keeps up to 4 batches of 500 in the output.
    // Its batches are handed to the producer in the order taken, so each key stays in order.
    let config = format!(
        "data_dir: '{}'
api: {{enabled: false}}
pipelines:
  main:
    workers: 1
    ordered: false
    batch: {{size: 500}}
    inputs: [{{type: stdin, codec: json_lines}}]
    outputs:
      - {{type: kafka, bootstrap_servers: '{}', topic: flight, key: '%{{/host}}', batches_in_flight: 4}}
",
        dir.path().join("data").display(),
        kafka.bootstrap()
    );
    let (ok, log) = run_once(dir.path(), &config, &input);
    assert!(ok, "{log}");
    assert!(log.contains("batches_in_flight=4"), "the worker kept several batches in flight:\n{log}");
    let mut records = kafka.consume_all("flight", n, Duration::from_secs(60));
    records.sort_by_key(|(partition, offset, _, _)| (*partition, *offset));
    let mut seen = BTreeMap::<u64, u32>::new();
    let mut last_of_key = BTreeMap::<Vec<u8>, u64>::new();
    for (_, _, key, value) in &records {
        let seq = json(value)["seq"].as_u64().unwrap();
        *seen.entry(seq).or_default() += 1;
        let key = key.clone().expect("every record has a key");
        if let Some(before) = last_of_key.insert(key.clone(), seq) {
            assert!(before < seq, "{} came after {seq} for key {}", before, String::from_utf8_lossy(&key));
        }
    }
    assert_eq!(seen.len(), n, "every record arrived");
    assert!(seen.values().all(|&c| c == 1), "and only once: {:?}", seen.iter().find(|(_, c)| **c > 1));
    assert_eq!(last_of_key.len(), 11);
}

#[test]
fn records_the_broker_refuses_go_to_the_dead_letter_queue_with_its_reason() {
    let kafka = Kafka::start_or_panic(&[("auto.create.topics.enable", "false")]);
    kafka.try_create_topic("small", 1, &[("max.message.bytes", "10000")]).unwrap();
    // 100 ordinary events, 3 larger than the topic takes, 2 for a topic that does not exist.
    let mut input = String::new();
    for i in 0..105 {
        let (topic, pad) = match i {
            100..=102 => ("small", 20_000),
            103 | 104 => ("nosuch", 10),
            _ => ("small", 100),
        };
        input.push_str(&format!("{{\"event_id\":{i},\"to\":\"{topic}\",\"pad\":\"{}\"}}\n", "y".repeat(pad)));
    }
    let config = format!(
        "data_dir: '{{dir}}/data'
api: {{address: '127.0.0.1:0'}}
pipelines:
  main:
    inputs: [{{type: stdin, codec: json_lines}}]
    outputs:
      - {{type: kafka, id: bus, bootstrap_servers: '{}', topic: '%{{/to}}',
          librdkafka_options: {{topic.metadata.propagation.max.ms: '2000'}}}}
    dead_letter_queue: {{enabled: true, sync: commit}}
",
        kafka.bootstrap()
    );
    // Run with the API up, stdin held open until the figures are read.
    let mut s = Sluice::start_with(&config, std::process::Stdio::piped());
    let data = s.path("data");
    let api = s.api();
    std::io::Write::write_all(s.child.stdin.as_mut().unwrap(), input.as_bytes()).unwrap();
    let mut bus = Value::Null;
    common::wait_until("every event delivered or dead-lettered", Duration::from_secs(60), || {
        let stats = common::get_json(&api, "/stats");
        bus = common::component(&stats, "main", "id", "bus");
        bus["events"]["out"] == 100 && stats["pipelines"]["main"]["events"]["dead_lettered"] == 5
    });
    drop(s.child.stdin.take());
    let (status, log) = s.wait(Duration::from_secs(30));
    assert!(status.success(), "{log}");
    let records = kafka.consume_all("small", 100, Duration::from_secs(30));
    let delivered: BTreeSet<u64> = records.iter().map(|(_, _, _, v)| json(v)["event_id"].as_u64().unwrap()).collect();
    assert_eq!(delivered, (0..100).collect::<BTreeSet<u64>>());
    // Sent bytes: the values the broker acknowledged, not the refused records.
    let values: usize = records.iter().map(|(_, _, _, v)| v.len()).sum();
    assert_eq!(bus["bytes_out"], values as u64, "{bus}");
    let entries = common::dlq_show(&data, "main");
    let mut ids: Vec<u64> = entries.iter().map(|e| e["event"]["event_id"].as_u64().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, [100, 101, 102, 103, 104], "exactly the refused records are in the dead letter queue");
    for e in &entries {
        let reason = e["reason"].as_str().unwrap();
        assert_eq!(e["plugin_id"], "bus");
        if e["event"]["to"] == "small" {
            assert!(reason.contains("topic small") && reason.to_lowercase().contains("too large"), "{reason}");
        } else {
            assert!(reason.contains("topic nosuch") && reason.contains("Unknown topic"), "{reason}");
        }
    }
}

#[test]
fn the_broker_stopped_and_started_mid_load_loses_nothing_a_client_was_acknowledged_for() {
    let mut kafka = Kafka::start_or_panic(&[]);
    kafka.create_topic("events", 3);
    let port = free_port();
    let mut s = Sluice::start(&format!(
        "data_dir: '{{dir}}/data'
api: {{enabled: false}}
pipelines:
  main:
    queue: {{type: persisted, sync: commit}}
    inputs: [{{type: http, address: '127.0.0.1:{port}'}}]
    outputs:
      - {{type: kafka, bootstrap_servers: '{}', topic: events, key: '%{{/id}}', retry: {{initial_backoff: 50ms, max_backoff: 1s}}}}
",
        kafka.bootstrap()
    ));
    s.wait_port(port);
    let address = format!("127.0.0.1:{port}");
    let mut acked = Vec::new();
    let started = Instant::now();
    let (mut stopped, mut restarted) = (false, false);
    let mut next = 0u64;
    while next < 20_000 {
        if !stopped && next >= 6_000 {
            kafka.stop();
            stopped = true;
        }
        if stopped && !restarted && next >= 12_000 {
            kafka.restart_or_panic();
            restarted = true;
        }
        let body: String = (next..next + 100).map(|i| format!("{{\"id\":{i}}}\n")).collect();
        match try_http(&address, "POST", "/", &[], body.as_bytes()) {
            Ok((200, _)) => acked.extend(next..next + 100),
            Ok((status, body)) => eprintln!("POST answered {status}: {body}"),
            Err(e) => eprintln!("POST failed: {e}"),
        }
        next += 100;
        assert!(started.elapsed() < Duration::from_secs(180), "the load took too long:\n{}", s.log());
    }
    assert!(acked.len() >= 19_000, "the persisted queue acknowledges while the broker is away: {}", acked.len());
    let records = kafka.consume_all("events", acked.len(), Duration::from_secs(120));
    let ids: BTreeSet<u64> = records.iter().map(|(_, _, _, v)| json(v)["id"].as_u64().unwrap()).collect();
    let missing: Vec<&u64> = acked.iter().filter(|i| !ids.contains(i)).take(10).collect();
    assert!(missing.is_empty(), "acknowledged but not in the topic: {missing:?}\n{}", s.log());
    eprintln!("{} acknowledged, {} records ({} duplicates)", acked.len(), records.len(), records.len() - ids.len());
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
}

/// With `delivery_timeout` and a bounded `retry`, records no broker acknowledges are given up:
/// counted failed in the summary, said in the log, and `sluice run` over a finite input exits
/// non-zero (events failed outside a dead letter queue). No broker listens on the address.
#[test]
fn records_no_broker_acknowledges_are_given_up_after_delivery_timeout_and_retries() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "data_dir: '{}'
api: {{enabled: false}}
pipelines:
  main:
    inputs: [{{type: stdin, codec: json_lines}}]
    outputs:
      - {{type: kafka, id: bus, bootstrap_servers: '127.0.0.1:{}', topic: logs, delivery_timeout: 1s,
          retry: {{max_retries: 1, initial_backoff: 100ms, max_backoff: 200ms}}}}
",
        dir.path().join("data").display(),
        free_port()
    );
    let input: String = (0..5).map(|i| format!("{{\"event_id\":{i}}}\n")).collect();
    let (ok, log) = run_once(dir.path(), &config, &input);
    assert!(!ok, "events were given up, so the run must fail:\n{log}");
    assert!(log.contains("kafka output gave up after retry.max_retries"), "{log}");
    let summary = common::summary(&log, "main");
    // `out` counts events handed to the outputs, rejected ones included.
    assert_eq!((summary["in"], summary["failed"]), (5, 5), "{log}");
    assert!(log.contains("kept in no dead letter queue events=5"), "{log}");
}

/// librdkafka retries inside, so a batch waiting on a broker that is not there fails no attempt
/// of ours: the producer's error reports are what make the output `retrying`, with the error.
/// No broker listens on the address.
#[test]
fn records_waiting_on_a_broker_that_is_not_there_make_the_output_retrying() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("in")).unwrap();
    std::fs::write(dir.path().join("in/app.log"), "one\ntwo\n").unwrap();
    let mut s = Sluice::start_in(
        dir,
        &format!(
            "data_dir: '{{dir}}/data'
api: {{address: '127.0.0.1:0'}}
pipelines:
  main:
    inputs: [{{type: file, include: ['{{dir}}/in/*.log']}}]
    outputs: [{{type: kafka, id: bus, bootstrap_servers: '127.0.0.1:{}', topic: logs}}]
",
            free_port()
        ),
        std::process::Stdio::null(),
    );
    let api = s.api();
    let mut bus = Value::Null;
    common::wait_until("the kafka output to be retrying", Duration::from_secs(30), || {
        let stats = common::get_json(&api, "/stats");
        bus = common::component(&stats, "main", "id", "bus");
        bus["output_state"] == "retrying"
    });
    assert!(bus["last_error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{bus}");
    assert_eq!(bus["events"]["out"], 0, "{bus}");
    assert_eq!(bus["bytes_out"], 0, "nothing acknowledged, nothing sent: {bus}");
    drop(s);
}
