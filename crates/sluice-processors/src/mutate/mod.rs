//! `mutate`: renames, copies, adds, removes, converts and reshapes fields, and edits tags.
//!
//! The operations run in this fixed order, whatever the order of the keys in the config (inside
//! one operation, entries run in the order written):
//!
//! 1. `rename`: `{from: to}`, moves the value (missing `from`: nothing happens);
//! 2. `copy`: `{from: to}`, copies it;
//! 3. `convert`: `{field: int|float|bool|string}` (`integer` and `boolean` also read), arrays
//!    element by element;
//! 4. `lowercase`, 5. `uppercase`: `[paths]`, strings and arrays of strings;
//! 6. `split`: `{field: separator}`, a string becomes an array of strings;
//! 7. `merge`: `{dest: src}` with Logstash's semantics: two objects merge key by key (`src`
//!    wins), anything else concatenates as arrays (a scalar or missing `dest` becomes an array
//!    first); a missing `src` changes nothing;
//! 8. `add`: `{field: template}`, sets the field to the rendered template, replacing any value
//!    (a template that is exactly one `%{/field}` keeps that field's type), creating parent
//!    objects as needed;
//! 9. `remove`: `[paths]`;
//! 10. `add_tag`: `[templates]`, 11. `remove_tag`: `[tags]`.
//!
//! Paths, templates and separators are parsed once at build time. A failing step (a value
//! that does not convert, a destination under a scalar, `split` of a non-string, merging an
//! object with a non-object) leaves that value alone, the other steps still run, and the event
//! is tagged with `tag_on_failure` (default `_mutate_error`) and counted as
//! [`Verdict::Failed`].

mod config;

use std::sync::Arc;

use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::event::TAGS;
use sluice_core::{Event, FieldPath, Str, Value};
use sluice_expr::Template;

use crate::common::{add_tags, float_to_int, str_value, text_to_float, text_to_int};
use crate::{Processor, Verdict};
use config::Conversion;

/// A tag to add: text known at build time, or a template rendered per event.
enum TagTemplate {
    Constant(String),
    Dynamic(Template),
}

struct Mutate {
    rename: Vec<(FieldPath, FieldPath)>,
    copy: Vec<(FieldPath, FieldPath)>,
    add: Vec<(FieldPath, Template)>,
    remove: Vec<FieldPath>,
    convert: Vec<(FieldPath, Conversion)>,
    lowercase: Vec<FieldPath>,
    uppercase: Vec<FieldPath>,
    split: Vec<(FieldPath, String)>,
    merge: Vec<(FieldPath, FieldPath)>,
    add_tag: Vec<TagTemplate>,
    remove_tag: Vec<String>,
    tag_on_failure: Vec<String>,
}

pub(crate) fn build(spec: &ComponentSpec) -> Result<Arc<dyn Processor>, ConfigError> {
    let c = config::read(spec)?;
    Ok(Arc::new(Mutate {
        rename: c.rename.0,
        copy: c.copy.0,
        add: c.add.0,
        remove: c.remove,
        convert: c.convert.0,
        lowercase: c.lowercase,
        uppercase: c.uppercase,
        split: c.split.0,
        merge: c.merge.0,
        add_tag: c
            .add_tag
            .into_iter()
            .map(
                |t| {
                    if t.is_constant() {
                        TagTemplate::Constant(t.source().to_string())
                    } else {
                        TagTemplate::Dynamic(t)
                    }
                },
            )
            .collect(),
        remove_tag: c.remove_tag,
        tag_on_failure: c.tag_on_failure,
    }))
}

impl Processor for Mutate {
    fn process(&self, event: &mut Event) -> Verdict {
        let mut ok = true;
        for (from, to) in &self.rename {
            if let Some(v) = event.remove(from)
                && let Err(v) = event.insert(to, v)
            {
                // Put it back where it was: a failed rename loses nothing.
                let _ = event.insert(from, v);
                ok = false;
            }
        }
        for (from, to) in &self.copy {
            if let Some(v) = event.get(from).cloned() {
                ok &= event.insert(to, v).is_ok();
            }
        }
        for (field, conversion) in &self.convert {
            if let Some(v) = event.get_mut(field) {
                ok &= convert(v, *conversion);
            }
        }
        for field in &self.lowercase {
            if let Some(v) = event.get_mut(field) {
                change_case(v, false);
            }
        }
        for field in &self.uppercase {
            if let Some(v) = event.get_mut(field) {
                change_case(v, true);
            }
        }
        for (field, sep) in &self.split {
            match event.get_mut(field) {
                Some(v @ Value::String(_)) => {
                    let parts = v.as_str().unwrap_or_default().split(sep.as_str()).map(str_value).collect();
                    *v = Value::Array(parts);
                }
                None | Some(Value::Array(_)) => {}
                Some(_) => ok = false,
            }
        }
        for (dest, src) in &self.merge {
            ok &= merge(event, dest, src);
        }
        // Like Logstash's add_field and remove_field, these come after the field operations.
        for (field, template) in &self.add {
            let v = template.render_value(event);
            ok &= event.insert(field, v).is_ok();
        }
        for field in &self.remove {
            event.remove(field);
        }
        for tag in &self.add_tag {
            match tag {
                TagTemplate::Constant(t) => event.add_tag(t),
                TagTemplate::Dynamic(t) => {
                    let t = t.render_string(event);
                    if !t.is_empty() {
                        event.add_tag(&t);
                    }
                }
            }
        }
        if !self.remove_tag.is_empty() {
            remove_tags(event, &self.remove_tag);
        }
        if ok {
            Verdict::Keep
        } else {
            add_tags(event, &self.tag_on_failure);
            Verdict::Failed
        }
    }
}

/// Converts in place; false (leaving the value as it was) when it cannot be converted.
/// Null stays null.
fn convert(v: &mut Value, to: Conversion) -> bool {
    if let Value::Array(items) = v {
        let mut ok = true;
        for item in items {
            ok &= convert(item, to);
        }
        return ok;
    }
    if v.is_null() {
        return true;
    }
    let new = match (to, &*v) {
        (Conversion::Int, Value::Int(_))
        | (Conversion::Float, Value::Float(_))
        | (Conversion::Bool, Value::Bool(_))
        | (Conversion::String, Value::String(_)) => return true,
        (Conversion::Int, Value::Float(f)) => float_to_int(*f).map(Value::Int),
        (Conversion::Int, Value::Bool(b)) => Some(Value::Int(i64::from(*b))),
        (Conversion::Int, Value::String(s)) => text_to_int(s).map(Value::Int),
        (Conversion::Float, Value::Int(i)) => Some(Value::Float(*i as f64)),
        (Conversion::Float, Value::Bool(b)) => Some(Value::Float(if *b { 1.0 } else { 0.0 })),
        (Conversion::Float, Value::String(s)) => text_to_float(s).map(Value::Float),
        (Conversion::Bool, Value::Int(0)) => Some(Value::Bool(false)),
        (Conversion::Bool, Value::Int(1)) => Some(Value::Bool(true)),
        (Conversion::Bool, Value::String(s)) => text_to_bool(s).map(Value::Bool),
        (Conversion::String, other) => Some(Value::String(Str::from(other.to_text()))),
        _ => None,
    };
    match new {
        Some(n) => {
            *v = n;
            true
        }
        None => false,
    }
}

fn text_to_bool(s: &str) -> Option<bool> {
    const TRUE: &[&str] = &["true", "yes", "1", "t", "y"];
    const FALSE: &[&str] = &["false", "no", "0", "f", "n"];
    let s = s.trim();
    if TRUE.iter().any(|t| t.eq_ignore_ascii_case(s)) {
        Some(true)
    } else if FALSE.iter().any(|f| f.eq_ignore_ascii_case(s)) {
        Some(false)
    } else {
        None
    }
}

fn change_case(v: &mut Value, upper: bool) {
    match v {
        Value::String(s) if s.is_ascii() => {
            if upper {
                s.as_mut_str().make_ascii_uppercase();
            } else {
                s.as_mut_str().make_ascii_lowercase();
            }
        }
        Value::String(s) => *s = Str::from(if upper { s.to_uppercase() } else { s.to_lowercase() }),
        Value::Array(items) => items.iter_mut().for_each(|i| change_case(i, upper)),
        _ => {}
    }
}

fn into_array(v: Value) -> Vec<Value> {
    match v {
        Value::Array(a) => a,
        Value::Null => Vec::new(),
        other => vec![other],
    }
}

fn merge(event: &mut Event, dest: &FieldPath, src: &FieldPath) -> bool {
    let Some(added) = event.get(src).cloned() else {
        return true;
    };
    match event.get_mut(dest) {
        None => event.insert(dest, Value::Array(into_array(added))).is_ok(),
        Some(Value::Object(d)) => match added {
            Value::Object(s) => {
                d.extend(s);
                true
            }
            _ => false,
        },
        Some(_) if matches!(added, Value::Object(_)) => false,
        Some(d) => {
            let mut items = into_array(std::mem::take(d));
            items.extend(into_array(added));
            *d = Value::Array(items);
            true
        }
    }
}

fn remove_tags(event: &mut Event, remove: &[String]) {
    match event.fields.get_mut(TAGS) {
        Some(Value::Array(tags)) => tags.retain(|t| !t.as_str().is_some_and(|t| remove.iter().any(|r| r == t))),
        Some(Value::String(t)) if remove.iter().any(|r| r == t) => {
            event.fields.remove(TAGS);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests;
