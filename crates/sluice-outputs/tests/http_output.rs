//! The `http` output against a local server that answers as each test scripts it.

mod common;

use std::io::Read;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use common::{build, build_err, build_with, context, numbered, refs};
use parking_lot::Mutex;
use tokio::net::TcpListener;

#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    headers: HeaderMap,
    /// The body, gunzipped when it came gzipped.
    body: String,
}

#[derive(Default)]
struct Script {
    /// Answers for the coming requests, in order; 200 once they run out.
    answers: Vec<(StatusCode, &'static str, Duration)>,
    seen: Vec<Seen>,
}

type Server = Arc<Mutex<Script>>;

async fn handler(State(s): State<Server>, method: Method, headers: HeaderMap, body: Bytes) -> (StatusCode, String) {
    let body = if headers.get("content-encoding").is_some_and(|v| v == "gzip") {
        let mut text = String::new();
        flate2::read::GzDecoder::new(&body[..]).read_to_string(&mut text).unwrap();
        text
    } else {
        String::from_utf8(body.to_vec()).unwrap()
    };
    let (status, answer, delay) = {
        let mut s = s.lock();
        s.seen.push(Seen { method, headers, body });
        if s.answers.is_empty() { (StatusCode::OK, "ok", Duration::ZERO) } else { s.answers.remove(0) }
    };
    tokio::time::sleep(delay).await;
    (status, answer.to_string())
}

async fn server(answers: Vec<(StatusCode, &'static str, Duration)>) -> (SocketAddr, Server) {
    let state: Server = Arc::new(Mutex::new(Script { answers, seen: Vec::new() }));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().fallback(handler).with_state(state.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, state)
}

fn answer(code: u16, body: &'static str) -> (StatusCode, &'static str, Duration) {
    (StatusCode::from_u16(code).unwrap(), body, Duration::ZERO)
}

const FAST_RETRY: &str = "retry: {initial_backoff: 5ms, max_backoff: 20ms}";

fn lines(body: &str) -> Vec<serde_json::Value> {
    body.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

async fn bounded<T>(f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f).await.expect("took too long")
}

#[tokio::test]
async fn delivers_ndjson_with_headers_and_token() {
    let (addr, srv) = server(vec![]).await;
    let out = build(&format!(
        "{{type: http, url: 'http://{addr}/in', auth_token: t0k, headers: {{X-Source: sluice}}, method: put}}"
    ));
    let events = numbered(3);
    let d = bounded(out.send(&refs(&events))).await.unwrap();
    assert!(d.rejected.is_empty());
    let seen = srv.lock().seen.clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].method, Method::PUT);
    assert_eq!(seen[0].headers["content-type"], "application/x-ndjson");
    assert_eq!(seen[0].headers["authorization"], "Bearer t0k");
    assert_eq!(seen[0].headers["x-source"], "sluice");
    let got = lines(&seen[0].body);
    assert_eq!(got.len(), 3);
    assert_eq!(got[2]["message"], "event 2");
    assert_eq!(got[2]["@timestamp"], "2023-11-14T22:13:20.000Z");
}

#[tokio::test]
async fn retries_a_500_then_delivers() {
    let (addr, srv) = server(vec![answer(500, "busy"), answer(429, "slow down")]).await;
    let out = build(&format!("{{type: http, url: 'http://{addr}/', {FAST_RETRY}}}"));
    let events = numbered(2);
    let d = bounded(out.send(&refs(&events))).await.unwrap();
    assert!(d.rejected.is_empty());
    let seen = srv.lock().seen.clone();
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|s| s.body == seen[0].body), "every attempt sends the same body");
}

#[tokio::test]
async fn a_400_rejects_without_retrying() {
    let (addr, srv) = server(vec![answer(400, "field `n` is not allowed"), answer(200, "")]).await;
    let out = build(&format!("{{type: http, url: 'http://{addr}/', isolate_refused: false, {FAST_RETRY}}}"));
    let events = numbered(3);
    let d = bounded(out.send(&refs(&events))).await.unwrap();
    assert_eq!(d.rejected.len(), 3);
    assert_eq!(d.rejected.iter().map(|r| r.index).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(d.rejected[0].reason, "HTTP 400: field `n` is not allowed");
    assert!(d.rejected.iter().all(|r| r.permanent && r.attempts == 1), "{:?}", d.rejected);
    assert_eq!(srv.lock().seen.len(), 1);
}

#[tokio::test]
async fn gives_up_after_max_retries() {
    let always = vec![answer(503, "down"); 10];
    let (addr, srv) = server(always).await;
    let out = build(&format!(
        "{{type: http, url: 'http://{addr}/', retry: {{max_retries: 2, initial_backoff: 5ms, max_backoff: 10ms}}}}"
    ));
    let events = numbered(4);
    let d = bounded(out.send(&refs(&events))).await.unwrap();
    assert_eq!(srv.lock().seen.len(), 3, "one attempt and two retries");
    assert_eq!(d.rejected.len(), 4);
    assert_eq!(d.rejected[3].reason, "HTTP 503: down");
    assert!(d.rejected.iter().all(|r| !r.permanent && r.attempts == 3), "{:?}", d.rejected);
}

#[tokio::test]
async fn a_400_after_retries_counts_every_attempt() {
    let (addr, _srv) = server(vec![answer(503, "busy"), answer(422, "bad mapping")]).await;
    let out = build(&format!("{{type: http, url: 'http://{addr}/', isolate_refused: false, {FAST_RETRY}}}"));
    let events = numbered(2);
    let d = bounded(out.send(&refs(&events))).await.unwrap();
    assert_eq!(d.rejected.len(), 2);
    assert!(d.rejected.iter().all(|r| r.permanent && r.attempts == 2), "{:?}", d.rejected);
    assert_eq!(d.rejected[1].reason, "HTTP 422: bad mapping");
}

/// A server that refuses (400) any body holding an event whose message is in `bad`, and keeps
/// the messages of the bodies it accepts.
async fn picky_server(bad: &'static [&'static str]) -> (SocketAddr, Arc<Mutex<(Vec<String>, usize)>>) {
    let state = Arc::new(Mutex::new((Vec::new(), 0usize)));
    let seen = state.clone();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().fallback(move |body: Bytes| {
        let seen = seen.clone();
        async move {
            let messages: Vec<String> = String::from_utf8_lossy(&body)
                .lines()
                .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["message"].as_str().unwrap().to_string())
                .collect();
            let mut seen = seen.lock();
            seen.1 += 1;
            if messages.iter().any(|m| bad.contains(&m.as_str())) {
                (StatusCode::BAD_REQUEST, "a bad event".to_string())
            } else {
                seen.0.extend(messages);
                (StatusCode::OK, "ok".to_string())
            }
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, state)
}

#[tokio::test]
async fn only_the_events_the_server_refuses_are_rejected() {
    let (addr, srv) = picky_server(&["event 1", "event 6"]).await;
    let out = build(&format!("{{type: http, url: 'http://{addr}/', {FAST_RETRY}}}"));
    let events = numbered(8);
    let d = bounded(out.send(&refs(&events))).await.unwrap();
    assert_eq!(d.rejected.iter().map(|r| r.index).collect::<Vec<_>>(), [1, 6], "{:?}", d.rejected);
    assert!(d.rejected.iter().all(|r| r.permanent && r.reason == "HTTP 400: a bad event"), "{:?}", d.rejected);
    // Refused as part of 8, of 4, of 2, then alone.
    assert!(d.rejected.iter().all(|r| r.attempts == 4), "{:?}", d.rejected);
    let (delivered, requests) = srv.lock().clone();
    let mut delivered = delivered;
    delivered.sort();
    assert_eq!(delivered, ["event 0", "event 2", "event 3", "event 4", "event 5", "event 7"]);
    assert_eq!(requests, 11);

    // Split within each request of batch_max_events, with indexes into the whole batch.
    let out = build(&format!("{{type: http, url: 'http://{addr}/', batch_max_events: 3, {FAST_RETRY}}}"));
    let d = bounded(out.send(&refs(&events))).await.unwrap();
    assert_eq!(d.rejected.iter().map(|r| r.index).collect::<Vec<_>>(), [1, 6]);
}

#[tokio::test]
async fn answers_about_the_endpoint_or_credentials_are_retried_not_blamed_on_the_events() {
    for code in [401, 403, 404, 405, 407, 408, 410, 421, 425] {
        let (addr, srv) = server(vec![answer(code, "not the events")]).await;
        let ctx = context();
        let metrics = ctx.metrics.clone();
        let out = build_with(&format!("{{type: http, url: 'http://{addr}/', {FAST_RETRY}}}"), ctx);
        let events = numbered(2);
        let d = bounded(out.send(&refs(&events))).await.unwrap();
        assert!(d.rejected.is_empty(), "{code}: retried until the server took them: {:?}", d.rejected);
        assert_eq!(srv.lock().seen.len(), 2, "{code}");
        assert_eq!(metrics.retries.get(), 1, "{code}");
    }
    // With a limit they are given up, not sent to the dead letter queue.
    let (addr, _srv) = server(vec![answer(401, "bad token"); 3]).await;
    let out = build(&format!(
        "{{type: http, url: 'http://{addr}/', retry: {{max_retries: 1, initial_backoff: 5ms, max_backoff: 5ms}}}}"
    ));
    let events = numbered(1);
    let d = bounded(out.send(&refs(&events))).await.unwrap();
    assert_eq!(d.rejected.len(), 1);
    assert!(!d.rejected[0].permanent && d.rejected[0].reason == "HTTP 401: bad token", "{:?}", d.rejected);
}

#[tokio::test]
async fn connection_errors_and_timeouts_are_retried() {
    // Nothing listens on a port that was just released.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
    let out = build(&format!(
        "{{type: http, url: 'http://{closed}/', retry: {{max_retries: 1, initial_backoff: 5ms, max_backoff: 5ms}}}}"
    ));
    let events = numbered(1);
    let d = bounded(out.send(&refs(&events))).await.unwrap();
    assert_eq!(d.rejected.len(), 1);
    assert!(!d.rejected[0].reason.is_empty());

    let slow = (StatusCode::OK, "late", Duration::from_secs(3));
    let (addr, srv) = server(vec![slow]).await;
    let out = build(&format!("{{type: http, url: 'http://{addr}/', timeout: 200ms, {FAST_RETRY}}}"));
    let d = bounded(out.send(&refs(&events))).await.unwrap();
    assert!(d.rejected.is_empty());
    assert_eq!(srv.lock().seen.len(), 2);
}

#[tokio::test]
async fn gzip_bodies_decode() {
    let (addr, srv) = server(vec![]).await;
    let out = build(&format!("{{type: http, url: 'http://{addr}/', compression: gzip}}"));
    let events = numbered(50);
    assert!(bounded(out.send(&refs(&events))).await.unwrap().rejected.is_empty());
    let seen = srv.lock().seen.clone();
    assert_eq!(seen[0].headers["content-encoding"], "gzip");
    let got = lines(&seen[0].body);
    assert_eq!(got.len(), 50);
    assert_eq!(got[49]["n"], 49);
}

#[tokio::test]
async fn json_array_format() {
    let (addr, srv) = server(vec![]).await;
    let out = build(&format!("{{type: http, url: 'http://{addr}/', format: json_array}}"));
    let events = numbered(3);
    assert!(bounded(out.send(&refs(&events))).await.unwrap().rejected.is_empty());
    let seen = srv.lock().seen.clone();
    assert_eq!(seen[0].headers["content-type"], "application/json");
    let got: serde_json::Value = serde_json::from_str(&seen[0].body).unwrap();
    assert_eq!(got.as_array().unwrap().len(), 3);
    assert_eq!(got[1]["message"], "event 1");
}

#[tokio::test]
async fn batches_are_split_by_batch_max_events() {
    let (addr, srv) = server(vec![answer(200, ""), answer(422, "no")]).await;
    let out = build(&format!(
        "{{type: http, url: 'http://{addr}/', batch_max_events: 10, isolate_refused: false, {FAST_RETRY}}}"
    ));
    let events = numbered(25);
    let d = bounded(out.send(&refs(&events))).await.unwrap();
    let seen = srv.lock().seen.clone();
    assert_eq!(seen.iter().map(|s| lines(&s.body).len()).collect::<Vec<_>>(), [10, 10, 5]);
    assert_eq!(lines(&seen[2].body)[0]["n"], 20);
    // The second request was refused: exactly its events are rejected.
    assert_eq!(d.rejected.iter().map(|r| r.index).collect::<Vec<_>>(), (10..20).collect::<Vec<_>>());
    assert_eq!(d.rejected[0].reason, "HTTP 422: no");
}

#[tokio::test]
async fn abort_stops_retrying() {
    let (addr, _srv) = server(vec![answer(503, ""); 1000]).await;
    let ctx = context();
    let abort = ctx.abort.clone();
    let out = build_with(&format!("{{type: http, url: 'http://{addr}/', {FAST_RETRY}}}"), ctx);
    let events = numbered(1);
    let slice = refs(&events);
    let send = out.send(&slice);
    let cancel = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        abort.cancel();
    };
    let (r, ()) = bounded(async { tokio::join!(send, cancel) }).await;
    assert_eq!(r, Err(sluice_outputs::Aborted));
}

#[test]
fn config_is_checked() {
    assert!(build_err("{type: http}").contains("url"));
    assert!(build_err("{type: http, url: 'ftp://x/'}").contains("http://"));
    assert!(build_err("{type: http, url: 'http://x/', batch_max_events: 0}").contains("batch_max_events"));
    assert!(build_err("{type: http, url: 'http://x/', headers: {'bad header': v}}").contains("header"));
    assert!(build_err("{type: http, url: 'http://x/', compression: zstd}").contains("compression"));
    assert!(build_err("{type: http, url: 'http://x/', verbose: true}").contains("verbose"));
}
