//! What `sluice run` says when it starts.

mod common;

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
