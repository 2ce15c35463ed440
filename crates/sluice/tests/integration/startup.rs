//! How `sluice run` starts and stops: what it says, what stops a start (a taken port, at start
//! and at a reload), `/health` and the drain's bound.

use crate::common;

use std::time::Duration;

use common::Sluice;

#[test]
fn run_logs_the_version_config_and_data_dir_at_start() {
    let mut s = Sluice::start(
        "data_dir: {dir}/state\napi: {enabled: false}\npipelines:\n  web:\n    inputs: [{type: generator, count: 10}]\n    outputs: [{type: blackhole}]\n",
    );
    let (status, log) = s.wait(Duration::from_secs(60));
    assert!(status.success(), "{log}");
    let line = log.lines().find(|l| l.contains("sluice starting")).unwrap_or_else(|| panic!("no start line:\n{log}"));
    assert!(line.contains(&format!("version={}", env!("CARGO_PKG_VERSION"))), "{line}");
    assert!(line.contains(&format!("config={}", s.config.display())), "{line}");
    assert!(line.contains(&format!("data_dir={}", s.path("state").display())), "{line}");
    // It comes before the pipelines start.
    assert!(log.find("sluice starting") < log.find("pipeline web:"), "{log}");
}

#[test]
fn run_without_a_config_names_the_embedded_default() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(common::BIN)
        .arg("run")
        .current_dir(dir.path())
        .env("SLUICE_LOG", "info")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    assert!(log.contains("sluice starting") && log.contains("config=embedded default"), "{log}");
}

/// A port held by someone else for the test's length.
fn taken_port() -> (std::net::TcpListener, u16) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

#[test]
fn a_taken_port_stops_the_start_naming_each_pipeline_input_and_address() {
    let (_held_tcp, tcp_port) = taken_port();
    let (_held_http, http_port) = taken_port();
    let started = std::time::Instant::now();
    let mut s = Sluice::start(&format!(
        "data_dir: {{dir}}/state\napi: {{enabled: false}}\npipelines:\n  \
         logs:\n    inputs: [{{type: tcp, id: lines, address: '127.0.0.1:{tcp_port}'}}]\n    outputs: [{{type: blackhole}}]\n  \
         web:\n    inputs: [{{type: http, id: hooks, address: '127.0.0.1:{http_port}'}}, {{type: generator}}]\n    outputs: [{{type: blackhole}}]\n"
    ));
    let (status, log) = s.wait(Duration::from_secs(60));
    assert_eq!(status.code(), Some(2), "{log}");
    for (pipeline, input, kind, port) in [("logs", "lines", "tcp", tcp_port), ("web", "hooks", "http", http_port)] {
        let line = log
            .lines()
            .find(|l| l.contains(&format!("pipeline `{pipeline}`")) && l.contains("cannot start"))
            .unwrap_or_else(|| panic!("no start failure for pipeline {pipeline}:\n{log}"));
        assert!(
            line.contains(&format!("input `{input}` ({kind})")) && line.contains(&format!("127.0.0.1:{port}")),
            "{line}"
        );
    }
    // Not left running until a signal: it gave up at once (the generator ran meanwhile).
    assert!(started.elapsed() < Duration::from_secs(40), "took {:?}", started.elapsed());
}

#[test]
fn a_taken_api_address_stops_the_start() {
    let (_held, port) = taken_port();
    let mut s = Sluice::start(&format!(
        "data_dir: {{dir}}/state\napi: {{address: '127.0.0.1:{port}'}}\npipelines:\n  web:\n    inputs: [{{type: generator}}]\n    outputs: [{{type: blackhole}}]\n"
    ));
    let (status, log) = s.wait(Duration::from_secs(60));
    assert_eq!(status.code(), Some(2), "{log}");
    assert!(log.contains("api.address") && log.contains(&format!("127.0.0.1:{port}")), "{log}");
    assert!(!log.contains("pipeline started"), "pipelines started before the API could listen:\n{log}");
}

#[test]
fn a_reload_that_cannot_listen_keeps_the_running_config_and_is_counted() {
    let port = common::free_port();
    let (_held, taken) = taken_port();
    let api_port = common::free_port();
    let config = |port: u16| {
        format!(
            "data_dir: {{dir}}/state\napi: {{address: '127.0.0.1:{api_port}'}}\npipelines:\n  \
             logs:\n    inputs: [{{type: tcp, id: lines, address: '127.0.0.1:{port}'}}]\n    \
             outputs: [{{type: file, path: '{{dir}}/out.log', codec: text}}]\n"
        )
    };
    let mut s = Sluice::start(&config(port));
    s.wait_port(port);
    let api = s.api();
    std::fs::write(&s.config, config(taken).replace("{dir}", s.dir.path().to_str().unwrap())).unwrap();
    s.signal("HUP");
    s.wait_log("could not start; going back to the running one", Duration::from_secs(60));
    let log = s.log();
    assert!(log.contains(&format!("127.0.0.1:{taken}")), "the taken address is not named:\n{log}");
    // The old input serves again on its port, and what it takes is delivered.
    s.wait_port(port);
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    std::io::Write::write_all(&mut c, b"after the failed reload\n").unwrap();
    drop(c);
    let out = s.path("out.log");
    common::wait_until("the line to be delivered", Duration::from_secs(30), || {
        std::fs::read_to_string(&out).is_ok_and(|t| t.contains("after the failed reload"))
    });
    let (status, metrics) = common::http(&api, "GET", "/metrics", &[], b"");
    assert_eq!(status, 200);
    assert_eq!(common::metric(&metrics, "sluice_config_reloads_total{result=\"failed\"}"), 1.0, "{metrics}");
    assert_eq!(common::metric(&metrics, "sluice_config_reloads_total{result=\"succeeded\"}"), 0.0, "{metrics}");
    assert!(common::metric(&metrics, "sluice_config_last_reload_timestamp_seconds") > 1.0e9, "{metrics}");
    let stats = common::get_json(&api, "/stats");
    assert_eq!(stats["reloads"]["failed"], 1, "{stats}");
    assert_eq!(stats["version"], env!("CARGO_PKG_VERSION"), "{stats}");
    let health = common::get_json(&api, "/health");
    assert_eq!(health["status"], "ok", "{health}");
    assert_eq!(health["pipelines"]["logs"]["components"][0]["state"], "running", "{health}");
    let (status, _) = s.stop();
    assert!(status.success());
}

#[test]
fn health_answers_503_while_the_node_drains() {
    let api_port = common::free_port();
    let dead = common::free_port();
    let mut s = Sluice::start(&format!(
        "data_dir: {{dir}}/state\nshutdown_timeout: 30s\napi: {{address: '127.0.0.1:{api_port}'}}\npipelines:\n  \
         stuck:\n    inputs: [{{type: generator}}]\n    \
         outputs: [{{type: http, url: 'http://127.0.0.1:{dead}/'}}]\n"
    ));
    let api = s.api();
    let health = common::get_json(&api, "/health");
    assert_eq!(health["status"], "ok", "{health}");
    let states: Vec<_> =
        health["pipelines"]["stuck"]["components"].as_array().unwrap().iter().map(|c| c["state"].clone()).collect();
    assert_eq!(states, ["running", "running"], "{health}");
    // The output cannot deliver: the drain lasts until the timeout.
    s.signal("TERM");
    common::wait_until("/health to say draining", Duration::from_secs(20), || {
        let (status, body) = common::http(&api, "GET", "/health", &[], b"");
        status == 503 && body.contains("\"draining\"")
    });
    let (status, metrics) = common::http(&api, "GET", "/metrics", &[], b"");
    assert_eq!(status, 200);
    assert_eq!(common::metric(&metrics, "sluice_draining"), 1.0, "{metrics}");
}

#[test]
fn stuck_pipelines_stop_together_within_one_shutdown_timeout() {
    let dead = common::free_port();
    let pipeline = |name: &str| {
        format!(
            "  {name}:\n    inputs: [{{type: generator}}]\n    \
             outputs: [{{type: http, url: 'http://127.0.0.1:{dead}/{name}'}}]\n"
        )
    };
    let mut s = Sluice::start(&format!(
        "data_dir: {{dir}}/state\nshutdown_timeout: 4s\napi: {{enabled: false}}\npipelines:\n{}{}{}",
        pipeline("a"),
        pipeline("b"),
        pipeline("c")
    ));
    s.wait_log("pipeline started", Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(1));
    let asked = std::time::Instant::now();
    s.signal("TERM");
    let (_, log) = s.wait(Duration::from_secs(60));
    let took = asked.elapsed();
    // One after the other they would take three timeouts (12 s); together one, plus the
    // abort of deliveries in progress. The bound is loose for a loaded machine, and still
    // below two timeouts.
    assert!(took < Duration::from_secs(8), "stopping took {took:?}:\n{log}");
    for name in ["a", "b", "c"] {
        assert!(log.contains(&format!("pipeline {name}:")), "no summary of {name}:\n{log}");
    }
}
