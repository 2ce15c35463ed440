//! `dissect`: splits a string field on the literal text between `%{...}` fields, like Logstash's
//! dissect filter. No regular expressions: each delimiter is searched with a precompiled
//! `memchr::memmem` finder, left to right, first occurrence.
//!
//! Fields of a pattern such as `%{ts} %{+ts} %{level} [%{?thread}] %{&thread} %{msg}`:
//!
//! - `%{name}`: stores the text up to the next delimiter; the last field takes the rest of the
//!   line (text after a trailing delimiter is ignored);
//! - `%{}` and `%{?name}`: match and skip;
//! - `%{+name}`: appends to `name`, joined with `append_separator` (default one space);
//!   `%{+name/2}` sets the order of the parts (a plain `%{name}` and unnumbered parts count as
//!   0; equal numbers keep their place);
//! - `%{name->}`: right padding, skips repeats of the delimiter that follows the field;
//! - `%{?key}` (or `%{*key}`) with `%{&key}`: the text of `?key` names a top-level field and the
//!   text of `&key` is its value;
//! - names may be nested: `[a][b]`, `a.b` or `/a/b` all write `/a/b`.
//!
//! The pattern is compiled at build time into a leading literal and a list of (field, following
//! delimiter) steps; two fields with nothing between them are a config error. If the text does
//! not match (the leading literal or a delimiter is missing, or the source is missing or not a
//! string), nothing is written, the event is tagged with `tag_on_failure` (default
//! `_dissectfailure`) and counted as [`Verdict::Failed`]. With several `mapping` entries each is
//! matched on its own; one failing fails the event. `convert_datatype: {name: int|float}`
//! converts a field after a match; a value that does not convert stays text and the event is
//! tagged `_dissectconversionfailure` (and counted as failed).

mod config;

use std::sync::Arc;

use memchr::memmem::Finder;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::{Event, FieldPath, Str, Value};
use smallvec::SmallVec;

use crate::common::{NumType, OnFailure, add_tags, capture_target, str_value};
use crate::{Processor, Verdict};

const CONVERSION_FAILURE: &str = "_dissectconversionfailure";

/// What one `%{...}` does with the text it spans.
#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Skip,
    /// Written by an [`Output`].
    Field,
    /// `?key` / `*key`: names the field of the `&key` step.
    RefKey(String),
    /// `&key`: the value; the index of its key step.
    RefValue(usize),
}

#[derive(Debug)]
struct Step {
    kind: Kind,
    /// The literal after this field; `None` for a last field, which takes the rest.
    delimiter: Option<Finder<'static>>,
    pad: bool,
}

/// One field write, planned at build time.
#[derive(Debug)]
enum Output {
    /// The text of these steps (one, or an append group in order), joined.
    Field { steps: Vec<usize>, target: FieldPath, convert: Option<NumType> },
    /// A `?key`/`&key` pair: (key step, value step).
    Reference(usize, usize),
}

#[derive(Debug)]
struct Pattern {
    prefix: String,
    steps: Vec<Step>,
    outputs: Vec<Output>,
}

struct Dissect {
    mappings: Vec<(FieldPath, Pattern)>,
    separator: String,
    tag_on_failure: Vec<String>,
    on_failure: OnFailure,
}

pub(crate) fn build(spec: &ComponentSpec) -> Result<Arc<dyn Processor>, ConfigError> {
    let c = config::read(spec)?;
    let mut conversions = Vec::new();
    for (name, ty) in &c.convert_datatype.0 {
        let target = capture_target(name).map_err(|e| spec.key_error("convert_datatype", e))?;
        let ty = NumType::from_name(ty).ok_or_else(|| {
            spec.key_error("convert_datatype", format!("`{name}`: unknown type `{ty}`, expected `int` or `float`"))
        })?;
        conversions.push((name.as_str(), target, ty));
    }
    let mut mappings = Vec::new();
    for (field, text) in c.mapping.0 {
        let pattern = Pattern::compile(&text, &conversions)
            .map_err(|e| spec.key_error("mapping", format!("pattern for {field}: {e}")))?;
        mappings.push((field, pattern));
    }
    for (name, target, _) in &conversions {
        let used = mappings
            .iter()
            .any(|(_, p)| p.outputs.iter().any(|o| matches!(o, Output::Field { target: t, .. } if t == target)));
        if !used {
            return Err(spec.key_error("convert_datatype", format!("`{name}` is not a field of any mapping pattern")));
        }
    }
    Ok(Arc::new(Dissect {
        mappings,
        separator: c.append_separator,
        tag_on_failure: c.tag_on_failure,
        on_failure: c.on_failure,
    }))
}

impl Pattern {
    fn compile(text: &str, conversions: &[(&str, FieldPath, NumType)]) -> Result<Pattern, String> {
        let mut prefix = None;
        let mut steps: Vec<Step> = Vec::new();
        // (target, order, step) for every written field, in pattern order.
        let mut writes: Vec<(FieldPath, u32, usize)> = Vec::new();
        let mut rest = text;
        loop {
            let (literal, after) = match rest.find("%{") {
                Some(i) => (&rest[..i], Some(&rest[i + 2..])),
                None => (rest, None),
            };
            match steps.last_mut() {
                None => prefix = Some(literal.to_string()),
                Some(last) if !literal.is_empty() => last.delimiter = Some(Finder::new(literal).into_owned()),
                Some(_) if after.is_some() => {
                    return Err("two fields with no text between them cannot be told apart".to_string());
                }
                Some(_) => {}
            }
            let Some(after) = after else { break };
            let Some(end) = after.find('}') else {
                return Err("unterminated `%{` (missing `}`)".to_string());
            };
            let body = &after[..end];
            rest = &after[end + 1..];
            let (body, pad) = match body.strip_suffix("->") {
                Some(b) => (b, true),
                None => (body, false),
            };
            let index = steps.len();
            let kind = match body.as_bytes().first() {
                None => Kind::Skip,
                Some(b'?' | b'*') => {
                    let name = &body[1..];
                    if name.is_empty() { Kind::Skip } else { Kind::RefKey(name.to_string()) }
                }
                Some(b'&') => {
                    let name = &body[1..];
                    let key = steps
                        .iter()
                        .position(|s| s.kind == Kind::RefKey(name.to_string()))
                        .ok_or_else(|| format!("`%{{&{name}}}` needs a `%{{?{name}}}` before it"))?;
                    Kind::RefValue(key)
                }
                Some(b'+') => {
                    let name = &body[1..];
                    let (name, order) = match name.rsplit_once('/') {
                        Some((n, o)) if !n.is_empty() && !o.is_empty() && o.bytes().all(|c| c.is_ascii_digit()) => {
                            (n, o.parse().map_err(|_| format!("append order `{o}` is too large"))?)
                        }
                        _ => (name, 0),
                    };
                    writes.push((capture_target(name)?, order, index));
                    Kind::Field
                }
                Some(_) => {
                    writes.push((capture_target(body)?, 0, index));
                    Kind::Field
                }
            };
            steps.push(Step { kind, delimiter: None, pad });
        }
        if steps.is_empty() {
            return Err("the pattern has no `%{field}`".to_string());
        }
        // Group writes to the same field (an append group), in order, first place first.
        let mut outputs = Vec::new();
        let mut done = vec![false; writes.len()];
        for i in 0..writes.len() {
            if done[i] {
                continue;
            }
            let mut group: Vec<(u32, usize)> = Vec::new();
            for j in i..writes.len() {
                if writes[j].0 == writes[i].0 {
                    done[j] = true;
                    group.push((writes[j].1, writes[j].2));
                }
            }
            group.sort_by_key(|&(order, _)| order);
            let target = writes[i].0.clone();
            let convert = conversions.iter().find(|(_, t, _)| *t == target).map(|(_, _, ty)| *ty);
            outputs.push(Output::Field { steps: group.into_iter().map(|(_, s)| s).collect(), target, convert });
        }
        for (i, s) in steps.iter().enumerate() {
            if let Kind::RefValue(key) = s.kind {
                outputs.push(Output::Reference(key, i));
            }
        }
        Ok(Pattern { prefix: prefix.unwrap_or_default(), steps, outputs })
    }

    /// The byte range of each step in `text`, or `None` when the text does not match.
    fn spans(&self, text: &str, spans: &mut SmallVec<[(usize, usize); 16]>) -> Option<()> {
        let bytes = text.as_bytes();
        let mut pos = self.prefix.len();
        if !bytes.starts_with(self.prefix.as_bytes()) {
            return None;
        }
        for step in &self.steps {
            match &step.delimiter {
                None => {
                    spans.push((pos, bytes.len()));
                    pos = bytes.len();
                }
                Some(finder) => {
                    let at = pos + finder.find(&bytes[pos..])?;
                    spans.push((pos, at));
                    let delim = finder.needle();
                    pos = at + delim.len();
                    if step.pad {
                        while bytes[pos..].starts_with(delim) {
                            pos += delim.len();
                        }
                    }
                }
            }
        }
        Some(())
    }
}

/// Where a matched value goes: a planned path, or a field named by the text (`&key`).
enum Dest<'a> {
    Path(&'a FieldPath),
    Key(Str),
}

impl Dissect {
    /// Matches one mapping and queues its writes; false when it does not match.
    fn extract<'a>(
        &'a self,
        pattern: &'a Pattern,
        text: &str,
        out: &mut SmallVec<[(Dest<'a>, Value, bool); 16]>,
    ) -> bool {
        let mut spans = SmallVec::new();
        if pattern.spans(text, &mut spans).is_none() {
            return false;
        }
        // Matched spans always fall on char boundaries (the delimiters are UTF-8 text), so
        // `get` only guards against the impossible.
        let span = |i: usize| text.get(spans[i].0..spans[i].1).unwrap_or_default();
        for o in &pattern.outputs {
            match o {
                Output::Field { steps, target, convert } => {
                    let value = match steps.as_slice() {
                        [one] => str_value(span(*one)),
                        many => {
                            let mut joined = String::new();
                            for (n, s) in many.iter().enumerate() {
                                if n > 0 {
                                    joined.push_str(&self.separator);
                                }
                                joined.push_str(span(*s));
                            }
                            Value::String(Str::from(joined))
                        }
                    };
                    let (value, ok) = match convert {
                        None => (value, true),
                        Some(ty) => match ty.convert(value.as_str().unwrap_or_default()) {
                            Some(v) => (v, true),
                            None => (value, false),
                        },
                    };
                    out.push((Dest::Path(target), value, ok));
                }
                Output::Reference(key, value) => {
                    let name = span(*key);
                    if !name.is_empty() {
                        out.push((Dest::Key(Str::new(name)), str_value(span(*value)), true));
                    }
                }
            }
        }
        true
    }
}

impl Processor for Dissect {
    fn process(&self, event: &mut Event) -> Verdict {
        let mut out: SmallVec<[(Dest<'_>, Value, bool); 16]> = SmallVec::new();
        let mut matched = true;
        let mut unmatched: Option<&FieldPath> = None;
        for (field, pattern) in &self.mappings {
            let before = out.len();
            let ok = match event.get(field) {
                Some(Value::String(s)) => self.extract(pattern, s, &mut out),
                _ => false,
            };
            if !ok {
                out.truncate(before);
                matched = false;
                unmatched.get_or_insert(field);
            }
        }
        let mut converted = true;
        for (dest, value, ok) in out {
            converted &= ok;
            match dest {
                Dest::Path(p) => {
                    let _ = event.insert(p, value);
                }
                Dest::Key(k) => {
                    event.fields.insert(k, value);
                }
            }
        }
        if !matched {
            add_tags(event, &self.tag_on_failure);
        }
        if !converted {
            event.add_tag(CONVERSION_FAILURE);
        }
        if matched && converted {
            return Verdict::Keep;
        }
        self.on_failure.verdict(|| match unmatched {
            Some(field) => format!("dissect: {field} does not match its mapping pattern"),
            None => "dissect: a captured value could not be converted to its convert_datatype".to_string(),
        })
    }
}

#[cfg(test)]
mod tests;
