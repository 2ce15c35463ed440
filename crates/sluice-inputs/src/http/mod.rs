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
//! Bounds (see [`crate::limits`] and [`body`]): at most `max_connections` open connections (the
//! next is answered 503 and closed); a connection idle for `idle_timeout`, or sending one
//! request's headers for longer than `header_timeout`, is closed; a body that takes longer than
//! `body_timeout` is answered 408. A request's body, its inflated form and its events are
//! charged to the node's memory budget before they are held: a request that would need more
//! than half the budget, more than `max_events_per_request` events or more than
//! `max_body_bytes` is answered 413; one that waits `request_timeout` for room in the budget or
//! the queue is answered 429 with `Retry-After`. Nothing of a refused request is enqueued.
//!
//! Other answers: 401 when `auth_token` is set and the `Authorization: Bearer` header is
//! missing or wrong (compared in constant time); 404 for another path; 405 for a method other
//! than POST; 415 for a `Content-Encoding` other than `gzip` or `identity`. Every error body is
//! `{"error": "..."}`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Deserialize;
use sluice_config::model::ComponentSpec;
use sluice_config::{ByteSize, ConfigError, HumanDuration};
use sluice_core::ack::AckOutcome;
use sluice_core::value::now_nanos;
use sluice_core::{AckSet, Acker, Batch};
use subtle::ConstantTimeEq;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use crate::limits::{Activity, ConnectionSlot, ConnectionSlots, WatchedIo};
use crate::{Input, InputContext, InputError};

mod body;

#[doc(hidden)]
pub use body::parse_body_for_fuzzing;
use body::{Admission, Refusal};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpConfig {
    address: String,
    #[serde(default = "default_path")]
    path: String,
    #[serde(default = "default_max_body")]
    max_body_bytes: ByteSize,
    auth_token: Option<String>,
    #[serde(default = "default_max_connections")]
    max_connections: usize,
    #[serde(default = "default_max_events")]
    max_events_per_request: usize,
    #[serde(default = "default_header_timeout")]
    header_timeout: HumanDuration,
    #[serde(default = "default_body_timeout")]
    body_timeout: HumanDuration,
    #[serde(default = "default_idle_timeout")]
    idle_timeout: HumanDuration,
    #[serde(default = "default_request_timeout")]
    request_timeout: HumanDuration,
}

fn default_path() -> String {
    "/".to_string()
}
fn default_max_body() -> ByteSize {
    ByteSize(10 << 20)
}
fn default_max_connections() -> usize {
    1024
}
fn default_max_events() -> usize {
    100_000
}
fn default_header_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(10))
}
fn default_body_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
}
fn default_idle_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(60))
}
fn default_request_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(30))
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
    if config.max_connections == 0 {
        return Err(spec.key_error("max_connections", "must be at least 1"));
    }
    if config.max_events_per_request == 0 {
        return Err(spec.key_error("max_events_per_request", "must be at least 1"));
    }
    for (key, value) in [("body_timeout", config.body_timeout), ("request_timeout", config.request_timeout)] {
        if value.0.is_zero() {
            return Err(spec.key_error(key, "must be more than 0"));
        }
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
    max_events: usize,
    body_timeout: Duration,
    request_timeout: Duration,
    idle_timeout: Duration,
    header_timeout: Duration,
    /// `Bearer <token>`, as the `Authorization` header must read.
    expected_auth: Option<Vec<u8>>,
}

/// How long in-flight requests may take to finish after shutdown (they are answered 503 at
/// once, so this only bounds clients that stall).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The answer to a connection beyond `max_connections`, written without reading the request.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\n\
Connection: close\r\nContent-Length: 63\r\n\r\n{\"error\":\"too many open connections (max_connections); retry\"}";

async fn serve(config: HttpConfig, listener: TcpListener, ctx: InputContext) -> Result<(), InputError> {
    let local = listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| config.address.clone());
    tracing::info!(pipeline = %ctx.pipeline, input = %ctx.id, address = %local, path = %config.path,
        max_connections = config.max_connections, "http input listening");
    let slots = ConnectionSlots::new(config.max_connections);
    let shared = Arc::new(Shared {
        ctx: ctx.clone(),
        path: config.path,
        max_body: config.max_body_bytes.as_usize(),
        max_events: config.max_events_per_request,
        body_timeout: config.body_timeout.0,
        request_timeout: config.request_timeout.0,
        idle_timeout: config.idle_timeout.0,
        header_timeout: config.header_timeout.0,
        expected_auth: config.auth_token.map(|t| format!("Bearer {t}").into_bytes()),
    });
    let mut connections = JoinSet::new();
    let mut refused_logged = None::<tokio::time::Instant>;
    loop {
        let accepted = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            r = listener.accept() => r,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors, or a connection reset before it was accepted: keep
                // serving, but do not spin on a persistent error.
                tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, error = %e, "http input cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let activity = Activity::new(shared.idle_timeout, shared.header_timeout);
        let Some(slot) = slots.take_or_evict(&activity) else {
            ctx.metrics.refused.add(1);
            // Best effort and without waiting: a client that does not read its answer is not
            // worth a task.
            let _ = stream.try_write(BUSY);
            if refused_logged.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                refused_logged = Some(tokio::time::Instant::now());
                tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %peer, max_connections = slots.max(),
                    "http input refused a connection: max_connections reached, every one busy with a request (logged once per 10 s)");
            }
            continue;
        };
        connections.spawn(connection(shared.clone(), stream, peer, slot, activity));
    }
    drop(listener);
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async { while connections.join_next().await.is_some() {} });
    if drained.await.is_err() {
        tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, open = connections.len(),
            "http input: connections still open after shutdown; closing them");
        connections.shutdown().await;
    }
    Ok(())
}

/// Serves one client's requests until it closes, runs out of a timeout, or shutdown.
async fn connection(
    shared: Arc<Shared>,
    stream: TcpStream,
    peer: SocketAddr,
    _slot: ConnectionSlot,
    activity: Arc<Activity>,
) {
    let ctx = shared.ctx.clone();
    let io = TokioIo::new(WatchedIo::new(stream, activity.clone()));
    let requests = activity.clone();
    let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
        let shared = shared.clone();
        let activity = requests.clone();
        async move {
            activity.request_started();
            let mut request = request.map(Body::new);
            request.extensions_mut().insert(activity.clone());
            let response = handle(&shared, request).await;
            activity.request_finished();
            Ok::<_, Infallible>(response)
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    // The head and idle timeouts are ours (`Activity`), which tell an idle connection from one
    // that is slowly sending a head; hyper's would count both from the end of the last answer.
    builder.timer(TokioTimer::new()).header_read_timeout(None).keep_alive(true);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let mut closing = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %peer, error = %e, "http connection ended with an error");
                }
                return;
            }
            _ = ctx.shutdown.cancelled(), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            why = activity.expired() => {
                ctx.metrics.refused.add(1);
                tracing::debug!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %peer, "http input closed a connection that {why}");
                return;
            }
        }
    }
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

fn mib(bytes: usize) -> String {
    ByteSize(bytes as u64).to_string()
}

/// The answer to a refused request; counted as refused.
fn refuse(s: &Shared, refusal: Refusal) -> Response {
    if !matches!(refusal, Refusal::Malformed(_)) {
        s.ctx.metrics.refused.add(1);
    }
    let timeout = |d: Duration| format!("{d:?}");
    let (status, message) = match refusal {
        Refusal::BodyTooLarge => {
            (StatusCode::PAYLOAD_TOO_LARGE, format!("the body is larger than max_body_bytes ({})", mib(s.max_body)))
        }
        Refusal::TooManyEvents(max) => (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request holds more than max_events_per_request ({max}) events; send fewer per request"),
        ),
        Refusal::NeedsTooMuchMemory { needed, cap } => (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the request's events need more than {} of memory, and one request may hold at most half the node's memory budget ({}); send fewer or smaller events per request",
                mib(needed),
                mib(cap)
            ),
        ),
        Refusal::NoRoom => {
            let mut r = error(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "no room for the request's events in the node's memory budget within request_timeout ({}); send again later",
                    timeout(s.request_timeout)
                ),
            );
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return r;
        }
        Refusal::BodyTimeout => {
            let mut r = error(
                StatusCode::REQUEST_TIMEOUT,
                format!("the body did not arrive within body_timeout ({})", timeout(s.body_timeout)),
            );
            r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            return r;
        }
        Refusal::Malformed(reason) => {
            s.ctx.metrics.failed.add(1);
            tracing::debug!(pipeline = %s.ctx.pipeline, input = %s.ctx.id, reason = %reason, "http input refused a malformed request");
            (StatusCode::BAD_REQUEST, reason)
        }
    };
    error(status, message)
}

async fn handle(s: &Shared, request: Request) -> Response {
    if request.uri().path() != s.path {
        return error(StatusCode::NOT_FOUND, format!("events are accepted at {}", s.path));
    }
    if request.method() != Method::POST {
        let mut r = error(StatusCode::METHOD_NOT_ALLOWED, "only POST is accepted");
        r.headers_mut().insert(header::ALLOW, HeaderValue::from_static("POST"));
        return r;
    }
    let (parts, body) = request.into_parts();
    let activity = parts.extensions.get::<Arc<Activity>>().cloned();
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
        return refuse(s, Refusal::BodyTooLarge);
    }
    let deadline = tokio::time::Instant::now() + s.request_timeout;
    let budget = &s.ctx.memory;
    let mut admission = Admission::new(budget.empty(), budget.limit() / 2, deadline);
    let accepted = tokio::select! {
        r = admit(s, body, declared.unwrap_or(0) as usize, gzip, &mut admission, activity.as_deref()) => r,
        _ = shutdown.cancelled() => return shutting_down(),
    };
    let (events, body_len) = match accepted {
        Ok(a) => a,
        Err(refusal) => return refuse(s, refusal),
    };
    let n = events.len();
    if n == 0 {
        return reply(StatusCode::OK, serde_json::json!({ "accepted": 0 }));
    }
    let (acker, done) = Acker::with_notify(n);
    let batch = Batch::new(events, AckSet::single(acker, n), body_len).with_memory(admission.settle());
    match tokio::time::timeout_at(deadline, s.ctx.send(batch)).await {
        Ok(Ok(())) => {}
        Ok(Err(_)) => return shutting_down(),
        Err(_) => {
            s.ctx.metrics.refused.add(1);
            let mut r = error(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "the pipeline's queue stayed full for request_timeout ({:?}); nothing was accepted, send again later",
                    s.request_timeout
                ),
            );
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return r;
        }
    }
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

/// Reads, inflates and decodes a request's body within its limits; the events and the size of
/// the body they came from. The admission holds the events' charge; the body's is given back.
async fn admit(
    s: &Shared,
    mut body: Body,
    declared: usize,
    gzip: bool,
    admission: &mut Admission,
    activity: Option<&Activity>,
) -> Result<(Vec<sluice_core::Event>, usize), Refusal> {
    let started = tokio::time::Instant::now();
    let read = tokio::time::timeout(s.body_timeout, body::read_body(&mut body, s.max_body, declared, admission)).await;
    let raw = match read {
        Err(_) => return Err(Refusal::BodyTimeout),
        Ok(Err(refusal @ (Refusal::NoRoom | Refusal::NeedsTooMuchMemory { .. } | Refusal::BodyTooLarge))) => {
            // Refused while the client was still sending: let it finish (within what is left
            // of body_timeout, and max_body_bytes) so that it reads the answer.
            let left = s.body_timeout.saturating_sub(started.elapsed());
            let _ = tokio::time::timeout(left, body::discard_rest(&mut body, s.max_body)).await;
            return Err(refusal);
        }
        Ok(r) => r?,
    };
    if let Some(a) = activity {
        a.body_received();
    }
    let (body, held) = if gzip {
        let inflated = body::gunzip(&raw, s.max_body, admission).await?;
        admission.give_back(raw.len());
        drop(raw);
        let held = inflated.len();
        (inflated, held)
    } else {
        let held = raw.len();
        (raw, held)
    };
    let events = body::decode_events(&body, now_nanos(), s.max_events, admission).await?;
    let body_len = body.len();
    drop(body);
    admission.give_back(held);
    Ok((events, body_len))
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

/// Compares without stopping at the first difference, so timing does not reveal how much of
/// a guess was right (a guess of another length is refused at once).
fn constant_time_eq(expected: &[u8], given: &[u8]) -> bool {
    expected.ct_eq(given).into()
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::net::SocketAddr;

    use sluice_core::{Event, FieldPath, Value};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;
    use tokio::sync::mpsc;

    use super::*;
    use crate::tcp::tests::{context, spec};

    async fn start(
        yaml: &str,
    ) -> (SocketAddr, InputContext, mpsc::UnboundedReceiver<Batch>, tokio::task::JoinHandle<()>) {
        start_with_budget(yaml, 64 << 20).await
    }

    async fn start_with_budget(
        yaml: &str,
        budget: usize,
    ) -> (SocketAddr, InputContext, mpsc::UnboundedReceiver<Batch>, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (mut ctx, rx) = context();
        ctx.memory = sluice_core::MemoryBudget::new(budget);
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
        assert_eq!((c.max_connections, c.max_events_per_request), (1024, 100_000));
        let secs = |d: HumanDuration| d.0.as_secs();
        assert_eq!(
            (secs(c.header_timeout), secs(c.body_timeout), secs(c.idle_timeout), secs(c.request_timeout)),
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
        let (addr, ctx, rx, task) =
            start("{type: http, address: 'x:0', header_timeout: 200ms, idle_timeout: 1s}").await;
        let _batches = auto_ack(rx);
        let mut slow = TcpStream::connect(addr).await.unwrap();
        let mut idle = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"POST / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        let started = std::time::Instant::now();
        assert!(closed_within(&mut slow, Duration::from_secs(5)).await.is_some(), "the slow head was kept");
        let slow_closed = started.elapsed();
        assert!(
            slow_closed >= Duration::from_millis(150) && slow_closed < Duration::from_millis(900),
            "{slow_closed:?}"
        );
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
        let (addr, ctx, rx, task) =
            start_with_budget("{type: http, address: 'x:0', request_timeout: 20s}", 4 << 20).await;
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
