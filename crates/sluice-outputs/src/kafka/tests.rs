use crate::Output;
use crate::test_support::{context, spec};

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
