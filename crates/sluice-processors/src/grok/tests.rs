//! Unit tests of the `grok` processor.

use super::*;
use crate::common::{build_err, build_yaml, get, loghub, tags};

const SSHD: &str = r"%{SYSLOGTIMESTAMP:ts} %{HOSTNAME:host} %{DATA:program}(?:\[%{POSINT:pid}\])?: %{GREEDYDATA:msg}";

fn yaml(pattern: &str, extra: &str) -> String {
    format!("type: grok\nmatch:\n  /message: '{}'\n{extra}", pattern.replace('\'', "''"))
}

fn s(e: &Event, path: &str) -> Option<String> {
    get(e, path).map(|v| v.to_text())
}

fn compile(p: &str) -> Compiled {
    Compiled::new(p, &HashMap::new(), true, &[]).unwrap()
}

#[test]
fn openssh_every_line_matches() {
    let p = build_yaml(&yaml(SSHD, ""));
    let text = loghub("OpenSSH_2k.log");
    let mut n = 0;
    for line in text.lines() {
        let mut e = Event::from_message_at(line, 0);
        assert_eq!(p.process(&mut e), Verdict::Keep, "{line}");
        // `Dec 10 06:55:46 LabSZ sshd[24200]: message`
        let (head, msg) = line.split_once("]: ").unwrap();
        assert_eq!(s(&e, "/ts").as_deref(), Some(&line[..15]), "{line}");
        assert_eq!(s(&e, "/host").as_deref(), Some("LabSZ"));
        assert_eq!(s(&e, "/program").as_deref(), Some("sshd"));
        assert_eq!(s(&e, "/pid").as_deref(), Some(&head[head.find('[').unwrap() + 1..]));
        assert_eq!(s(&e, "/msg").as_deref(), Some(msg));
        assert_eq!(e.message(), Some(line));
        n += 1;
    }
    assert_eq!(n, 2000);
    let mut e =
        Event::from_message_at("Dec 10 06:55:46 LabSZ sshd[24200]: Invalid user webmaster from 173.234.31.186", 0);
    p.process(&mut e);
    assert_eq!(
        e.to_json_string(),
        r#"{"message":"Dec 10 06:55:46 LabSZ sshd[24200]: Invalid user webmaster from 173.234.31.186","@timestamp":"1970-01-01T00:00:00.000Z","ts":"Dec 10 06:55:46","host":"LabSZ","program":"sshd","pid":"24200","msg":"Invalid user webmaster from 173.234.31.186"}"#
    );
}

#[test]
fn linux_syslog_with_standard_syslogbase() {
    let p = build_yaml(&yaml("%{SYSLOGBASE} %{GREEDYDATA:msg}", ""));
    let text = loghub("Linux_2k.log");
    let mut failed = Vec::new();
    for line in text.lines() {
        let mut e = Event::from_message_at(line, 0);
        if p.process(&mut e) != Verdict::Keep {
            failed.push(line);
            continue;
        }
        assert_eq!(s(&e, "/timestamp").as_deref(), Some(&line[..15]), "{line}");
        assert_eq!(s(&e, "/logsource").as_deref(), Some("combo"), "{line}");
    }
    // Eight lines are not syslog-shaped: `syslogd 1.4.1: restart.` (a space in the program)
    // and `combo  -- root[2421]: ROOT LOGIN ON tty2`.
    assert_eq!(failed.len(), 8, "{failed:?}");
    assert!(failed.iter().all(|l| l.contains("syslogd 1.4.1: restart.") || l.contains("combo  -- root")));
    let mut e = Event::from_message_at("Jun 14 15:16:01 combo sshd(pam_unix)[19939]: check pass; user unknown", 0);
    p.process(&mut e);
    assert_eq!(s(&e, "/program").as_deref(), Some("sshd(pam_unix)"));
    assert_eq!(s(&e, "/pid").as_deref(), Some("19939"));
    assert_eq!(s(&e, "/msg").as_deref(), Some("check pass; user unknown"));
}

#[test]
fn engines() {
    // Plain patterns use the regex crate; look-arounds need fancy-regex.
    assert_eq!(compile("%{WORD:a} %{POSINT:b} %{GREEDYDATA:c}").engine_name(), "regex");
    assert_eq!(compile(SSHD).engine_name(), "fancy-regex");
    assert_eq!(compile("%{IPV4:ip}").engine_name(), "fancy-regex");
    assert_eq!(compile("%{NUMBER:n}").engine_name(), "fancy-regex");
    for p in ["%{COMBINEDAPACHELOG}", "%{SYSLOGLINE}", "%{TIMESTAMP_ISO8601:ts}", "%{HTTPD20_ERRORLOG}"] {
        let c = compile(p);
        assert!(!c.captures.is_empty(), "{p}");
    }
    // Same results from both engines.
    let line = "alice 42 rest of it";
    for p in ["%{WORD:a} %{POSINT:b} %{GREEDYDATA:c}", "%{WORD:a} %{POSINT:b}(?!x) %{GREEDYDATA:c}"] {
        let c = compile(p);
        let mut out = SmallVec::new();
        assert!(c.extract(line, false, &mut out));
        let got: Vec<(String, String)> = out.iter().map(|(c, v)| (c.target.to_string(), v.to_text())).collect();
        assert_eq!(
            got,
            [("/a".into(), "alice".into()), ("/b".into(), "42".into()), ("/c".into(), "rest of it".into())]
        );
    }
}

#[test]
fn every_standard_pattern_compiles() {
    for (name, _) in grok::patterns() {
        Compiled::new(&format!("%{{{name}}}"), &HashMap::new(), false, &[]).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn combined_apache_log_with_types_and_nesting() {
    let p = build_yaml(&yaml(
        r#"%{IPORHOST:[client][ip]} %{HTTPDUSER:ident} %{HTTPDUSER:auth} \[%{HTTPDATE:timestamp}\] "%{WORD:http.method} %{NOTSPACE:url} HTTP/%{NUMBER:http.version:float}" %{NUMBER:status:int} (?:%{NUMBER:bytes:int}|-) %{QS:referrer} %{QS:agent}"#,
        "",
    ));
    let mut e = Event::from_message_at(
        r#"127.0.0.1 - frank [10/Oct/2000:13:55:36 -0700] "GET /apache_pb.gif HTTP/1.0" 200 2326 "http://www.example.com/start.html" "Mozilla/4.08 [en] (Win98; I ;Nav)""#,
        0,
    );
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(s(&e, "/client/ip").as_deref(), Some("127.0.0.1"));
    assert_eq!(s(&e, "/auth").as_deref(), Some("frank"));
    assert_eq!(s(&e, "/timestamp").as_deref(), Some("10/Oct/2000:13:55:36 -0700"));
    assert_eq!(s(&e, "/http/method").as_deref(), Some("GET"));
    assert_eq!(get(&e, "/http/version"), Some(&Value::Float(1.0)));
    assert_eq!(get(&e, "/status"), Some(&Value::Int(200)));
    assert_eq!(get(&e, "/bytes"), Some(&Value::Int(2326)));
    assert_eq!(s(&e, "/agent").as_deref(), Some(r#""Mozilla/4.08 [en] (Win98; I ;Nav)""#));
    // `-` for bytes: the group does not take part, so no field.
    let mut e = Event::from_message_at(r#"::1 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 304 - "-" "curl""#, 0);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(s(&e, "/client/ip").as_deref(), Some("::1"));
    assert_eq!(get(&e, "/bytes"), None);
}

#[test]
fn typed_capture_that_does_not_convert_stays_text() {
    let p = build_yaml(&yaml("%{WORD:n:int} %{WORD:f:float}", ""));
    let mut e = Event::from_message_at("abc 1", 0);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(get(&e, "/n"), Some(&Value::from("abc")));
    assert_eq!(get(&e, "/f"), Some(&Value::Float(1.0)));
}

#[test]
fn custom_definitions_and_inline_groups() {
    let p = build_yaml(
        "type: grok\nmatch: {/message: '%{QUEUE:q} (?<mail.to>\\S+) %{MYNUM:n:int}'}\n\
         pattern_definitions: {QUEUE: '[0-9A-F]{10}', MYNUM: '%{INT}'}",
    );
    let mut e = Event::from_message_at("ABCDEF0123 bob@example.com 17", 0);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(s(&e, "/q").as_deref(), Some("ABCDEF0123"));
    assert_eq!(s(&e, "/mail/to").as_deref(), Some("bob@example.com"));
    assert_eq!(get(&e, "/n"), Some(&Value::Int(17)));
    // User definitions override standard ones.
    let p = build_yaml("type: grok\nmatch: {/message: '%{WORD:w}'}\npattern_definitions: {WORD: '[a-z]+'}");
    let mut e = Event::from_message_at("ABC def", 0);
    p.process(&mut e);
    assert_eq!(s(&e, "/w").as_deref(), Some("def"));
}

#[test]
fn break_on_match_and_several_patterns() {
    let base = "type: grok\nmatch:\n  /message: ['%{INT:num}', '%{WORD:word}']\n  /other: '%{WORD:w2}'\n";
    let p = build_yaml(base);
    let mut e = Event::from_message_at("abc 12", 0);
    e.fields.insert("other", Value::from("xyz"));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!((s(&e, "/num"), s(&e, "/word"), s(&e, "/w2")), (Some("12".into()), None, None));
    let p = build_yaml(&format!("{base}break_on_match: false"));
    let mut e = Event::from_message_at("abc 12", 0);
    e.fields.insert("other", Value::from("xyz"));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(
        (s(&e, "/num"), s(&e, "/word"), s(&e, "/w2")),
        (Some("12".into()), Some("abc".into()), Some("xyz".into()))
    );
    // The first pattern failing, the second matching: no failure.
    let p = build_yaml(base);
    let mut e = Event::from_message_at("abc", 0);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(s(&e, "/word").as_deref(), Some("abc"));
    // Numbers are matched as text.
    let mut e = Event::default();
    e.fields.insert("message", Value::Int(77));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(s(&e, "/num").as_deref(), Some("77"));
}

#[test]
fn named_captures_only_off() {
    let p = build_yaml(&yaml("%{WORD} %{INT:n}", "named_captures_only: false"));
    let mut e = Event::from_message_at("abc 12", 0);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!((s(&e, "/WORD"), s(&e, "/n"), s(&e, "/INT")), (Some("abc".into()), Some("12".into()), None));
    let p = build_yaml(&yaml("%{WORD} %{INT:n}", ""));
    let mut e = Event::from_message_at("abc 12", 0);
    p.process(&mut e);
    assert_eq!(s(&e, "/WORD"), None);
}

#[test]
fn empty_captures() {
    let pat = "%{DATA:a}:%{GREEDYDATA:b}";
    let p = build_yaml(&yaml(pat, ""));
    let mut e = Event::from_message_at(":x", 0);
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!((get(&e, "/a"), s(&e, "/b")), (None, Some("x".into())));
    let p = build_yaml(&yaml(pat, "keep_empty_captures: true"));
    let mut e = Event::from_message_at(":x", 0);
    p.process(&mut e);
    assert_eq!(get(&e, "/a"), Some(&Value::from("")));
}

#[test]
fn existing_fields_append_unless_overwritten() {
    let pat = "%{WORD:message} %{WORD:list} %{WORD:num} %{WORD:w} %{WORD:w}";
    let p = build_yaml(&yaml(pat, ""));
    let mut e = Event::from_message_at("a b c d e", 0);
    e.fields.insert("list", Value::Array(vec![Value::from("z")]));
    e.fields.insert("num", Value::Int(1));
    assert_eq!(p.process(&mut e), Verdict::Keep);
    assert_eq!(get(&e, "/message").unwrap().to_text(), r#"["a b c d e","a"]"#);
    assert_eq!(get(&e, "/list").unwrap().to_text(), r#"["z","b"]"#);
    assert_eq!(get(&e, "/num"), Some(&Value::Int(1)));
    assert_eq!(get(&e, "/w").unwrap().to_text(), r#"["d","e"]"#);
    let p = build_yaml(&yaml(pat, "overwrite: [message, num]"));
    let mut e = Event::from_message_at("a b c d e", 0);
    e.fields.insert("num", Value::Int(1));
    p.process(&mut e);
    assert_eq!(e.message(), Some("a"));
    assert_eq!(get(&e, "/num"), Some(&Value::from("c")));
}

#[test]
fn failures() {
    let p = build_yaml(&yaml(SSHD, "tag_on_failure: [no_grok, x]"));
    for line in ["", "not syslog at all", "Dec 10 06:55:46 LabSZ"] {
        let mut e = Event::from_message_at(line, 0);
        let before = e.fields.clone();
        assert_eq!(p.process(&mut e), Verdict::Failed, "{line}");
        assert_eq!(tags(&e), ["no_grok", "x"]);
        e.fields.remove("tags");
        assert_eq!(e.fields, before);
    }
    let p = build_yaml(&yaml("%{WORD:w}", ""));
    let mut e = Event::default();
    assert_eq!(p.process(&mut e), Verdict::Failed);
    assert_eq!(tags(&e), ["_grokparsefailure"]);
    let mut e = Event::default();
    e.fields.insert("message", Value::Array(vec![]));
    assert_eq!(p.process(&mut e), Verdict::Failed);
}

#[test]
fn config_errors() {
    let e = build_err(&yaml("%{NOPE:x}", ""));
    assert!(e.contains("match: pattern `%{NOPE:x}` for /message: unknown pattern `NOPE`"), "{e}");
    let e = build_err(&yaml("%{WORD:x:bool}", ""));
    assert!(e.contains("unknown type `bool`"), "{e}");
    let e = build_err(&yaml("%{WORD::int}", ""));
    assert!(e.contains("has a type but no field name"), "{e}");
    let e = build_err(&yaml("%{WORD:x", ""));
    assert!(e.contains("unterminated"), "{e}");
    let e = build_err(&yaml("%{WORD:x} (unclosed", ""));
    assert!(e.contains("match: pattern `%{WORD:x} (unclosed` for /message: not a valid regular expression"), "{e}");
    let e = build_err(&yaml("%{LOOP}", "pattern_definitions: {LOOP: 'a%{LOOP}'}"));
    assert!(e.contains("nest more than 64 deep"), "{e}");
    let e = build_err(&yaml("%{W-X}", ""));
    assert!(e.contains("invalid pattern name `W-X`"), "{e}");
    let e = build_err(&yaml("%{WORD:[a][b}", ""));
    assert!(e.contains("does not end with"), "{e}");
    let e = build_err(&yaml("%{WORD:w}", "pattern_definitions: {'bad name': x}"));
    assert!(e.contains("pattern_definitions: pattern name `bad name`"), "{e}");
    let e = build_err("type: grok\nmatch: {}");
    assert!(e.contains("match: give at least one"), "{e}");
    let e = build_err("type: grok\nmatch: {/message: []}");
    assert!(e.contains("no pattern for /message"), "{e}");
    let e = build_err(&yaml("%{WORD:w}", "timeout_millis: 5"));
    assert!(e.contains("unknown field `timeout_millis`"), "{e}");
    let e = build_err(&yaml("%{WORD:w}", "overwrite: ['a..b']"));
    assert!(e.contains("overwrite:"), "{e}");
}

/// Which pattern, where in it and why; never the engine's debug dump of the expanded
/// expression (`ParseError(26, UnclosedOpenParen)`), whose positions are not the user's.
#[test]
fn an_expression_that_does_not_compile_is_placed_in_the_pattern_as_written() {
    for (pattern, why, place) in [
        (
            "%{WORD:x} (unclosed",
            "Opening parenthesis without closing parenthesis",
            "at byte 19 of the pattern, after `%{WORD:x} (unclosed`",
        ),
        (
            "%{WORD:a} (?<x>\\d+) [z-a] %{NUMBER:n}",
            "invalid character class range, the start must be <= the end",
            "after `%{WORD:a} (?<x>\\d+) [`",
        ),
        ("%{IPV4:ip} (?<=a+)b", "Look-behind assertion without constant size", ""),
        ("%{BROKEN:x} tail", "invalid character class range", "in the expansion of `%{BROKEN:x}`"),
    ] {
        let e = build_err(&yaml(pattern, "pattern_definitions: {BROKEN: 'a[z-a]'}"));
        let wanted = format!("not a valid regular expression: {why}");
        assert!(e.contains(&wanted) && e.contains(place), "{pattern}: {e}");
        assert!(!e.contains("ParseError") && !e.contains("CompileError") && !e.contains("_sl0"), "{e}");
    }
}

#[test]
fn on_failure_dlq_gives_the_reason() {
    let p = build_yaml("type: grok\nmatch: {/message: '%{NUMBER:n}'}\non_failure: dlq");
    let mut e = Event::from_message("no digits here");
    assert_eq!(p.process(&mut e), Verdict::DeadLetter("grok: no pattern matched /message".to_string()));
    assert_eq!(tags(&e), ["_grokparsefailure"]);
    let mut e = Event::from_message("42");
    assert_eq!(p.process(&mut e), Verdict::Keep);
}
