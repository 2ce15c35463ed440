//! Output faults end to end: an event whose own path the file system refuses goes to the dead
//! letter queue with the reason while the events behind it are delivered and their client is
//! answered; `sluice validate` warns about a file output whose events choose the directory.

mod common;

use std::process::{Command, Stdio};

use common::{BIN, Sluice, free_port, http, metric, summary, validate};
use serde_json::Value;

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
    let out = Command::new(BIN)
        .args(["dlq", "show", "--data-dir", dir.path().join("data").to_str().unwrap(), "--pipeline", "web"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let entries: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
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
