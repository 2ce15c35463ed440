//! Every processor on real log lines from the loghub samples, through the real binary.

use crate::common;

use std::process::{Command, Stdio};

use common::*;

/// Runs a one-pipeline config with `file` on stdin; returns the JSON events written to stdout.
fn run_over(file: &str, processors: &str) -> (Vec<serde_json::Value>, String) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("p.yml");
    std::fs::write(
        &cfg,
        format!("api: {{enabled: false}}\npipelines:\n  p:\n    workers: 2\n    inputs: [{{type: stdin}}]\n    processors:\n{processors}\n    outputs: [{{type: stdout}}]\n"),
    )
    .unwrap();
    let input = std::fs::File::open(loghub(file)).unwrap();
    let out = Command::new(BIN)
        .args(["run", "-c", cfg.to_str().unwrap()])
        .env("SLUICE_LOG", "warn")
        .stdin(Stdio::from(input))
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{log}");
    let events = String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    (events, log)
}

#[test]
fn grok_and_date_on_openssh() {
    let (events, log) = run_over(
        "OpenSSH_2k.log",
        r#"      - type: grok
        match:
          /message: '%{SYSLOGTIMESTAMP:ts} %{HOSTNAME:host} %{DATA:program}(?:\[%{POSINT:pid:int}\])?: %{GREEDYDATA:msg}'
      - type: date
        source: /ts
        formats: ['MMM dd HH:mm:ss', 'MMM  d HH:mm:ss']"#,
    );
    assert_eq!(events.len(), 2000, "{log}");
    assert!(events.iter().all(|e| e["program"] == "sshd" && e["pid"].is_i64()), "{:?}", events[0]);
    assert!(
        events.iter().all(|e| e.get("tags").is_none()),
        "every line parsed: {:?}",
        events.iter().find(|e| e.get("tags").is_some())
    );
    assert_eq!(summary(&log, "p")["out"], 2000);
}

#[test]
fn dissect_mutate_and_drop_on_apache() {
    let (events, log) = run_over(
        "Apache_2k.log",
        r#"      - type: dissect
        mapping:
          /message: '[%{ts}] [%{level}] %{msg}'
      - type: mutate
        uppercase: [/level]
        add: {source: apache, line_level: '%{/level}'}
      - type: drop
        if: '/level == "NOTICE"'"#,
    );
    let sum = summary(&log, "p");
    assert_eq!(sum["in"], 2000);
    assert_eq!(sum["out"] + sum["dropped"], 2000);
    assert!(sum["dropped"] > 0, "the sample has notice lines");
    assert_eq!(events.len() as u64, sum["out"]);
    assert!(
        events.iter().all(|e| e["level"] == "ERROR" || e["level"] == "WARN" || e["level"] == "INFO"),
        "{:?}",
        events[0]
    );
    assert!(events.iter().all(|e| e["source"] == "apache" && e["line_level"] == e["level"]));
}

#[test]
fn json_on_generated_lines_and_failures_are_tagged() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("j.yml");
    std::fs::write(
        &cfg,
        r#"api: {enabled: false}
pipelines:
  j:
    inputs: [{type: generator, count: 300, lines: ['{"a":1,"b":{"c":"x"}}', 'not json', '{"@timestamp":"2026-01-02T03:04:05Z","a":2}']}]
    processors:
      - {type: json, remove_source: true}
    outputs: [{type: stdout}]
"#,
    )
    .unwrap();
    let out = Command::new(BIN).args(["run", "-c", cfg.to_str().unwrap()]).env("SLUICE_LOG", "warn").output().unwrap();
    assert!(out.status.success());
    let events: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(events.len(), 300);
    let failed: Vec<_> = events.iter().filter(|e| e["tags"].to_string().contains("_jsonparsefailure")).collect();
    assert_eq!(failed.len(), 100);
    assert!(failed.iter().all(|e| e["message"] == "not json"), "the source is kept on failure");
    let parsed: Vec<_> = events.iter().filter(|e| e.get("a").is_some()).collect();
    assert_eq!(parsed.len(), 200);
    assert!(parsed.iter().all(|e| e.get("message").is_none()), "remove_source removes it on success");
    assert!(parsed.iter().any(|e| e["@timestamp"] == "2026-01-02T03:04:05.000Z"));
    assert!(parsed.iter().any(|e| e["b"]["c"] == "x"));
}
