//! `sluice registry show`: lists what the registry holds, as a table or JSON, without taking the
//! registry over; finds the data directory from a config; fails clearly when there is none.

use crate::common;

use std::process::Command;

use common::BIN;
use sluice_registry::{Registry, RegistryOptions};

fn populate(data_dir: &std::path::Path) {
    let r = Registry::open(&data_dir.join("registry"), RegistryOptions::default()).unwrap();
    let a = r.cursor("file:2049:131");
    a.set_meta(serde_json::json!({"path": "/var/log/app.log", "fingerprint": "9f2c"}));
    a.commit(4096);
    r.cursor("dlq:web").commit(17);
    r.cursor("gone").commit(1);
    r.flush().unwrap();
    r.remove("gone");
    r.close().unwrap();
}

fn show(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(["registry", "show"]).args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn shows_a_table_and_json_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    populate(dir.path());
    let files = |d: &std::path::Path| {
        let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(d.join("registry"))
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap())
            })
            .collect();
        v.sort();
        v
    };
    let before = files(dir.path());

    let (code, out, err) = show(&["--data-dir", dir.path().to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("KEY") && lines[0].contains("OFFSET") && lines[0].contains("PATH"), "{out}");
    assert!(lines[1].starts_with("dlq:web") && lines[1].contains(" 17 "), "{out}");
    assert!(lines[2].starts_with("file:2049:131") && lines[2].contains("4096"), "{out}");
    assert!(lines[2].contains("/var/log/app.log") && lines[2].contains(r#"{"fingerprint":"9f2c"}"#), "{out}");
    assert!(!out.contains("gone"), "a removed key is listed:\n{out}");
    assert!(lines[3].starts_with("2 key(s) in "), "{out}");
    // Aligned: the offset column ends at the same place in every row.
    let end = |l: &str, v: &str| l.find(v).unwrap() + v.len();
    assert_eq!(end(lines[0], "OFFSET"), end(lines[1], "17"), "{out}");
    assert_eq!(end(lines[0], "OFFSET"), end(lines[2], "4096"), "{out}");

    let (code, out, err) = show(&["--data-dir", dir.path().to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let entries = v["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[1]["key"], "file:2049:131");
    assert_eq!(entries[1]["offset"], 4096);
    assert_eq!(entries[1]["meta"]["path"], "/var/log/app.log");
    assert!(entries[1]["updated_unix_ms"].as_u64().unwrap() > 1_600_000_000_000);
    assert_eq!(v["in_use"], false);

    assert_eq!(files(dir.path()), before, "`registry show` changed the registry's files");
}

#[test]
fn reads_the_data_dir_from_a_config_and_while_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("state");
    populate(&data);
    let config = dir.path().join("sluice.yml");
    std::fs::write(
        &config,
        format!(
            "data_dir: {}\npipelines:\n  p:\n    inputs: [{{type: stdin}}]\n    outputs: [{{type: stdout}}]\n",
            data.display()
        ),
    )
    .unwrap();
    // Another holder of the registry (standing in for a running sluice) keeps the lock.
    let holder = Registry::open(&data.join("registry"), RegistryOptions::default()).unwrap();
    holder.cursor("dlq:web").commit(18);
    let (code, out, err) = show(&["-c", config.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("file:2049:131") && out.contains("dlq:web"), "{out}");
    assert!(err.contains("a running sluice holds this registry"), "{err}");
    // It never took the registry over: the holder still writes.
    holder.flush().unwrap();
    holder.close().unwrap();
    let (_, out, _) = show(&["-c", config.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["entries"][0]["offset"], 18);
}

#[test]
fn reports_damage_and_a_missing_registry() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, err) = show(&["--data-dir", dir.path().to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("registry") && err.contains(dir.path().to_str().unwrap()), "{err}");

    populate(dir.path());
    let log = dir.path().join("registry/log");
    let mut bytes = std::fs::read(&log).unwrap();
    let len = bytes.len();
    bytes[len - 3] ^= 0xff;
    std::fs::write(&log, &bytes).unwrap();
    let (code, out, err) = show(&["--data-dir", dir.path().to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("warning:") && err.contains("bad record at offset"), "{err}");
    // The last record (the removal of `gone`) is damaged: `gone` is back, as of the record before.
    assert!(out.contains("gone"), "{out}");
    assert_eq!(std::fs::read(&log).unwrap(), bytes, "`registry show` repaired the log");
}
