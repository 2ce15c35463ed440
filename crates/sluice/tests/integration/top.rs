//! `sluice top` against a running `sluice run`: the live view in a pseudo-terminal (read back
//! through a terminal emulator, so the test sees the screen a person would), plain lines when
//! the output is piped, and the error for an address nothing listens on.

use crate::common;

use std::io::{Read, Write};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{BIN, Sluice, component, eventually, free_port, get_json, http};
use portable_pty::{CommandBuilder, PtySize, native_pty_system};

const ROWS: u16 = 40;
const COLS: u16 = 160;

/// A pipeline that moves events steadily for as long as the test runs, with an API on a
/// known port (so that `-c` can find it too).
fn steady() -> (Sluice, String) {
    let port = free_port();
    let mut s = Sluice::start(&format!(
        "api: {{address: \"127.0.0.1:{port}\"}}
data_dir: {{dir}}/data
pipelines:
  steady:
    inputs: [{{type: generator, rate: 2000, id: gen}}]
    processors: [{{type: mutate, id: tag, add_tag: [seen]}}]
    outputs: [{{type: blackhole, id: sink}}]
"
    ));
    let api = s.api();
    assert_eq!(api, format!("127.0.0.1:{port}"));
    (s, api)
}

/// The screen row of `name` split into cells: `name` is its first word.
fn screen_row<'a>(screen: &'a str, name: &str) -> Option<Vec<&'a str>> {
    screen.lines().find_map(|l| {
        let cells: Vec<&str> = l.trim_matches(|c: char| c == '│' || c.is_whitespace()).split_whitespace().collect();
        (cells.first() == Some(&name)).then_some(cells)
    })
}

fn rate(cells: &[&str], at: usize) -> f64 {
    cells.get(at).and_then(|c| c.parse().ok()).unwrap_or(0.0)
}

#[test]
fn live_view_in_a_terminal_shows_rates_and_quits_on_q() {
    let (mut sluice, api) = steady();
    let pty = native_pty_system();
    let pair = pty.openpty(PtySize { rows: ROWS, cols: COLS, pixel_width: 0, pixel_height: 0 }).unwrap();
    let mut cmd = CommandBuilder::new(BIN);
    cmd.args(["top", "--api", &api]);
    cmd.env("TERM", "xterm-256color");
    cmd.cwd(sluice.dir.path());
    let mut child = pair.slave.spawn_command(cmd).unwrap();
    drop(pair.slave);
    let mut reader = pair.master.try_clone_reader().unwrap();
    let mut keys = pair.master.take_writer().unwrap();
    let (tx, rx) = mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut term = vt100::Parser::new(ROWS, COLS, 0);
    let feed = |term: &mut vt100::Parser, until: Instant| {
        while let Ok(bytes) = rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
            term.process(&bytes);
            if Instant::now() >= until {
                break;
            }
        }
    };

    // The first screen has no rates yet (they need two snapshots); later ones do.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut screen = String::new();
    while Instant::now() < deadline {
        feed(&mut term, Instant::now() + Duration::from_millis(250));
        screen = term.screen().contents();
        let shown = screen_row(&screen, "steady").is_some_and(|r| r[1] == "pipeline" && rate(&r, 2) > 0.0)
            && screen_row(&screen, "gen").is_some_and(|r| rate(&r, 3) > 0.0)
            && screen_row(&screen, "tag").is_some()
            && screen_row(&screen, "sink").is_some_and(|r| rate(&r, 2) > 0.0);
        if shown {
            break;
        }
        assert!(child.try_wait().unwrap().is_none(), "sluice top exited early; screen:\n{screen}");
    }
    let row = screen_row(&screen, "steady").unwrap_or_else(|| panic!("no pipeline row; screen:\n{screen}"));
    assert!(rate(&row, 2) > 0.0 && rate(&row, 3) > 0.0, "no rate for the pipeline; screen:\n{screen}");
    for id in ["gen", "tag", "sink"] {
        assert!(screen_row(&screen, id).is_some(), "component {id} missing; screen:\n{screen}");
    }
    assert!(screen.contains("127.0.0.1:"), "the header names the API; screen:\n{screen}");
    assert!(term.screen().alternate_screen(), "the view draws on the alternate screen");

    keys.write_all(b"q").unwrap();
    keys.flush().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("sluice top did not exit within 5 s of `q`; screen:\n{}", term.screen().contents());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "exit status {status:?}");
    feed(&mut term, Instant::now() + Duration::from_millis(300));
    assert!(!term.screen().alternate_screen(), "the main screen is back after `q`");
    assert!(!term.screen().hide_cursor(), "the cursor is shown again after `q`");
    sluice.stop();
}

/// The value of `key=` in a plain line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace().find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

#[test]
fn once_with_a_pipe_prints_plain_lines() {
    let (mut sluice, api) = steady();
    // Let a few batches through, so that the first interval has events in it.
    std::thread::sleep(Duration::from_millis(500));
    let by_api = Command::new(BIN).args(["top", "--api", &api, "--once"]).output().unwrap();
    let by_config = Command::new(BIN)
        .args(["top", "-c", sluice.config.to_str().unwrap(), "--once", "--interval", "500ms"])
        .output()
        .unwrap();
    sluice.stop();
    for out in [by_api, by_config] {
        let stdout = String::from_utf8(out.stdout).unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "exit {:?}: {stderr}", out.status);
        assert!(!stdout.contains('\x1b'), "no escape sequences in plain output: {stdout:?}");
        let lines: Vec<&str> = stdout.lines().collect();
        let pipeline = lines
            .iter()
            .find(|l| field(l, "pipeline") == Some("steady") && field(l, "component").is_none())
            .unwrap_or_else(|| panic!("no pipeline line: {stdout}"));
        let rate: f64 = field(pipeline, "in_per_sec").and_then(|r| r.parse().ok()).unwrap_or(0.0);
        assert!(rate > 0.0, "a rate for the pipeline: {pipeline}");
        assert!(field(pipeline, "out_per_sec").is_some_and(|r| r.parse::<f64>().is_ok()), "{pipeline}");
        for id in ["gen", "tag", "sink"] {
            assert!(lines.iter().any(|l| field(l, "component") == Some(id)), "component {id}: {stdout}");
        }
        assert_eq!(lines.len(), 4, "one line per pipeline and component, once: {stdout}");
    }
}

#[test]
fn an_address_nothing_listens_on_is_a_one_line_error() {
    let address = format!("127.0.0.1:{}", free_port());
    let out = Command::new(BIN).args(["top", "--api", &address, "--once"]).output().unwrap();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success(), "exit 0 without an API: {stderr}");
    assert!(stderr.contains(&address), "the error names {address}: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    assert!(out.stdout.is_empty());
    // The same without --once on a pipe, and in the live view: it fails before drawing.
    let out = Command::new(BIN).args(["top", "--api", &address]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains(&address));
}

#[test]
fn with_a_config_only_its_api_section_needs_to_read() {
    let (mut sluice, api) = steady();
    // What an operator's shell may lack: a variable `sluice run` had, used outside `api`.
    let other = sluice.path("operator-view.yml");
    std::fs::write(
        &other,
        format!(
            "api: {{address: \"{api}\"}}\npipelines:\n  steady:\n    inputs: [{{type: generator}}]\n    \
             outputs: [{{type: http, url: \"${{SLUICE_TOP_TEST_UNSET_URL}}\"}}]\n"
        ),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["top", "-c", other.to_str().unwrap(), "--once"])
        .env_remove("SLUICE_TOP_TEST_UNSET_URL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "exit {:?}: {}", out.status, String::from_utf8_lossy(&out.stderr));
    let sink = stdout.lines().find(|l| field(l, "component") == Some("sink")).unwrap_or_else(|| panic!("{stdout}"));
    assert_eq!(field(sink, "state"), Some("running"), "{sink}");
    assert!(field(sink, "retries").is_some(), "{sink}");

    // A variable in the `api` section itself is still needed, and named.
    std::fs::write(&other, "api: {address: \"${SLUICE_TOP_TEST_UNSET_API}\"}\npipelines: {}\n").unwrap();
    let out = Command::new(BIN)
        .args(["top", "-c", other.to_str().unwrap(), "--once"])
        .env_remove("SLUICE_TOP_TEST_UNSET_API")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("SLUICE_TOP_TEST_UNSET_API"), "{stderr}");
    sluice.stop();
}

/// A node with many kinds of component and every store: a persisted queue, a dead letter queue
/// and its replay, the registry (a file input), the memory budget, a one-node cluster, an
/// output that cannot reach its engine, a stateful processor.
fn many_components() -> (Sluice, String) {
    let (api, tcp, http, udp, node, engine) =
        (free_port(), free_port(), free_port(), free_port(), free_port(), free_port());
    let mut s = Sluice::start(&format!(
        "api: {{address: \"127.0.0.1:{api}\"}}
data_dir: '{{dir}}/data'
cluster:
  listen: 127.0.0.1:{node}
  discovery: {{static: [127.0.0.1:{node}]}}
pipelines:
  web:
    queue: {{type: persisted}}
    inputs:
      - {{type: generator, id: gen, rate: 200, lines: ['{{\"user\":\"a\"}}', 'not json']}}
      - {{type: tcp, id: tcp_in, address: '127.0.0.1:{tcp}'}}
      - {{type: http, id: http_in, address: '127.0.0.1:{http}'}}
      - {{type: syslog, id: udp_in, mode: udp, address: '127.0.0.1:{udp}'}}
      - {{type: file, id: files, include: ['{{dir}}/in/*.log'], scan_interval: 100ms}}
    processors:
      - {{type: json, id: parse, on_failure: dlq}}
      - {{type: mutate, id: tag, add_tag: [seen]}}
      - {{type: aggregate, id: per_user, identification_keys: [/user], group_duration: 1s, action: count}}
    outputs:
      - {{type: file, id: out, path: '{{dir}}/out.log'}}
      - {{type: blackhole, id: sink}}
    dead_letter_queue: {{enabled: true}}
  search:
    inputs: [{{type: generator, id: gen2, count: 5}}]
    outputs:
      - {{type: elasticsearch, id: es, hosts: ['http://127.0.0.1:{engine}'], index: logs,
          retry: {{initial_backoff: 20ms, max_backoff: 100ms}}}}
  replay:
    inputs: [{{type: dead_letter_queue, id: dlq_in, pipeline: web}}]
    outputs: [{{type: blackhole, id: drain}}]
"
    ));
    let api = s.api();
    (s, api)
}

/// The shape of a `/metrics` scrape: each family's name, type and help, then the names and label
/// names of its samples (values, and label values, left out: they move).
fn metrics_shape(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut samples = std::collections::BTreeSet::new();
    let flush = |out: &mut Vec<String>, samples: &mut std::collections::BTreeSet<String>| {
        out.extend(samples.iter().map(|s| format!("  {s}")));
        samples.clear();
    };
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            flush(&mut out, &mut samples);
            out.push(format!("HELP {rest}"));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            out.push(format!("TYPE {rest}"));
        } else if line.starts_with('#') {
            out.push(line.to_string());
        } else {
            let series = line.rsplit_once(' ').map_or(line, |(s, _)| s);
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            // Label names: what precedes each `="` outside a quoted value.
            let (mut names, mut quoted, mut escaped, mut word) = (Vec::new(), false, false, String::new());
            for c in labels.chars() {
                match (quoted, c) {
                    (true, '\\') if !escaped => escaped = true,
                    (true, '"') if !escaped => quoted = false,
                    (true, _) => escaped = false,
                    (false, '"') => quoted = true,
                    (false, '=') => names.push(std::mem::take(&mut word)),
                    (false, ',' | '}') => word.clear(),
                    (false, c) => word.push(c),
                }
            }
            names.sort();
            samples.insert(format!("{name}{{{}}}", names.join(",")));
        }
    }
    flush(&mut out, &mut samples);
    out
}

/// The shape of a JSON document: every path with the types found there (`[]` for any element
/// of an array: elements' shapes are merged, so that a count of shards does not matter).
fn json_shape(
    v: &serde_json::Value,
    path: &str,
    out: &mut std::collections::BTreeMap<String, std::collections::BTreeSet<&'static str>>,
) {
    use serde_json::Value;
    let kind = match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float",
        Value::Number(_) => "int",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    out.entry(path.to_string()).or_default().insert(kind);
    match v {
        Value::Array(items) => items.iter().for_each(|i| json_shape(i, &format!("{path}[]"), out)),
        Value::Object(map) => map.iter().for_each(|(k, v)| json_shape(v, &format!("{path}.{k}"), out)),
        _ => {}
    }
}

const GOLDEN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/figures.golden");

/// Every figure's name, type, help and labels at `/metrics`, and the keys and value types of
/// `/stats`, are as recorded in `tests/figures.golden`: a figure renamed, retyped or dropped
/// fails here. After a change meant to show, `SLUICE_BLESS=1` rewrites the file.
#[test]
fn metrics_and_stats_keep_their_names_and_shapes() {
    let (sluice, api) = many_components();
    std::fs::create_dir_all(sluice.path("in")).unwrap();
    std::fs::write(sluice.path("in/a.log"), "{\"user\":\"b\"}\n").unwrap();
    // Settled: events went through every pipeline, the dead letter queue holds some and was
    // replayed, the output that cannot reach its engine failed an attempt, groups concluded.
    let settled = || {
        let stats = get_json(&api, "/stats");
        let web = &stats["pipelines"]["web"];
        let count = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
        let es = component(&stats, "search", "id", "es");
        count(&web["events"]["out"]) > 0
            && count(&web["dead_letter_queue"]["entries"]) > 0
            && count(&component(&stats, "web", "id", "files")["events"]["out"]) > 0
            && count(&component(&stats, "web", "id", "per_user")["state"]["groups_concluded"]) > 0
            && count(&component(&stats, "replay", "id", "dlq_in")["events"]["out"]) > 0
            && !web["ack_latency"]["p50_seconds"].is_null()
            && !stats["pipelines"]["replay"]["ack_latency"]["p50_seconds"].is_null()
            && es["output_state"] == "retrying"
            && !es["last_error"].is_null()
    };
    assert!(eventually(Duration::from_secs(30), settled), "the node did not settle: {}", get_json(&api, "/stats"));
    let (status, metrics) = http(&api, "GET", "/metrics", &[], b"");
    assert_eq!(status, 200, "{metrics}");
    let stats = get_json(&api, "/stats");
    // Killed: a clean stop would wait out the drain of the output that cannot deliver.
    drop(sluice.kill_into_dir());

    let mut shape = vec!["# /metrics".to_string()];
    shape.extend(metrics_shape(&metrics));
    shape.push("# /stats".to_string());
    let mut paths = std::collections::BTreeMap::new();
    json_shape(&stats, "", &mut paths);
    shape.extend(
        paths.iter().map(|(path, kinds)| format!("{path}: {}", kinds.iter().copied().collect::<Vec<_>>().join("|"))),
    );
    let shape = shape.join("\n") + "\n";
    if std::env::var_os("SLUICE_BLESS").is_some() {
        std::fs::write(GOLDEN, &shape).unwrap();
    }
    let golden = std::fs::read_to_string(GOLDEN).unwrap_or_default();
    if golden != shape {
        let (old, new): (Vec<&str>, Vec<&str>) = (golden.lines().collect(), shape.lines().collect());
        let gone: Vec<&&str> = old.iter().filter(|l| !new.contains(l)).collect();
        let added: Vec<&&str> = new.iter().filter(|l| !old.contains(l)).collect();
        panic!("the figures' shape changed (SLUICE_BLESS=1 records it)\ngone: {gone:#?}\nnew: {added:#?}");
    }
}
