//! The `kafka` input's settings (defaults, what is refused, how errors name the key) and its
//! task between the consumer thread and the queue. (The offset tracker and the decoding have
//! their own tests; the input against a real broker is tested through the binary, in
//! the `kafka_input` module of `crates/sluice/tests/integration`.)

use sluice_config::ConfigError;

use super::config::{KafkaCodec, OffsetReset, consumer_config, read};
use crate::tcp::tests::spec;

fn build(yaml: &str) -> Result<rdkafka::ClientConfig, ConfigError> {
    let spec = spec(yaml);
    let (connection, c) = read(&spec)?;
    consumer_config(&spec, &connection, &c)
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
    let (_, c) = read(&spec).unwrap();
    assert_eq!(c.auto_offset_reset, OffsetReset::Latest);
    assert_eq!(c.codec, KafkaCodec::Text);
    assert_eq!(c.commit_interval.0, std::time::Duration::from_secs(1));
    assert_eq!(c.revoke_timeout.0, std::time::Duration::from_secs(10));
    assert_eq!(c.topic_field.unwrap().as_str(), "/@metadata/kafka/topic");
    assert_eq!(c.headers_field.unwrap().as_str(), "/@metadata/kafka/headers");
    let (connection, own) = read(&spec).unwrap();
    let client = consumer_config(&spec, &connection, &own).unwrap();
    assert_eq!(client.get("group.id"), Some("sluice"));
    assert_eq!(client.get("enable.auto.commit"), Some("false"));
    assert_eq!(client.get("enable.auto.offset.store"), Some("false"));
    assert_eq!(client.get("auto.offset.reset"), Some("latest"));
    assert_eq!(client.get("fetch.queue.backoff.ms"), Some("10"));
    assert!(crate::build(&spec).is_ok());
}

#[test]
fn an_unknown_key_lists_the_connection_keys_too() {
    let e = error("{type: kafka, bootstrap_servers: 'a:9092', topics: [t], group_id: g, bootstrap_server: 'b:1'}");
    assert!(
        e.contains("pipelines.p.inputs[0].bootstrap_server: unknown field `bootstrap_server`, expected one of"),
        "{e}"
    );
    assert!(e.contains("`group_id`") && e.contains("`bootstrap_servers`, `tls`, `sasl`, `librdkafka_options`"), "{e}");
    let e = error("{type: kafka, bootstrap_servers: 'a:9092', topics: [t], group_id: g, sasl: {mechanism: PLAIN}}");
    assert!(e.contains("pipelines.p.inputs[0].sasl: missing field `username`"), "{e}");
}

#[test]
fn keys_are_taken() {
    let client = build(
        "{type: kafka, bootstrap_servers: 'a:9092,b:9092', topics: [logs, '^app-.*'], group_id: g, codec: json, \
         auto_offset_reset: earliest, commit_interval: 250ms, revoke_timeout: 3s, topic_field: /kafka/topic, \
         partition_field: null, offset_field: null, key_field: null, timestamp_field: null, headers_field: null, \
         librdkafka_options: {session.timeout.ms: '10000', partition.assignment.strategy: cooperative-sticky, \
         fetch.queue.backoff.ms: '1000'}}",
    )
    .unwrap();
    assert_eq!(client.get("fetch.queue.backoff.ms"), Some("1000"), "the user's value wins");
    assert_eq!(client.get("auto.offset.reset"), Some("earliest"));
    assert_eq!(client.get("session.timeout.ms"), Some("10000"));
    assert_eq!(client.get("bootstrap.servers"), Some("a:9092,b:9092"));
    let spec = spec(
        "{type: kafka, bootstrap_servers: 'a:1', topics: [t], group_id: g, codec: json_lines, partition_field: null}",
    );
    let (_, c) = read(&spec).unwrap();
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

mod sending {
    //! The input's task between the consumer thread and the queue: batches grouped by
    //! partition, one acknowledgement per partition, revoked partitions' records left out.

    use std::sync::Arc;
    use std::time::Duration;

    use sluice_core::{FieldPath, Value};
    use tokio::sync::mpsc;

    use super::super::consumer::Chunk;
    use super::super::decode::{Fields, Record};
    use super::super::figures::Figures;
    use super::super::offsets::OffsetTracker;
    use super::super::{KafkaInput, send_chunks};
    use crate::codec::Codec;
    use crate::tcp::tests::context;

    fn record(partition: i32, offset: i64, epoch: u64) -> Record {
        Record {
            topic: Arc::from("logs"),
            partition,
            offset,
            epoch,
            timestamp_ms: None,
            key: None,
            value: format!("{{\"p\":{partition},\"o\":{offset}}}").into_bytes(),
            headers: Vec::new(),
        }
    }

    fn input() -> KafkaInput {
        KafkaInput {
            client: rdkafka::ClientConfig::new(),
            topics: vec!["logs".into()],
            group_id: "g".into(),
            bootstrap: "a:1".into(),
            codec: Codec::JsonLines,
            fields: Fields {
                topic: None,
                partition: FieldPath::parse("/@metadata/kafka/partition").ok(),
                offset: FieldPath::parse("/@metadata/kafka/offset").ok(),
                key: None,
                timestamp: None,
                headers: None,
            },
            commit_interval: Duration::from_secs(1),
            revoke_timeout: Duration::from_secs(1),
        }
    }

    fn committable(t: &OffsetTracker, p: i32) -> Option<i64> {
        t.to_commit().into_iter().find(|((_, q), _)| *q == p).map(|(_, o)| o)
    }

    #[tokio::test]
    async fn one_acknowledgement_per_partition_and_revoked_records_left_out() {
        let (ctx, mut batches) = context();
        let tracker = OffsetTracker::new();
        let key = |p: i32| (Arc::<str>::from("logs"), p);
        tracker.assign([key(0), key(1), key(2)]);
        let epochs = tracker.epochs();
        let e = |p: i32| epochs[&key(p)];
        // Partition 2 is revoked after its records were polled.
        tracker.close(&[key(2)]);
        tracker.release(&[key(2)]);
        let records = vec![
            record(0, 10, e(0)),
            record(1, 5, e(1)),
            record(2, 7, e(2)),
            record(0, 11, e(0)),
            record(1, 6, e(1)),
            record(0, 12, e(0)),
        ];
        let bytes = records.iter().map(|r| r.value.len()).sum();
        let (tx, mut rx) = mpsc::channel(2);
        tx.send(Chunk { records, bytes }).await.unwrap();
        drop(tx);
        let figures = Figures::default();
        send_chunks(&input(), &ctx, &tracker, &figures, &mut rx).await;
        let batch = batches.try_recv().unwrap();
        let at = |i: usize| {
            let get = |p: &str| batch.events[i].get(&FieldPath::parse(p).unwrap()).cloned();
            (get("/@metadata/kafka/partition"), get("/@metadata/kafka/offset"))
        };
        assert_eq!(batch.len(), 5, "partition 2's record is left to its next owner");
        // Grouped by partition, each in offset order.
        let expected = [(0, 10), (0, 11), (0, 12), (1, 5), (1, 6)];
        for (i, (p, o)) in expected.iter().enumerate() {
            assert_eq!(at(i), (Some(Value::Int(*p)), Some(Value::Int(*o))));
        }
        assert_eq!(batch.acks.covered(), 5);
        assert_eq!(figures.skipped_revoked.load(std::sync::atomic::Ordering::Relaxed), 1);
        assert_eq!(committable(&tracker, 0), None, "nothing committable on receipt");
        // Handled: each partition's offset moves past its last record.
        let mut batch = batch;
        let first = batch.split_front(3);
        first.complete();
        assert_eq!(committable(&tracker, 0), Some(13));
        assert_eq!(committable(&tracker, 1), None);
        batch.complete();
        assert_eq!(committable(&tracker, 1), Some(7));
        assert_eq!(ctx.metrics.events_in.get(), 5);
    }
}
