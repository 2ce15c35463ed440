//! `grok`: matches fields against grok patterns (regular expressions with named, reusable
//! `%{PATTERN:field}` parts) and stores the captures, like Logstash's grok filter.
//!
//! - `%{NAME}` inserts pattern `NAME` (from `pattern_definitions`, else from the standard set
//!   that ships with the `grok` crate: Logstash's patterns, `SYSLOGBASE`, `COMBINEDAPACHELOG`,
//!   `TIMESTAMP_ISO8601`, ...); `%{NAME:field}` also captures it; `%{NAME:field:int}` and
//!   `:float` convert the capture (text that does not convert is kept as text). Inline
//!   `(?<field>...)` groups capture too.
//! - Field names may be nested: `[client][ip]` (Logstash), `client.ip` and `/client/ip` all
//!   write `/client/ip`.
//! - Patterns are expanded and compiled once, at build time. Each compiled pattern uses the
//!   `regex` crate (linear time, fastest) when the expansion has no look-around, atomic groups
//!   or backreferences, and otherwise `fancy-regex` (through the `grok` crate): many standard
//!   patterns need it (`TIME`, `IPV4`, `NUMBER`, `QUOTEDSTRING` use look-arounds or atomic
//!   groups). A pattern that fails to expand or compile is a config error on `match`.
//!
//! `match: {field: pattern or [patterns]}` is tried in order. With `break_on_match` (default)
//! the first pattern that matches ends the search; without it every pattern is tried and every
//! match is applied. Numbers and booleans are matched as their text. Empty captures are
//! skipped unless `keep_empty_captures`. A capture into a field that already holds a string is
//! appended (the field becomes an array), into an array it is pushed, and other values are left
//! alone, as in Logstash, unless the field is listed in `overwrite`, which replaces it. When
//! nothing matches (or no source field is a string or scalar), the event is tagged with
//! `tag_on_failure` (default `_grokparsefailure`) and counted as [`Verdict::Failed`].

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};

use serde::Deserialize;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::{Event, FieldPath, Value};
use smallvec::SmallVec;

use crate::common::{NumType, OnFailure, OneOrMany, OrderedMap, add_tags, capture_target, str_value};
use crate::{Processor, Verdict};

/// Capture groups this processor names itself are `_sl0`, `_sl1`, ...
const GROUP_PREFIX: &str = "_sl";
const MAX_DEPTH: usize = 64;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GrokConfig {
    #[serde(rename = "match")]
    matches: OrderedMap<FieldPath, OneOrMany>,
    #[serde(default)]
    pattern_definitions: OrderedMap<String, String>,
    #[serde(default = "yes")]
    break_on_match: bool,
    #[serde(default = "yes")]
    named_captures_only: bool,
    #[serde(default)]
    keep_empty_captures: bool,
    #[serde(default)]
    overwrite: Vec<String>,
    #[serde(default = "default_tags")]
    tag_on_failure: Vec<String>,
    #[serde(default)]
    on_failure: OnFailure,
}

fn yes() -> bool {
    true
}

fn default_tags() -> Vec<String> {
    vec!["_grokparsefailure".to_string()]
}

#[derive(Debug)]
struct Capture {
    target: FieldPath,
    ty: Option<NumType>,
    overwrite: bool,
}

enum Engine {
    /// `slots[group index]` is the capture the group feeds.
    Regex { regex: regex::Regex, slots: Vec<Option<usize>> },
    /// (group name, capture), in capture order.
    Fancy { pattern: grok::Pattern, names: Vec<(String, usize)> },
}

struct Compiled {
    engine: Engine,
    captures: Vec<Capture>,
}

struct Grok {
    matchers: Vec<(FieldPath, Vec<Compiled>)>,
    break_on_match: bool,
    keep_empty_captures: bool,
    tag_on_failure: Vec<String>,
    on_failure: OnFailure,
}

fn builtin_patterns() -> &'static HashMap<&'static str, &'static str> {
    static PATTERNS: OnceLock<HashMap<&'static str, &'static str>> = OnceLock::new();
    PATTERNS.get_or_init(|| grok::patterns().iter().copied().collect())
}

fn is_pattern_name(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

pub(crate) fn build(spec: &ComponentSpec) -> Result<Arc<dyn Processor>, ConfigError> {
    let c: GrokConfig = spec.settings()?;
    if c.matches.0.is_empty() {
        return Err(spec.key_error("match", "give at least one `field: pattern`"));
    }
    let mut definitions = HashMap::new();
    for (name, regex) in c.pattern_definitions.0 {
        if !is_pattern_name(&name) {
            return Err(spec.key_error(
                "pattern_definitions",
                format!("pattern name `{name}` may hold only letters, digits and `_`"),
            ));
        }
        definitions.insert(name, regex);
    }
    let overwrite = c
        .overwrite
        .iter()
        .map(|name| capture_target(name))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| spec.key_error("overwrite", e))?;
    let mut matchers = Vec::new();
    for (field, patterns) in c.matches.0 {
        if patterns.0.is_empty() {
            return Err(spec.key_error("match", format!("no pattern for {field}")));
        }
        let mut compiled = Vec::new();
        for p in &patterns.0 {
            let c = Compiled::new(p, &definitions, c.named_captures_only, &overwrite)
                .map_err(|e| spec.key_error("match", format!("pattern `{p}` for {field}: {e}")))?;
            compiled.push(c);
        }
        matchers.push((field, compiled));
    }
    Ok(Arc::new(Grok {
        matchers,
        break_on_match: c.break_on_match,
        keep_empty_captures: c.keep_empty_captures,
        tag_on_failure: c.tag_on_failure,
        on_failure: c.on_failure,
    }))
}

/// Expands `%{...}` references into one regular expression.
struct Expander<'a> {
    definitions: &'a HashMap<String, String>,
    named_captures_only: bool,
    /// (field name, type) of each `_slN` group.
    captures: Vec<(String, Option<NumType>)>,
    out: String,
    /// Where each part of `out` came from in the pattern the user wrote, to say where a
    /// regular expression error is: (start in `out`, what it is).
    origins: Vec<(usize, Origin)>,
}

/// What a stretch of the expanded regular expression is, in the pattern the user wrote.
#[derive(Debug, Clone)]
enum Origin {
    /// Written as it is, from this byte of the pattern on.
    Written(usize),
    /// The expansion of this `%{...}`.
    Reference(String),
}

impl Expander<'_> {
    /// Where byte `at` of the expanded expression is, in the user's terms.
    fn locate(&self, pattern: &str, at: usize) -> String {
        let Some((start, origin)) = self.origins.iter().rev().find(|(start, _)| *start <= at) else {
            return String::new();
        };
        match origin {
            Origin::Written(from) => {
                let offset = (from + (at - start)).min(pattern.len());
                let before = pattern.floor_char_boundary(offset);
                format!(" at byte {before} of the pattern, after `{}`", &pattern[..before])
            }
            Origin::Reference(body) => format!(" in the expansion of `%{{{body}}}`"),
        }
    }
}

impl Expander<'_> {
    fn expand(&mut self, pattern: &str, depth: usize) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err(format!("patterns nest more than {MAX_DEPTH} deep (does a pattern refer to itself?)"));
        }
        let mut rest = pattern;
        while let Some(i) = rest.find("%{") {
            if depth == 0 {
                self.origins.push((self.out.len(), Origin::Written(pattern.len() - rest.len())));
            }
            self.out.push_str(&rest[..i]);
            let after = &rest[i + 2..];
            let end = after.find('}').ok_or("unterminated `%{` (missing `}`)")?;
            let body = &after[..end];
            if depth == 0 {
                self.origins.push((self.out.len(), Origin::Reference(body.to_string())));
            }
            rest = &after[end + 1..];
            let mut parts = body.splitn(3, ':');
            let name = parts.next().unwrap_or_default();
            let field = parts.next().filter(|f| !f.is_empty());
            let ty = match parts.next() {
                None => None,
                Some(t) => Some(
                    NumType::from_name(t)
                        .ok_or_else(|| format!("unknown type `{t}` in `%{{{body}}}`, expected `int` or `float`"))?,
                ),
            };
            if !is_pattern_name(name) {
                return Err(format!("invalid pattern name `{name}` in `%{{{body}}}`"));
            }
            let definition = match self.definitions.get(name) {
                Some(d) => d.as_str(),
                None => builtin_patterns().get(name).copied().ok_or_else(|| format!("unknown pattern `{name}`"))?,
            };
            let field = field.or((!self.named_captures_only).then_some(name));
            match field {
                Some(f) => {
                    let _ = write!(self.out, "(?<{GROUP_PREFIX}{}>", self.captures.len());
                    self.captures.push((f.to_string(), ty));
                }
                None if ty.is_some() => return Err(format!("`%{{{body}}}` has a type but no field name")),
                None => self.out.push_str("(?:"),
            }
            self.expand(definition, depth + 1)?;
            self.out.push(')');
        }
        if depth == 0 {
            self.origins.push((self.out.len(), Origin::Written(pattern.len() - rest.len())));
        }
        self.out.push_str(rest);
        Ok(())
    }
}

/// Why the expanded expression of `pattern` does not compile, and where in `pattern`: from
/// fancy-regex (the engine grok compiles with) when it says, else from the `regex` crate that
/// it builds on, whose message draws the expression with a caret under the fault.
fn regex_error(fancy: &fancy_regex::Error, plain: &regex::Error, pattern: &str, ex: &Expander<'_>) -> String {
    let why = match fancy {
        fancy_regex::Error::ParseError(at, why) => format!("{why}{}", ex.locate(pattern, *at)),
        fancy_regex::Error::CompileError(fancy_regex::CompileError::InnerError(_)) => {
            let text = plain.to_string();
            let lines: Vec<&str> = text.lines().collect();
            let why = lines.iter().find_map(|l| l.trim_start().strip_prefix("error: ")).unwrap_or(text.as_str());
            // The expression is drawn on one line, indented as its caret line is.
            let at = lines.windows(2).find_map(|w| {
                let caret = w[1].find('^')?;
                (w[0].trim_start() == ex.out && w[1].trim_matches(['^', ' ']).is_empty())
                    .then(|| caret - (w[0].len() - w[0].trim_start().len()))
            });
            format!("{why}{}", at.map_or_else(String::new, |at| ex.locate(pattern, at)))
        }
        other => other.to_string().trim_start_matches("Error compiling regex: ").to_string(),
    };
    format!("not a valid regular expression: {why}")
}

impl Compiled {
    fn new(
        pattern: &str,
        definitions: &HashMap<String, String>,
        named_captures_only: bool,
        overwrite: &[FieldPath],
    ) -> Result<Compiled, String> {
        let mut ex = Expander {
            definitions,
            named_captures_only,
            captures: Vec::new(),
            out: String::new(),
            origins: Vec::new(),
        };
        ex.expand(pattern, 0)?;
        let mut captures = std::mem::take(&mut ex.captures)
            .into_iter()
            .map(|(name, ty)| Ok(Capture { target: capture_target(&name)?, ty, overwrite: false }))
            .collect::<Result<Vec<_>, String>>()?;
        let engine = match regex::Regex::new(&ex.out) {
            Ok(regex) => {
                let mut slots = vec![None; regex.captures_len()];
                for (i, name) in regex.capture_names().enumerate() {
                    if let Some(name) = name {
                        slots[i] = Some(capture_index(name, &mut captures)?);
                    }
                }
                Engine::Regex { regex, slots }
            }
            Err(plain) => {
                if let Err(e) = fancy_regex::Regex::new(&ex.out) {
                    return Err(regex_error(&e, &plain, pattern, &ex));
                }
                let pattern = grok::Grok::empty().compile(&ex.out, false).map_err(|e| e.to_string())?;
                let mut names = Vec::new();
                for name in pattern.capture_names() {
                    names.push((name.to_string(), capture_index(name, &mut captures)?));
                }
                names.sort_by_key(|(_, i)| *i);
                Engine::Fancy { pattern, names }
            }
        };
        for c in &mut captures {
            c.overwrite = overwrite.contains(&c.target);
        }
        Ok(Compiled { engine, captures })
    }

    #[cfg(test)]
    fn engine_name(&self) -> &'static str {
        match self.engine {
            Engine::Regex { .. } => "regex",
            Engine::Fancy { .. } => "fancy-regex",
        }
    }

    /// Matches and queues the captures; false when the text does not match.
    fn extract<'a>(&'a self, text: &str, keep_empty: bool, out: &mut SmallVec<[(&'a Capture, Value); 16]>) -> bool {
        let mut push = |index: usize, s: &str| {
            if s.is_empty() && !keep_empty {
                return;
            }
            let Some(capture) = self.captures.get(index) else { return };
            let value = capture.ty.and_then(|t| t.convert(s)).unwrap_or_else(|| str_value(s));
            out.push((capture, value));
        };
        match &self.engine {
            Engine::Regex { regex, slots } => {
                let Some(caps) = regex.captures(text) else {
                    return false;
                };
                for (group, slot) in slots.iter().enumerate() {
                    if let (Some(index), Some(m)) = (slot, caps.get(group)) {
                        push(*index, m.as_str());
                    }
                }
            }
            Engine::Fancy { pattern, names } => {
                let Some(m) = pattern.match_against(text) else {
                    return false;
                };
                for (name, index) in names {
                    if let Some(s) = m.get(name) {
                        push(*index, s);
                    }
                }
            }
        }
        true
    }
}

/// The capture a named group feeds: one of ours (`_slN`) or a user's inline `(?<name>...)`.
fn capture_index(name: &str, captures: &mut Vec<Capture>) -> Result<usize, String> {
    if let Some(i) = name.strip_prefix(GROUP_PREFIX).and_then(|n| n.parse::<usize>().ok())
        && i < captures.len()
    {
        return Ok(i);
    }
    captures.push(Capture { target: capture_target(name)?, ty: None, overwrite: false });
    Ok(captures.len() - 1)
}

impl Processor for Grok {
    fn process(&self, event: &mut Event) -> Verdict {
        let mut out: SmallVec<[(&Capture, Value); 16]> = SmallVec::new();
        let mut matched = false;
        let mut scratch = String::new();
        'fields: for (field, patterns) in &self.matchers {
            let text = match event.get(field) {
                Some(Value::String(s)) => s.as_str(),
                Some(v @ (Value::Int(_) | Value::Float(_) | Value::Bool(_))) => {
                    scratch.clear();
                    v.write_text(&mut scratch);
                    scratch.as_str()
                }
                _ => continue,
            };
            for p in patterns {
                if p.extract(text, self.keep_empty_captures, &mut out) {
                    matched = true;
                    if self.break_on_match {
                        break 'fields;
                    }
                }
            }
        }
        if !matched {
            add_tags(event, &self.tag_on_failure);
            return self.on_failure.verdict(|| {
                let fields: Vec<String> = self.matchers.iter().map(|(f, _)| f.to_string()).collect();
                format!("grok: no pattern matched {}", fields.join(", "))
            });
        }
        for (capture, value) in out {
            if capture.overwrite {
                let _ = event.insert(&capture.target, value);
                continue;
            }
            match event.get_mut(&capture.target) {
                None => {
                    let _ = event.insert(&capture.target, value);
                }
                Some(slot @ Value::Null) => *slot = value,
                Some(Value::Array(items)) => items.push(value),
                Some(slot @ Value::String(_)) => {
                    let old = std::mem::take(slot);
                    *slot = Value::Array(vec![old, value]);
                }
                Some(_) => {}
            }
        }
        Verdict::Keep
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::{build_err, build_yaml, get, loghub, tags};

    const SSHD: &str =
        r"%{SYSLOGTIMESTAMP:ts} %{HOSTNAME:host} %{DATA:program}(?:\[%{POSINT:pid}\])?: %{GREEDYDATA:msg}";

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
            Compiled::new(&format!("%{{{name}}}"), &HashMap::new(), false, &[])
                .unwrap_or_else(|e| panic!("{name}: {e}"));
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
        let mut e =
            Event::from_message_at(r#"::1 - - [10/Oct/2000:13:55:36 -0700] "GET / HTTP/1.1" 304 - "-" "curl""#, 0);
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
}
