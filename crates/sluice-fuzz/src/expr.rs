//! The condition language and `%{...}` templates: parsed from the fuzz input, then evaluated
//! and rendered against an event also built from it.

use sluice_core::{Event, Map, Value};
use sluice_expr::{Condition, ExprError, Template};

use crate::split::split;

/// Input: `[condition, template, event]` cut by [`split`](crate::split); the event part is an
/// 8-byte little-endian `@timestamp` (nanoseconds) followed by a JSON object (a fixed event
/// when it is not one).
pub fn expr(data: &[u8]) {
    let parts = split(data, 3);
    let event = event(parts[2]);
    let other = Event::from_message_at("other", 0);

    let src = String::from_utf8_lossy(parts[0]);
    match Condition::parse(&src) {
        Ok(cond) => {
            assert_eq!(cond.source(), src);
            let matched = cond.eval(&event);
            cond.eval(&other);
            // Wrapping adds two levels of nesting, which a condition at the limit cannot take.
            match Condition::parse(&format!("not ({src})")) {
                Ok(negated) => {
                    assert_eq!(negated.eval(&event), !matched, "`not ({src})` is not the negation of `{src}`");
                }
                Err(e) if e.message.starts_with("nested more than") => {}
                Err(e) => panic!("`{src}` parses but `not ({src})` does not: {e}"),
            }
        }
        Err(e) => check_error(&e, &src),
    }

    let src = String::from_utf8_lossy(parts[1]);
    match Template::parse(&src) {
        Ok(template) => {
            assert_eq!(template.source(), src);
            let rendered = template.render_string(&event);
            let mut appended = String::from("x");
            template.render(&event, &mut appended);
            assert_eq!(appended[1..], rendered, "render and render_string differ");
            let value = template.render_value(&event);
            if let Value::String(s) = &value {
                assert_eq!(s.as_str(), rendered, "render_value gives other text than render_string");
            }
            if template.is_constant() {
                assert_eq!(template.render_string(&other), rendered, "a constant template renders differently");
                assert_eq!(template.literal_prefix(), rendered, "a constant template's literal prefix is not itself");
            } else {
                assert!(rendered.starts_with(template.literal_prefix()), "the literal prefix is not rendered first");
            }
        }
        Err(e) => check_error(&e, &src),
    }
}

fn event(part: &[u8]) -> Event {
    let (timestamp, json) = match part.split_first_chunk::<8>() {
        Some((ts, json)) => (i64::from_le_bytes(*ts), json),
        None => (1_700_000_000_123_456_789, part),
    };
    let fields = serde_json::from_slice::<Map>(json).unwrap_or_else(|_| {
        let mut m = Map::new();
        m.insert("status", Value::Int(503));
        m.insert("level", Value::from("error"));
        m.insert("ratio", Value::Float(f64::NAN));
        m.insert("tags", Value::Array(vec![Value::from("a"), Value::Null, Value::Bool(true)]));
        let mut nested = Map::new();
        nested.insert("a/b", Value::from("slash"));
        nested.insert("t~", Value::Timestamp(i64::MIN));
        m.insert("user", Value::Object(nested));
        m
    });
    let mut event = Event::new(fields);
    event.set_timestamp_nanos(timestamp);
    event
}

/// An error points inside its source (or just past its end) and renders.
fn check_error(e: &ExprError, src: &str) {
    assert!(
        (1..=src.chars().count() + 1).contains(&e.column),
        "column {} outside `{src}` ({} chars)",
        e.column,
        src.chars().count()
    );
    assert_eq!(e.source, src);
    assert!(!e.to_string().is_empty());
}
