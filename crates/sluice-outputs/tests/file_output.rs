//! The `file` output in a temporary directory.

mod common;

use std::time::Duration;

use common::{build, build_err, event, numbered, refs};
use serde_json::json;

fn read(path: impl AsRef<std::path::Path>) -> String {
    std::fs::read_to_string(path.as_ref()).unwrap_or_else(|e| panic!("{}: {e}", path.as_ref().display()))
}

#[tokio::test]
async fn path_template_by_field_and_date() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().display();
    let out = build(&format!("{{type: file, path: '{root}/%{{/service}}/%{{+%Y-%m-%d}}.log'}}"));
    let mut late = event(json!({"service": "api", "message": "next day"}));
    late.set_timestamp_nanos(1_700_000_000_000_000_000 + 86_400_000_000_000);
    let events = vec![
        event(json!({"service": "api", "message": "one"})),
        event(json!({"service": "db", "message": "two"})),
        event(json!({"service": "api", "message": "three"})),
        late,
    ];
    let d = out.send(&refs(&events)).await.unwrap();
    assert!(d.rejected.is_empty(), "{:?}", d.rejected);
    let api = read(dir.path().join("api/2023-11-14.log"));
    let api: Vec<serde_json::Value> = api.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(api.len(), 2);
    assert_eq!((api[0]["message"].as_str(), api[1]["message"].as_str()), (Some("one"), Some("three")));
    assert_eq!(api[0]["@timestamp"], "2023-11-14T22:13:20.000Z");
    assert_eq!(read(dir.path().join("db/2023-11-14.log")).lines().count(), 1);
    assert!(read(dir.path().join("api/2023-11-15.log")).contains("next day"));

    // Appends, across sends and across reopening.
    out.send(&refs(&events[..1])).await.unwrap();
    out.close().await;
    let again = build(&format!("{{type: file, path: '{root}/%{{/service}}/%{{+%Y-%m-%d}}.log'}}"));
    again.send(&refs(&events[..1])).await.unwrap();
    assert_eq!(read(dir.path().join("api/2023-11-14.log")).lines().count(), 4);
}

#[tokio::test]
async fn paths_that_climb_out_or_render_empty_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().display();
    let out = build(&format!("{{type: file, path: '{root}/%{{/service}}.log'}}"));
    let events = vec![
        event(json!({"service": "ok", "message": "kept"})),
        event(json!({"service": "../../escape", "message": "bad"})),
        event(json!({"service": "a/../../b", "message": "bad"})),
        event(json!({"service": "ok", "message": "kept too"})),
    ];
    let d = out.send(&refs(&events)).await.unwrap();
    assert_eq!(d.rejected.iter().map(|r| r.index).collect::<Vec<_>>(), [1, 2]);
    assert!(d.rejected[0].reason.contains("`..`"), "{}", d.rejected[0].reason);
    assert!(d.rejected.iter().all(|r| r.permanent), "the event's own path is at fault");
    assert_eq!(read(dir.path().join("ok.log")).lines().count(), 2);
    assert!(!dir.path().parent().unwrap().join("escape.log").exists());

    let only_field = build("{type: file, path: '%{/nothing}'}");
    let d = only_field.send(&refs(&events[..1])).await.unwrap();
    assert!(d.rejected[0].reason.contains("empty"), "{}", d.rejected[0].reason);

    assert!(build_err("{type: file, path: '../logs/out.log'}").contains("`..`"));
    assert!(build_err("{type: file}").contains("path"));
    assert!(build_err("{type: file, path: x.log, max_open_files: 0}").contains("max_open_files"));
}

#[tokio::test]
async fn text_codec_and_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plain.txt");
    let out = build(&format!("{{type: file, path: '{}', codec: text, fsync: true}}", path.display()));
    let mut events = numbered(3);
    events.push(event(json!({"no_message": true})));
    assert!(out.send(&refs(&events)).await.unwrap().rejected.is_empty());
    let text = read(&path);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[..3], ["event 0", "event 1", "event 2"]);
    assert!(lines[3].starts_with("{\"no_message\":true"), "{}", lines[3]);
}

#[tokio::test]
async fn more_files_than_max_open_files() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().display();
    let out = build(&format!("{{type: file, path: '{root}/%{{/k}}.log', max_open_files: 2, codec: text}}"));
    for round in 0..3 {
        let events: Vec<_> = (0..5).map(|k| event(json!({"k": k, "message": format!("r{round}")}))).collect();
        assert!(out.send(&refs(&events)).await.unwrap().rejected.is_empty());
    }
    for k in 0..5 {
        assert_eq!(read(dir.path().join(format!("{k}.log"))), "r0\nr1\nr2\n");
    }
}

#[tokio::test]
async fn io_errors_are_retried_then_rejected() {
    let dir = tempfile::tempdir().unwrap();
    // A regular file where a directory should be: neither opening nor creating works.
    std::fs::write(dir.path().join("blocker"), "").unwrap();
    let out = build(&format!(
        "{{type: file, path: '{}/blocker/%{{/k}}.log', retry: {{max_retries: 2, initial_backoff: 5ms, max_backoff: 5ms}}}}",
        dir.path().display()
    ));
    let events = vec![event(json!({"k": "a"})), event(json!({"k": "b"}))];
    let d = tokio::time::timeout(Duration::from_secs(10), out.send(&refs(&events))).await.unwrap().unwrap();
    assert_eq!(d.rejected.len(), 2);
    assert!(d.rejected[0].reason.starts_with("cannot write"), "{}", d.rejected[0].reason);
    assert!(!d.rejected[0].permanent, "an I/O error is not the event's fault");

    // Once the obstacle is gone, the same output writes.
    std::fs::remove_file(dir.path().join("blocker")).unwrap();
    assert!(out.send(&refs(&events)).await.unwrap().rejected.is_empty());
    assert!(dir.path().join("blocker/a.log").exists());
}

#[tokio::test]
async fn a_partial_last_line_left_by_a_crash_is_cut_before_new_events() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("out.log");
    std::fs::write(&path, "{\"n\":1}\n{\"n\":2,\"mess").unwrap();
    let out = build(&format!("{{type: file, path: '{}'}}", path.display()));
    let events = numbered(1);
    assert!(out.send(&refs(&events)).await.unwrap().rejected.is_empty());
    out.close().await;
    let text = read(&path);
    let lines: Vec<&str> = text.lines().collect();
    // The torn line's event is delivered again after the crash; its fragment would only be
    // a line no reader can parse.
    assert_eq!(lines.len(), 2, "{text:?}");
    assert_eq!(lines[0], "{\"n\":1}", "the whole line before it is kept");
    assert!(lines[1].contains("event 0"), "the new event follows the last whole line: {text:?}");
}
