//! The dead letter queue end to end: what outputs and processors reject lands in it with the
//! reason, `sluice dlq` shows and replays it, the `dead_letter_queue` input replays it (with
//! resumption, cleaning, and damage survived), the storage policies and retention count what
//! they drop, and replayed events that fail again do not loop.

use crate::common;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{BIN, Sluice, free_port, http, metric, serve_http, summary, wait_until};
use serde_json::Value;

/// Accepted documents, in arrival order, and the number of requests seen.
#[derive(Default)]
struct Received {
    accepted: Mutex<Vec<Value>>,
    requests: AtomicUsize,
}

/// A bulk endpoint: an NDJSON body with a document whose field `x` is set gets a 400 naming it
/// (and nothing of the request is kept); any other body is accepted.
fn strict_server(delay: Duration) -> (String, Arc<Received>) {
    let received = Arc::new(Received::default());
    let seen = received.clone();
    let addr = serve_http(move |body| {
        seen.requests.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(delay);
        let docs: Vec<Value> = String::from_utf8_lossy(body)
            .lines()
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        if docs.iter().any(|d| !d["x"].is_null()) {
            let text = "field x is not allowed";
            format!("HTTP/1.1 400 Bad Request\r\nContent-Length: {}\r\n\r\n{text}", text.len())
        } else {
            seen.accepted.lock().unwrap().extend(docs);
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_string()
        }
    });
    (addr, received)
}

/// Runs `sluice` with arguments; returns (success, stdout, stderr).
fn sluice(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(BIN).args(args).env("SLUICE_LOG", "warn").stdin(Stdio::null()).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `sluice dlq show` of a pipeline's queue under `data`, as JSON values.
fn show(data: &Path, pipeline: &str) -> (Vec<Value>, String) {
    let (ok, out, err) = sluice(&["dlq", "show", "--data-dir", data.to_str().unwrap(), "--pipeline", pipeline]);
    assert!(ok, "dlq show failed: {err}");
    (out.lines().map(|l| serde_json::from_str(l).unwrap()).collect(), err)
}

fn lines_of(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn sequences(docs: &[Value], at: &str) -> Vec<u64> {
    let mut s: Vec<u64> = docs.iter().map(|d| d.pointer(at).and_then(Value::as_u64).unwrap()).collect();
    s.sort_unstable();
    s
}

/// The monitoring API's `/metrics` text.
fn metrics_text(api: &str) -> String {
    http(api, "GET", "/metrics", &[], b"").1
}

/// The facts the dead letter queue keeps about an event the `bulk` http output of pipeline
/// `web` had refused (an entry, or the metadata of a replayed event).
fn assert_refused_by_bulk(facts: &Value) {
    assert_eq!(facts["reason"], "HTTP 400: field x is not allowed", "{facts}");
    assert_eq!((facts["plugin_id"].as_str(), facts["plugin_type"].as_str()), (Some("bulk"), Some("http")), "{facts}");
    assert_eq!((facts["pipeline"].as_str(), facts["attempts"].as_u64()), (Some("web"), Some(1)), "{facts}");
}

/// 20 events; the odd ones have `x` set, which the server refuses.
const MIXED: &str = r#"lines: ['{"kind":"good"}', '{"kind":"bad","x":1}'], codec: json_lines"#;

#[test]
fn refused_documents_land_in_the_dlq_and_replay_delivers_exactly_them() {
    let (addr, server) = strict_server(Duration::ZERO);
    let odd: Vec<u64> = (1..20).step_by(2).collect();
    let mut s = Sluice::start(&format!(
        "data_dir: '{{dir}}/data'
api: {{enabled: false}}
pipelines:
  web:
    workers: 2
    inputs: [{{type: generator, count: 20, batch_size: 5, {MIXED}}}]
    outputs:
      - {{type: http, id: bulk, url: 'http://{addr}/_bulk', batch_max_events: 1, retry: {{initial_backoff: 10ms}}}}
    dead_letter_queue: {{enabled: true, sync: commit}}
"
    ));
    let (status, log) = s.wait(Duration::from_secs(60));
    assert!(status.success(), "{log}");
    let sum = summary(&log, "web");
    assert_eq!((sum["in"], sum["dead_lettered"], sum["failed"], sum["unfinished"]), (20, 10, 0, 0), "{log}");
    assert_eq!(sequences(&server.accepted.lock().unwrap(), "/sequence"), (0..20).step_by(2).collect::<Vec<_>>());

    let dir = s.into_dir();
    let data = dir.path().join("data");
    let (entries, _) = show(&data, "web");
    assert_eq!(sequences(&entries, "/event/sequence"), odd, "those and only those");
    for e in &entries {
        assert_refused_by_bulk(e);
        assert_eq!(e["event"]["kind"], "bad");
        assert!(e["time"].as_str().unwrap().ends_with('Z'));
    }
    let (ok, out, _) =
        sluice(&["dlq", "show", "--data-dir", data.to_str().unwrap(), "--pipeline", "web", "--limit", "3"]);
    assert!(ok);
    assert_eq!(out.lines().count(), 3, "--limit");
    let (ok, out, _) = sluice(&["dlq", "replay", "--path", data.join("dlq/web").to_str().unwrap()]);
    assert!(ok);
    let replayed: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(sequences(&replayed, "/sequence"), odd, "replay to stdout");
    let (ok, out, _) = sluice(&["dlq", "stats", "--json", "--data-dir", data.to_str().unwrap(), "--pipeline", "web"]);
    assert!(ok);
    let stats: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((stats["entries"].as_u64(), stats["writer_active"].as_bool()), (Some(10), Some(false)), "{stats}");

    // Replay through a config's pipeline with `sluice dlq replay --to`.
    let again = dir.path().join("again.yml");
    let again_out = dir.path().join("again.ndjson");
    std::fs::write(
        &again,
        format!(
            "data_dir: '{}'\npipelines:\n  again:\n    inputs: [{{type: stdin}}]\n    outputs: [{{type: file, path: '{}'}}]\n",
            data.display(),
            again_out.display()
        ),
    )
    .unwrap();
    let (ok, _, err) = sluice(&["dlq", "replay", "-c", again.to_str().unwrap(), "--pipeline", "web", "--to", "again"]);
    assert!(ok, "{err}");
    assert_eq!(sequences(&lines_of(&again_out), "/sequence"), odd, "{err}");

    // The dead_letter_queue input, committing and cleaning, with the queue's facts copied
    // out of @metadata (outputs never write @metadata).
    let out = dir.path().join("replayed.ndjson");
    let mut r = Sluice::start_in(
        dir,
        "data_dir: '{dir}/data'
api: {enabled: false}
pipelines:
  fix:
    workers: 1
    inputs: [{type: dead_letter_queue, pipeline: web, follow: false, clean_consumed: true}]
    processors: [{type: mutate, copy: {/@metadata/dead_letter_queue: /dlq}}]
    outputs: [{type: file, path: '{dir}/replayed.ndjson'}]
",
        Stdio::null(),
    );
    let (status, log) = r.wait(Duration::from_secs(60));
    assert!(status.success(), "{log}");
    let docs = lines_of(&out);
    assert_eq!(sequences(&docs, "/sequence"), odd, "exactly them:\n{log}");
    for d in &docs {
        assert_refused_by_bulk(&d["dlq"]);
        assert!(d["dlq"]["entry_time"].as_str().is_some(), "{d}");
    }
    let dir = r.into_dir();
    let (entries, _) = show(&dir.path().join("data"), "web");
    assert!(entries.is_empty(), "clean_consumed deleted the consumed segments: {entries:?}");
}

#[test]
fn storage_policies_retention_and_the_loop_guard() {
    let port = free_port();
    let bad = "lines: ['not json'], count: 30, batch_size: 3";
    let mut s = Sluice::start(&format!(
        "data_dir: '{{dir}}/data'
api: {{address: '127.0.0.1:0'}}
pipelines:
  newer:
    workers: 1
    inputs: [{{type: generator, {bad}}}, {{type: tcp, address: '127.0.0.1:{port}'}}]
    processors: [{{type: json, on_failure: dlq}}]
    outputs: [{{type: blackhole}}]
    dead_letter_queue: {{enabled: true, max_bytes: 2KiB, segment_bytes: 1KiB, storage_policy: drop_newer}}
  older:
    workers: 1
    inputs: [{{type: generator, {bad}}}]
    processors: [{{type: json, on_failure: dlq}}]
    outputs: [{{type: blackhole}}]
    dead_letter_queue: {{enabled: true, max_bytes: 2KiB, segment_bytes: 1KiB, storage_policy: drop_older}}
  aged:
    workers: 1
    inputs: [{{type: generator, lines: ['not json'], count: 5}}]
    processors: [{{type: json, on_failure: dlq}}]
    outputs: [{{type: blackhole}}]
    dead_letter_queue: {{enabled: true, retain_age: 1s, seal_idle: 200ms}}
  looping:
    workers: 1
    inputs: [{{type: dead_letter_queue, pipeline: newer, commit_offsets: false}}]
    processors: [{{type: json, on_failure: dlq}}]
    outputs: [{{type: file, path: '{{dir}}/looped.ndjson'}}]
    dead_letter_queue: {{enabled: true}}
"
    ));
    let api = s.api();
    s.wait_port(port);
    let text = || metrics_text(&api);
    let newer = "{pipeline=\"newer\"}";
    let older = "{pipeline=\"older\"}";
    let aged = "{pipeline=\"aged\"}";
    wait_until("every entry written or dropped", Duration::from_secs(30), || {
        let t = text();
        // Put in by the inputs, then each either stored or refused by the storage policy.
        let handled = |p: &str| {
            metric(&t, &format!("sluice_pipeline_events_in_total{p}")) == 30.0
                && metric(&t, &format!("sluice_pipeline_events_dead_lettered_total{p}"))
                    + metric(&t, &format!("sluice_dlq_lost_total{p}"))
                    == 30.0
        };
        handled(newer) && handled(older) && metric(&t, &format!("sluice_dlq_expired_total{aged}")) == 5.0
    });
    let t = text();
    let stored_newer = metric(&t, &format!("sluice_dlq_entries{newer}")) as u64;
    let dropped_newer = metric(&t, &format!("sluice_dlq_dropped_newer_total{newer}")) as u64;
    assert!(stored_newer > 0 && dropped_newer > 0, "{t}");
    assert_eq!(stored_newer + dropped_newer, 30, "{t}");
    assert_eq!(metric(&t, &format!("sluice_dlq_lost_total{newer}")) as u64, dropped_newer, "lost on purpose: {t}");
    assert!(metric(&t, &format!("sluice_dlq_bytes{newer}")) <= 2048.0);
    let stored_older = metric(&t, &format!("sluice_dlq_entries{older}")) as u64;
    let dropped_older = metric(&t, &format!("sluice_dlq_dropped_older_total{older}")) as u64;
    assert!(stored_older > 0 && dropped_older > 0, "{t}");
    assert_eq!(stored_older + dropped_older, 30, "{t}");
    assert_eq!(metric(&t, &format!("sluice_dlq_dropped_newer_total{older}")), 0.0);
    assert_eq!(metric(&t, &format!("sluice_dlq_entries{aged}")), 0.0, "retain_age expired them: {t}");
    let stats = common::get_json(&api, "/stats");
    assert_eq!(stats["pipelines"]["newer"]["dead_letter_queue"]["dropped_newer"].as_u64(), Some(dropped_newer));
    assert_eq!(stats["pipelines"]["older"]["dead_letter_queue"]["dropped_older"].as_u64(), Some(dropped_older));

    // The replayed `newer` entries fail the json processor again: not written back.
    wait_until("the replayed entries looped back", Duration::from_secs(30), || {
        metric(&text(), "sluice_dlq_loop_rejected_total{pipeline=\"looping\"}") as u64 == stored_newer
    });
    let t = text();
    assert_eq!(metric(&t, "sluice_dlq_entries{pipeline=\"looping\"}"), 0.0, "{t}");
    // The replaying input read every stored entry's frame: the segments less their headers.
    let segments = metric(&t, &format!("sluice_dlq_segments{newer}"));
    let frames = metric(&t, &format!("sluice_dlq_bytes{newer}")) - 64.0 * segments;
    let looping_input =
        "{pipeline=\"looping\",component=\"dead_letter_queue_0\",kind=\"input\",type=\"dead_letter_queue\"}";
    assert_eq!(metric(&t, &format!("sluice_component_received_bytes_total{looping_input}")), frames, "{t}");
    assert!(s.log().contains("failed again; it is not written back"), "logged");
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    let looped = lines_of(&s.path("looped.ndjson"));
    assert_eq!(looped.len() as u64, stored_newer, "kept in the batch, tagged, delivered");
    assert!(looped.iter().all(|d| d["tags"][0] == "_jsonparsefailure"));

    let data = s.path("data");
    let (kept_newer, _) = show(&data, "newer");
    assert_eq!(sequences(&kept_newer, "/event/sequence"), (0..stored_newer).collect::<Vec<_>>(), "the first ones kept");
    assert!(
        kept_newer.iter().all(|e| e["reason"].as_str().unwrap().starts_with("json: /message is not a JSON object"))
    );
    assert_eq!(kept_newer[0]["plugin_type"], "json");
    let (kept_older, _) = show(&data, "older");
    assert_eq!(
        sequences(&kept_older, "/event/sequence"),
        (30 - stored_older..30).collect::<Vec<_>>(),
        "the last ones kept"
    );

    let d = data.to_str().unwrap();
    let out = Command::new(BIN).args(["dlq", "purge", "--data-dir", d, "--pipeline", "older"]).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "purge asks for --yes");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--yes"));
    assert_eq!(show(&data, "older").0.len() as u64, stored_older, "nothing deleted without --yes");
    let (ok, out, err) = sluice(&["dlq", "purge", "--yes", "--data-dir", d, "--pipeline", "older"]);
    assert!(ok, "{err}");
    assert!(out.contains("deleted"), "{out}");
    assert!(show(&data, "older").0.is_empty());
    let out = Command::new(BIN).args(["dlq", "stats", "--data-dir", d, "--pipeline", "nope"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no dead letter queue here"), "{out:?}");
    let out = Command::new(BIN).args(["dlq", "show", "--pipeline", "newer"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--data-dir"), "{out:?}");
}

#[test]
fn a_restart_in_the_middle_of_a_replay_resumes_from_the_committed_position() {
    const N: u64 = 600;
    let port = free_port();
    // Fill a queue: every event fails the json processor.
    let mut fill = Sluice::start(&format!(
        "data_dir: '{{dir}}/data'
api: {{enabled: false}}
pipelines:
  web:
    inputs: [{{type: generator, lines: ['not json'], count: {N}}}]
    processors: [{{type: json, on_failure: dlq}}]
    outputs: [{{type: blackhole}}]
    dead_letter_queue: {{enabled: true, segment_bytes: 16KiB}}
"
    ));
    let (status, log) = fill.wait(Duration::from_secs(60));
    assert!(status.success(), "{log}");
    assert_eq!(summary(&log, "web")["dead_lettered"], N, "{log}");
    let dir = fill.into_dir();

    let (addr, server) = strict_server(Duration::from_millis(30));
    let replay = format!(
        "data_dir: '{{dir}}/data'
api: {{enabled: false}}
registry: {{flush_interval: 50ms}}
pipelines:
  fix:
    workers: 1
    batch: {{size: 20, delay: 1ms}}
    queue: {{max_events: 40}}
    inputs:
      - {{type: dead_letter_queue, pipeline: web, batch_size: 20}}
      - {{type: tcp, address: '127.0.0.1:{port}'}}
    outputs: [{{type: http, url: 'http://{addr}/', batch_max_events: 20}}]
"
    );
    let first = Sluice::start_in(dir, &replay, Stdio::null());
    wait_until("part of the replay", Duration::from_secs(30), || server.accepted.lock().unwrap().len() >= 200);
    let dir = first.kill_into_dir();
    let before = server.accepted.lock().unwrap().len() as u64;
    assert!(before < N, "killed in the middle ({before})");

    let mut second = Sluice::start_in(dir, &replay, Stdio::null());
    second.wait_port(port);
    wait_until("every entry delivered", Duration::from_secs(60), || {
        let seen: std::collections::BTreeSet<u64> =
            server.accepted.lock().unwrap().iter().map(|d| d["sequence"].as_u64().unwrap()).collect();
        seen.len() as u64 == N
    });
    let (status, log) = second.stop();
    assert!(status.success(), "{log}");
    let all = server.accepted.lock().unwrap().clone();
    let mut counts: BTreeMap<u64, u64> = BTreeMap::new();
    for d in &all {
        *counts.entry(d["sequence"].as_u64().unwrap()).or_default() += 1;
    }
    assert_eq!(counts.len() as u64, N, "no entry missing");
    assert!(counts.values().all(|&c| c <= 2), "an entry is delivered at most twice");
    let again = all.len() as u64 - N;
    // In flight at the kill: the queue (40), a worker's batch (20), one flush interval.
    assert!(again <= 200, "the second run resumed near where the first stopped, not at the start: {again} again");
}

#[test]
fn corrupt_and_torn_segments_are_survived() {
    let port = free_port();
    let mut fill = Sluice::start(&format!(
        "data_dir: '{{dir}}/data'
api: {{address: '127.0.0.1:0'}}
pipelines:
  web:
    workers: 1
    inputs:
      - {{type: generator, lines: ['not json'], count: 12, batch_size: 1}}
      - {{type: tcp, address: '127.0.0.1:{port}'}}
    processors: [{{type: json, on_failure: dlq}}]
    outputs: [{{type: blackhole}}]
    dead_letter_queue: {{enabled: true, segment_bytes: 1KiB, sync: commit, seal_idle: 1h}}
"
    ));
    let api = fill.api();
    wait_until("12 entries", Duration::from_secs(30), || {
        metric(&metrics_text(&api), "sluice_pipeline_events_dead_lettered_total{pipeline=\"web\"}") == 12.0
    });
    // A crash: the last segment stays open.
    let dir = fill.kill_into_dir();
    let dlq = dir.path().join("data/dlq/web");
    let mut files: Vec<_> = std::fs::read_dir(&dlq).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    let sealed = files.iter().find(|p| p.extension().is_some_and(|e| e == "dlq")).expect("a sealed segment").clone();
    let open = files.iter().find(|p| p.extension().is_some_and(|e| e == "open")).expect("an open segment").clone();
    // Flip a byte in the middle of the sealed segment's second entry, and leave half a frame at
    // the end of the open one (a torn write).
    let (before, _) = show(&dir.path().join("data"), "web");
    let first_segment = before[0]["segment"].as_u64().unwrap();
    let second = before.iter().filter(|e| e["segment"].as_u64() == Some(first_segment)).nth(1).unwrap();
    let third_offset = before
        .iter()
        .filter(|e| e["segment"].as_u64() == Some(first_segment))
        .nth(2)
        .map(|e| e["offset"].as_u64().unwrap())
        .unwrap();
    let victim = second["event"]["sequence"].as_u64().unwrap();
    let at = (second["offset"].as_u64().unwrap() + third_offset) / 2;
    let mut bytes = std::fs::read(&sealed).unwrap();
    bytes[at as usize] ^= 0x55;
    std::fs::write(&sealed, &bytes).unwrap();
    let mut torn = std::fs::OpenOptions::new().append(true).open(&open).unwrap();
    torn.write_all(&bytes[64..64 + 40]).unwrap();
    drop(torn);

    let (after, err) = show(&dir.path().join("data"), "web");
    assert_eq!(after.len(), 11, "{err}");
    assert!(err.contains("damaged"), "{err}");

    let mut replay = Sluice::start_in(
        dir,
        &format!(
            "data_dir: '{{dir}}/data'
api: {{address: '127.0.0.1:0'}}
pipelines:
  web:
    workers: 1
    inputs: [{{type: tcp, address: '127.0.0.1:{port}'}}]
    outputs: [{{type: blackhole}}]
    dead_letter_queue: {{enabled: true, segment_bytes: 1KiB}}
  fix:
    workers: 1
    inputs: [{{type: dead_letter_queue, id: replay, pipeline: web}}]
    outputs: [{{type: file, path: '{{dir}}/replayed.ndjson'}}]
"
        ),
        Stdio::null(),
    );
    let api = replay.api();
    let out = replay.path("replayed.ndjson");
    wait_until("the intact entries replayed", Duration::from_secs(30), || lines_of(&out).len() == 11);
    let expected: Vec<u64> = (0..12).filter(|s| *s != victim).collect();
    assert_eq!(sequences(&lines_of(&out), "/sequence"), expected, "the damaged one missing, neighbours delivered");
    let t = metrics_text(&api);
    let damaged = metric(
        &t,
        "sluice_component_events_failed_total{pipeline=\"fix\",component=\"replay\",kind=\"input\",type=\"dead_letter_queue\"}",
    );
    assert!(damaged >= 1.0, "the damaged entry is counted: {t}");
    let (status, log) = replay.stop();
    assert!(status.success(), "{log}");
}

#[test]
fn config_errors_name_the_place() {
    let (ok, text) = common::validate(
        "pipelines:
  web:
    inputs: [{type: stdin}]
    processors: [{type: json, on_failure: dlq}]
    outputs: [{type: stdout}]
    dead_letter_queue: {enabled: false, storage_policy: drop_oldest}
",
    );
    assert!(!ok);
    assert!(text.contains("check.yml:6:57: pipelines.web.dead_letter_queue.storage_policy"), "{text}");
    let (ok, text) = common::validate(
        "pipelines:
  web:
    inputs: [{type: stdin}]
    processors: [{type: json, on_failure: dlq}]
    outputs: [{type: stdout}]
",
    );
    assert!(!ok);
    assert!(
        text.contains(
            "pipelines.web.processors[0].on_failure: `on_failure: dlq` needs the pipeline's dead letter queue"
        ),
        "{text}"
    );
    let (ok, text) = common::validate(
        "pipelines:
  web:
    inputs: [{type: dead_letter_queue, pipeline: web, start_from: yesterday}, {type: dead_letter_queue}]
    outputs: [{type: stdout}]
",
    );
    assert!(!ok);
    assert!(text.contains("pipelines.web.inputs[0].start_from"), "{text}");
    assert!(text.contains("give `pipeline`"), "{text}");
    let (ok, text) = common::validate(
        "pipelines:
  a:
    inputs: [{type: stdin}]
    outputs: [{type: stdout}]
    dead_letter_queue: {enabled: true, path: /srv/a-dlq}
  b:
    inputs: [{type: dead_letter_queue, pipeline: a}]
    outputs: [{type: stdout}]
",
    );
    assert!(!ok);
    assert!(
        text.contains("pipelines.b.inputs[0].pipeline: pipeline `a` keeps its dead letter queue at /srv/a-dlq"),
        "{text}"
    );
    let (ok, text) = common::validate(
        "pipelines:
  a:
    inputs: [{type: stdin}]
    outputs: [{type: stdout}]
    dead_letter_queue: {enabled: true, path: /srv/shared-dlq}
  b:
    inputs: [{type: stdin}]
    outputs: [{type: stdout}]
    dead_letter_queue: {enabled: true, path: /srv/shared-dlq}
",
    );
    assert!(!ok);
    assert!(
        text.contains("check.yml:9:46: pipelines.b.dead_letter_queue.path: dead letter queue /srv/shared-dlq is already used by pipeline `a`"),
        "{text}"
    );
}

#[test]
fn a_reload_keeps_the_queue_when_its_settings_did_not_change_and_start_from_picks_a_time() {
    let port = free_port();
    let config = |workers: u32, max_bytes: &str| {
        format!(
            "data_dir: '{{dir}}/data'
api: {{enabled: false}}
pipelines:
  web:
    workers: {workers}
    inputs: [{{type: tcp, address: '127.0.0.1:{port}'}}]
    processors: [{{type: json, on_failure: dlq}}]
    outputs: [{{type: blackhole}}]
    dead_letter_queue: {{enabled: true, max_bytes: {max_bytes}}}
"
        )
    };
    let mut s = Sluice::start(&config(1, "1MiB"));
    s.wait_port(port);
    let send = |line: &str| {
        let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.write_all(format!("{line}\n").as_bytes()).unwrap();
    };
    let opened = |s: &Sluice| s.log().matches("dead letter queue open").count();
    let stored = |s: &Sluice| {
        let (entries, _) = show(&s.path("data"), "web");
        entries.len()
    };
    send("first, not json");
    wait_until("the first entry", Duration::from_secs(30), || stored(&s) == 1);

    let reload = |s: &mut Sluice, text: String, times: usize| {
        std::fs::write(&s.config, text.replace("{dir}", s.dir.path().to_str().unwrap())).unwrap();
        s.signal("HUP");
        wait_until("the reload", Duration::from_secs(30), || s.log().matches("config reloaded").count() == times);
    };
    reload(&mut s, config(2, "1MiB"), 1);
    assert_eq!(opened(&s), 1, "the queue was kept open across the restart of the pipeline:\n{}", s.log());
    send("second, not json");
    wait_until("the second entry", Duration::from_secs(30), || stored(&s) == 2);

    reload(&mut s, config(2, "2MiB"), 2);
    assert_eq!(opened(&s), 2, "new settings: closed and opened again:\n{}", s.log());
    send("third, not json");
    wait_until("the third entry", Duration::from_secs(30), || stored(&s) == 3);
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");

    let (entries, _) = show(&s.path("data"), "web");
    let messages: Vec<&str> = entries.iter().map(|e| e["event"]["message"].as_str().unwrap()).collect();
    assert_eq!(messages, ["first, not json", "second, not json", "third, not json"]);
    let since = entries[1]["time"].as_str().unwrap().to_string();
    let dir = s.into_dir();
    let mut r = Sluice::start_in(
        dir,
        &format!(
            "data_dir: '{{dir}}/data'
api: {{enabled: false}}
pipelines:
  fix:
    inputs: [{{type: dead_letter_queue, pipeline: web, start_from: '{since}', follow: false, commit_offsets: false}}]
    outputs: [{{type: file, path: '{{dir}}/since.ndjson'}}]
"
        ),
        Stdio::null(),
    );
    let (status, log) = r.wait(Duration::from_secs(60));
    assert!(status.success(), "{log}");
    let got: Vec<String> =
        lines_of(&r.path("since.ndjson")).iter().map(|d| d["message"].as_str().unwrap().to_string()).collect();
    assert_eq!(got, ["second, not json", "third, not json"], "entries from that time on");
}

/// A replay from a `path` that does not exist (mistyped) says so and fails, instead of creating
/// an empty directory and ending with nothing said.
#[test]
fn a_replay_from_a_path_that_does_not_exist_fails_naming_it() {
    let mut s = Sluice::start(
        "data_dir: '{dir}/data'
api: {enabled: false}
pipelines:
  fix:
    inputs: [{type: dead_letter_queue, path: '{dir}/data/dlq/wbe', follow: false}]
    outputs: [{type: blackhole}]
",
    );
    let (status, log) = s.wait(Duration::from_secs(30));
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("no dead letter queue at") && log.contains("dlq/wbe") && log.contains("does not exist"),
        "{log}"
    );
    assert!(!s.path("data/dlq/wbe").exists(), "an empty directory was created for the typo");
}
