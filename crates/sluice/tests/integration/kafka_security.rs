//! The `kafka` input and output against a real Kafka 4.3 broker whose client listener is
//! secured (`servers/kafka/run start --security ...`), through the real binary:
//! - SASL_PLAINTEXT: the output delivers with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512, the input
//!   consumes with PLAIN; a wrong password delivers nothing, is logged as an authentication
//!   failure naming the broker and the mechanism, and the events stay unacknowledged;
//! - SSL: the output delivers with `tls: {ca: ...}` (a CA the test made) and, with another
//!   CA, logs a certificate verification failure and delivers nothing; a listener that requires
//!   client certificates takes `tls: {cert, key}`;
//! - SASL_SSL: SCRAM-SHA-512 over TLS, both ways.
//!
//! One broker per mode, its scenarios run against it one after the other: a broker takes
//! seconds to start, a scenario a second or two (a refusal waits out a 4 s drain). The admin
//! client reads and writes the topics over the broker's PLAINTEXT listener, independently of
//! the secured one.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::{Sluice, eventually, numbers_after, run_to_end, summary};
use sluice_testkit::kafka::{Kafka, ListenerTls, Security};
use sluice_tls::testing::CertSet;

const USER: &str = "alice";
const PASSWORD: &str = "alice-secret";
/// How the output's line on brokers that refuse it begins.
const OUTPUT_REFUSED: &str = "kafka output cannot deliver";

fn users() -> Vec<(String, String)> {
    vec![(USER.to_string(), PASSWORD.to_string())]
}

fn sasl(mechanism: &str, password: &str) -> String {
    format!("sasl: {{mechanism: {mechanism}, username: {USER}, password: {password}}}")
}

/// A config that reads `n` JSON lines from stdin and writes them to `topic` with the output's
/// `connection` keys; it ends once they are all delivered.
fn output_config(kafka: &Kafka, topic: &str, connection: &str, shutdown_timeout: &str) -> String {
    format!(
        "data_dir: '{{dir}}/data'
api: {{enabled: false}}
shutdown_timeout: {shutdown_timeout}
pipelines:
  main:
    inputs: [{{type: stdin, codec: json_lines}}]
    outputs:
      - {{type: kafka, id: secured, bootstrap_servers: '{}', topic: {topic}, {connection}}}
",
        kafka.bootstrap()
    )
}

fn input_lines(n: u64, what: &str) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().unwrap();
    let text: String = (0..n).map(|i| format!("{{\"n\":{i},\"via\":\"{what}\"}}\n")).collect();
    std::fs::write(file.path(), text).unwrap();
    file
}

/// Runs sluice with the output's `connection` keys over `n` events, and checks that each is in
/// `topic` once.
fn output_delivers(kafka: &Kafka, topic: &str, connection: &str, n: u64) {
    kafka.create_topic(topic, 2);
    let input = input_lines(n, topic);
    let (ok, log) = run_to_end(&output_config(kafka, topic, connection, "30s"), input.path());
    assert!(ok, "{topic}: sluice did not deliver with `{connection}`:\n{log}");
    let records = kafka.consume_all(topic, n as usize, Duration::from_secs(30));
    let mut seen = BTreeMap::<u64, u32>::new();
    for (_, _, _, value) in &records {
        let e: serde_json::Value = serde_json::from_slice(value).unwrap();
        assert_eq!(e["via"], topic);
        *seen.entry(e["n"].as_u64().unwrap()).or_default() += 1;
    }
    assert_eq!(seen.len() as u64, n, "{topic}: every event in the topic, with `{connection}`:\n{log}");
    assert!(seen.values().all(|&c| c == 1), "{topic}: each once");
}

/// Runs sluice with the output's `connection` keys, which the broker refuses, over a few events:
/// it must deliver nothing, log `expected` (each a case-insensitive part of one log line), end
/// with every event unfinished (not acknowledged, not counted as failed) and not panic. Returns
/// the matching log line.
fn output_is_refused(kafka: &Kafka, topic: &str, connection: &str, expected: &[&str]) -> String {
    kafka.create_topic(topic, 1);
    let n = 20;
    let input = input_lines(n, topic);
    // The inputs end at once; the drain then waits for the output until shutdown_timeout.
    let mut s = Sluice::start_with(
        &output_config(kafka, topic, connection, "4s"),
        Stdio::from(std::fs::File::open(input.path()).unwrap()),
    );
    let (status, log) = s.wait(Duration::from_secs(60));
    let line = log
        .lines()
        .find(|l| {
            let l = l.to_lowercase();
            expected.iter().all(|e| l.contains(&e.to_lowercase()))
        })
        .unwrap_or_else(|| panic!("{topic}: no log line with all of {expected:?}:\n{log}"))
        .to_string();
    assert!(!log.contains("panicked"), "{topic}: {log}");
    assert!(!status.success(), "{topic}: unfinished events make the exit status 1:\n{log}");
    let figures = summary(&log, "main");
    assert_eq!(figures["in"], n, "{log}");
    assert_eq!(figures["unfinished"], n, "{topic}: nothing was acknowledged:\n{log}");
    assert_eq!(figures["failed"], 0, "{topic}: nor given up as failed:\n{log}");
    assert!(kafka.consume_all(topic, 0, Duration::from_secs(5)).is_empty(), "{topic}: nothing in the topic");
    line
}

/// Runs sluice's kafka input with `connection` on `topic` (which the admin client fills with
/// `n` records) into a file, and waits until every record is in it.
fn input_consumes(kafka: &Kafka, topic: &str, connection: &str, n: u64) {
    kafka.create_topic(topic, 2);
    let owned: Vec<(String, String)> = (0..n).map(|i| (format!("k{}", i % 7), format!("{{\"n\":{i}}}"))).collect();
    let records: Vec<(Option<&[u8]>, &[u8])> = owned.iter().map(|(k, v)| (Some(k.as_bytes()), v.as_bytes())).collect();
    kafka.produce(topic, &records);
    let mut s = Sluice::start(&format!(
        "data_dir: '{{dir}}/data'
api: {{enabled: false}}
pipelines:
  main:
    inputs:
      - {{type: kafka, bootstrap_servers: '{}', topics: [{topic}], group_id: {topic}-readers, codec: json,
          auto_offset_reset: earliest, commit_interval: 200ms, {connection}}}
    outputs: [{{type: file, path: '{{dir}}/out.log'}}]
",
        kafka.bootstrap()
    ));
    let out = s.path("out.log");
    let all = eventually(Duration::from_secs(60), || numbers_after(&out, r#""n":"#).len() as u64 == n);
    assert!(all, "{topic}: the input did not read all {n} records with `{connection}`:\n{}", s.log());
    let got = numbers_after(&out, r#""n":"#);
    assert!(got.values().all(|&c| c == 1), "{topic}: each once");
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
}

/// Runs the kafka input with `connection`, which the broker refuses: it must log `expected`
/// (each a case-insensitive part of one log line), read nothing, keep running and stop cleanly.
fn input_is_refused(kafka: &Kafka, topic: &str, connection: &str, expected: &[&str]) -> String {
    kafka.create_topic(topic, 1);
    kafka.produce(topic, &[(None, b"{\"n\":0}")]);
    let mut s = Sluice::start(&format!(
        "data_dir: '{{dir}}/data'
api: {{enabled: false}}
pipelines:
  main:
    inputs:
      - {{type: kafka, bootstrap_servers: '{}', topics: [{topic}], group_id: {topic}-readers, codec: json,
          auto_offset_reset: earliest, {connection}}}
    outputs: [{{type: file, path: '{{dir}}/out.log'}}]
",
        kafka.bootstrap()
    ));
    let matching = |log: &str| {
        log.lines()
            .find(|l| {
                let l = l.to_lowercase();
                expected.iter().all(|e| l.contains(&e.to_lowercase()))
            })
            .map(str::to_string)
    };
    let logged = eventually(Duration::from_secs(30), || matching(&s.log()).is_some());
    assert!(logged, "{topic}: no log line with all of {expected:?}:\n{}", s.log());
    assert!(s.child.try_wait().unwrap().is_none(), "the input keeps trying:\n{}", s.log());
    let (status, log) = s.stop();
    assert!(!log.contains("panicked"), "{log}");
    assert!(status.success(), "{log}");
    assert!(numbers_after(&s.path("out.log"), r#""n":"#).is_empty(), "{topic}: nothing read:\n{log}");
    matching(&log).unwrap()
}

/// A CA and the broker's certificate (for 127.0.0.1, the address it advertises), a client
/// certificate from the same CA, and an unrelated CA.
fn certificates(dir: &Path) -> (CertSet, CertSet) {
    let certs = CertSet::generate(dir, &["127.0.0.1", "client"]);
    let other = CertSet::generate_other_ca(dir, &[]);
    (certs, other)
}

fn listener_tls(certs: &CertSet, client_ca: bool) -> ListenerTls {
    ListenerTls {
        cert: certs.cert("127.0.0.1"),
        key: certs.key("127.0.0.1"),
        client_ca: client_ca.then(|| certs.ca_cert.clone()),
    }
}

#[test]
fn sasl_plaintext_plain_and_scram_deliver_and_a_wrong_password_is_refused() {
    let kafka = Kafka::start_secured_or_panic(&Security::SaslPlaintext { users: users() }, &[]);
    output_delivers(&kafka, "plain-out", &sasl("PLAIN", PASSWORD), 500);
    output_delivers(&kafka, "scram256-out", &sasl("SCRAM-SHA-256", PASSWORD), 500);
    output_delivers(&kafka, "scram512-out", &sasl("SCRAM-SHA-512", PASSWORD), 500);
    input_consumes(&kafka, "plain-in", &sasl("PLAIN", PASSWORD), 500);

    // A refusal waits out the drain: they run side by side.
    let broker = kafka.bootstrap();
    let refused = |mechanism: &'static str| {
        [OUTPUT_REFUSED, "authentication failed", broker.as_str(), "SASL_PLAINTEXT", mechanism, USER, "invalid"]
    };
    let kafka = &kafka;
    std::thread::scope(|scope| {
        let plain = scope
            .spawn(|| output_is_refused(kafka, "plain-refused", &sasl("PLAIN", "wrong"), &refused("mechanism PLAIN")));
        let scram = scope.spawn(|| {
            output_is_refused(
                kafka,
                "scram-refused",
                &sasl("SCRAM-SHA-256", "wrong"),
                &refused("mechanism SCRAM-SHA-256"),
            )
        });
        let input = scope.spawn(|| {
            input_is_refused(
                kafka,
                "plain-in-refused",
                &sasl("PLAIN", "wrong"),
                &["kafka input cannot read", "authentication failed", &broker, "mechanism PLAIN", USER],
            )
        });
        for (what, thread) in [("PLAIN, output", plain), ("SCRAM-SHA-256, output", scram), ("PLAIN, input", input)] {
            match thread.join() {
                Ok(line) => eprintln!("wrong {what}: {line}"),
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
    });
}

#[test]
fn ssl_with_the_test_ca_delivers_and_another_ca_fails_certificate_verification() {
    let dir = tempfile::tempdir().unwrap();
    let (certs, other) = certificates(dir.path());
    let kafka = Kafka::start_secured_or_panic(&Security::Ssl(listener_tls(&certs, false)), &[]);
    let ca = |set: &CertSet| format!("tls: {{ca: '{}'}}", set.ca_cert.display());
    output_delivers(&kafka, "tls-out", &ca(&certs), 500);
    input_consumes(&kafka, "tls-in", &ca(&certs), 500);
    let line = output_is_refused(
        &kafka,
        "tls-other-ca",
        &ca(&other),
        &[OUTPUT_REFUSED, "the TLS handshake failed", &kafka.bootstrap(), "certificate verify failed"],
    );
    eprintln!("another CA, output: {line}");
}

#[test]
fn ssl_with_client_certificates_takes_the_tls_cert_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let (certs, _) = certificates(dir.path());
    let kafka = Kafka::start_secured_or_panic(&Security::Ssl(listener_tls(&certs, true)), &[]);
    let mutual = format!(
        "tls: {{ca: '{}', cert: '{}', key: '{}'}}",
        certs.ca_cert.display(),
        certs.cert("client").display(),
        certs.key("client").display()
    );
    output_delivers(&kafka, "mtls-out", &mutual, 200);
    // Without a client certificate the broker ends the handshake.
    let line = output_is_refused(
        &kafka,
        "mtls-refused",
        &format!("tls: {{ca: '{}'}}", certs.ca_cert.display()),
        &[OUTPUT_REFUSED, "the TLS handshake failed", &kafka.bootstrap()],
    );
    eprintln!("no client certificate, output: {line}");
}

#[test]
fn sasl_ssl_with_scram_sha_512_delivers_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let (certs, _) = certificates(dir.path());
    let kafka =
        Kafka::start_secured_or_panic(&Security::SaslSsl { users: users(), tls: listener_tls(&certs, false) }, &[]);
    let connection = format!("tls: {{ca: '{}'}}, {}", certs.ca_cert.display(), sasl("SCRAM-SHA-512", PASSWORD));
    output_delivers(&kafka, "sasl-ssl-out", &connection, 500);
    input_consumes(&kafka, "sasl-ssl-in", &connection, 500);
    let wrong = format!("tls: {{ca: '{}'}}, {}", certs.ca_cert.display(), sasl("SCRAM-SHA-512", "wrong"));
    let line = output_is_refused(
        &kafka,
        "sasl-ssl-refused",
        &wrong,
        &[OUTPUT_REFUSED, "authentication failed", &kafka.bootstrap(), "SASL_SSL", "mechanism SCRAM-SHA-512"],
    );
    eprintln!("wrong SCRAM-SHA-512 password over TLS, output: {line}");
}
