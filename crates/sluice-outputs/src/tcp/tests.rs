//! Unit tests of the `tcp` output: its settings, and lines reaching a local server.

use tokio::io::AsyncReadExt;

use super::*;
use crate::test_support::{context, spec};

#[test]
fn defaults_are_json_lines_with_a_ten_second_connect_timeout() {
    let c = config::read(&spec("{type: tcp, address: 'localhost:5000'}")).unwrap();
    assert_eq!((c.codec, c.connect_timeout.0), (TcpCodec::Json, Duration::from_secs(10)));
    assert!(c.tls.is_none() && c.retry.max_retries.is_none());
}

#[test]
fn an_address_needs_a_host_and_a_port() {
    for address in ["localhost", ":5000", "localhost:0", "localhost:http"] {
        let e = config::read(&spec(&format!("{{type: tcp, address: '{address}'}}"))).unwrap_err();
        assert!(e.path.ends_with(".address"), "{address}: {e}");
        assert_eq!(e.message, format!("`{address}` is not a `host:port` address"));
    }
    let e = config::read(&spec("{type: tcp, address: 'localhost:5000', connect_timeout: 0s}")).unwrap_err();
    assert!(e.path.ends_with(".connect_timeout") && e.message == "must be more than 0", "{e}");
}

#[tokio::test]
async fn text_lines_reach_the_server_in_order() {
    let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = server.local_addr().unwrap();
    let out = build(&spec(&format!("{{type: tcp, address: '{address}', codec: text}}")), context("p", "tcp")).unwrap();
    let events = [Event::from_message_at("a", 0), Event::from_message_at("b", 0)];
    let refs: Vec<&Event> = events.iter().collect();
    assert!(out.send(&refs).await.unwrap().rejected.is_empty());
    let (mut peer, _) = tokio::time::timeout(Duration::from_secs(20), server.accept()).await.unwrap().unwrap();
    let mut got = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(20), peer.read_exact(&mut got)).await.unwrap().unwrap();
    assert_eq!(&got, b"a\nb\n");
    out.close().await;
}
