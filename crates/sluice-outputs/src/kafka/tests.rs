//! Tests of the `kafka` output that need no broker: its settings, how an event becomes a record,
//! and events refused before anything is sent.

use crate::Output;
use crate::test_support::{context, spec};
use rdkafka::message::Headers;

fn build(extra: &str) -> Result<super::KafkaOutput, String> {
    let yaml = format!("{{type: kafka, bootstrap_servers: '127.0.0.1:9', topic: logs{extra}}}");
    super::build_output(&spec(&yaml), context("p", "kafka")).map_err(|e| e.to_string())
}

#[test]
fn batches_in_flight_defaults_to_four_and_is_bounded() {
    let out = build("").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.batches_in_flight(), 4);
    let out = build(", batches_in_flight: 64").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out.batches_in_flight(), 64);
    for bad in ["0", "65"] {
        let e = build(&format!(", batches_in_flight: {bad}")).err().expect("refused");
        assert!(e.contains("batches_in_flight") && e.contains("between 1 and 64"), "{e}");
    }
}

fn event(json: &str) -> sluice_core::Event {
    sluice_core::Event::new(serde_json::from_str(json).unwrap())
}

#[test]
fn records_take_their_topic_key_and_headers_from_the_event() {
    let out = build_with("topic: 'logs-%{/svc}', key: '%{/host}', headers: {trace: '%{/trace}'}, codec: text");
    let r = out.encode(0, &event(r#"{"svc":"web","host":"h1","trace":"t-9","message":"hello"}"#)).unwrap();
    assert_eq!((r.topic.as_ref(), r.key.as_deref(), &r.payload[..]), ("logs-web", Some("h1"), &b"hello"[..]));
    let headers = r.headers.expect("one header");
    assert_eq!((headers.count(), headers.get(0).key, headers.get(0).value), (1, "trace", Some(&b"t-9"[..])));
    // A missing key field is no key, a missing header field no header; text without a message is JSON.
    let r = out.encode(0, &event(r#"{"svc":"web","n":1}"#)).unwrap();
    assert!(r.key.is_none() && r.headers.is_none());
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&r.payload).unwrap()["n"], 1);
}

#[tokio::test]
async fn an_event_without_its_topic_field_is_refused_unsent_naming_the_field() {
    let out = build_with("topic: 'logs-%{/svc}'");
    let events = [event(r#"{"n":1}"#), event(r#"{"n":2}"#)];
    let refs: Vec<&sluice_core::Event> = events.iter().collect();
    // No broker listens: had anything been sent, this would wait for it.
    let delivery = out.send(&refs).await.unwrap();
    assert_eq!(delivery.rejected.iter().map(|r| r.index).collect::<Vec<_>>(), [0, 1]);
    let reason = &delivery.rejected[0].reason;
    assert!(reason.contains("/svc") && reason.contains("logs-%{/svc}"), "{reason}");
    assert!(delivery.rejected.iter().all(|r| r.permanent));
}

fn build_with(keys: &str) -> super::KafkaOutput {
    let yaml = format!("{{type: kafka, bootstrap_servers: '127.0.0.1:9', {keys}}}");
    super::build_output(&spec(&yaml), context("p", "kafka")).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn a_bad_librdkafka_option_is_a_config_error_naming_it() {
    let e = build(", librdkafka_options: {socket.keepalive.enable: maybe}").err().expect("refused");
    assert!(e.contains("librdkafka_options.socket.keepalive.enable"), "{e}");
    let e = build(", librdkafka_options: {no.such.setting: '1'}").err().expect("refused");
    assert!(e.contains("librdkafka_options.no.such.setting"), "{e}");
}
