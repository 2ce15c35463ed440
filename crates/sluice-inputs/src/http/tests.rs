//! The `http` input over real sockets: formats, limits, acknowledgements, authentication and TLS.

use std::io::Write;
use std::net::SocketAddr;

use sluice_core::{Event, FieldPath, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::*;
use crate::tcp::tests::{context, spec, spec_with_env};
use sluice_config::HumanDuration;

async fn start(yaml: &str) -> (SocketAddr, InputContext, mpsc::UnboundedReceiver<Batch>, tokio::task::JoinHandle<()>) {
    start_with_budget(yaml, 64 << 20).await
}

async fn start_with_budget(
    yaml: &str,
    budget: usize,
) -> (SocketAddr, InputContext, mpsc::UnboundedReceiver<Batch>, tokio::task::JoinHandle<()>) {
    start_spec(spec(yaml), budget).await
}

async fn start_spec(
    spec: ComponentSpec,
    budget: usize,
) -> (SocketAddr, InputContext, mpsc::UnboundedReceiver<Batch>, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (mut ctx, rx) = context();
    ctx.memory = sluice_core::MemoryBudget::new(budget);
    // Built as the engine builds it, then run over a listener the test chose.
    let input = build_input(&spec).unwrap();
    let c = ctx.clone();
    let task = tokio::spawn(async move { serve(input, listener, c).await.unwrap() });
    (addr, ctx, rx, task)
}

/// One HTTP/1.1 request on a fresh connection; returns the status and the body.
async fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut head =
        format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    // A server may answer (413) before reading the body and close: that is not an error.
    let _ = s.write_all(body).await;
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp).await;
    let text = String::from_utf8_lossy(&resp).into_owned();
    let status = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

async fn post(addr: SocketAddr, body: &[u8]) -> (u16, String) {
    request(addr, "POST", "/", &[], body).await
}

/// Answers every batch the input pushes as handled, like a running pipeline would.
fn auto_ack(mut rx: mpsc::UnboundedReceiver<Batch>) -> mpsc::UnboundedReceiver<Vec<Event>> {
    let (tx, out) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(mut b) = rx.recv().await {
            let events = std::mem::take(&mut b.events);
            b.complete();
            let _ = tx.send(events);
        }
    });
    out
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

#[test]
fn config_is_checked() {
    assert!(build(&spec("{type: http, address: '127.0.0.1:8080'}")).is_ok());
    assert!(build(&spec("{type: http, address: '127.0.0.1:8080', path: nope}")).is_err());
    assert!(build(&spec("{type: http, address: '127.0.0.1:8080', codec: json}")).is_err());
    assert!(build(&spec("{type: http}")).is_err());
    let (l, c) = config::read(&spec("{type: http, address: 'h:1'}")).unwrap();
    assert_eq!((c.path.as_str(), c.max_body_bytes.0, c.auth_token), ("/", 10 << 20, None));
    assert_eq!((l.max_connections, c.max_events_per_request), (1024, 100_000));
    let secs = |d: HumanDuration| d.0.as_secs();
    assert_eq!(
        (secs(c.header_timeout), secs(c.body_timeout), l.idle_timeout.as_secs(), secs(c.request_timeout)),
        (10, 30, 60, 30)
    );
    for bad in ["max_connections: 0", "max_events_per_request: 0", "body_timeout: 0", "request_timeout: 0"] {
        let e = build(&spec(&format!("{{type: http, address: 'h:1', {bad}}}"))).err().unwrap().to_string();
        assert!(e.contains(bad.split(':').next().unwrap()), "{e}");
    }
}

/// Reads from `s` until the server closes it; the bytes read, or `None` if still open at `within`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    tokio::time::timeout(within, s.read_to_end(&mut got)).await.ok().map(|_| got)
}

#[tokio::test]
async fn connections_beyond_max_connections_are_answered_busy_when_all_are_busy() {
    let (addr, ctx, mut rx, task) = start("{type: http, address: 'x:0', max_connections: 2}").await;
    // Two requests waiting for their answer hold both places.
    let first = tokio::spawn(async move { post(addr, b"{}").await });
    let second = tokio::spawn(async move { post(addr, b"{}").await });
    let held = [rx.recv().await.unwrap(), rx.recv().await.unwrap()];
    let mut c = TcpStream::connect(addr).await.unwrap();
    let answer = closed_within(&mut c, Duration::from_secs(5)).await.expect("the third connection was kept");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 503") && answer.contains("max_connections"), "{answer}");
    let body = answer.split_once("\r\n\r\n").unwrap().1;
    assert!(json(body)["error"].is_string(), "{body}");
    assert_eq!(ctx.metrics.refused.get(), 1);
    for b in held {
        b.complete();
    }
    assert_eq!(first.await.unwrap().0, 200);
    assert_eq!(second.await.unwrap().0, 200);
    let _batches = auto_ack(rx);
    let (status, _) = post(addr, b"{}").await;
    assert_eq!(status, 200, "a slot is free again once a connection closes");
    ctx.shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn stalled_connections_make_room_for_a_new_client() {
    let (addr, ctx, rx, task) = start("{type: http, address: 'x:0', max_connections: 3}").await;
    let _batches = auto_ack(rx);
    // Three clients take every place and stall: one in its body, two in their heads.
    let mut first = TcpStream::connect(addr).await.unwrap();
    first.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n[1,").await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut stalled = vec![first];
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"POST / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        stalled.push(s);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A normal client is served at once: the longest-stalled connection (the first) made
    // room; the next requests find that place free again, so nobody else is closed.
    for i in 0..3 {
        let (status, body) = post(addr, b"{}").await;
        assert_eq!(status, 200, "request {i}: {body}");
    }
    assert!(closed_within(&mut stalled[0], Duration::from_secs(5)).await.is_some(), "the oldest was kept");
    assert!(closed_within(&mut stalled[1], Duration::from_millis(300)).await.is_none());
    assert_eq!(ctx.metrics.refused.get(), 1);
    ctx.shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn half_a_head_is_closed_after_header_timeout_and_idle_after_idle_timeout() {
    let (addr, ctx, rx, task) = start("{type: http, address: 'x:0', header_timeout: 200ms, idle_timeout: 1s}").await;
    let _batches = auto_ack(rx);
    let mut slow = TcpStream::connect(addr).await.unwrap();
    let mut idle = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"POST / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let started = std::time::Instant::now();
    assert!(closed_within(&mut slow, Duration::from_secs(5)).await.is_some(), "the slow head was kept");
    let slow_closed = started.elapsed();
    assert!(slow_closed >= Duration::from_millis(150) && slow_closed < Duration::from_millis(900), "{slow_closed:?}");
    // A connection that sent nothing is only idle: it outlives the header timeout...
    let mut one = [0u8; 1];
    assert!(tokio::time::timeout(Duration::from_millis(300), idle.read(&mut one)).await.is_err());
    // ...and can still send a whole request, which restarts its idle time.
    let request = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
    idle.write_all(request).await.unwrap();
    let mut answer = vec![0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(5), idle.read(&mut answer)).await.unwrap().unwrap();
    assert!(answer[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&answer[..n]));
    let answered = std::time::Instant::now();
    assert!(closed_within(&mut idle, Duration::from_secs(5)).await.is_some(), "the idle connection was kept");
    assert!(answered.elapsed() >= Duration::from_millis(800), "{:?}", answered.elapsed());
    assert_eq!(ctx.metrics.refused.get(), 2);
    ctx.shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn a_body_slower_than_body_timeout_gets_408() {
    let (addr, ctx, mut rx, task) = start("{type: http, address: 'x:0', body_timeout: 200ms}").await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n[1,2,").await.unwrap();
    let answer = closed_within(&mut s, Duration::from_secs(5)).await.expect("kept open");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408") && answer.contains("body_timeout"), "{answer}");
    assert!(rx.try_recv().is_err());
    ctx.shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn too_many_events_or_too_much_memory_is_413_and_enqueues_nothing() {
    let (addr, ctx, rx, task) =
        start_with_budget("{type: http, address: 'x:0', max_events_per_request: 10}", 4 << 20).await;
    let mut rx = auto_ack(rx);
    let (status, body) = post(addr, &b"1 ".repeat(11)).await;
    assert_eq!(status, 413, "{body}");
    assert!(json(&body)["error"].as_str().unwrap().contains("max_events_per_request (10)"), "{body}");
    let (status, _) = post(addr, &b"1 ".repeat(10)).await;
    assert_eq!(status, 200);
    let _ten = rx.recv().await.unwrap();
    // A body of tiny values: 1 MiB of `1 ` is half a million events, far past half of 4 MiB.
    let (addr2, ctx2, rx2, task2) = start_with_budget("{type: http, address: 'x:0'}", 4 << 20).await;
    let mut rx2 = auto_ack(rx2);
    let (status, body) = post(addr2, &b"1 ".repeat(1 << 19)).await;
    assert_eq!(status, 413, "{body}");
    assert!(json(&body)["error"].as_str().unwrap().contains("half the node's memory budget"), "{body}");
    assert_eq!(ctx2.memory.used(), 0, "what the refused request held is given back");
    assert!(rx2.try_recv().is_err());
    assert_eq!(ctx.metrics.refused.get() + ctx2.metrics.refused.get(), 2);
    for (c, t) in [(ctx, task), (ctx2, task2)] {
        c.shutdown.cancel();
        t.await.unwrap();
    }
}

#[tokio::test]
async fn a_request_that_waits_request_timeout_for_memory_gets_429() {
    let (addr, ctx, rx, task) =
        start_with_budget("{type: http, address: 'x:0', request_timeout: 300ms}", 4 << 20).await;
    let mut batches = auto_ack(rx);
    let held = ctx.memory.charge(ctx.memory.limit(), None).await.unwrap();
    let started = std::time::Instant::now();
    let (status, body) = request(addr, "POST", "/", &[], b"{\"a\":1}").await;
    assert_eq!(status, 429, "{body}");
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert!(json(&body)["error"].as_str().unwrap().contains("request_timeout"), "{body}");
    // Once the memory is back, the same request goes through, and its batch carried its charge.
    drop(held);
    let (status, _) = post(addr, b"{\"a\":1}").await;
    assert_eq!(status, 200);
    assert_eq!(batches.recv().await.unwrap().len(), 1);
    assert_eq!(ctx.memory.used(), 0);
    ctx.shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_together_exceed_the_budget_take_turns_instead_of_stalling() {
    // Each request's events need most of half the budget: two at once cannot both fit, and
    // a request that waited while holding its part would stall the others until timeout.
    let (addr, ctx, rx, task) = start_with_budget("{type: http, address: 'x:0', request_timeout: 20s}", 4 << 20).await;
    let mut batches = auto_ack(rx);
    let body: Vec<u8> = (0..3000).flat_map(|i| format!("{{\"n\":{i}}}\n").into_bytes()).collect();
    let started = std::time::Instant::now();
    let clients: Vec<_> = (0..6)
        .map(|_| {
            let body = body.clone();
            tokio::spawn(async move { post(addr, &body).await })
        })
        .collect();
    for c in clients {
        let (status, body) = c.await.unwrap();
        assert_eq!((status, json(&body)), (200, serde_json::json!({"accepted": 3000})));
    }
    assert!(started.elapsed() < Duration::from_secs(15), "requests stalled: {:?}", started.elapsed());
    for _ in 0..6 {
        assert_eq!(batches.recv().await.unwrap().len(), 3000);
    }
    assert_eq!(ctx.memory.used(), 0);
    ctx.shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn a_batch_carries_the_memory_its_events_hold() {
    let (addr, ctx, mut rx, task) = start("{type: http, address: 'x:0'}").await;
    let response = tokio::spawn(async move { post(addr, &b"{\"n\": 1}\n".repeat(1000)).await });
    let batch = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
    let held: usize = batch.events.iter().map(Event::memory_size).sum();
    assert!(batch.memory.bytes() >= held && batch.memory.bytes() < held + 4096, "{:?} for {held}", batch.memory);
    assert_eq!(ctx.memory.used(), batch.memory.bytes(), "the body's own charge was given back");
    batch.complete();
    assert_eq!(ctx.memory.used(), 0);
    assert_eq!(response.await.unwrap().0, 200);
    ctx.shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn array_ndjson_and_single_object() {
    let (addr, ctx, rx, task) = start("{type: http, address: 'x:0'}").await;
    let mut batches = auto_ack(rx);

    let (status, body) = post(addr, br#"[{"message":"a"},{"message":"b"},"c"]"#).await;
    assert_eq!((status, json(&body)), (200, serde_json::json!({"accepted": 3})));
    let ev = batches.recv().await.unwrap();
    assert_eq!(ev.iter().map(|e| e.message().unwrap()).collect::<Vec<_>>(), ["a", "b", "c"]);

    let (status, body) = post(addr, b"{\"n\":1}\n{\"n\":2}\r\n\n{\"n\":3}").await;
    assert_eq!((status, json(&body)), (200, serde_json::json!({"accepted": 3})));
    let ev = batches.recv().await.unwrap();
    assert_eq!(ev[2].fields.get("n"), Some(&Value::Int(3)));
    assert!(ev[0].timestamp_nanos().is_some());

    let (status, body) = post(addr, br#"{"user":{"id":7}}"#).await;
    assert_eq!((status, json(&body)), (200, serde_json::json!({"accepted": 1})));
    let ev = batches.recv().await.unwrap();
    assert_eq!(ev[0].get(&FieldPath::parse("/user/id").unwrap()), Some(&Value::Int(7)));

    let (status, body) = post(addr, b"").await;
    assert_eq!((status, json(&body)), (200, serde_json::json!({"accepted": 0})));
    assert_eq!(ctx.metrics.events_in.get(), 7);

    ctx.shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap();
}

#[tokio::test]
async fn malformed_requests_enqueue_nothing() {
    let (addr, ctx, mut rx, task) = start("{type: http, address: 'x:0', max_body_bytes: 100}").await;

    let (status, body) = post(addr, br#"[{"a":1},{"a":2},{"a":]"#).await;
    assert_eq!(status, 400);
    let reason = json(&body)["error"].as_str().unwrap().to_string();
    assert!(reason.contains("element 2"), "{reason}");

    let (status, body) = post(addr, b"{\"a\":1}\n{\"a\":2}\nnot json\n").await;
    assert_eq!(status, 400);
    let reason = json(&body)["error"].as_str().unwrap().to_string();
    assert!(reason.contains("line 3"), "{reason}");

    let (status, body) = post(addr, &[b'1'; 101]).await;
    assert_eq!(status, 413, "{body}");
    assert!(json(&body)["error"].as_str().unwrap().contains("max_body_bytes"));

    let (status, _) = request(addr, "GET", "/", &[], b"").await;
    assert_eq!(status, 405);
    let (status, _) = request(addr, "POST", "/elsewhere", &[], b"{}").await;
    assert_eq!(status, 404);
    let (status, _) = request(addr, "POST", "/", &[("Content-Encoding", "br")], b"{}").await;
    assert_eq!(status, 415);

    assert!(rx.try_recv().is_err(), "nothing was enqueued");
    assert_eq!(ctx.metrics.events_in.get(), 0);
    ctx.shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn gzip_bodies_with_a_decompressed_size_cap() {
    let (addr, ctx, rx, task) = start("{type: http, address: 'x:0', max_body_bytes: 1KiB}").await;
    let mut batches = auto_ack(rx);
    let gz = |data: &[u8]| {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    };
    let headers = [("Content-Encoding", "gzip"), ("Content-Type", "application/x-ndjson")];
    let small = gz(b"{\"z\":1}\n{\"z\":2}\n");
    let (status, body) = request(addr, "POST", "/", &headers, &small).await;
    assert_eq!((status, json(&body)), (200, serde_json::json!({"accepted": 2})));
    assert_eq!(batches.recv().await.unwrap()[1].fields.get("z"), Some(&Value::Int(2)));
    assert_eq!(ctx.metrics.bytes_in.get(), small.len() as u64, "the body as sent, compressed");

    // Small on the wire, too large once decompressed.
    let bomb = gz(format!("[{}\"x\"]", "\"x\",".repeat(1000)).as_bytes());
    assert!(bomb.len() < 1024);
    let (status, _) = request(addr, "POST", "/", &headers, &bomb).await;
    assert_eq!(status, 413);

    let (status, _) = request(addr, "POST", "/", &headers, b"not gzip").await;
    assert_eq!(status, 400);
    // Refused bodies were read too: what came in, whatever became of it; headers not counted.
    assert_eq!(ctx.metrics.bytes_in.get(), (small.len() + bomb.len() + b"not gzip".len()) as u64);
    ctx.shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn bearer_token() {
    let (addr, ctx, rx, task) = start("{type: http, address: 'x:0', auth_token: s3cret, path: /ingest}").await;
    let _batches = auto_ack(rx);
    let (status, _) = request(addr, "POST", "/ingest", &[], b"{}").await;
    assert_eq!(status, 401);
    let (status, _) = request(addr, "POST", "/ingest", &[("Authorization", "Bearer wrong")], b"{}").await;
    assert_eq!(status, 401);
    let (status, _) = request(addr, "POST", "/ingest", &[("Authorization", "Basic s3cret")], b"{}").await;
    assert_eq!(status, 401);
    let (status, body) = request(addr, "POST", "/ingest", &[("Authorization", "Bearer s3cret")], b"{}").await;
    assert_eq!((status, json(&body)), (200, serde_json::json!({"accepted": 1})));
    assert_eq!(auth_failures(&ctx), 3);
    ctx.shutdown.cancel();
    task.await.unwrap();
}

fn auth_failures(ctx: &InputContext) -> u64 {
    let figures = ctx.metrics.state.get().expect("the http input reports its figures").figures();
    figures.iter().find(|f| f.name == "auth_failures_total").unwrap().count()
}

#[tokio::test]
async fn basic_authentication_from_the_environment() {
    // The environment as the config loader sees it (changing the process's own would race
    // with the other tests' threads reading it).
    let env = |name: &str| match name {
        "SLUICE_TEST_HTTP_USER" => Some("shipper".to_string()),
        "SLUICE_TEST_HTTP_PASSWORD" => Some("correct horse".to_string()),
        _ => None,
    };
    let yaml = "{type: http, address: 'x:0', auth: {basic: {user: '${SLUICE_TEST_HTTP_USER}', password: '${SLUICE_TEST_HTTP_PASSWORD}'}}}";
    let (addr, ctx, rx, task) = start_spec(spec_with_env(yaml, &env), 64 << 20).await;
    let _batches = auto_ack(rx);
    let (status, body) = request(addr, "POST", "/", &[], b"{}").await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("basic credentials"), "{body}");
    // `shipper:correct horse` and `shipper:correct horsf`
    let (status, _) =
        request(addr, "POST", "/", &[("Authorization", "Basic c2hpcHBlcjpjb3JyZWN0IGhvcnNm")], b"{}").await;
    assert_eq!(status, 401);
    let (status, body) =
        request(addr, "POST", "/", &[("Authorization", "Basic c2hpcHBlcjpjb3JyZWN0IGhvcnNl")], b"{}").await;
    assert_eq!((status, json(&body)), (200, serde_json::json!({"accepted": 1})));
    assert_eq!(auth_failures(&ctx), 2);
    ctx.shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn https_with_a_client_certificate() {
    use sluice_tls::testing::CertSet;
    let dir = tempfile::tempdir().unwrap();
    let certs = CertSet::generate(dir.path(), &["server", "client"]);
    let yaml = format!(
        "{{type: http, address: 'x:0', tls: {{cert: '{}', key: '{}', ca: '{}'}}}}",
        certs.cert("server").display(),
        certs.key("server").display(),
        certs.ca_cert.display()
    );
    let (addr, ctx, rx, task) = start(&yaml).await;
    let _batches = auto_ack(rx);
    let connector = certs.tls("client").connector().unwrap();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut tls = connector.connect("localhost", tcp).await.unwrap();
    tls.write_all(b"POST / HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}").await.unwrap();
    let mut answer = String::new();
    tls.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with(r#"{"accepted":1}"#), "{answer}");

    // Plain HTTP to an HTTPS input gets no answer, and is counted as refused.
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain.write_all(b"POST / HTTP/1.1\r\nHost: test\r\nContent-Length: 2\r\n\r\n{}").await.unwrap();
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), plain.read_to_end(&mut buf)).await;
    assert!(!String::from_utf8_lossy(&buf).contains("200"), "{buf:?}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while ctx.metrics.refused.get() < 1 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(ctx.metrics.refused.get(), 1);
    ctx.shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn answers_only_once_the_batch_is_handled() {
    let (addr, ctx, mut rx, task) = start("{type: http, address: 'x:0'}").await;
    let response = tokio::spawn(async move { post(addr, b"{\"a\":1}\n{\"a\":2}").await });
    let batch = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
    assert_eq!(batch.len(), 2);
    assert_eq!(batch.acks.covered(), 2);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!response.is_finished(), "answered before the batch was handled");
    batch.complete();
    let (status, body) = tokio::time::timeout(Duration::from_secs(5), response).await.unwrap().unwrap();
    assert_eq!((status, json(&body)), (200, serde_json::json!({"accepted": 2})));
    ctx.shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn dropped_batch_gets_503() {
    let (addr, ctx, mut rx, task) = start("{type: http, address: 'x:0'}").await;
    let response = tokio::spawn(async move { post(addr, b"{\"a\":1}").await });
    let batch = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
    drop(batch);
    let (status, body) = tokio::time::timeout(Duration::from_secs(5), response).await.unwrap().unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(json(&body)["error"].as_str().unwrap().contains("abandoned"));
    ctx.shutdown.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn shutdown_answers_waiting_requests_with_503() {
    let (addr, ctx, mut rx, task) = start("{type: http, address: 'x:0'}").await;
    let response = tokio::spawn(async move { post(addr, b"{\"a\":1}").await });
    let _batch = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
    ctx.shutdown.cancel();
    let (status, _) = tokio::time::timeout(Duration::from_secs(5), response).await.unwrap().unwrap();
    assert_eq!(status, 503);
    tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap();
    assert!(TcpStream::connect(addr).await.is_err());
}
