//! The Kafka harness against a real broker: a topic with 3 partitions is created, led and
//! readable, and it and its records survive a SIGKILL and a restart on the same port.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use sluice_testkit::kafka::Kafka;

#[test]
fn topic_survives_kill_and_restart() {
    let t0 = Instant::now();
    let mut kafka = Kafka::start_or_panic(&[("auto.create.topics.enable", "false")]);
    eprintln!("started in {:?}", t0.elapsed());
    let port = kafka.port();
    assert_eq!(kafka.bootstrap(), format!("127.0.0.1:{port}"));
    TcpStream::connect(kafka.bootstrap()).expect("the broker accepts connections");

    kafka.create_topic("logs", 3);
    let parts = kafka.describe_topic("logs").expect("the topic exists once created");
    assert_eq!(parts.len(), 3, "{parts:?}");
    for (i, p) in parts.iter().enumerate() {
        assert_eq!(p.partition, i as i32, "{parts:?}");
        assert_eq!(p.leader, Some(1), "every partition is led by the one node: {parts:?}");
        assert_eq!(p.end_offset, 0, "{parts:?}");
    }
    let err = kafka.try_create_topic("logs", 3, &[]).expect_err("the topic exists already");
    assert!(err.contains("TopicExistsException"), "{err}");

    let values: Vec<String> = (0..30).map(|i| format!("record {i}")).collect();
    let records: Vec<(Option<&[u8]>, &[u8])> =
        values.iter().enumerate().map(|(i, v)| ((i % 3 == 0).then_some(&b"key"[..]), v.as_bytes())).collect();
    kafka.produce("logs", &records);
    eprintln!("created, described and produced after {:?}", t0.elapsed());

    let t1 = Instant::now();
    kafka.kill();
    assert!(TcpStream::connect(kafka.bootstrap()).is_err(), "nothing listens after the kill");
    kafka.restart_or_panic();
    eprintln!("restarted after a SIGKILL in {:?}", t1.elapsed());
    assert_eq!(kafka.port(), port, "the same port after a restart");
    TcpStream::connect(kafka.bootstrap()).expect("the broker accepts connections again");
    assert_eq!(kafka.topics(), vec!["logs".to_string()]);

    let parts = kafka.describe_topic("logs").expect("the topic survives a SIGKILL");
    assert_eq!(parts.len(), 3, "{parts:?}");
    assert_eq!(parts.iter().map(|p| p.end_offset).sum::<i64>(), 30, "acknowledged records survive: {parts:?}");

    let read = kafka.consume_all("logs", 30, Duration::from_secs(20));
    assert_eq!(read.len(), 30, "{read:?}");
    let mut got: Vec<String> = read.iter().map(|r| String::from_utf8(r.3.clone()).expect("UTF-8")).collect();
    got.sort_by_key(|v| v[7..].parse::<u32>().expect("a number"));
    assert_eq!(got, values, "each record once");
    let keyed: Vec<_> = read.iter().filter(|r| r.2.as_deref() == Some(&b"key"[..])).collect();
    assert_eq!(keyed.len(), 10);
    assert!(keyed.iter().all(|r| r.0 == keyed[0].0), "one key, one partition: {keyed:?}");
    eprintln!("whole test: {:?}", t0.elapsed());
}
