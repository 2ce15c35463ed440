//! Output faults end to end: an event whose own path the file system refuses goes to the dead
//! letter queue with the reason while the events behind it are delivered and their client is
//! answered; a file output on a file system that fills holds its clients back and resumes
//! without a broken or repeated line; `sluice validate` warns about a file output whose events
//! choose the directory.

mod common;

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
