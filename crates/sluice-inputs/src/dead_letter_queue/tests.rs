//! Unit tests of the `dead_letter_queue` input.

use super::config::parse_start;
use super::*;

fn pos(segment: u64, offset: u64) -> Position {
    Position { segment, offset }
}

#[test]
fn only_the_contiguous_acknowledged_prefix_moves() {
    let mut p = Progress::default();
    assert_eq!(p.finish(1, pos(1, 200), AckOutcome::Handled), None, "batch 0 is still out");
    assert_eq!(p.finish(2, pos(2, 100), AckOutcome::Handled), None);
    assert_eq!(p.finish(0, pos(1, 100), AckOutcome::Handled), Some(pos(2, 100)), "0, 1 and 2 are done");
    assert_eq!(p.next, 3);
    assert_eq!(p.finish(4, pos(3, 10), AckOutcome::Handled), None);
    assert_eq!(p.finish(3, pos(2, 900), AckOutcome::Abandoned), None, "given up: no commit past it");
    assert_eq!(p.finish(5, pos(3, 20), AckOutcome::Handled), None);
    assert_eq!(p.next, 3);
}

#[test]
fn start_from_is_checked() {
    assert_eq!(parse_start("beginning").unwrap(), ReadFrom::Beginning);
    assert_eq!(parse_start("1970-01-01T00:00:01Z").unwrap(), ReadFrom::Time(1_000_000_000));
    assert_eq!(parse_start("1970-01-01T01:00:01+01:00").unwrap(), ReadFrom::Time(1_000_000_000));
    assert!(parse_start("yesterday").unwrap_err().contains("RFC 3339"));
}

#[test]
fn replayed_events_carry_the_queue_facts() {
    let entry = DeadLetter {
        event: Event::from_message_at("hello", 5),
        reason: "HTTP 400: bad".to_string(),
        plugin_id: "es".to_string(),
        plugin_type: "http".to_string(),
        pipeline: "web".to_string(),
        time: 7,
        attempts: 2,
    };
    let e = replayed_event(entry);
    let m = e.fields.get("@metadata").and_then(Value::as_object).and_then(|m| m.get(METADATA_KEY)).unwrap();
    let m = m.as_object().unwrap();
    assert_eq!(m.get("reason"), Some(&Value::from("HTTP 400: bad")));
    assert_eq!(m.get("plugin_type"), Some(&Value::from("http")));
    assert_eq!(m.get("entry_time"), Some(&Value::Timestamp(7)));
    assert_eq!(m.get("attempts"), Some(&Value::Int(2)));
    assert_eq!(e.message(), Some("hello"));
    assert_eq!(e.to_json_string(), r#"{"message":"hello","@timestamp":"1970-01-01T00:00:00.000000005Z"}"#);
}
