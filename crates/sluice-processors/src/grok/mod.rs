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

mod config;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, OnceLock};

use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::{Event, FieldPath, Value};
use smallvec::SmallVec;

use crate::common::{NumType, OnFailure, add_tags, capture_target, str_value};
use crate::{Processor, Verdict};

/// Capture groups this processor names itself are `_sl0`, `_sl1`, ...
const GROUP_PREFIX: &str = "_sl";
const MAX_DEPTH: usize = 64;

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
    let c = config::read(spec)?;
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
mod tests;
