//! The `kafka` input's settings: defaults, what is refused and how errors name the key. (The
//! offset tracker and the decoding have their own tests; the input against a real broker is
//! tested through the binary, in `crates/sluice/tests/kafka_input.rs`.)

use sluice_config::ConfigError;

use super::config::{KafkaCodec, KafkaInputConfig, OffsetReset, consumer_config};
use crate::tcp::tests::spec;

fn build(yaml: &str) -> Result<rdkafka::ClientConfig, ConfigError> {
    let spec = spec(yaml);
    let c: KafkaInputConfig = spec.settings()?;
    consumer_config(&spec, &c)
}

fn error(yaml: &str) -> String {
    match crate::build(&spec(yaml)) {
        Ok(_) => panic!("{yaml} was accepted"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn defaults() {
    let spec = spec("{type: kafka, bootstrap_servers: '127.0.0.1:9092', topics: [logs], group_id: sluice}");
    let c: KafkaInputConfig = spec.settings().unwrap();
    assert_eq!(c.auto_offset_reset, OffsetReset::Latest);
    assert_eq!(c.codec, KafkaCodec::Text);
    assert_eq!(c.commit_interval.0, std::time::Duration::from_secs(1));
    assert_eq!(c.revoke_timeout.0, std::time::Duration::from_secs(10));
    assert_eq!(c.topic_field.unwrap().as_str(), "/@metadata/kafka/topic");
    assert_eq!(c.headers_field.unwrap().as_str(), "/@metadata/kafka/headers");
    let client = consumer_config(&spec, &spec.settings().unwrap()).unwrap();
    assert_eq!(client.get("group.id"), Some("sluice"));
    assert_eq!(client.get("enable.auto.commit"), Some("false"));
    assert_eq!(client.get("enable.auto.offset.store"), Some("false"));
    assert_eq!(client.get("auto.offset.reset"), Some("latest"));
    assert!(crate::build(&spec).is_ok());
}

#[test]
fn keys_are_taken() {
    let client = build(
        "{type: kafka, bootstrap_servers: 'a:9092,b:9092', topics: [logs, '^app-.*'], group_id: g, codec: json, \
         auto_offset_reset: earliest, commit_interval: 250ms, revoke_timeout: 3s, topic_field: /kafka/topic, \
         partition_field: null, offset_field: null, key_field: null, timestamp_field: null, headers_field: null, \
         librdkafka_options: {session.timeout.ms: '10000', partition.assignment.strategy: cooperative-sticky}}",
    )
    .unwrap();
    assert_eq!(client.get("auto.offset.reset"), Some("earliest"));
    assert_eq!(client.get("session.timeout.ms"), Some("10000"));
    assert_eq!(client.get("bootstrap.servers"), Some("a:9092,b:9092"));
    let spec = spec(
        "{type: kafka, bootstrap_servers: 'a:1', topics: [t], group_id: g, codec: json_lines, partition_field: null}",
    );
    let c: KafkaInputConfig = spec.settings().unwrap();
    assert_eq!(c.codec, KafkaCodec::Json);
    assert!(c.partition_field.is_none());
}

#[test]
fn errors_name_the_key() {
    let base = "type: kafka, bootstrap_servers: 'a:9092', group_id: g";
    let e = error(&format!("{{{base}, topics: []}}"));
    assert!(e.contains("topics"), "{e}");
    let e = error(&format!("{{{base}, topics: ['^(unclosed']}}"));
    assert!(e.contains("topics") && e.contains("regular expression"), "{e}");
    let e = error("{type: kafka, bootstrap_servers: 'a:9092', topics: [t], group_id: ''}");
    assert!(e.contains("group_id"), "{e}");
    let e = error("{type: kafka, bootstrap_servers: 'a:9092', topics: [t]}");
    assert!(e.contains("group_id"), "{e}");
    let e = error(&format!("{{{base}, topics: [t], librdkafka_options: {{enable.auto.commit: 'true'}}}}"));
    assert!(e.contains("librdkafka_options.enable.auto.commit"), "{e}");
    let e = error(&format!("{{{base}, topics: [t], librdkafka_options: {{no.such.option: '1'}}}}"));
    assert!(e.contains("librdkafka_options.no.such.option"), "{e}");
    let e = error(&format!("{{{base}, topics: [t], librdkafka_options: {{session.timeout.ms: lots}}}}"));
    assert!(e.contains("session.timeout.ms"), "{e}");
    let e = error(&format!("{{{base}, topics: [t], revoke_timeout: 0s}}"));
    assert!(e.contains("revoke_timeout"), "{e}");
    let e = error(&format!(
        "{{{base}, topics: [t], revoke_timeout: 20s, librdkafka_options: {{max.poll.interval.ms: '15000'}}}}"
    ));
    assert!(e.contains("revoke_timeout") && e.contains("max.poll.interval.ms"), "{e}");
    let e = error(&format!("{{{base}, topics: [t], commit_interval: 1ms}}"));
    assert!(e.contains("commit_interval"), "{e}");
    let e = error(&format!("{{{base}, topics: [t], auto_offset_reset: middle}}"));
    assert!(e.contains("auto_offset_reset"), "{e}");
    let e = error(&format!("{{{base}, topics: [t], codec: xml}}"));
    assert!(e.contains("codec"), "{e}");
    let e = error(&format!("{{{base}, topics: [t], topic_field: 'a//b'}}"));
    assert!(e.contains("topic_field"), "{e}");
    let e = error("{type: kafka, bootstrap_servers: 'nope', topics: [t], group_id: g}");
    assert!(e.contains("bootstrap_servers"), "{e}");
    let e = error(&format!("{{{base}, topics: [t], unknown_key: 1}}"));
    assert!(e.contains("unknown_key"), "{e}");
}

#[test]
fn tls_and_sasl_reach_librdkafka() {
    let dir = tempfile::tempdir().unwrap();
    let certs = sluice_tls::testing::CertSet::generate(dir.path(), &["client"]);
    let client = build(&format!(
        "{{type: kafka, bootstrap_servers: 'a:9093', topics: [t], group_id: g, tls: {{ca: '{}', cert: '{}', key: '{}'}}, \
         sasl: {{mechanism: SCRAM-SHA-256, username: u, password: p}}}}",
        certs.ca_cert.display(),
        certs.cert("client").display(),
        certs.key("client").display()
    ))
    .unwrap();
    assert_eq!(client.get("security.protocol"), Some("sasl_ssl"));
    assert_eq!(client.get("sasl.mechanism"), Some("SCRAM-SHA-256"));
    assert_eq!(client.get("ssl.ca.location"), Some(certs.ca_cert.to_str().unwrap()));
    let client =
        build("{type: kafka, bootstrap_servers: 'a:9092', topics: [t], group_id: g, tls: {verify: false}}").unwrap();
    assert_eq!(client.get("security.protocol"), Some("ssl"));
    assert_eq!(client.get("enable.ssl.certificate.verification"), Some("false"));
}
