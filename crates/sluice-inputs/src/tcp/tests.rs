//! Also the test support for the `http` input's tests: a queue that hands every pushed
//! batch to the test, and a context around it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sluice_config::model::ComponentSpec;
use sluice_core::bus::PipelineBus;
use sluice_core::metrics::{ComponentKind, ComponentMetrics};
use sluice_core::{Batch, Queue, QueueClosed, QueueStats};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::codec::Codec;
use crate::codec::{TAG_JSON_FAILURE, TAG_TRUNCATED};
use sluice_core::FieldPath;

/// Hands pushed batches to the test over a channel.
pub(crate) struct ChannelQueue {
    tx: mpsc::UnboundedSender<Batch>,
}

#[async_trait]
impl Queue for ChannelQueue {
    async fn push(&self, batch: Batch) -> Result<(), QueueClosed> {
        self.tx.send(batch).map_err(|_| QueueClosed)
    }
    async fn pop(&self, _max_events: usize, _delay: Duration) -> Option<Batch> {
        None
    }
    fn close(&self) {}
    fn stats(&self) -> QueueStats {
        QueueStats::default()
    }
}

pub(crate) fn context() -> (InputContext, mpsc::UnboundedReceiver<Batch>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let ctx = InputContext {
        pipeline: "test".into(),
        id: "in".into(),
        queue: Arc::new(ChannelQueue { tx }),
        metrics: Arc::new(ComponentMetrics::new("in", ComponentKind::Input, "test")),
        shutdown: CancellationToken::new(),
        bus: Arc::new(PipelineBus::default()),
        data_dir: PathBuf::from("."),
        registry: sluice_registry::Registry::in_memory(),
        memory: sluice_core::MemoryBudget::new(64 << 20),
    };
    (ctx, rx)
}

/// The spec of an input written as a YAML flow mapping.
pub(crate) fn spec(yaml: &str) -> ComponentSpec {
    spec_with_env(yaml, &|name| std::env::var(name).ok())
}

/// As [`spec`], with `${VAR}` answered by `lookup` rather than the process environment.
pub(crate) fn spec_with_env(yaml: &str, lookup: &dyn Fn(&str) -> Option<String>) -> ComponentSpec {
    let text = format!("pipelines:\n  p:\n    inputs:\n      - {yaml}\n    outputs: [{{type: stdout}}]\n");
    let root = sluice_config::model::load_str_with_env(&text, "test.yml", lookup).unwrap();
    root.pipelines.into_iter().next().unwrap().inputs.remove(0)
}

fn config(yaml: &str) -> (Listener, TcpConfig) {
    config::read(&spec(yaml)).unwrap()
}

async fn start(yaml: &str) -> (SocketAddr, InputContext, mpsc::UnboundedReceiver<Batch>, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (ctx, rx) = context();
    let c = ctx.clone();
    let spec = spec(yaml);
    let (keys, cfg) = config::read(&spec).unwrap();
    let tls = keys.server_tls(&spec).unwrap();
    let task = tokio::spawn(async move { serve(keys, cfg, tls, listener, c).await.unwrap() });
    (addr, ctx, rx, task)
}

#[tokio::test]
async fn tls_with_client_certificates() {
    use sluice_tls::testing::CertSet;
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &["server", "client"]);
    let strangers = CertSet::generate_other_ca(dir.path(), &["client"]);
    let yaml = format!(
        "{{type: tcp, address: 'x:0', tls: {{cert: '{}', key: '{}', ca: '{}', client_auth: required}}}}",
        certs.cert("server").display(),
        certs.key("server").display(),
        certs.ca_cert.display()
    );
    let (addr, ctx, mut rx, task) = start(&yaml).await;

    let trusted = certs.tls("client").connector().unwrap();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut tls = trusted.connect("127.0.0.1", tcp).await.unwrap();
    tls.write_all(b"over tls\nsecond\n").await.unwrap();
    tls.flush().await.unwrap();
    let events = collect(&mut rx, 2).await;
    let messages: Vec<_> = events.iter().map(|e| e.message().unwrap().to_string()).collect();
    assert_eq!(messages, ["over tls", "second"]);

    // A client whose certificate another CA signed, and one that does not speak TLS, are
    // refused and counted; neither gets an event in.
    let mut stranger = strangers.tls("client");
    stranger.ca = Some(certs.ca_cert.clone());
    let tcp = TcpStream::connect(addr).await.unwrap();
    if let Ok(mut s) = stranger.connector().unwrap().connect("127.0.0.1", tcp).await {
        // TLS 1.3: the client learns of the refusal at its first read.
        let _ = s.write_all(b"sneaky\n").await;
        let _ = s.flush().await;
        let mut buf = [0u8; 16];
        assert!(!matches!(tokio::io::AsyncReadExt::read(&mut s, &mut buf).await, Ok(n) if n > 0));
    }
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain.write_all(b"plain text\n").await.unwrap();
    let mut buf = [0u8; 16];
    let _ = tokio::time::timeout(Duration::from_secs(5), tokio::io::AsyncReadExt::read(&mut plain, &mut buf)).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while ctx.metrics.refused.get() < 2 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(ctx.metrics.refused.get(), 2);
    assert!(tokio::time::timeout(Duration::from_millis(200), rx.recv()).await.is_err(), "nothing else came in");
    assert_eq!(ctx.metrics.bytes_in.get(), 16, "what TLS decrypted, from the trusted client only");
    ctx.shutdown.cancel();
    task.await.unwrap();
}

#[test]
fn tls_files_are_checked_when_built() {
    let e = build(&spec("{type: tcp, address: 'x:0', tls: {cert: missing.crt, key: missing.key}}"))
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("inputs[0].tls.cert") && e.contains("missing.crt"), "{e}");
    let e = build(&spec("{type: tcp, address: 'x:0', tls: {certs: a.crt}}")).err().unwrap().to_string();
    assert!(e.contains("tls.certs"), "{e}");
    assert!(build(&spec("{type: tcp, address: 'x:0', tls: {enabled: false, cert: missing.crt}}")).is_ok());
}

/// Collects events until `n` have arrived (or the time is up).
async fn collect(rx: &mut mpsc::UnboundedReceiver<Batch>, n: usize) -> Vec<Event> {
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while out.len() < n {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(b)) => out.extend(b.events),
            _ => break,
        }
    }
    out
}

#[test]
fn config_is_checked() {
    assert!(build(&spec("{type: tcp, address: '127.0.0.1:5000'}")).is_ok());
    let e = build(&spec("{type: tcp, address: 'nope'}")).err().unwrap().to_string();
    assert!(e.contains("not a `host:port`"), "{e}");
    assert!(build(&spec("{type: tcp, address: '127.0.0.1:1', colour: red}")).is_err());
    assert!(build(&spec("{type: tcp, address: '127.0.0.1:1', max_connections: 0}")).is_err());
    let (l, c) = config("{type: tcp, address: 'h:1'}");
    assert_eq!((c.max_line_bytes.0, l.max_connections, c.read_buffer.0), (1 << 20, 1024, 256 << 10));
    assert_eq!(l.idle_timeout, Duration::from_secs(300));
    assert_eq!(c.codec, Codec::Lines);
}

#[tokio::test]
async fn reads_wait_for_room_in_the_memory_budget_and_batches_carry_their_charge() {
    let (addr, ctx, mut rx, task) = start("{type: tcp, address: 'x:0', codec: json_lines}").await;
    // Someone else holds the whole budget: the connection must not decode.
    let held = ctx.memory.charge(ctx.memory.limit(), None).await.unwrap();
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&b"1\n".repeat(10_000)).await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), rx.recv()).await.is_err(),
        "decoded while the budget was spent"
    );
    assert_eq!(ctx.memory.waiting(), 1);
    drop(held);
    let batch = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
    // The charge is what the events hold, far more than the two bytes a line they came from.
    let expected = admission::measure(Codec::JsonLines, &batch.events, 0);
    assert!(batch.memory.bytes() >= expected && batch.memory.bytes() > 100 * batch.len(), "{:?}", batch.memory);
    let mut batches = vec![batch];
    while let Ok(Some(b)) = tokio::time::timeout(Duration::from_millis(200), rx.recv()).await {
        batches.push(b);
    }
    assert_eq!(batches.iter().map(Batch::len).sum::<usize>(), 10_000);
    assert_eq!(ctx.memory.used(), batches.iter().map(|b| b.memory.bytes()).sum::<usize>());
    drop(batches);
    assert_eq!(ctx.memory.used(), 0, "the charges go back with the batches");
    ctx.shutdown.cancel();
    drop(s);
    task.await.unwrap();
}

#[tokio::test]
async fn an_idle_connection_is_closed_after_idle_timeout() {
    let (addr, ctx, _rx, task) = start("{type: tcp, address: 'x:0', idle_timeout: 200ms}").await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let started = std::time::Instant::now();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(5), tokio::io::AsyncReadExt::read(&mut s, &mut buf))
        .await
        .expect("the idle connection was not closed")
        .unwrap_or(0);
    assert_eq!(n, 0);
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert_eq!(ctx.metrics.refused.get(), 1);
    ctx.shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn bind_error_names_the_address() {
    let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let input = build(&spec(&format!("{{type: tcp, address: '{address}'}}"))).unwrap();
    let (ctx, _rx) = context();
    let e = tokio::time::timeout(Duration::from_secs(5), input.run(ctx)).await.unwrap().unwrap_err();
    assert!(e.to_string().contains(&address), "{e}");
}

#[tokio::test]
async fn every_line_from_three_connections_arrives() {
    let (addr, ctx, mut rx, task) = start("{type: tcp, address: 'x:0', peer_field: /peer}").await;
    let mut clients = Vec::new();
    for c in 0..3 {
        clients.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            let count = if c == 2 { 3334 } else { 3333 };
            let mut text = String::new();
            for i in 0..count {
                text.push_str(&format!("client {c} line {i} {}\n", "x".repeat(i % 300)));
            }
            // Odd-sized writes, so lines straddle reads.
            for chunk in text.as_bytes().chunks(7919) {
                s.write_all(chunk).await.unwrap();
            }
            s.shutdown().await.unwrap();
            text.len() as u64
        }));
    }
    let mut sent = 0;
    for c in clients {
        sent += c.await.unwrap();
    }
    let events = collect(&mut rx, 10_000).await;
    assert_eq!(events.len(), 10_000);
    let mut seen = std::collections::HashSet::new();
    for e in &events {
        let m = e.message().unwrap();
        let mut words = m.split(' ');
        let (c, i) = (words.nth(1).unwrap(), words.nth(1).unwrap());
        let i: usize = i.parse().unwrap();
        assert_eq!(m, format!("client {c} line {i} {}", "x".repeat(i % 300)));
        assert!(seen.insert((c.to_string(), i)), "duplicate {m}");
        let peer = e.get(&FieldPath::parse("/peer").unwrap()).unwrap().as_str().unwrap();
        assert!(peer.starts_with("127.0.0.1:"), "{peer}");
        assert!(e.timestamp_nanos().is_some());
    }
    assert_eq!(ctx.metrics.events_in.get(), 10_000);
    assert_eq!(ctx.metrics.bytes_in.get(), sent, "every byte read is counted once");
    ctx.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap();
}

#[tokio::test]
async fn long_lines_are_cut_and_tagged_and_the_next_line_is_intact() {
    let (addr, ctx, mut rx, task) = start("{type: tcp, address: 'x:0', max_line_bytes: 10}").await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"0123456789abcdefghij\nnext\nlast-without-newline").await.unwrap();
    s.shutdown().await.unwrap();
    let events = collect(&mut rx, 3).await;
    assert_eq!(events.len(), 3);
    assert_eq!(events[0].message(), Some("0123456789"));
    assert!(events[0].has_tag(TAG_TRUNCATED));
    assert_eq!(events[1].message(), Some("next"));
    assert!(!events[1].has_tag(TAG_TRUNCATED));
    assert!(events[1].fields.get("peer").is_none());
    assert_eq!(events[2].message(), Some("last-witho"));
    assert!(events[2].has_tag(TAG_TRUNCATED));
    assert_eq!(ctx.metrics.bytes_in.get(), 46, "what was read, the parts cut off included");
    ctx.shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn lines_share_their_read_and_a_line_joined_across_reads_is_whole() {
    let (addr, ctx, mut rx, task) = start("{type: tcp, address: 'x:0', read_buffer: 1KiB}").await;
    let long = "a line long enough that copying it would cost an allocation";
    let message = |e: &Event| match e.fields.get("message") {
        Some(Value::String(m)) => m.clone(),
        other => panic!("no message: {other:?}"),
    };
    let mut s = TcpStream::connect(addr).await.unwrap();
    // One line in a 1 KiB buffer (shared from a copy of the read's size; see SharedText).
    s.write_all(format!("{long}\n").as_bytes()).await.unwrap();
    let sparse = collect(&mut rx, 1).await;
    assert_eq!(message(&sparse[0]), long);
    assert!(message(&sparse[0]).is_shared());
    // Twelve lines in one read. The last line is finished by a later read, which joins it.
    s.write_all(format!("{long}\n").repeat(12).as_bytes()).await.unwrap();
    s.write_all(format!("{long} split").as_bytes()).await.unwrap();
    let full = collect(&mut rx, 12).await;
    assert_eq!(full.len(), 12);
    for e in &full {
        assert_eq!(message(e), long);
        assert!(message(e).is_shared(), "not copied out of the read buffer");
    }
    s.write_all(b" across two reads\n").await.unwrap();
    s.shutdown().await.unwrap();
    let joined = collect(&mut rx, 1).await;
    assert_eq!(message(&joined[0]), format!("{long} split across two reads"));
    ctx.shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn json_lines_tags_broken_lines_and_counts_them() {
    let (addr, ctx, mut rx, task) = start("{type: tcp, address: 'x:0', codec: json_lines}").await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"{\"a\":1,\"message\":\"ok\"}\n{broken\n{\"b\":2}\n").await.unwrap();
    s.shutdown().await.unwrap();
    let events = collect(&mut rx, 3).await;
    assert_eq!(events.len(), 3);
    assert_eq!(events[0].fields.get("a"), Some(&Value::Int(1)));
    assert!(!events[0].has_tag(TAG_JSON_FAILURE));
    assert_eq!(events[1].message(), Some("{broken"));
    assert!(events[1].has_tag(TAG_JSON_FAILURE));
    assert_eq!(events[2].fields.get("b"), Some(&Value::Int(2)));
    assert_eq!(ctx.metrics.failed.get(), 1);
    ctx.shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn a_full_house_closes_the_connection_idle_the_longest() {
    let (addr, ctx, mut rx, task) = start("{type: tcp, address: 'x:0', max_connections: 2}").await;
    let mut a = TcpStream::connect(addr).await.unwrap();
    a.write_all(b"a\n").await.unwrap();
    assert_eq!(collect(&mut rx, 1).await.len(), 1);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut b = TcpStream::connect(addr).await.unwrap();
    b.write_all(b"b\n").await.unwrap();
    assert_eq!(collect(&mut rx, 1).await.len(), 1);
    // Both places are taken; a newcomer is served, and `a`, idle the longest, is closed.
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"c\n").await.unwrap();
    let got = collect(&mut rx, 1).await;
    assert_eq!(got[0].message(), Some("c"));
    let mut byte = [0u8; 1];
    let closed = tokio::time::timeout(Duration::from_secs(5), a.read(&mut byte)).await.unwrap();
    assert!(matches!(closed, Ok(0) | Err(_)), "the longest idle connection is closed: {closed:?}");
    b.write_all(b"b again\n").await.unwrap();
    assert_eq!(collect(&mut rx, 1).await[0].message(), Some("b again"), "the other one is kept");
    assert_eq!(ctx.metrics.refused.get(), 1);
    drop((b, c));
    ctx.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap();
}

#[tokio::test]
async fn shutdown_pushes_what_was_read_and_closes_connections() {
    let (addr, ctx, mut rx, task) = start("{type: tcp, address: 'x:0'}").await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"one\ntwo\npartial").await.unwrap();
    assert_eq!(collect(&mut rx, 2).await.len(), 2);
    ctx.shutdown.cancel();
    // The connection is still open from the client's side: shutdown must not wait for it.
    tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap();
    let rest = collect(&mut rx, 1).await;
    assert_eq!(rest.len(), 1);
    assert_eq!(rest[0].message(), Some("partial"));
    assert!(TcpStream::connect(addr).await.is_err());
}
