//! Unit tests of the `dissect` processor.

use super::*;
use crate::common::{build_err, build_yaml, get, loghub, tags};

fn run(yaml: &str, line: &str) -> (Verdict, Event) {
    let p = build_yaml(yaml);
    let mut e = Event::from_message_at(line, 0);
    let v = p.process(&mut e);
    (v, e)
}

fn s(e: &Event, path: &str) -> Option<String> {
    get(e, path).map(|v| v.to_text())
}

#[test]
fn apache_error_log_every_line() {
    let p = build_yaml("type: dissect\nmapping: {/message: '[%{ts}] [%{level}] %{msg}'}");
    let text = loghub("Apache_2k.log");
    let mut levels = std::collections::BTreeMap::new();
    for line in text.lines() {
        let mut e = Event::from_message_at(line, 0);
        assert_eq!(p.process(&mut e), Verdict::Keep, "{line}");
        let ts_end = line.find(']').unwrap();
        assert_eq!(s(&e, "/ts").as_deref(), Some(&line[1..ts_end]));
        let rest = &line[ts_end + 3..];
        let level_end = rest.find(']').unwrap();
        assert_eq!(s(&e, "/level").as_deref(), Some(&rest[..level_end]));
        assert_eq!(s(&e, "/msg").as_deref(), Some(&rest[level_end + 2..]));
        assert_eq!(e.message(), Some(line));
        *levels.entry(s(&e, "/level").unwrap()).or_insert(0) += 1;
    }
    assert_eq!(levels.values().sum::<i32>(), 2000);
    assert_eq!(levels.keys().collect::<Vec<_>>(), ["error", "notice"]);
    let (_, e) = run(
        "type: dissect\nmapping: {/message: '[%{ts}] [%{level}] %{msg}'}",
        "[Sun Dec 04 04:47:44 2005] [notice] workerEnv.init() ok /etc/httpd/conf/workers2.properties",
    );
    assert_eq!(s(&e, "/ts").as_deref(), Some("Sun Dec 04 04:47:44 2005"));
    assert_eq!(s(&e, "/level").as_deref(), Some("notice"));
    assert_eq!(s(&e, "/msg").as_deref(), Some("workerEnv.init() ok /etc/httpd/conf/workers2.properties"));
}

#[test]
fn dissect_then_date_on_apache() {
    let d = build_yaml("type: dissect\nmapping: {/message: '[%{ts}] [%{level}] %{msg}'}");
    let date = build_yaml("type: date\nsource: /ts\nformats: ['EEE MMM dd HH:mm:ss yyyy']");
    let mut e = Event::from_message_at("[Sun Dec 04 04:47:44 2005] [error] mod_jk child init 1 -2", 0);
    assert_eq!(d.process(&mut e), Verdict::Keep);
    assert_eq!(date.process(&mut e), Verdict::Keep);
    assert_eq!(e.timestamp_nanos(), Some(1_133_671_664_000_000_000));
}

#[test]
fn zookeeper_padding_and_append() {
    let p = build_yaml("type: dissect\nmapping:\n  /message: '%{ts} %{+ts} - %{level->} %{}[%{thread}] - %{msg}'");
    let text = loghub("Zookeeper_2k.log");
    for line in text.lines() {
        let mut e = Event::from_message_at(line, 0);
        assert_eq!(p.process(&mut e), Verdict::Keep, "{line}");
        assert_eq!(s(&e, "/ts").as_deref(), Some(&line[..23]), "{line}");
        let level = s(&e, "/level").unwrap();
        assert!(["INFO", "WARN", "ERROR", "DEBUG"].contains(&level.as_str()), "{line}: {level:?}");
    }
    let (v, e) = run(
        "type: dissect\nmapping:\n  /message: '%{ts} %{+ts} - %{level->} %{}[%{thread}] - %{msg}'",
        "2015-07-29 19:04:29,071 - WARN  [SendWorker:188978561024:QuorumCnxManager$SendWorker@688] - Send worker leaving thread",
    );
    assert_eq!(v, Verdict::Keep);
    assert_eq!(s(&e, "/ts").as_deref(), Some("2015-07-29 19:04:29,071"));
    assert_eq!(s(&e, "/level").as_deref(), Some("WARN"));
    assert_eq!(s(&e, "/thread").as_deref(), Some("SendWorker:188978561024:QuorumCnxManager$SendWorker@688"));
    assert_eq!(s(&e, "/msg").as_deref(), Some("Send worker leaving thread"));
}

#[test]
fn skips_references_and_nested_names() {
    let (v, e) = run(
        "type: dissect\nmapping: {/message: '%{ts} %{+ts} %{level} [%{?thread}] %{&thread} %{}: %{[log][msg]}'}",
        "Jun 14 INFO [worker] busy x: all good",
    );
    assert_eq!(v, Verdict::Keep);
    assert_eq!(s(&e, "/ts").as_deref(), Some("Jun 14"));
    assert_eq!(s(&e, "/level").as_deref(), Some("INFO"));
    assert_eq!(s(&e, "/worker").as_deref(), Some("busy"));
    assert_eq!(s(&e, "/log/msg").as_deref(), Some("all good"));
    assert_eq!(get(&e, "/thread"), None);
    let (_, e) = run("type: dissect\nmapping: {/message: '%{*k}=%{&k} %{a.b} %{/c/d}'}", "user=bob 1 2");
    assert_eq!(s(&e, "/user").as_deref(), Some("bob"));
    assert_eq!(s(&e, "/a/b").as_deref(), Some("1"));
    assert_eq!(s(&e, "/c/d").as_deref(), Some("2"));
}

#[test]
fn append_order_and_separator() {
    let (_, e) = run(
        "type: dissect\nmapping: {/message: '%{+name/2} %{+name/4} %{+name/3} %{+name/1}'}",
        "john jacob jingleheimer schmidt",
    );
    assert_eq!(s(&e, "/name").as_deref(), Some("schmidt john jingleheimer jacob"));
    let (_, e) = run("type: dissect\nappend_separator: '-'\nmapping: {/message: '%{d} %{+d} %{+d}'}", "2026 11 21");
    assert_eq!(s(&e, "/d").as_deref(), Some("2026-11-21"));
}

#[test]
fn trailing_delimiter_and_empty_fields() {
    let (v, e) = run("type: dissect\nmapping: {/message: '<%{pri}>%{rest}'}", "<13>hello <x>");
    assert_eq!(v, Verdict::Keep);
    assert_eq!((s(&e, "/pri").as_deref(), s(&e, "/rest").as_deref()), (Some("13"), Some("hello <x>")));
    let (v, e) = run("type: dissect\nmapping: {/message: '%{a}|%{b}|'}", "|x|ignored");
    assert_eq!(v, Verdict::Keep);
    assert_eq!((s(&e, "/a").as_deref(), s(&e, "/b").as_deref()), (Some(""), Some("x")));
    let (v, e) = run("type: dissect\nmapping: {/message: '%{a}'}", "");
    assert_eq!(v, Verdict::Keep);
    assert_eq!(s(&e, "/a").as_deref(), Some(""));
    let (v, e) = run("type: dissect\nmapping: {/message: 'a=%{a}, b=%{b}'}", "a=é→, b=ü");
    assert_eq!(v, Verdict::Keep);
    assert_eq!((s(&e, "/a").as_deref(), s(&e, "/b").as_deref()), (Some("é→"), Some("ü")));
}

#[test]
fn convert_datatype() {
    let yaml =
        "type: dissect\nmapping: {/message: '%{n} %{f} %{[x][y]}'}\nconvert_datatype: {n: int, f: float, x.y: int}";
    let (v, e) = run(yaml, "42 2.5 -7");
    assert_eq!(v, Verdict::Keep);
    assert_eq!(get(&e, "/n"), Some(&Value::Int(42)));
    assert_eq!(get(&e, "/f"), Some(&Value::Float(2.5)));
    assert_eq!(get(&e, "/x/y"), Some(&Value::Int(-7)));
    let (v, e) = run(yaml, "many 2.5 -7");
    assert_eq!(v, Verdict::Failed);
    assert_eq!(get(&e, "/n"), Some(&Value::from("many")));
    assert_eq!(get(&e, "/f"), Some(&Value::Float(2.5)));
    assert_eq!(tags(&e), ["_dissectconversionfailure"]);
}

#[test]
fn failures() {
    let yaml = "type: dissect\nmapping: {/message: '[%{ts}] [%{level}] %{msg}'}\ntag_on_failure: [nope]";
    for line in ["no brackets", "[ts only", "[ts] level] x", "[ts] [level"] {
        let (v, e) = run(yaml, line);
        assert_eq!(v, Verdict::Failed, "{line}");
        assert_eq!(tags(&e), ["nope"]);
        assert_eq!(get(&e, "/ts"), None, "{line}");
    }
    let p = build_yaml(yaml);
    let mut e = Event::default();
    assert_eq!(p.process(&mut e), Verdict::Failed);
    let mut e = Event::default();
    e.fields.insert("message", Value::Int(3));
    assert_eq!(p.process(&mut e), Verdict::Failed);
    // Two mappings: the one that matches is written, the event still fails.
    let p = build_yaml("type: dissect\nmapping: {/message: '%{a} %{b}', /other: '%{c}-%{d}'}");
    let mut e = Event::from_message_at("1 2", 0);
    e.fields.insert("other", Value::from("no dash"));
    assert_eq!(p.process(&mut e), Verdict::Failed);
    assert_eq!((s(&e, "/a").as_deref(), s(&e, "/c")), (Some("1"), None));
    assert_eq!(tags(&e), ["_dissectfailure"]);
    e.fields.insert("other", Value::from("3-4"));
    e.fields.remove("tags");
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(s(&e, "/d").as_deref(), Some("4"));
}

#[test]
fn config_errors() {
    let e = build_err("type: dissect\nmapping: {/message: '%{a}%{b}'}");
    assert!(e.contains("mapping: pattern for /message: two fields with no text between them"), "{e}");
    assert!(build_err("type: dissect\nmapping: {/message: '%{a'}").contains("unterminated"));
    assert!(build_err("type: dissect\nmapping: {/message: 'text'}").contains("no `%{field}`"));
    assert!(build_err("type: dissect\nmapping: {/message: '%{&k} %{?k}'}").contains("needs a `%{?k}` before"));
    assert!(build_err("type: dissect\nmapping: {}").contains("at least one"));
    assert!(build_err("type: dissect\nmapping: {/message: '%{[a][b}'}").contains("does not end with"));
    let e = build_err("type: dissect\nmapping: {/message: '%{a}'}\nconvert_datatype: {a: bool}");
    assert!(e.contains("convert_datatype: `a`: unknown type `bool`"), "{e}");
    let e = build_err("type: dissect\nmapping: {/message: '%{a}'}\nconvert_datatype: {b: int}");
    assert!(e.contains("`b` is not a field of any mapping pattern"), "{e}");
    let e = build_err("type: dissect\nmapping: {/message: '%{a}'}\nfield_split: ','");
    assert!(e.contains("unknown field `field_split`"), "{e}");
}

#[test]
fn on_failure_dlq_gives_the_reason() {
    let p = build_yaml("type: dissect\nmapping: {/message: '%{a} [%{b}]'}\non_failure: dlq");
    let mut e = Event::from_message("nothing to see");
    assert_eq!(
        p.process(&mut e),
        Verdict::DeadLetter("dissect: /message does not match its mapping pattern".to_string())
    );
    assert_eq!(tags(&e), ["_dissectfailure"]);
}
