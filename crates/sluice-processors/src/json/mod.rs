//! `json`: parses a string field as JSON.
//!
//! Without `target`, the parsed object's fields are merged into the event root, replacing fields
//! of the same name; with `target`, the parsed value (of any JSON type) is stored there. When
//! merging, an `@timestamp` that is an RFC 3339 string becomes a real timestamp (as Logstash
//! does); one that does not parse stays a string and the event is tagged
//! `_timestampparsefailure` (and counted as failed).
//!
//! `remove_source` removes the source field only after a successful parse: when merging, a parsed
//! field of the same name survives; with a `target`, the source is removed after the value is
//! stored, unless one path contains the other. On any failure (source missing, not a string, not
//! JSON, or a non-object with no `target` to put it in) the event is left as it was, tagged with
//! `tag_on_failure`, and the verdict is [`Verdict::Failed`] — or, with `on_failure: dlq`,
//! [`Verdict::DeadLetter`] with the reason.
//!
//! The source text is never copied: it is parsed where it is, and when merging, the object's
//! fields go straight into the event (no intermediate map); a parse that fails half-way is rolled
//! back so the event is exactly as it was.

mod config;

use std::fmt;
use std::sync::Arc;

use serde::de::{MapAccess, Visitor};
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::event::TIMESTAMP;
use sluice_core::{Event, FieldPath, Map, Str, Value};

use crate::common::{OnFailure, add_tags};
use crate::date::parse_iso8601;
use crate::{Processor, Verdict};

const TIMESTAMP_FAILURE: &str = "_timestampparsefailure";

struct Json {
    source: FieldPath,
    target: Option<FieldPath>,
    remove_source: bool,
    tag_on_failure: Vec<String>,
    on_failure: OnFailure,
}

pub(crate) fn build(spec: &ComponentSpec) -> Result<Arc<dyn Processor>, ConfigError> {
    let c = config::read(spec)?;
    Ok(Arc::new(Json {
        source: c.source,
        target: c.target,
        remove_source: c.remove_source,
        tag_on_failure: c.tag_on_failure,
        on_failure: c.on_failure,
    }))
}

impl Json {
    fn fail(&self, event: &mut Event, reason: impl FnOnce() -> String) -> Verdict {
        add_tags(event, &self.tag_on_failure);
        self.on_failure.verdict(reason)
    }

    fn not_a_string(&self, event: &mut Event) -> Verdict {
        let found = match event.get(&self.source) {
            None => "missing".to_string(),
            Some(v) => format!("not a string but {}", v.type_name()),
        };
        self.fail(event, || format!("json: the source {} is {found}", self.source))
    }
}

impl Processor for Json {
    fn process(&self, event: &mut Event) -> Verdict {
        match &self.target {
            Some(target) => self.parse_into(event, target),
            None => self.merge(event),
        }
    }
}

impl Json {
    /// Parses the whole value and stores it at `target`.
    fn parse_into(&self, event: &mut Event, target: &FieldPath) -> Verdict {
        let parsed = match event.get(&self.source) {
            Some(Value::String(s)) => serde_json::from_str::<Value>(s),
            _ => return self.not_a_string(event),
        };
        let value = match parsed {
            Ok(v) => v,
            Err(e) => return self.fail(event, || format!("json: {} is not valid JSON: {e}", self.source)),
        };
        // Insert first: if the target cannot be written, the source is still there.
        if event.insert(target, value).is_err() {
            return self.fail(event, || format!("json: cannot write the target {target} (a parent is not an object)"));
        }
        // When one path contains the other, the source is already replaced (or holds the
        // result): nothing to remove.
        let (s, t) = (self.source.segments(), target.segments());
        if self.remove_source && !s.starts_with(t) && !t.starts_with(s) {
            event.remove(&self.source);
        }
        Verdict::Keep
    }

    /// Parses an object straight into the event root, with no intermediate map. The source text
    /// is moved out of the event for the parse (not copied) and moved back after; if the parse
    /// fails half-way, the fields it added or replaced are rolled back.
    fn merge(&self, event: &mut Event) -> Verdict {
        let text = match event.get_mut(&self.source) {
            Some(Value::String(s)) => std::mem::take(s),
            _ => return self.not_a_string(event),
        };
        let source_key = self.source.segments().first().map(|s| s.as_str()).unwrap_or_default();
        let original_len = event.fields.len();
        let seen = event.fields.keys().fold(0, |m, k| m | key_bit(k));
        let mut merge = Merge {
            fields: &mut event.fields,
            original_len,
            replaced: Vec::new(),
            source_key,
            source_replaced: false,
            timestamp_set: false,
            seen,
        };
        let mut de = serde_json::Deserializer::from_str(&text);
        let outcome = serde::de::Deserializer::deserialize_map(&mut de, &mut merge).and_then(|_| de.end());
        let Merge { replaced, source_replaced, timestamp_set, .. } = merge;
        if let Err(error) = outcome {
            // Put back the values replaced (in reverse, for keys seen twice), drop the new ones.
            for (index, old) in replaced.into_iter().rev() {
                if let Some((_, v)) = event.fields.iter_mut().nth(index) {
                    *v = old;
                }
            }
            let mut n = 0;
            event.fields.retain(|_, _| {
                n += 1;
                n <= original_len
            });
            self.restore_source(event, text);
            return self.fail(event, || format!("json: {} is not a JSON object: {error}", self.source));
        }
        if !source_replaced {
            if self.remove_source {
                event.remove(&self.source);
            } else {
                self.restore_source(event, text);
            }
        }
        if timestamp_set && let Some(v @ Value::String(_)) = event.fields.get_mut(TIMESTAMP) {
            match parse_iso8601(v.as_str().unwrap_or_default(), 0) {
                Some(ns) => *v = Value::Timestamp(ns),
                None => {
                    let text = v.to_text();
                    event.add_tag(TIMESTAMP_FAILURE);
                    return self
                        .on_failure
                        .verdict(|| format!("json: the parsed @timestamp `{text}` is not an RFC 3339 time"));
                }
            }
        }
        Verdict::Keep
    }

    fn restore_source(&self, event: &mut Event, text: Str) {
        if let Some(Value::String(s)) = event.get_mut(&self.source) {
            *s = text;
        }
    }
}

/// Receives the top-level object of the parse and writes each field into the event.
struct Merge<'a> {
    fields: &'a mut Map,
    original_len: usize,
    /// (index, previous value) of fields that existed before the parse and were replaced.
    replaced: Vec<(usize, Value)>,
    /// The top-level field holding the source text.
    source_key: &'a str,
    source_replaced: bool,
    timestamp_set: bool,
    /// One bit per key in `fields` (see [`key_bit`]): a key whose bit is clear is certainly
    /// new, and is appended without scanning the event's keys.
    seen: u64,
}

/// A cheap 1-in-64 fingerprint of a key.
fn key_bit(key: &str) -> u64 {
    let b = key.as_bytes();
    let h = b.len().wrapping_mul(31)
        ^ usize::from(b.first().copied().unwrap_or(0)).wrapping_mul(7)
        ^ usize::from(b.last().copied().unwrap_or(0));
    1 << (h & 63)
}

impl<'de> Visitor<'de> for &mut Merge<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<(), A::Error> {
        while let Some(key) = access.next_key::<Str>()? {
            let value: Value = access.next_value()?;
            self.timestamp_set |= key == TIMESTAMP;
            self.source_replaced |= key == self.source_key;
            let bit = key_bit(&key);
            if self.seen & bit == 0 {
                self.seen |= bit;
                self.fields.push_unchecked(key, value);
                continue;
            }
            let slot = self.fields.iter_mut().enumerate().find(|(_, (k, _))| **k == key);
            match slot {
                Some((index, (_, v))) => {
                    let old = std::mem::replace(v, value);
                    if index < self.original_len {
                        self.replaced.push((index, old));
                    }
                }
                None => self.fields.push_unchecked(key, value),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
