//! The `tcp` output against a local listener, including one that hangs up.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::{build, build_err, build_with, context, numbered, refs};
use sluice_core::Event;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

async fn bounded<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), f).await.expect("took too long")
}

/// Reads from `s` until `lines` newlines have arrived (or the peer closes).
async fn read_lines(s: &mut TcpStream, lines: usize) -> Vec<String> {
    let mut data = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut count = 0;
    while count < lines {
        let n = s.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        count += buf[..n].iter().filter(|b| **b == b'\n').count();
        data.extend_from_slice(&buf[..n]);
    }
    String::from_utf8(data).unwrap().lines().map(str::to_string).collect()
}

fn text_events(count: usize, width: usize) -> Vec<Event> {
    (0..count).map(|i| Event::from_message_at(format!("{i:08} {}", "x".repeat(width)), 0)).collect()
}

#[tokio::test]
async fn delivers_json_lines_and_text() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let out = build(&format!("{{type: tcp, address: '{addr}'}}"));
    let events = numbered(3);
    let d = bounded(out.send(&refs(&events))).await.unwrap();
    assert!(d.rejected.is_empty());
    let (mut s, _) = listener.accept().await.unwrap();
    let got = bounded(read_lines(&mut s, 3)).await;
    let first: serde_json::Value = serde_json::from_str(&got[0]).unwrap();
    assert_eq!(first["message"], "event 0");
    assert_eq!(got.len(), 3);

    // The connection is kept: the next batch comes on it.
    let more = numbered(2);
    bounded(out.send(&refs(&more))).await.unwrap();
    assert_eq!(bounded(read_lines(&mut s, 2)).await.len(), 2);
    out.close().await;

    let text = build(&format!("{{type: tcp, address: '{addr}', codec: text}}"));
    bounded(text.send(&refs(&events))).await.unwrap();
    let (mut s, _) = listener.accept().await.unwrap();
    assert_eq!(bounded(read_lines(&mut s, 3)).await, ["event 0", "event 1", "event 2"]);
}

#[tokio::test]
async fn reconnects_after_the_server_closed_between_batches() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let out = build(&format!("{{type: tcp, address: '{addr}', codec: text}}"));
    let first = text_events(10, 10);
    bounded(out.send(&refs(&first))).await.unwrap();
    let (mut s, _) = listener.accept().await.unwrap();
    assert_eq!(bounded(read_lines(&mut s, 10)).await.len(), 10);
    drop(s);
    tokio::time::sleep(Duration::from_millis(50)).await;

    let second = text_events(10, 20);
    bounded(out.send(&refs(&second))).await.unwrap();
    let (mut s, _) = bounded(listener.accept()).await.unwrap();
    let got = bounded(read_lines(&mut s, 10)).await;
    assert_eq!(got.len(), 10);
    assert!(got[0].ends_with(&"x".repeat(20)));
}

#[tokio::test]
async fn a_server_hanging_up_mid_batch_gets_the_whole_batch_again() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let out = build(&format!(
        "{{type: tcp, address: '{addr}', codec: text, retry: {{initial_backoff: 10ms, max_backoff: 50ms}}}}"
    ));
    // Far more than the socket buffers hold, so the write is still going when the server leaves.
    let count = 300_000;
    let events = text_events(count, 120);
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let first = read_lines(&mut s, 1000).await;
        drop(s);
        let (mut s, _) = listener.accept().await.unwrap();
        let second = read_lines(&mut s, count).await;
        (first, second)
    });
    let d = bounded(out.send(&refs(&events))).await.unwrap();
    assert!(d.rejected.is_empty());
    let (first, second) = bounded(server).await.unwrap();
    assert!(!first.is_empty());
    let mut seen = HashSet::new();
    for line in first.iter().chain(&second) {
        if line.len() == 8 + 1 + 120 {
            seen.insert(line[..8].to_string());
        }
    }
    assert_eq!(seen.len(), count, "every line arrived (some twice)");
    assert_eq!(second.len(), count);
}

#[tokio::test]
async fn gives_up_after_max_retries_when_nothing_listens() {
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let out = build(&format!(
        "{{type: tcp, address: '{closed}', retry: {{max_retries: 2, initial_backoff: 5ms, max_backoff: 5ms}}}}"
    ));
    let events = numbered(2);
    let d = bounded(out.send(&refs(&events))).await.unwrap();
    assert_eq!(d.rejected.len(), 2);
    assert!(d.rejected[0].reason.contains("cannot connect"), "{}", d.rejected[0].reason);
}

#[tokio::test]
async fn a_peer_down_holds_the_batch_until_it_listens_counting_retries() {
    // Take a free port, then leave it closed until the output has retried a few times.
    let address = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let ctx = context();
    let metrics = ctx.metrics.clone();
    let out = build_with(
        &format!("{{type: tcp, address: '{address}', retry: {{initial_backoff: 5ms, max_backoff: 20ms}}}}"),
        ctx,
    );
    let sending = tokio::spawn(async move {
        let events = numbered(2);
        out.send(&refs(&events)).await
    });
    sluice_testkit::wait_until_async("the output to retry", Duration::from_secs(20), || metrics.retries.get() >= 3)
        .await;
    assert!(!sending.is_finished(), "the batch waits for the peer");
    let listener = TcpListener::bind(address).await.unwrap();
    let (mut peer, _) = bounded(listener.accept()).await.unwrap();
    let lines = bounded(read_lines(&mut peer, 2)).await;
    assert_eq!(lines.len(), 2);
    let d = bounded(sending).await.unwrap().unwrap();
    assert!(d.rejected.is_empty(), "{:?}", d.rejected);
}

#[test]
fn config_is_checked() {
    assert!(build_err("{type: tcp}").contains("address"));
    assert!(build_err("{type: tcp, address: 'nope'}").contains("host:port"));
    assert!(build_err("{type: tcp, address: 'h:1', codec: xml}").contains("codec"));
}
