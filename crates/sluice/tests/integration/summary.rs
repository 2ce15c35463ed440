//! The shutdown summary: printed once, structured with JSON logs, and a finite run that lost
//! events to an output's rejection exits non-zero.

use crate::common;

use std::time::Duration;

use common::*;

/// A generator of 10 events; every event names a file that cannot be opened (a name too long),
/// so the file output rejects them all for good, and there is no dead letter queue.
const REJECTED: &str = "data_dir: '{dir}/data'
api: {enabled: false}
pipelines:
  web:
    inputs: [{type: generator, count: 10, lines: ['{\"name\":\"NAME\"}'], codec: json_lines}]
    processors: [{type: json, source: /message, on_failure: tag}]
    outputs: [{type: file, path: '{dir}/out/%{/name}.log'}]
";

fn rejected_config(log: &str) -> String {
    format!("{log}{}", REJECTED.replace("NAME", &"n".repeat(300)))
}

#[test]
fn a_finite_run_that_lost_events_to_a_rejection_exits_non_zero_and_says_why() {
    let mut s = Sluice::start(&rejected_config(""));
    let (status, log) = s.wait(Duration::from_secs(30));
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("events were rejected for good by outputs and kept in no dead letter queue"), "{log}");
    let sum = summary(&log, "web");
    assert_eq!((sum["in"], sum["failed"], sum["unfinished"]), (10, 10, 0), "{log}");
    assert_eq!(log.lines().filter(|l| l.starts_with("pipeline web: ")).count(), 1, "printed once: {log}");
}

#[test]
fn processor_failures_are_in_the_summary() {
    let mut s = Sluice::start(
        "data_dir: '{dir}/data'
api: {enabled: false}
pipelines:
  web:
    inputs: [{type: generator, count: 5, lines: ['not json']}]
    processors: [{type: json}]
    outputs: [{type: blackhole}]
",
    );
    let (status, log) = s.wait(Duration::from_secs(30));
    assert!(status.success(), "tagged events were delivered: {log}");
    let sum = summary(&log, "web");
    assert_eq!((sum["in"], sum["out"], sum["tagged"]), (5, 5, 5), "{log}");
}

#[test]
fn with_json_logs_the_summary_is_one_json_event() {
    let mut s = Sluice::start(&rejected_config("log: {format: json}\n"));
    let (_, log) = s.wait(Duration::from_secs(30));
    let mut summaries = Vec::new();
    for line in log.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}\n{log}"));
        if v["fields"]["message"] == "pipeline stopped" {
            summaries.push(v);
        }
    }
    assert_eq!(summaries.len(), 1, "{log}");
    let f = &summaries[0]["fields"];
    assert_eq!(
        (f["pipeline"].as_str(), f["events_in"].as_u64(), f["failed"].as_u64()),
        (Some("web"), Some(10), Some(10)),
        "{log}"
    );
}
