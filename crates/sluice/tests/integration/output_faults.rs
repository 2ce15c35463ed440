//! Output faults end to end: an event whose own path the file system refuses goes to the dead
//! letter queue with the reason while the events behind it are delivered and their client is
//! answered; a file output on a file system that fills holds its clients back and resumes
//! without a broken or repeated line; `sluice validate` warns about a file output whose events
//! choose the directory; an output to a port where nothing listens is `retrying` with the
//! connection error, and `up` once a server appears, while the file input it holds back shows
//! its lag, which drains to 0.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Sluice, free_port, http, metric, summary, try_http, validate, wait_until};
use serde_json::Value;
use sluice_testkit::SmallTmpfs;

#[test]
fn an_event_with_a_name_too_long_goes_to_the_dlq_and_the_pipeline_goes_on() {
    let port = free_port();
    let mut s = Sluice::start(&format!(
        "data_dir: '{{dir}}/data'
api: {{address: '127.0.0.1:0'}}
pipelines:
  web:
    inputs: [{{type: http, address: '127.0.0.1:{port}'}}]
    outputs: [{{type: file, id: by_name, path: '{{dir}}/out/%{{/name}}.log'}}]
    dead_letter_queue: {{enabled: true, sync: commit}}
"
    ));
    s.wait_port(port);
    let api = s.api();
    let address = format!("127.0.0.1:{port}");
    let long = "n".repeat(300);
    // Before, the open of this event's file was retried forever: no answer, and nothing after it
    // was delivered. The client's socket gives up after 30 s, which fails the test.
    let (status, body) =
        http(&address, "POST", "/", &[], format!("{{\"name\":\"{long}\",\"message\":\"too long\"}}\n").as_bytes());
    assert_eq!(status, 200, "{body}");
    for i in 0..3 {
        let (status, body) =
            http(&address, "POST", "/", &[], format!("{{\"name\":\"app\",\"message\":\"normal {i}\"}}\n").as_bytes());
        assert_eq!(status, 200, "{body}");
    }
    let delivered = std::fs::read_to_string(s.path("out/app.log")).unwrap();
    assert_eq!(delivered.lines().count(), 3, "{delivered}");
    let metrics = http(&api, "GET", "/metrics", &[], b"").1;
    let labels = "{pipeline=\"web\",component=\"by_name\",kind=\"output\",type=\"file\"}";
    assert_eq!(metric(&metrics, &format!("sluice_component_retries_total{labels}")), 0.0, "not retried");

    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    let sum = summary(&log, "web");
    assert_eq!((sum["in"], sum["dead_lettered"], sum["failed"], sum["unfinished"]), (4, 1, 0, 0), "{log}");

    let dir = s.into_dir();
    let entries = common::dlq_show(&dir.path().join("data"), "web");
    assert_eq!(entries.len(), 1, "{entries:?}");
    let entry = &entries[0];
    assert_eq!(entry["event"]["name"].as_str(), Some(long.as_str()));
    assert_eq!((entry["plugin_id"].as_str(), entry["plugin_type"].as_str()), (Some("by_name"), Some("file")));
    let reason = entry["reason"].as_str().unwrap();
    assert!(reason.contains("ENAMETOOLONG") && reason.contains(&long), "{reason}");
    assert_eq!(entry["attempts"].as_u64(), Some(1), "refused at the first attempt");
}

#[test]
fn validate_warns_about_a_file_path_the_events_choose_the_directory_of() {
    let config = |path: &str, extra: &str| {
        format!(
            "pipelines:\n  web:\n    inputs: [{{type: stdin}}]\n    outputs:\n      - {{type: file, path: '{path}'{extra}}}\n"
        )
    };
    let (ok, text) = validate(&config("%{/dir}/x.log", ""));
    assert!(ok, "a warning does not fail validation: {text}");
    assert!(
        text.contains("warning: check.yml:5:")
            && text.contains("pipelines.web.outputs[0].path")
            && text.contains("root:"),
        "{text}"
    );
    for (path, extra) in [("{dir}/%{/dir}/x.log", ""), ("%{/dir}/x.log", ", root: '{dir}'"), ("x.log", "")] {
        let (ok, text) = validate(&config(path, extra));
        assert!(ok && !text.contains("warning"), "{path}: {text}");
    }
}

#[test]
fn a_file_output_on_a_disk_that_fills_holds_clients_back_and_resumes_without_broken_lines() {
    let Some(mount) = SmallTmpfs::mount("2m") else { return };
    let port = free_port();
    let out = mount.path().join("out.log");
    let mut s = Sluice::start(&format!(
        "api: {{address: '127.0.0.1:0'}}
pipelines:
  p:
    workers: 2
    batch: {{size: 50, delay: 2ms}}
    inputs: [{{type: http, address: '127.0.0.1:{port}'}}]
    outputs: [{{type: file, id: disk, path: '{}', retry: {{initial_backoff: 10ms, max_backoff: 100ms}}}}]
",
        out.display()
    ));
    s.wait_port(port);
    let api = s.api();
    // Room for a few requests only: the disk fills part-way through an append.
    let ballast = mount.fill_leaving(24 * 1024);
    const REQUESTS: u64 = 40;
    const PER_REQUEST: u64 = 20;
    let clients: Vec<_> = (0..2)
        .map(|c| {
            let address = format!("127.0.0.1:{port}");
            std::thread::spawn(move || {
                let mut answered = Vec::new();
                for r in (c..REQUESTS).step_by(2) {
                    let body: String = (r * PER_REQUEST..(r + 1) * PER_REQUEST)
                        .map(|n| format!("{{\"n\":{n},\"pad\":\"{}\"}}\n", "p".repeat(150)))
                        .collect();
                    match try_http(&address, "POST", "/", &[], body.as_bytes()) {
                        Ok((200, _)) => answered.push(r),
                        other => panic!("request {r}: {other:?}"),
                    }
                }
                answered
            })
        })
        .collect();
    let labels = "{pipeline=\"p\",component=\"disk\",kind=\"output\",type=\"file\"}";
    let retries = |api: &str| {
        metric(&http(api, "GET", "/metrics", &[], b"").1, &format!("sluice_component_retries_total{labels}"))
    };
    wait_until("the file output retried on the full disk", Duration::from_secs(30), || retries(&api) >= 3.0);
    assert!(clients.iter().any(|c| !c.is_finished()), "clients wait while the disk is full");
    s.wait_log("ENOSPC", Duration::from_secs(10));
    std::fs::remove_file(&ballast).unwrap();
    let answered: Vec<u64> = clients.into_iter().flat_map(|c| c.join().unwrap()).collect();
    assert_eq!(answered.len() as u64, REQUESTS, "every request answered once space returned");
    // The appends that failed part-way were rolled back and count nothing: sent is the file.
    let sent =
        metric(&http(&api, "GET", "/metrics", &[], b"").1, &format!("sluice_component_sent_bytes_total{labels}"));
    assert_eq!(sent, std::fs::metadata(&out).unwrap().len() as f64);
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("file output writes again"), "{log}");

    let text = std::fs::read_to_string(&out).unwrap();
    let mut seen: BTreeMap<u64, u32> = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let doc: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("line {i} is broken ({e}): {line:?}"));
        *seen.entry(doc["n"].as_u64().unwrap()).or_default() += 1;
    }
    assert_eq!(seen.len() as u64, REQUESTS * PER_REQUEST, "every event written");
    assert!(
        seen.values().all(|&c| c == 1),
        "none twice: {:?}",
        seen.iter().filter(|(_, c)| **c > 1).collect::<Vec<_>>()
    );
}

/// An output's state and a file input's lag, as an operator sees them: an http output to a port
/// where nothing listens is `retrying` with the connection error at /stats and /metrics, and the
/// file input it holds back is behind its file; once a server appears the output is `up` again
/// and the lag drains to 0.
#[test]
fn an_output_to_a_dead_port_is_retrying_with_its_error_then_up_and_the_file_lag_drains() {
    let lines = 20_000;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("in")).unwrap();
    let text: String = (0..lines).map(|i| format!("line {i:06} {}\n", "x".repeat(80))).collect();
    std::fs::write(dir.path().join("in/app.log"), &text).unwrap();
    // Taken now, served later: nothing listens on it until the server appears.
    let port = free_port();
    let mut s = Sluice::start_in(
        dir,
        &format!(
            "data_dir: '{{dir}}/data'
api: {{address: '127.0.0.1:0'}}
pipelines:
  p:
    queue: {{type: memory, max_events: 500}}
    inputs: [{{type: file, id: logs, include: ['{{dir}}/in/*.log']}}]
    outputs: [{{type: http, id: web, url: 'http://127.0.0.1:{port}/', retry: {{initial_backoff: 10ms, max_backoff: 100ms}}}}]
"
        ),
        std::process::Stdio::null(),
    );
    let api = s.api();
    let component = |stats: &Value, id: &str| -> Value {
        let c = common::component(stats, "p", "id", id);
        assert!(!c.is_null(), "no component {id} in {stats}");
        c
    };
    let out_labels = "{pipeline=\"p\",component=\"web\",kind=\"output\",type=\"http\"";
    let lag_series = "sluice_component_file_lag_bytes{pipeline=\"p\",component=\"logs\",kind=\"input\",type=\"file\"}";

    let mut web = Value::Null;
    wait_until("the output to be retrying", Duration::from_secs(30), || {
        web = component(&common::get_json(&api, "/stats"), "web");
        web["output_state"] == "retrying"
    });
    let message = web["last_error"]["message"].as_str().unwrap_or_default().to_lowercase();
    assert!(message.contains("connect"), "the connection error: {web}");
    assert_eq!(web["bytes_out"], 0, "nothing accepted, nothing sent: {web}");
    assert!(web["last_error"]["at"].as_f64().is_some_and(|at| at > 1.0e9), "{web}");
    let metrics = http(&api, "GET", "/metrics", &[], b"").1;
    assert_eq!(metric(&metrics, &format!("sluice_component_output_state{out_labels},state=\"retrying\"}}")), 1.0);
    assert_eq!(metric(&metrics, &format!("sluice_component_output_state{out_labels},state=\"up\"}}")), 0.0);
    assert_eq!(metric(&metrics, &format!("sluice_component_output_state{out_labels},state=\"down\"}}")), 0.0);
    assert!(metric(&metrics, &format!("sluice_component_last_error_timestamp_seconds{out_labels}}}")) > 1.0e9);

    // The pipeline holds the reader back: the file is far from read.
    let mut logs = Value::Null;
    wait_until("the file input to report its lag", Duration::from_secs(30), || {
        logs = component(&common::get_json(&api, "/stats"), "logs");
        logs["state"]["file_lag_bytes"].as_u64().is_some_and(|lag| lag > 0)
    });
    let files = logs["state"]["file_lag_largest"].as_array().cloned().unwrap_or_default();
    assert_eq!(files.len(), 1, "{logs}");
    assert!(files[0]["path"].as_str().unwrap().ends_with("in/app.log"), "{logs}");
    assert_eq!(files[0]["lag_bytes"], logs["state"]["file_lag_bytes"], "{logs}");
    assert!(metric(&http(&api, "GET", "/metrics", &[], b"").1, lag_series) > 0.0);

    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    common::serve_http_on(listener, |_| "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_string());
    wait_until("every line delivered, the output up and the lag gone", Duration::from_secs(60), || {
        let stats = common::get_json(&api, "/stats");
        let (web, logs) = (component(&stats, "web"), component(&stats, "logs"));
        web["events"]["out"] == lines && web["output_state"] == "up" && logs["state"]["file_lag_bytes"] == 0
    });
    let stats = common::get_json(&api, "/stats");
    let web = component(&stats, "web");
    assert!(web["last_error"]["message"].as_str().is_some(), "the last error stays after recovery: {web}");
    assert!(web["bytes_out"].as_u64().is_some_and(|b| b > 0), "{web}");
    assert_eq!(component(&stats, "logs")["bytes_in"], text.len(), "the whole file read, once");
    let metrics = http(&api, "GET", "/metrics", &[], b"").1;
    assert_eq!(metric(&metrics, &format!("sluice_component_output_state{out_labels},state=\"up\"}}")), 1.0);
    assert_eq!(metric(&metrics, &format!("sluice_component_output_state{out_labels},state=\"retrying\"}}")), 0.0);
    assert_eq!(metric(&metrics, lag_series), 0.0);
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
}
