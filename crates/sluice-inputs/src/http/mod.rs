//! `http` input: JSON events POSTed by clients, answered only once they are handled.
//!
//! Each request's events go to the queue as one batch carrying an acknowledgement, marked
//! awaited (its client sends nothing more on the connection until answered, so no worker holds
//! it back for a fuller batch), and the
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
//! With `tls:` the input speaks HTTPS only (see [`crate::limits::tls_handshake`]).
//!
//! Other answers: 401 when `auth` (or `auth_token`) is set and the `Authorization` header does
//! not carry its credentials (see [`auth`]: compared in constant time, counted, logged with the
//! peer); 404 for another path; 405 for a method other
//! than POST; 415 for a `Content-Encoding` other than `gzip` or `identity`. Every error body is
//! `{"error": "..."}`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use sluice_config::model::ComponentSpec;
use sluice_config::{ByteSize, ConfigError};
use sluice_core::ack::AckOutcome;
use sluice_core::figures::{Figure, Publish, Spec};
use sluice_core::value::now_nanos;
use sluice_core::{AckSet, Acker, Batch};
use sluice_tls::ServerTls;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use crate::limits::{Activity, ConnectionSlot, ConnectionSlots, WatchedIo, tls_handshake};
use crate::listener::Listener;
use crate::{Input, InputContext, InputError};

mod auth;
mod body;
mod config;

use auth::Authenticator;
use config::HttpConfig;

#[doc(hidden)]
pub use body::parse_body_for_fuzzing;
use body::{Admission, Refusal};

struct HttpInput {
    listener: Listener,
    config: HttpConfig,
    auth: Option<Authenticator>,
    tls: Option<Arc<ServerTls>>,
}

pub(crate) fn build(spec: &ComponentSpec) -> Result<Box<dyn Input>, ConfigError> {
    Ok(Box::new(build_input(spec)?))
}

fn build_input(spec: &ComponentSpec) -> Result<HttpInput, ConfigError> {
    let (listener, config) = config::read(spec)?;
    let auth = Authenticator::from_config(spec, config.auth.as_ref(), config.auth_token.as_deref())?;
    let tls = listener.server_tls(spec)?;
    Ok(HttpInput { listener, config, auth, tls })
}

#[async_trait]
impl Input for HttpInput {
    async fn run(self: Box<Self>, ctx: InputContext) -> Result<(), InputError> {
        let socket = ctx.listen_tcp(&self.listener.address).await?;
        serve(*self, socket, ctx).await
    }

    fn listens(&self) -> bool {
        true
    }
}

struct Shared {
    ctx: InputContext,
    /// TLS handshake refusals, logged at most once per 10 s per reason.
    handshakes: crate::limits::HandshakeLog,
    path: String,
    max_body: usize,
    max_events: usize,
    body_timeout: Duration,
    request_timeout: Duration,
    idle_timeout: Duration,
    header_timeout: Duration,
    auth: Option<Authenticator>,
    tls: Option<Arc<ServerTls>>,
    /// The connections open, for the `connections_open` figure.
    slots: Arc<ConnectionSlots>,
    /// Requests answered 401.
    auth_failures: AtomicU64,
    /// When a refused attempt was last logged (logged at most once per 10 s).
    auth_failure_logged: parking_lot::Mutex<Option<tokio::time::Instant>>,
}

/// The input's own figures at `/metrics` and `/stats`.
struct HttpFigures(Arc<Shared>);

impl Publish for HttpFigures {
    fn figures(&self) -> Vec<Figure> {
        vec![
            Spec::counter("auth_failures_total", "Requests answered 401: missing or wrong credentials.")
                .value(self.0.auth_failures.load(Ordering::Relaxed)),
            Spec::gauge("connections_open", "Client connections open now.").value(self.0.slots.open() as u64),
        ]
    }
}

/// How long in-flight requests may take to finish after shutdown (they are answered 503 at
/// once, so this only bounds clients that stall).
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The answer to a connection beyond `max_connections`, written without reading the request.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\n\
Connection: close\r\nContent-Length: 63\r\n\r\n{\"error\":\"too many open connections (max_connections); retry\"}";

async fn serve(input: HttpInput, listener: TcpListener, ctx: InputContext) -> Result<(), InputError> {
    let HttpInput { listener: keys, config, auth, tls } = input;
    let local = listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| keys.address.clone());
    tracing::info!(pipeline = %ctx.pipeline, input = %ctx.id, address = %local, path = %config.path,
        max_connections = keys.max_connections, tls = tls.is_some(), auth = auth.as_ref().map_or("none", Authenticator::kind),
        "http input listening");
    let slots = ConnectionSlots::new(keys.max_connections);
    let shared = Arc::new(Shared {
        ctx: ctx.clone(),
        handshakes: Default::default(),
        path: config.path,
        max_body: config.max_body_bytes.as_usize(),
        max_events: config.max_events_per_request,
        body_timeout: config.body_timeout.0,
        request_timeout: config.request_timeout.0,
        idle_timeout: keys.idle_timeout,
        header_timeout: config.header_timeout.0,
        auth,
        tls,
        slots: slots.clone(),
        auth_failures: AtomicU64::new(0),
        auth_failure_logged: parking_lot::Mutex::new(None),
    });
    let _ = ctx.metrics.state.set(Arc::new(HttpFigures(shared.clone())));
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
    let watched = WatchedIo::new(stream, activity.clone());
    let stream = match tls_handshake(shared.tls.as_ref(), watched, &activity, &ctx.shutdown).await {
        Ok(stream) => stream,
        Err(why) => {
            ctx.metrics.refused.add(1);
            shared.handshakes.refused(&ctx, "http", peer, &why);
            return;
        }
    };
    let io = TokioIo::new(stream);
    let requests = activity.clone();
    let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
        let shared = shared.clone();
        let activity = requests.clone();
        async move {
            activity.request_started();
            let mut request = request.map(Body::new);
            request.extensions_mut().insert(activity.clone());
            let response = handle(&shared, request, peer).await;
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
        Refusal::NoRoomToWait => {
            let mut r = error(
                StatusCode::TOO_MANY_REQUESTS,
                "no room for the request in the node's memory budget now, and the requests waiting for it already hold their share of it; send again later".to_string(),
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

async fn handle(s: &Shared, request: Request, peer: SocketAddr) -> Response {
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
    if let Some(auth) = &s.auth
        && !auth.admits(&parts.headers)
    {
        return unauthorized(s, auth, peer);
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
    // The client waits for this answer before it sends more on its connection: no worker should
    // hold these events back for up to `batch.delay` while a fuller batch gathers.
    let batch = Batch::new(events, AckSet::single(acker, n), body_len).with_memory(admission.settle()).awaited();
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
    let read = tokio::time::timeout(
        s.body_timeout,
        body::read_body(&mut body, s.max_body, declared, admission, &s.ctx.metrics.bytes_in),
    )
    .await;
    let raw = match read {
        Err(_) => return Err(Refusal::BodyTimeout),
        Ok(Err(
            refusal @ (Refusal::NoRoom
            | Refusal::NoRoomToWait
            | Refusal::NeedsTooMuchMemory { .. }
            | Refusal::BodyTooLarge),
        )) => {
            // Refused while the client was still sending: let it finish (within what is left
            // of body_timeout, and max_body_bytes) so that it reads the answer.
            let left = s.body_timeout.saturating_sub(started.elapsed());
            let _ =
                tokio::time::timeout(left, body::discard_rest(&mut body, s.max_body, &s.ctx.metrics.bytes_in)).await;
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
/// A 401 for missing or wrong credentials: counted, and logged with the peer at most once per
/// 10 s.
fn unauthorized(s: &Shared, auth: &Authenticator, peer: SocketAddr) -> Response {
    let failures = s.auth_failures.fetch_add(1, Ordering::Relaxed) + 1;
    {
        let mut logged = s.auth_failure_logged.lock();
        if logged.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            *logged = Some(tokio::time::Instant::now());
            tracing::warn!(pipeline = %s.ctx.pipeline, input = %s.ctx.id, peer = %peer, failures,
                "http input answered 401: missing or wrong {} credentials (logged once per 10 s; the count is \
                 sluice_component_auth_failures_total)", auth.kind());
        }
    }
    let mut r = error(StatusCode::UNAUTHORIZED, format!("missing or wrong {} credentials", auth.kind()));
    r.headers_mut().insert(header::WWW_AUTHENTICATE, auth.challenge());
    r
}

#[cfg(test)]
mod tests;
