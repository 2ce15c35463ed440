//! The `elasticsearch` output against a real OpenSearch 2.19 started from Maven Central jars
//! (`servers/opensearch/run`): exact counts and no duplicates with `document_id`, refused
//! documents in the dead letter queue with the engine's reason and replayed once the mapping
//! is fixed, real 429s retried until every document is in, an index write block held for
//! seconds under load and lifted with nothing refused, dead-lettered or lost, and the engine
//! killed mid-load with nothing that a client was acknowledged for lost. A test that cannot start the server fails
//! and says why.

use crate::common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{BIN, Sluice, free_port, run_to_end, try_http, wait_until};
use serde_json::Value;
use sluice_testkit::opensearch::OpenSearch;

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// Events as JSON lines: `event_id` e-0.., `n`, `service`.
fn events_file(
    dir: &std::path::Path,
    n: usize,
    extra: impl Fn(usize) -> Option<(&'static str, Value)>,
) -> std::path::PathBuf {
    let path = dir.join("events.ndjson");
    let mut text = String::with_capacity(n * 64);
    for i in 0..n {
        let mut e = serde_json::json!({"event_id": format!("e-{i}"), "n": i, "service": "web"});
        if let Some((k, v)) = extra(i) {
            e[k] = v;
        }
        text.push_str(&e.to_string());
        text.push('\n');
    }
    std::fs::write(&path, text).unwrap();
    path
}

fn search_ids(os: &OpenSearch, index: &str, ids: &[String]) -> Vec<Value> {
    let body = serde_json::json!({"size": ids.len(), "query": {"ids": {"values": ids}}}).to_string();
    let (status, text) = os.request("POST", &format!("/{index}/_search"), &body);
    assert_eq!(status, 200, "{text}");
    json(&text)["hits"]["hits"].as_array().unwrap().clone()
}

#[test]
fn every_event_is_indexed_once_and_a_replay_with_document_ids_adds_nothing() {
    let os = OpenSearch::start_or_panic(&[]);
    let dir = tempfile::tempdir().unwrap();
    let n = 20_000;
    let input = events_file(dir.path(), n, |_| None);
    let config = format!(
        "data_dir: '{data}'
api: {{enabled: false}}
pipelines:
  main:
    workers: 2
    inputs: [{{type: stdin, codec: json_lines}}]
    outputs:
      - {{type: opensearch, hosts: ['{url}'], index: 'logs-%{{/service}}-%{{+%Y.%m.%d}}', document_id: '%{{/event_id}}', batch_max_events: 500}}
",
        data = dir.path().join("data").display(),
        url = os.url()
    );
    let (ok, log) = run_to_end(&config, &input);
    assert!(ok, "{log}");
    os.refresh("logs-web-*");
    assert_eq!(os.count("logs-web-*"), n as u64, "{log}");
    let sample: Vec<String> = (0..n).step_by(997).map(|i| format!("e-{i}")).collect();
    let hits = search_ids(&os, "logs-web-*", &sample);
    assert_eq!(hits.len(), sample.len());
    for hit in &hits {
        let id = hit["_id"].as_str().unwrap();
        let i: u64 = id.trim_start_matches("e-").parse().unwrap();
        assert_eq!(hit["_source"]["n"].as_u64(), Some(i), "{hit}");
        assert_eq!(hit["_source"]["event_id"], id);
        assert!(hit["_source"]["@timestamp"].is_string(), "{hit}");
    }

    // The same events again: same ids, so the count does not move.
    let (ok, log) = run_to_end(&config, &input);
    assert!(ok, "{log}");
    os.refresh("logs-web-*");
    assert_eq!(os.count("logs-web-*"), n as u64, "a replay with document_id adds no duplicate");
}

#[test]
fn documents_the_mapping_refuses_go_to_the_dead_letter_queue_and_replay_once_it_is_fixed() {
    let os = OpenSearch::start_or_panic(&[]);
    let mapping = r#"{"mappings": {"dynamic": "strict", "properties": {
        "@timestamp": {"type": "date"}, "event_id": {"type": "keyword"}, "n": {"type": "long"}, "service": {"type": "keyword"}}}}"#;
    let (status, body) = os.request("PUT", "/strict", mapping);
    assert_eq!(status, 200, "{body}");
    let dir = tempfile::tempdir().unwrap();
    let n = 2_000;
    // Every 50th has a field the strict mapping does not know; every 70th a `n` that is not a number.
    let input = events_file(dir.path(), n, |i| match i {
        _ if i % 50 == 7 => Some(("extra", Value::from("surprise"))),
        _ if i % 70 == 3 => Some(("n", Value::from("many"))),
        _ => None,
    });
    let refused: std::collections::BTreeSet<String> =
        (0..n).filter(|i| i % 50 == 7 || i % 70 == 3).map(|i| format!("e-{i}")).collect();
    let data = dir.path().join("data");
    let config = format!(
        "data_dir: '{data}'
api: {{enabled: false}}
pipelines:
  main:
    inputs: [{{type: stdin, codec: json_lines}}]
    outputs:
      - {{type: elasticsearch, id: search, hosts: ['{url}'], index: strict, document_id: '%{{/event_id}}', batch_max_events: 300}}
    dead_letter_queue: {{enabled: true, sync: commit}}
",
        data = data.display(),
        url = os.url()
    );
    let (ok, log) = run_to_end(&config, &input);
    assert!(ok, "{log}");
    os.refresh("strict");
    assert_eq!(os.count("strict"), (n - refused.len()) as u64, "{log}");

    let entries = common::dlq_show(&data, "main");
    let in_dlq: std::collections::BTreeSet<String> =
        entries.iter().map(|e| e["event"]["event_id"].as_str().unwrap().to_string()).collect();
    assert_eq!(in_dlq, refused, "exactly the refused documents are in the dead letter queue");
    for e in &entries {
        let reason = e["reason"].as_str().unwrap();
        assert_eq!(e["plugin_id"], "search");
        assert!(reason.contains("status 400") && reason.contains("index strict"), "{reason}");
        if e["event"].get("extra").is_some() {
            assert!(reason.contains("strict_dynamic_mapping_exception"), "{reason}");
        } else {
            assert!(reason.contains("mapper_parsing_exception"), "{reason}");
        }
    }

    // Fix the mapping: know `extra`, and let a malformed `n` be kept but not indexed.
    let (status, body) = os.request(
        "PUT",
        "/strict/_mapping",
        r#"{"properties": {"extra": {"type": "keyword"}, "n": {"type": "long", "ignore_malformed": true}}}"#,
    );
    assert_eq!(status, 200, "{body}");
    let again = dir.path().join("again.yml");
    std::fs::write(
        &again,
        format!(
            "data_dir: '{}'\napi: {{enabled: false}}\npipelines:\n  again:\n    inputs: [{{type: stdin}}]\n    outputs: [{{type: elasticsearch, hosts: ['{}'], index: strict, document_id: '%{{/event_id}}'}}]\n",
            data.display(),
            os.url()
        ),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["dlq", "replay", "-c", again.to_str().unwrap(), "--pipeline", "main", "--to", "again"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    os.refresh("strict");
    assert_eq!(os.count("strict"), n as u64, "the replayed documents are indexed");
}

#[test]
fn real_429s_are_retried_until_every_document_is_in_without_duplicates() {
    let os = OpenSearch::start_or_panic(&[("thread_pool.write.size", "1"), ("thread_pool.write.queue_size", "1")]);
    let dir = tempfile::tempdir().unwrap();
    let n = 20_000;
    let input = events_file(dir.path(), n, |_| None);
    let api = free_port();
    let config = format!(
        "data_dir: '{data}'
api: {{address: '127.0.0.1:{api}'}}
pipelines:
  main:
    workers: 4
    inputs: [{{type: stdin, codec: json_lines}}]
    outputs:
      - {{type: elasticsearch, hosts: ['{url}'], index: busy, document_id: '%{{/event_id}}', batch_max_events: 100, max_in_flight: 16,
          retry: {{initial_backoff: 20ms, max_backoff: 500ms}}}}
",
        data = dir.path().join("data").display(),
        url = os.url()
    );
    let (ok, log) = run_to_end(&config, &input);
    assert!(ok, "{log}");
    os.refresh("busy");
    assert_eq!(os.count("busy"), n as u64, "{log}");
    let (status, body) = os.request("GET", "/_nodes/stats/thread_pool", "");
    assert_eq!(status, 200);
    let rejected: u64 = json(&body)["nodes"]
        .as_object()
        .unwrap()
        .values()
        .map(|node| node["thread_pool"]["write"]["rejected"].as_u64().unwrap_or(0))
        .sum();
    assert!(rejected > 0, "the engine rejected nothing, so nothing was retried: the test proves nothing");
    eprintln!("write thread pool rejections during the run: {rejected}");
}

/// Sums of a component series at `/metrics` over the rows whose labels hold every one of `labels`.
fn series_sum(metrics: &str, name: &str, labels: &[&str]) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `index.blocks.write: true` (what an operator, a shrink or a snapshot restore puts on) makes
/// the engine answer each document 403 `cluster_block_exception`. The documents are not at
/// fault: they are sent again until the block is lifted, and every event ends in the index,
/// none in the dead letter queue and none counted failed.
#[test]
fn an_index_write_block_lifted_later_loses_nothing_and_dead_letters_nothing() {
    let os = OpenSearch::start_or_panic(&[]);
    let (status, body) = os.request("PUT", "/held", r#"{"settings": {"number_of_replicas": 0}}"#);
    assert_eq!(status, 200, "{body}");
    let (status, body) = os.request("PUT", "/held/_settings", r#"{"index.blocks.write": true}"#);
    assert_eq!(status, 200, "{body}");
    let dir = tempfile::tempdir().unwrap();
    let n = 20_000;
    let input = events_file(dir.path(), n, |_| None);
    let api = free_port();
    let mut s = Sluice::start_with(
        &format!(
            "data_dir: '{{dir}}/data'
api: {{address: '127.0.0.1:{api}'}}
pipelines:
  main:
    workers: 2
    inputs: [{{type: stdin, codec: json_lines}}]
    outputs:
      - {{type: opensearch, id: search, hosts: ['{url}'], index: held, document_id: '%{{/event_id}}', batch_max_events: 500,
          retry: {{initial_backoff: 50ms, max_backoff: 500ms}}}}
    dead_letter_queue: {{enabled: true, sync: commit}}
",
            url = os.url()
        ),
        std::process::Stdio::from(std::fs::File::open(&input).unwrap()),
    );
    s.wait_port(api);
    let address = format!("127.0.0.1:{api}");
    let blocked_retries = |metrics: &str| {
        series_sum(
            metrics,
            "sluice_component_documents_retried_total",
            &[r#"status="403""#, r#"error_type="cluster_block_exception""#],
        )
    };
    // The block meets the load: documents are answered 403 and sent again, not refused.
    let started = Instant::now();
    loop {
        if let Ok(Some(status)) = s.child.try_wait() {
            panic!(
                "sluice finished ({status}) while the index was blocked: the blocked documents were not held
{}",
                s.log()
            );
        }
        if let Ok((200, metrics)) = try_http(&address, "GET", "/metrics", &[], b"")
            && blocked_retries(&metrics) > 0.0
        {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no document was answered 403:
{}",
            s.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Held for seconds while the output keeps trying.
    std::thread::sleep(Duration::from_secs(4));
    let (_, metrics) = common::http(&address, "GET", "/metrics", &[], b"");
    assert!(
        blocked_retries(&metrics) >= 500.0,
        "sent again over the block:
{metrics}"
    );
    assert_eq!(series_sum(&metrics, "sluice_component_documents_refused_total", &[]), 0.0, "{metrics}");
    let stats = common::get_json(&address, "/stats");
    let component = common::component(&stats, "main", "id", "search");
    let retried = component["state"]["documents_retried"].as_array().unwrap();
    assert!(
        retried.iter().any(|r| r["status"] == "403" && r["error_type"] == "cluster_block_exception"),
        "{component}"
    );
    assert!(component["retries"].as_u64().unwrap() > 0, "{component}");
    // Every answer holds documents sent again: the output stays retrying, with their error.
    assert_eq!(component["output_state"], "retrying", "{component}");
    let error = component["last_error"]["message"].as_str().unwrap_or_default();
    assert!(error.contains("cluster_block_exception"), "{component}");
    let (status, body) = os.request("PUT", "/held/_settings", r#"{"index.blocks.write": null}"#);
    assert_eq!(status, 200, "{body}");
    let blocked_for = started.elapsed();

    let (status, log) = s.wait(Duration::from_secs(180));
    assert!(status.success(), "{log}");
    os.refresh("held");
    assert_eq!(
        os.count("held"),
        n as u64,
        "every event is in the index:
{log}"
    );
    let sums = common::summary(&log, "main");
    assert_eq!((sums["out"], sums["failed"]), (n as u64, 0), "{log}");
    assert!(common::dlq_show(&s.path("data"), "main").is_empty(), "nothing was dead-lettered");
    // Logged, at most once per 10 s rather than once per round.
    let lines = log.matches("refused documents for a reason that is not theirs").count();
    eprintln!(
        "write block held {blocked_for:?}: {} documents sent again by then, {lines} log lines",
        blocked_retries(&metrics)
    );
    let allowed = 1 + blocked_for.as_secs() as usize / 10 + 1;
    assert!(
        (1..=allowed).contains(&lines),
        "{lines} retry lines over {blocked_for:?}:
{log}"
    );
    assert!(
        log.contains("cluster_block_exception"),
        "the log names the block:
{log}"
    );
}

#[test]
fn the_engine_killed_mid_load_loses_nothing_an_http_client_was_acknowledged_for() {
    let mut os = OpenSearch::start_or_panic(&[]);
    let (port, api) = (free_port(), free_port());
    let mut s = Sluice::start(&format!(
        "data_dir: '{{dir}}/data'
api: {{address: '127.0.0.1:{api}'}}
pipelines:
  main:
    queue: {{type: persisted, sync: commit}}
    inputs: [{{type: http, address: '127.0.0.1:{port}'}}]
    outputs:
      - {{type: opensearch, hosts: ['{url}'], index: survive, document_id: '%{{/event_id}}', batch_max_events: 200,
          timeout: 5s, retry: {{initial_backoff: 50ms, max_backoff: 1s}}}}
",
        url = os.url()
    ));
    s.wait_port(port);
    let address = format!("127.0.0.1:{port}");
    let mut acked = Vec::new();
    let mut next = 0u64;
    let post = |from: u64, count: u64| {
        let body: String = (from..from + count).map(|i| format!("{{\"event_id\":\"e-{i}\",\"n\":{i}}}\n")).collect();
        try_http(&address, "POST", "/", &[], body.as_bytes())
    };
    let started = Instant::now();
    let mut killed = false;
    let mut restarted = false;
    while next < 30_000 {
        if !killed && next >= 8_000 {
            os.kill();
            killed = true;
        }
        if killed && !restarted && next >= 16_000 {
            os.restart_or_panic();
            restarted = true;
        }
        match post(next, 100) {
            Ok((200, _)) => acked.extend(next..next + 100),
            Ok((status, body)) => eprintln!("POST answered {status}: {body}"),
            Err(e) => eprintln!("POST failed: {e}"),
        }
        next += 100;
        assert!(started.elapsed() < Duration::from_secs(240), "the load took too long:\n{}", s.log());
    }
    assert!(acked.len() >= 29_000, "the persisted queue acknowledges while the engine is down: {}", acked.len());
    wait_until("every acknowledged event indexed", Duration::from_secs(120), || {
        os.try_request("POST", "/survive/_refresh", "").is_ok_and(|(s, _)| s == 200)
            && os
                .try_request("GET", "/survive/_count", "")
                .is_ok_and(|(s, b)| s == 200 && json(&b)["count"].as_u64().unwrap_or(0) >= acked.len() as u64)
    });
    // Every acknowledged id is there, not just as many documents.
    for chunk in acked.chunks(1000) {
        let ids: Vec<String> = chunk.iter().map(|i| format!("e-{i}")).collect();
        assert_eq!(search_ids(&os, "survive", &ids).len(), ids.len());
    }
    // The output's own figures at /metrics and /stats.
    let (_, metrics) = common::http(&format!("127.0.0.1:{api}"), "GET", "/metrics", &[], b"");
    let series = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in:\n{metrics}"))
    };
    assert!(series("sluice_component_documents_indexed_total") >= acked.len() as f64);
    assert!(series("sluice_component_bulk_request_duration_seconds_count") > 0.0);
    assert!(
        series("sluice_component_bulk_bytes_sent_total") < series("sluice_component_bulk_bytes_encoded_total"),
        "gzip"
    );
    let stats = common::get_json(&format!("127.0.0.1:{api}"), "/stats");
    let state = &common::component(&stats, "main", "type", "opensearch")["state"];
    assert!(state["documents_indexed"].as_u64().unwrap() >= acked.len() as u64, "{state}");
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("bulk request failed; sending again"), "the outage was retried and logged:\n{log}");
}
