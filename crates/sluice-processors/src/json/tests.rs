//! Unit tests of the `json` processor.

use super::*;
use crate::common::{build_err, build_yaml, get, loghub, tags};

fn msg(text: &str) -> Event {
    Event::from_message_at(text, 7)
}

#[test]
fn merges_into_root_and_overwrites() {
    let p = build_yaml("type: json");
    let mut e = msg(r#"{"a":1,"b":{"c":[true,null,1.5]},"message":"inner","s":"x"}"#);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(get(&e, "/a"), Some(&Value::Int(1)));
    assert_eq!(get(&e, "/b/c/0"), Some(&Value::Bool(true)));
    assert_eq!(get(&e, "/b/c/1"), Some(&Value::Null));
    assert_eq!(get(&e, "/b/c/2"), Some(&Value::Float(1.5)));
    assert_eq!(e.message(), Some("inner"));
    assert_eq!(e.timestamp_nanos(), Some(7));
    assert_eq!(
        e.to_json_string(),
        r#"{"message":"inner","@timestamp":"1970-01-01T00:00:00.000000007Z","a":1,"b":{"c":[true,null,1.5]},"s":"x"}"#
    );
}

#[test]
fn duplicate_keys_last_wins() {
    let p = build_yaml("type: json");
    let mut e = msg(r#"{"k":1,"j":0,"k":2,"message":"a","message":"b"}"#);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(e.to_json_string(), r#"{"message":"b","@timestamp":"1970-01-01T00:00:00.000000007Z","k":2,"j":0}"#);
    // Many keys, so the fingerprints collide.
    let doc: String = (0..200).map(|i| format!(r#""f{i}":{i},"#)).collect::<String>() + r#""f7":"last""#;
    let mut e = msg(&format!("{{{doc}}}"));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(e.fields.len(), 202);
    assert_eq!(get(&e, "/f7"), Some(&Value::from("last")));
    assert_eq!(get(&e, "/f199"), Some(&Value::Int(199)));
}

#[test]
fn remove_source_only_on_success() {
    let p = build_yaml("type: json\nremove_source: true");
    let mut e = msg(r#"{"a":"b"}"#);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(e.message(), None);
    assert_eq!(get(&e, "/a"), Some(&Value::from("b")));
    let mut e = msg(r#"{"message":"again"}"#);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(e.message(), Some("again"), "a parsed field of the source's name survives");
    let mut e = msg("{not json");
    assert_eq!(p.process(&mut e), Verdict::Failed);
    assert_eq!(e.message(), Some("{not json"));
    assert_eq!(tags(&e), ["_jsonparsefailure"]);
}

#[test]
fn target_takes_any_value() {
    let p = build_yaml("type: json\nsource: /raw\ntarget: /parsed/doc\nremove_source: true");
    for (text, want) in [
        (r#"{"x":1}"#, Value::Object([("x".into(), Value::Int(1))].into_iter().collect())),
        ("[1,2]", Value::Array(vec![Value::Int(1), Value::Int(2)])),
        ("3.5", Value::Float(3.5)),
        (r#""s""#, Value::from("s")),
        ("null", Value::Null),
    ] {
        let mut e = Event::default();
        e.fields.insert("raw", Value::from(text));
        assert_eq!(p.process(&mut e), Verdict::Keep, "{text}");
        assert_eq!(get(&e, "/parsed/doc"), Some(&want));
        assert_eq!(get(&e, "/raw"), None);
    }
    // Target and source overlapping: the result is kept.
    let p = build_yaml("type: json\ntarget: /message\nremove_source: true");
    let mut e = msg(r#"{"x":1}"#);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(get(&e, "/message/x"), Some(&Value::Int(1)));
    let p = build_yaml("type: json\nsource: /a/raw\ntarget: /a\nremove_source: true");
    let mut e = Event::default();
    e.fields.insert("a", Value::Object([("raw".into(), Value::from(r#"{"raw":2}"#))].into_iter().collect()));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(e.to_json_string(), r#"{"a":{"raw":2}}"#);
    // A target under a scalar cannot be written; the source stays.
    let p = build_yaml("type: json\ntarget: /message/x");
    let mut e = msg("1");
    assert_eq!(p.process(&mut e), Verdict::Failed);
    assert_eq!(e.message(), Some("1"));
    assert_eq!(tags(&e), ["_jsonparsefailure"]);
}

#[test]
fn failures_keep_the_event_and_tag_it() {
    let p = build_yaml("type: json\ntag_on_failure: [bad, worse]");
    for text in ["", "{", r#"{"a":1}x"#, "[1,2]", "42", r#""str""#, "nul", r#"{"a":"\ud800"}"#] {
        let mut e = msg(text);
        let before = e.fields.clone();
        assert_eq!(p.process(&mut e), Verdict::Failed, "{text:?}");
        assert_eq!(tags(&e), ["bad", "worse"]);
        e.fields.remove("tags");
        assert_eq!(e.fields, before, "{text:?}");
    }
    // Missing or non-string source.
    let mut e = Event::default();
    assert_eq!(p.process(&mut e), Verdict::Failed);
    assert_eq!(tags(&e), ["bad", "worse"]);
    let mut e = Event::default();
    e.fields.insert("message", Value::Int(1));
    assert_eq!(p.process(&mut e), Verdict::Failed);
}

#[test]
fn a_parse_failing_half_way_is_rolled_back() {
    let p = build_yaml("type: json");
    for text in [
        r#"{"a":2,"new":3,"a":4,"message":"x","b":"#,
        r#"{"a":2,"message":"m","new":[1,2]}trailing"#,
        r#"{"a":2,"a":3,"message":{"k":1},"z":1,"z":2,"#,
    ] {
        let mut e = msg(text);
        e.fields.insert("a", Value::Int(1));
        e.fields.insert("b", Value::from("keep"));
        let before = e.fields.clone();
        assert_eq!(p.process(&mut e), Verdict::Failed, "{text}");
        e.fields.remove("tags");
        assert_eq!(e.fields, before, "{text}");
    }
    // Nested source: replaced by a parsed top-level field of its first name.
    let p = build_yaml("type: json\nsource: /raw/text");
    let mut e = Event::default();
    e.fields.insert("raw", Value::Object([("text".into(), Value::from(r#"{"raw":1}"#))].into_iter().collect()));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(e.to_json_string(), r#"{"raw":1}"#);
    let mut e = Event::default();
    e.fields.insert("raw", Value::Object([("text".into(), Value::from(r#"{"x":1}"#))].into_iter().collect()));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(e.to_json_string(), r#"{"raw":{"text":"{\"x\":1}"},"x":1}"#);
}

#[test]
fn timestamp_field_is_converted() {
    let p = build_yaml("type: json");
    let mut e = msg(r#"{"@timestamp":"2026-11-21T07:00:00.123Z","a":1}"#);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(e.timestamp_nanos(), Some(1_795_244_400_123_000_000));
    let mut e = msg(r#"{"@timestamp":"2026-11-21T09:00:00+02:00"}"#);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(e.timestamp_nanos(), Some(1_795_244_400_000_000_000));
    let mut e = msg(r#"{"@timestamp":"last tuesday","a":1}"#);
    assert_eq!(p.process(&mut e), Verdict::Failed);
    assert_eq!(get(&e, "/@timestamp"), Some(&Value::from("last tuesday")));
    assert_eq!(get(&e, "/a"), Some(&Value::Int(1)));
    assert_eq!(tags(&e), ["_timestampparsefailure"]);
    // A numeric @timestamp is left alone; under a target nothing is converted.
    let mut e = msg(r#"{"@timestamp":5}"#);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(get(&e, "/@timestamp"), Some(&Value::Int(5)));
    let p = build_yaml("type: json\ntarget: /doc");
    let mut e = msg(r#"{"@timestamp":"2026-11-21T07:00:00Z"}"#);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(get(&e, "/doc/@timestamp"), Some(&Value::from("2026-11-21T07:00:00Z")));
    assert_eq!(e.timestamp_nanos(), Some(7));
}

#[test]
fn config_errors() {
    let e = build_err("type: json\nsorce: /x");
    assert!(e.contains("unknown field `sorce`"), "{e}");
    let e = build_err("type: json\ntarget: 'a//b'");
    assert!(e.contains("target: invalid field path"), "{e}");
    let e = build_err("type: json\nremove_source: maybe");
    assert!(e.contains("remove_source: expected true or false"), "{e}");
}

/// Real log lines wrapped in JSON (as a shipper would send them) round-trip exactly.
#[test]
fn generated_lines_from_loghub() {
    let p = build_yaml("type: json\nremove_source: true");
    let text = loghub("Linux_2k.log");
    for (i, line) in text.lines().enumerate() {
        let doc = serde_json::json!({
            "@timestamp": "2026-11-21T07:00:00Z",
            "seq": i,
            "ratio": i as f64 / 4.0,
            "host": {"name": "combo", "ip": "10.0.0.1"},
            "line": line,
            "ok": i % 2 == 0,
        });
        let mut e = msg(&doc.to_string());
        assert_eq!(p.process(&mut e), Verdict::Keep, "{line}");
        assert_eq!(get(&e, "/line").and_then(Value::as_str), Some(line));
        assert_eq!(get(&e, "/seq"), Some(&Value::Int(i as i64)));
        assert_eq!(get(&e, "/ratio"), Some(&Value::Float(i as f64 / 4.0)));
        assert_eq!(get(&e, "/host/name"), Some(&Value::from("combo")));
        assert_eq!(get(&e, "/ok"), Some(&Value::Bool(i % 2 == 0)));
        assert_eq!(e.timestamp_nanos(), Some(1_795_244_400_000_000_000));
        assert_eq!(e.message(), None);
    }
}

#[test]
fn on_failure_dlq_gives_the_reason() {
    let p = build_yaml("type: json\non_failure: dlq");
    let mut e = Event::from_message("{not json");
    match p.process(&mut e) {
        Verdict::DeadLetter(reason) => {
            assert!(reason.starts_with("json: /message is not a JSON object"), "{reason}")
        }
        v => panic!("{v:?}"),
    }
    assert_eq!(tags(&e), ["_jsonparsefailure"]);
    assert_eq!(e.message(), Some("{not json"), "the event is left as it was");
    let mut e = Event::from_message("{\"a\": 1}");
    assert_eq!(p.process(&mut e), Verdict::Keep);
    let mut missing = Event::from_message("x");
    missing.fields.remove("message");
    match p.process(&mut missing) {
        Verdict::DeadLetter(reason) => assert_eq!(reason, "json: the source /message is missing"),
        v => panic!("{v:?}"),
    }
    let p = build_yaml("type: json\ntarget: /t\non_failure: dlq");
    let mut e = Event::from_message("[1,");
    assert!(matches!(p.process(&mut e), Verdict::DeadLetter(r) if r.contains("not valid JSON")));
    assert!(build_err("type: json\non_failure: drop").contains("on_failure"));
}
