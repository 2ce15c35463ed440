//! `http` input: JSON events POSTed by clients, answered only once they are handled.
//!
//! Each request's events go to the queue as one batch carrying an acknowledgement, and the
//! request is answered when the pipeline has handled every one of them (delivered by every
//! output, dropped on purpose, or rejected for good): `200 {"accepted": n}`. So a client that
//! got a 200 may forget its events. If the events are abandoned (the pipeline stopped before
//! handling them) or shutdown starts while the request waits, the answer is 503: the client
//! should send again, and the events may then arrive twice (at-least-once).
//!
//! The body format is told from its first non-blank byte: `[` means one JSON array whose
//! elements are the events; anything else is read as a sequence of JSON values separated by
//! whitespace — NDJSON, one value per line, of which a single object is the one-line case. A
//! JSON object becomes the event's fields; any other value becomes its `message`.
//! `Content-Type` is not looked at. A request is all or nothing: if any element is malformed
//! the answer is 400 naming the element or line, and nothing from it is enqueued.
//!
//! Other answers: 401 when `auth_token` is set and the `Authorization: Bearer` header is
//! missing or wrong (compared in constant time); 404 for another path; 405 for a method other
//! than POST; 413 when the body, or its gzip decompression, exceeds `max_body_bytes`; 415 for a
//! `Content-Encoding` other than `gzip` or `identity`. Every error body is `{"error": "..."}`.

use std::future::{IntoFuture, poll_fn};
use std::io::Read;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::body::{Body, HttpBody};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde::de::{DeserializeSeed, SeqAccess, Visitor};
use sluice_config::model::ComponentSpec;
use sluice_config::{ByteSize, ConfigError};
use sluice_core::ack::AckOutcome;
use sluice_core::value::now_nanos;
use sluice_core::{AckSet, Acker, Batch, Event, Value};
use tokio::net::TcpListener;

use crate::codec::event_from_value;
use crate::{Input, InputContext, InputError};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpConfig {
    address: String,
    #[serde(default = "default_path")]
    path: String,
    #[serde(default = "default_max_body")]
    max_body_bytes: ByteSize,
    auth_token: Option<String>,
}

fn default_path() -> String {
    "/".to_string()
}
fn default_max_body() -> ByteSize {
    ByteSize(10 << 20)
}

struct HttpInput {
    config: HttpConfig,
}

pub(crate) fn build(spec: &ComponentSpec) -> Result<Box<dyn Input>, ConfigError> {
    let config: HttpConfig = spec.settings()?;
    crate::tcp::check_address(&config.address).map_err(|m| spec.key_error("address", m))?;
    if !config.path.starts_with('/') {
        return Err(spec.key_error("path", format!("`{}` must start with `/`", config.path)));
    }
    if config.max_body_bytes.0 == 0 {
        return Err(spec.key_error("max_body_bytes", "must be at least 1 byte"));
    }
    if let Some(token) = &config.auth_token
        && (token.is_empty() || HeaderValue::from_str(&format!("Bearer {token}")).is_err())
    {
        return Err(spec.key_error("auth_token", "must be non-empty printable text"));
    }
    Ok(Box::new(HttpInput { config }))
}

#[async_trait]
impl Input for HttpInput {
    async fn run(self: Box<Self>, ctx: InputContext) -> Result<(), InputError> {
        let address = &self.config.address;
        let listener = TcpListener::bind(address)
            .await
            .map_err(|e| InputError(format!("http input cannot listen on {address}: {e}")))?;
        serve(self.config, listener, ctx).await
    }
}

struct Shared {
    ctx: InputContext,
    path: String,
    max_body: usize,
    /// `Bearer <token>`, as the `Authorization` header must read.
    expected_auth: Option<Vec<u8>>,
}

/// How long in-flight requests may take to finish after shutdown (they are answered 503 at
/// once, so this only bounds clients that stall).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

async fn serve(config: HttpConfig, listener: TcpListener, ctx: InputContext) -> Result<(), InputError> {
    let local = listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| config.address.clone());
    tracing::info!(pipeline = %ctx.pipeline, input = %ctx.id, address = %local, path = %config.path, "http input listening");
    let shared = Arc::new(Shared {
        ctx: ctx.clone(),
        path: config.path,
        max_body: config.max_body_bytes.as_usize(),
        expected_auth: config.auth_token.map(|t| format!("Bearer {t}").into_bytes()),
    });
    let app = Router::new().fallback(handle).with_state(shared);
    let server =
        axum::serve(listener, app).with_graceful_shutdown(ctx.shutdown.clone().cancelled_owned()).into_future();
    tokio::pin!(server);
    let result = tokio::select! {
        r = &mut server => r,
        _ = ctx.shutdown.cancelled() => match tokio::time::timeout(SHUTDOWN_GRACE, &mut server).await {
            Ok(r) => r,
            Err(_) => {
                tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, "http input: connections still open after shutdown; closing them");
                Ok(())
            }
        },
    };
    result.map_err(|e| InputError::io(format!("http input on {local}"), e))
}

fn reply(status: StatusCode, body: serde_json::Value) -> Response {
    (status, axum::Json(body)).into_response()
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    reply(status, serde_json::json!({ "error": message.into() }))
}

fn shutting_down() -> Response {
    error(StatusCode::SERVICE_UNAVAILABLE, "the pipeline is shutting down; nothing was accepted, send again later")
}

async fn handle(State(s): State<Arc<Shared>>, request: Request) -> Response {
    if request.uri().path() != s.path {
        return error(StatusCode::NOT_FOUND, format!("events are accepted at {}", s.path));
    }
    if request.method() != Method::POST {
        let mut r = error(StatusCode::METHOD_NOT_ALLOWED, "only POST is accepted");
        r.headers_mut().insert(header::ALLOW, HeaderValue::from_static("POST"));
        return r;
    }
    let (parts, body) = request.into_parts();
    if let Some(expected) = &s.expected_auth {
        let given = parts.headers.get(header::AUTHORIZATION).map(HeaderValue::as_bytes).unwrap_or_default();
        if !constant_time_eq(expected, given) {
            let mut r = error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token");
            r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return r;
        }
    }
    let gzip = match content_encoding(&parts.headers) {
        Ok(g) => g,
        Err(reason) => return error(StatusCode::UNSUPPORTED_MEDIA_TYPE, reason),
    };
    let shutdown = &s.ctx.shutdown;
    if shutdown.is_cancelled() {
        return shutting_down();
    }
    let declared =
        parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > s.max_body as u64) {
        return too_large(s.max_body);
    }
    let raw = tokio::select! {
        r = read_body(body, s.max_body, declared.unwrap_or(0) as usize) => r,
        _ = shutdown.cancelled() => return shutting_down(),
    };
    let raw = match raw {
        Ok(b) => b,
        Err(BodyError::TooLarge) => return too_large(s.max_body),
        Err(BodyError::Read(e)) => return error(StatusCode::BAD_REQUEST, format!("cannot read the request body: {e}")),
    };
    let body = if gzip {
        let limit = s.max_body;
        let decoded = if raw.len() > 64 << 10 {
            tokio::task::spawn_blocking(move || gunzip(&raw, limit))
                .await
                .unwrap_or_else(|e| Err(BodyError::Read(e.to_string())))
        } else {
            gunzip(&raw, limit)
        };
        match decoded {
            Ok(b) => b,
            Err(BodyError::TooLarge) => return too_large(s.max_body),
            Err(BodyError::Read(e)) => return error(StatusCode::BAD_REQUEST, format!("invalid gzip body: {e}")),
        }
    } else {
        raw
    };

    let events = match parse_body(&body, now_nanos()) {
        Ok(events) => events,
        Err(reason) => {
            s.ctx.metrics.failed.add(1);
            tracing::debug!(pipeline = %s.ctx.pipeline, input = %s.ctx.id, reason = %reason, "http input refused a malformed request");
            return error(StatusCode::BAD_REQUEST, reason);
        }
    };
    let n = events.len();
    if n == 0 {
        return reply(StatusCode::OK, serde_json::json!({ "accepted": 0 }));
    }
    let (acker, done) = Acker::with_notify(n);
    if s.ctx.send(Batch::new(events, AckSet::single(acker, n), body.len())).await.is_err() {
        return shutting_down();
    }
    drop(body);
    let outcome = tokio::select! {
        r = done => r.unwrap_or(AckOutcome::Abandoned),
        _ = shutdown.cancelled() => return shutting_down(),
    };
    match outcome {
        AckOutcome::Handled => reply(StatusCode::OK, serde_json::json!({ "accepted": n })),
        AckOutcome::Abandoned => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the events were abandoned before they were handled (the pipeline stopped); send again",
        ),
    }
}

/// Whether the body is gzip-compressed; other encodings are refused (415) with the reason.
fn content_encoding(headers: &HeaderMap) -> Result<bool, String> {
    let mut gzip = false;
    for value in headers.get_all(header::CONTENT_ENCODING) {
        for coding in value.to_str().unwrap_or("?").split(',').map(str::trim).filter(|c| !c.is_empty()) {
            if coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip") {
                if gzip {
                    return Err("gzip applied twice is not supported".to_string());
                }
                gzip = true;
            } else if !coding.eq_ignore_ascii_case("identity") {
                return Err(format!("Content-Encoding `{coding}` is not supported (use gzip or none)"));
            }
        }
    }
    Ok(gzip)
}

fn too_large(limit: usize) -> Response {
    error(StatusCode::PAYLOAD_TOO_LARGE, format!("the body is larger than max_body_bytes ({})", ByteSize(limit as u64)))
}

/// Compares without stopping at the first difference, so timing does not reveal how much of
/// a guess was right. The time depends on the length of `expected` only.
fn constant_time_eq(expected: &[u8], given: &[u8]) -> bool {
    let mut diff = u8::from(expected.len() != given.len());
    for (i, e) in expected.iter().enumerate() {
        diff |= e ^ given.get(i).copied().unwrap_or(!e);
    }
    std::hint::black_box(diff) == 0
}

#[derive(Debug)]
enum BodyError {
    TooLarge,
    Read(String),
}

async fn read_body(mut body: Body, limit: usize, hint: usize) -> Result<Vec<u8>, BodyError> {
    let mut out = Vec::with_capacity(hint.min(limit));
    while let Some(frame) = poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame.map_err(|e| BodyError::Read(e.to_string()))?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > limit {
                return Err(BodyError::TooLarge);
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

fn gunzip(raw: &[u8], limit: usize) -> Result<Vec<u8>, BodyError> {
    let mut out = Vec::with_capacity((raw.len() * 4).min(limit));
    flate2::read::MultiGzDecoder::new(raw)
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| BodyError::Read(e.to_string()))?;
    if out.len() > limit {
        return Err(BodyError::TooLarge);
    }
    Ok(out)
}

/// The body's events, or why the request is refused. See the module comment for the rules.
fn parse_body(body: &[u8], timestamp: i64) -> Result<Vec<Event>, String> {
    let body = body.strip_prefix("\u{feff}".as_bytes()).unwrap_or(body);
    let Some(start) = body.iter().position(|b| !b.is_ascii_whitespace()) else {
        return Ok(Vec::new());
    };
    if body[start] == b'[' {
        let index = std::cell::Cell::new(0usize);
        let mut de = serde_json::Deserializer::from_slice(body);
        let values = IndexedArray { index: &index }
            .deserialize(&mut de)
            .map_err(|e| format!("invalid JSON in element {} of the array (counting from 0): {e}", index.get()))?;
        de.end().map_err(|e| format!("unexpected text after the JSON array: {e}"))?;
        Ok(values.into_iter().map(|v| event_from_value(v, timestamp)).collect())
    } else {
        let mut events = Vec::new();
        for (i, value) in serde_json::Deserializer::from_slice(body).into_iter::<Value>().enumerate() {
            match value {
                Ok(v) => events.push(event_from_value(v, timestamp)),
                Err(e) => {
                    return Err(format!("invalid JSON on line {} (value {i}, counting from 0): {e}", e.line()));
                }
            }
        }
        Ok(events)
    }
}

/// A JSON array that records how many elements it read, so an error can name the element.
struct IndexedArray<'a> {
    index: &'a std::cell::Cell<usize>,
}

impl<'de> DeserializeSeed<'de> for IndexedArray<'_> {
    type Value = Vec<Value>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Vec<Value>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for IndexedArray<'_> {
    type Value = Vec<Value>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Value>, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(v) = seq.next_element::<Value>()? {
            out.push(v);
            self.index.set(out.len());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::net::SocketAddr;

    use sluice_core::FieldPath;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::sync::mpsc;

    use super::*;
    use crate::tcp::tests::{context, spec};

    async fn start(
        yaml: &str,
    ) -> (SocketAddr, InputContext, mpsc::UnboundedReceiver<Batch>, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (ctx, rx) = context();
        let config: HttpConfig = spec(yaml).settings().unwrap();
        let c = ctx.clone();
        let task = tokio::spawn(async move { serve(config, listener, c).await.unwrap() });
        (addr, ctx, rx, task)
    }

    /// One HTTP/1.1 request on a fresh connection; returns the status and the body.
    async fn request(
        addr: SocketAddr,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> (u16, String) {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Length: {}\r\n",
            body.len()
        );
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
        let c: HttpConfig = spec("{type: http, address: 'h:1'}").settings().unwrap();
        assert_eq!((c.path.as_str(), c.max_body_bytes.0, c.auth_token), ("/", 10 << 20, None));
    }

    #[test]
    fn body_rules() {
        let ev = parse_body(br#"[{"a":1}, "text", 5, [1]]"#, 0).unwrap();
        assert_eq!(ev.len(), 4);
        assert_eq!(ev[0].fields.get("a"), Some(&Value::Int(1)));
        assert_eq!(ev[1].message(), Some("text"));
        assert_eq!(ev[2].message(), Some("5"));
        assert_eq!(ev[3].message(), Some("[1]"));
        assert_eq!(parse_body(b"  \n ", 0).unwrap().len(), 0);
        assert_eq!(parse_body(b"[]", 0).unwrap().len(), 0);
        // A pretty-printed single object is one value.
        assert_eq!(parse_body(b"{\n  \"a\": 1\n}\n", 0).unwrap().len(), 1);
        let e = parse_body(b"[{\"a\":1},{\"b\":}]", 0).unwrap_err();
        assert!(e.contains("element 1 of the array"), "{e}");
        let e = parse_body(b"[{\"a\":1}] x", 0).unwrap_err();
        assert!(e.contains("after the JSON array"), "{e}");
        let e = parse_body(b"{\"a\":1}\n\n{\"b\":2}\n{oops}\n", 0).unwrap_err();
        assert!(e.contains("line 4") && e.contains("value 2"), "{e}");
    }

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"Bearer abc", b"Bearer abc"));
        assert!(!constant_time_eq(b"Bearer abc", b"Bearer abd"));
        assert!(!constant_time_eq(b"Bearer abc", b"Bearer ab"));
        assert!(!constant_time_eq(b"Bearer abc", b"Bearer abcd"));
        assert!(!constant_time_eq(b"Bearer abc", b""));
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
        let (status, body) = request(addr, "POST", "/", &headers, &gz(b"{\"z\":1}\n{\"z\":2}\n")).await;
        assert_eq!((status, json(&body)), (200, serde_json::json!({"accepted": 2})));
        assert_eq!(batches.recv().await.unwrap()[1].fields.get("z"), Some(&Value::Int(2)));

        // Small on the wire, too large once decompressed.
        let bomb = gz(format!("[{}\"x\"]", "\"x\",".repeat(1000)).as_bytes());
        assert!(bomb.len() < 1024);
        let (status, _) = request(addr, "POST", "/", &headers, &bomb).await;
        assert_eq!(status, 413);

        let (status, _) = request(addr, "POST", "/", &headers, b"not gzip").await;
        assert_eq!(status, 400);
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
}
