//! The engine end to end, through the real binary: counts, pipeline links, conditions,
//! draining on SIGTERM, reloading on SIGHUP, and the monitoring API.

use crate::common;

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

#[test]
fn generator_to_blackhole_counts_exactly() {
    let mut s = Sluice::start(
        "api: {enabled: false}
pipelines:
  count:
    workers: 2
    batch: {size: 333}
    inputs: [{type: generator, count: 250000, lines: [a, b, c]}]
    outputs: [{type: blackhole}]
",
    );
    let (status, log) = s.wait(Duration::from_secs(60));
    assert!(status.success(), "{log}");
    let sum = summary(&log, "count");
    assert_eq!((sum["in"], sum["out"], sum["dropped"], sum["failed"], sum["unfinished"]), (250000, 250000, 0, 0, 0));
    assert!(log.contains("blackhole closed") && log.contains("total=250000"), "{log}");
}

#[test]
fn embedded_default_reads_stdin_and_writes_json() {
    let mut child = Command::new(BIN)
        .arg("run")
        .env("SLUICE_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"first line\nsecond line\r\nlast without newline").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let messages: Vec<&str> = lines.iter().map(|l| l["message"].as_str().unwrap()).collect();
    assert_eq!(messages, ["first line", "second line", "last without newline"]);
    assert!(lines[0]["@timestamp"].as_str().unwrap().ends_with('Z'));
}

#[test]
fn pipeline_chain_delivers_everything_once_each() {
    let mut s = Sluice::start(
        "api: {enabled: false}
pipelines:
  upstream:
    workers: 2
    inputs: [{type: generator, count: 20000}]
    outputs: [{type: pipeline, send_to: enrich}]
  downstream:
    workers: 2
    inputs: [{type: pipeline, address: enrich}]
    processors:
      - {type: drop, if: '/sequence >= 19000'}
    outputs: [{type: stdout}]
",
    );
    let stdout = s.stdout();
    let (status, log) = s.wait(Duration::from_secs(60));
    assert!(status.success(), "{log}");
    let seqs: BTreeSet<i64> = stdout
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["sequence"].as_i64().unwrap())
        .collect();
    assert_eq!(stdout.lines().count(), 19000, "each event exactly once");
    assert_eq!(seqs, (0..19000).collect());
    let up = summary(&log, "upstream");
    let down = summary(&log, "downstream");
    assert_eq!((up["in"], up["out"]), (20000, 20000));
    assert_eq!((down["in"], down["out"], down["dropped"]), (20000, 19000, 1000));
}

#[test]
fn conditions_select_events_for_processors_and_outputs() {
    let mut s = Sluice::start(
        r#"api: {enabled: false}
pipelines:
  p:
    inputs: [{type: generator, count: 3000, lines: ['{"level":"debug","n":1}', '{"level":"error","n":600}', '{"level":"info","n":2}'], codec: json_lines}]
    processors:
      - {type: drop, if: '/level == "debug"'}
    outputs:
      - {type: stdout, codec: text, if: '/n >= 500 and /level in ["error", "fatal"]'}
"#,
    );
    let stdout = s.stdout();
    let (status, log) = s.wait(Duration::from_secs(60));
    assert!(status.success(), "{log}");
    assert_eq!(stdout.lines().count(), 1000, "{log}");
    assert!(stdout.lines().all(|l| l.contains("\"level\":\"error\"")), "text codec without message prints JSON");
    let sum = summary(&log, "p");
    assert_eq!((sum["in"], sum["out"], sum["dropped"]), (3000, 2000, 1000));
}

#[test]
fn sigterm_drains_with_nothing_lost() {
    let mut s = Sluice::start(
        "api: {enabled: false}
shutdown_timeout: 30s
pipelines:
  p:
    workers: 2
    batch: {size: 100, delay: 5ms}
    queue: {max_events: 50000}
    inputs: [{type: generator, rate: 50000}]
    outputs: [{type: stdout}]
",
    );
    s.wait_log("pipeline started", Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(800));
    s.signal("TERM");
    let stdout = s.stdout();
    let (status, log) = s.wait(Duration::from_secs(60));
    assert!(status.success(), "{log}");
    let sum = summary(&log, "p");
    assert!(sum["in"] > 1000, "the generator ran: {log}");
    assert_eq!(sum["in"], sum["out"], "{log}");
    assert_eq!(sum["unfinished"], 0);
    let seqs: BTreeSet<i64> = stdout
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["sequence"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs.len() as u64, sum["in"], "every accepted event was written once");
    assert_eq!(seqs, (0..sum["in"] as i64).collect(), "no gaps");
}

#[test]
fn sighup_with_a_broken_config_keeps_the_old_pipeline() {
    let good = "api: {address: '127.0.0.1:0'}
pipelines:
  keep:
    inputs: [{type: generator, rate: 2000}]
    outputs: [{type: blackhole}]
";
    let mut s = Sluice::start(good);
    let api = s.api();
    let count = |api: &str| get_json(api, "/stats")["pipelines"]["keep"]["events"]["out"].as_u64().unwrap();
    wait_until("events to flow", Duration::from_secs(20), || count(&api) > 0);

    std::fs::write(&s.config, "pipelines:\n  keep:\n    inputs: [{type: generator, rate: 2000, colour: blue}]\n    outputs: [{type: blackhole}]\n").unwrap();
    s.signal("HUP");
    s.wait_log("keeping the running one", Duration::from_secs(20));
    assert!(s.log().contains("pipelines.keep.inputs[0].colour: unknown field `colour`"), "{}", s.log());
    let before = count(&api);
    wait_until("events to keep flowing", Duration::from_secs(20), || count(&api) > before + 100);

    // A valid change restarts only the pipeline that changed.
    std::fs::write(
        &s.config,
        format!("{good}  added:\n    inputs: [{{type: generator, rate: 10}}]\n    outputs: [{{type: blackhole}}]\n"),
    )
    .unwrap();
    s.signal("HUP");
    s.wait_log("config reloaded", Duration::from_secs(20));
    let log = s.log();
    let line = log.lines().find(|l| l.contains("config reloaded")).unwrap();
    assert!(
        line.contains("started=added restarted=none stopped=none unchanged=keep"),
        "pipeline names as a user writes them: {line}"
    );
    wait_until("the new pipeline to appear", Duration::from_secs(20), || {
        get_json(&api, "/stats")["pipelines"].get("added").is_some()
    });
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    assert!(summary(&log, "keep")["out"] > 0);
}

#[test]
fn metrics_and_stats_agree_with_what_was_sent() {
    // stdin stays open, so the process keeps running after the generator is done.
    let mut s = Sluice::start_with(
        "api: {address: '127.0.0.1:0'}
pipelines:
  m:
    workers: 2
    inputs:
      - {type: generator, count: 12345, id: gen}
      - {type: stdin, id: keepalive}
    processors:
      - {type: drop, id: odd, if: '/sequence >= 12000'}
    outputs: [{type: blackhole, id: sink}]
",
        Stdio::piped(),
    );
    let api = s.api();
    wait_until("all events", Duration::from_secs(30), || {
        let e = &get_json(&api, "/stats")["pipelines"]["m"]["events"];
        e["in"].as_u64() == Some(12345)
            && e["out"].as_u64().zip(e["dropped"].as_u64()).map(|(o, d)| o + d) == Some(12345)
    });
    let stats = get_json(&api, "/stats");
    let m = &stats["pipelines"]["m"];
    assert_eq!(m["events"]["in"], 12345, "put in by the inputs");
    assert_eq!(m["events"]["taken"], 12345, "taken by the workers");
    assert_eq!(m["events"]["out"], 12000);
    assert_eq!(m["events"]["dropped"], 345);
    assert_eq!(m["workers"], 2);
    assert!(m["rates"]["in_1m"].as_f64().unwrap() > 0.0);
    assert!(m["rates"]["taken_1m"].as_f64().unwrap() > 0.0);
    assert_eq!(m["queue"]["events"], 0);
    let comp = |id: &str| m["components"].as_array().unwrap().iter().find(|c| c["id"] == id).unwrap().clone();
    assert_eq!(comp("gen")["events"]["out"], 12345);
    assert_eq!(comp("odd")["events"]["dropped"], 345);
    assert_eq!(comp("sink")["events"]["out"], 12000);
    // The generator's lines count as read ("Hello world!", 12 bytes each); stdin sent nothing;
    // the blackhole writes nothing; a processor has no bytes at all.
    assert_eq!(comp("gen")["bytes_in"], 12345 * 12);
    assert_eq!(comp("keepalive")["bytes_in"], 0);
    assert_eq!(comp("sink")["bytes_out"], 0);
    assert!(comp("odd").get("bytes_in").is_none() && comp("odd").get("bytes_out").is_none());

    let (status, text) = http(&api, "GET", "/metrics", &[], b"");
    assert_eq!(status, 200);
    assert!(text.ends_with("\n# EOF\n"), "a whole OpenMetrics exposition: {text}");
    assert!(text.contains("\n# TYPE sluice_pipeline_events_in counter\n"), "{text}");
    assert_eq!(metric(&text, "sluice_pipeline_events_in_total{pipeline=\"m\"}"), 12345.0);
    assert_eq!(metric(&text, "sluice_pipeline_events_taken_total{pipeline=\"m\"}"), 12345.0);
    assert_eq!(metric(&text, "sluice_pipeline_events_dropped_total{pipeline=\"m\"}"), 345.0);
    assert_eq!(
        metric(
            &text,
            "sluice_component_events_out_total{pipeline=\"m\",component=\"sink\",kind=\"output\",type=\"blackhole\"}"
        ),
        12000.0
    );
    assert_eq!(metric(&text, "sluice_queue_events{pipeline=\"m\"}"), 0.0);
    assert!(text.contains("sluice_pipeline_batch_duration_seconds_bucket{le=\"+Inf\",pipeline=\"m\"}"));
    assert_eq!(get_json(&api, "/health")["status"], "ok");

    drop(s.child.stdin.take());
    let (status, log) = s.wait(Duration::from_secs(30));
    assert!(status.success(), "{log}");
}
