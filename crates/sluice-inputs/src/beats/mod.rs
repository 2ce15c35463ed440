//! `beats` input: events from Filebeat, Winlogbeat, Metricbeat and any other client of the
//! Lumberjack v2 protocol (what Beats send to Logstash), over TCP or TLS.
//!
//! A client announces a window of events, sends them (as JSON data frames, or zlib-compressed
//! blocks of them), and waits for an ACK before it forgets them. This input ACKs a window only
//! once every one of its events has reached the pipeline's ack point — written and fsynced in a
//! persisted queue, or handled by the outputs with a memory queue — never before, and in the
//! order the windows came, however many the client pipelines. While a window waits, keep-alive
//! ACKs every `keepalive_interval` (5 s, as Logstash) tell the client the server is alive, so
//! it does not time out and send again. A connection that closes, breaks the protocol or is cut
//! by shutdown leaves its un-ACKed windows to the client, which sends them again: delivery is
//! at least once.
//!
//! Events keep the fields they arrive with (`@timestamp` parsed into a timestamp, `@metadata`
//! kept for processors and conditions); `@metadata.ip_address` gets the client's address, and
//! `@metadata.tls_peer.subject` its certificate's subject when it sent one. A document that is
//! not a JSON object is kept in `message`, tagged `_jsonparsefailure`, counted as failed, and
//! ACKed with its window; the connection goes on.
//!
//! Bounds: `max_window_size` and `max_frame_bytes` are checked on the frame header, before
//! anything of that size is allocated, and a client past them is logged (naming it) and
//! disconnected; compressed frames inflate to at most `max_frame_bytes`, a step at a time, and
//! their events go to the queue in slices, so that what one connection holds does not grow
//! with its window; every read, every inflating step and every slice of events is charged to
//! the node's memory budget first, and a connection never waits for memory while it holds
//! some ([`connection`]); a connection reads no further while [`connection::MAX_AWAITING`]
//! windows wait for their ACK to be written, and one whose client does not read its ACKs for
//! `write_timeout` is closed and counted; connections are bounded by `max_connections` and
//! `idle_timeout` ([`crate::limits`]).
//!
//! Layout: [`config`] reads and checks the settings, [`protocol`] decodes frames, [`window`]
//! keeps the ACKs owed, [`connection`] runs a client's reader and writer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::event::{METADATA, TIMESTAMP};
use sluice_core::figures::{Figure, Publish, Spec};
use sluice_core::metrics::Counter;
use sluice_core::{Event, Map, Value};
use sluice_tls::ServerTls;
use tokio::net::TcpListener;

use crate::codec::{Codec, Decoded, json_object};
use crate::limits::accept_connections;
use crate::listener::Listener;
use crate::{Input, InputContext, InputError};
use config::BeatsConfig;

mod config;
mod connection;
mod protocol;
#[cfg(test)]
mod tests;
mod window;

pub use crate::codec::TAG_TIMESTAMP_FAILURE;

struct Beats {
    listener: Listener,
    config: BeatsConfig,
    tls: Option<Arc<ServerTls>>,
}

pub(crate) fn build(spec: &ComponentSpec) -> Result<Box<dyn Input>, ConfigError> {
    let (listener, config) = config::read(spec)?;
    // The files are read and checked now, so that `sluice validate` reports them.
    let tls = listener.server_tls(spec)?;
    Ok(Box::new(Beats { listener, config, tls }))
}

#[async_trait]
impl Input for Beats {
    async fn run(self: Box<Self>, ctx: InputContext) -> Result<(), InputError> {
        let socket = ctx.listen_tcp(&self.listener.address).await?;
        serve(self.listener, self.config, self.tls, socket, ctx).await
    }

    fn listens(&self) -> bool {
        true
    }
}

/// The input's own figures, at `/metrics` as `sluice_component_<name>` and in `/stats`.
#[derive(Debug, Default)]
pub(crate) struct Figures {
    pub connections_open: AtomicU64,
    pub connections: Counter,
    pub windows: Counter,
    pub acks: Counter,
    pub keepalives: Counter,
    pub protocol_errors: Counter,
    pub write_timeouts: Counter,
}

impl Publish for Figures {
    fn figures(&self) -> Vec<Figure> {
        let f = |name, help, counter: bool, value| {
            if counter { Spec::counter(name, help) } else { Spec::gauge(name, help) }.value(value)
        };
        vec![
            f(
                "beats_connections_open",
                "Client connections the beats input holds open now.",
                false,
                self.connections_open.load(Ordering::Relaxed),
            ),
            f("beats_connections_total", "Client connections the beats input accepted.", true, self.connections.get()),
            f("beats_windows_total", "Windows announced by beats clients.", true, self.windows.get()),
            f(
                "beats_acks_total",
                "ACKs sent to beats clients for events that reached the ack point (whole windows and parts).",
                true,
                self.acks.get(),
            ),
            f(
                "beats_keepalives_total",
                "Keep-alive ACKs sent to beats clients while a window waited.",
                true,
                self.keepalives.get(),
            ),
            f(
                "beats_protocol_errors_total",
                "Beats connections closed because the client broke the protocol or a limit.",
                true,
                self.protocol_errors.get(),
            ),
            f(
                "beats_write_timeouts_total",
                "Beats connections closed because the client did not read its ACKs within write_timeout.",
                true,
                self.write_timeouts.get(),
            ),
        ]
    }
}

/// Counts an open connection while it lives.
pub(crate) struct OpenConnection(Arc<Figures>);

impl OpenConnection {
    pub fn new(figures: &Arc<Figures>) -> OpenConnection {
        figures.connections.add(1);
        figures.connections_open.fetch_add(1, Ordering::Relaxed);
        OpenConnection(figures.clone())
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.connections_open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What every connection task shares.
pub(crate) struct Shared {
    pub ctx: InputContext,
    pub limits: protocol::Limits,
    pub keepalive: Duration,
    pub write_timeout: Duration,
    /// The memory a slice of events (one batch) is cut at: a quarter of the budget at most.
    pub slice: usize,
    pub tls: Option<Arc<ServerTls>>,
    pub figures: Arc<Figures>,
    /// When a write timeout was last logged (at most once per 10 s).
    pub write_timeout_logged: parking_lot::Mutex<Option<tokio::time::Instant>>,
    /// TLS handshake refusals, logged at most once per 10 s per reason.
    pub handshakes: crate::limits::HandshakeLog,
}

/// Accepts connections on `listener` until shutdown, then waits for the connection tasks.
async fn serve(
    keys: Listener,
    config: BeatsConfig,
    tls: Option<Arc<ServerTls>>,
    listener: TcpListener,
    ctx: InputContext,
) -> Result<(), InputError> {
    let local = listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| keys.address.clone());
    tracing::info!(pipeline = %ctx.pipeline, input = %ctx.id, address = %local, tls = tls.is_some(),
        "beats input listening");
    let figures = Arc::new(Figures::default());
    let _ = ctx.metrics.state.set(figures.clone());
    let (max_connections, idle_timeout) = (keys.max_connections, keys.idle_timeout);
    let shared = Arc::new(Shared {
        ctx: ctx.clone(),
        limits: protocol::Limits { max_frame: config.max_frame_bytes.as_usize(), max_window: config.max_window_size },
        keepalive: config.keepalive_interval.0,
        write_timeout: config.write_timeout.0,
        slice: connection::SLICE_BYTES.min(ctx.memory.limit() / 4),
        tls,
        figures,
        write_timeout_logged: parking_lot::Mutex::new(None),
        handshakes: Default::default(),
    });
    accept_connections(listener, max_connections, idle_timeout, &ctx, "beats", |stream, peer, activity| {
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        async move { connection::run(&shared, stream, peer, activity).await }
    })
    .await;
    Ok(())
}

/// What a connection adds to each event's `@metadata`: `ip_address`, and `tls_peer.subject`
/// when the client sent a certificate.
#[derive(Debug, Clone, Default)]
pub(crate) struct PeerMetadata {
    /// Made once per connection and shared: an event that arrives without `@metadata` (as the
    /// documents of most clients but Beats do) gets a handle to it, not a map of its own; a
    /// processor that changes it copies it first.
    fields: Map,
}

impl PeerMetadata {
    pub fn new(ip_address: Option<&str>, tls_subject: Option<&str>) -> PeerMetadata {
        let mut fields = Map::with_capacity(2);
        if let Some(ip) = ip_address {
            fields.push_unchecked("ip_address", Value::from(ip));
        }
        if let Some(subject) = tls_subject {
            let mut tls = Map::with_capacity(1);
            tls.push_unchecked("subject", Value::from(subject));
            // Shared too: a Beat's own @metadata gets a handle to it, not a copy per event.
            fields.push_unchecked("tls_peer", Value::Object(tls.shared()));
        }
        PeerMetadata { fields: fields.shared() }
    }

    /// The same fields, shared on reference counts of their own (see `Map::reshared`): one copy
    /// per read's batch keeps the count that every event's handle touches off the threads
    /// dropping the previous batch's events.
    pub fn reshared(&self) -> PeerMetadata {
        PeerMetadata { fields: self.fields.reshared() }
    }

    /// Adds what the event's own `@metadata` does not have already.
    fn add_to(&self, meta: &mut Map) {
        for (key, value) in self.fields.iter() {
            if !meta.contains_key(key.as_str()) {
                meta.push_unchecked(key.clone(), value.clone());
            }
        }
    }
}

/// One data frame's JSON document as an event stamped `now` unless it has its own
/// `@timestamp`; whether the document was a JSON object.
///
/// `@timestamp` and `@metadata` are found in one pass over the document's fields and changed in
/// place: this runs once per event on the connection's task, which is what bounds a client's rate.
pub(crate) fn decode_event(payload: &[u8], now: i64, peer: &PeerMetadata) -> (Event, Decoded) {
    let Some(mut fields) = json_object(payload) else {
        let (mut event, decoded) = Codec::JsonLines.decode(payload, false, now);
        if !peer.fields.is_empty() {
            peer.add_to(event.metadata_mut());
        }
        return (event, decoded);
    };
    let (mut has_timestamp, mut has_metadata, mut bad_timestamp) = (false, false, false);
    for (key, value) in fields.iter_mut() {
        let key = key.as_str();
        if !key.starts_with('@') {
            continue;
        }
        if key == TIMESTAMP {
            has_timestamp = true;
            match crate::codec::parse_timestamp(value) {
                Some(ns) => *value = Value::Timestamp(ns),
                None => bad_timestamp = true,
            }
        } else if key == METADATA {
            has_metadata = true;
            match value {
                Value::Object(meta) => peer.add_to(meta),
                // Not an object: replaced, as `Event::metadata_mut` does.
                other => *other = Value::Object(peer.fields.clone()),
            }
        }
    }
    if !has_timestamp {
        fields.push_unchecked(TIMESTAMP, Value::Timestamp(now));
    }
    if !has_metadata && !peer.fields.is_empty() {
        fields.push_unchecked(METADATA, Value::Object(peer.fields.clone()));
    }
    let mut event = Event::new(fields);
    if bad_timestamp {
        // Kept under another name, and the event stamped and tagged.
        if let Some(original) = event.fields.remove(TIMESTAMP) {
            event.fields.insert("_@timestamp", original);
        }
        event.set_timestamp_nanos(now);
        event.add_tag(TAG_TIMESTAMP_FAILURE);
    }
    (event, Decoded::Ok)
}

/// Decodes `bytes` as a client's stream the way a connection does (frames, compressed blocks,
/// events), without a socket: for fuzz targets. The number of events and whether the stream
/// was refused. Never panics, and allocates nothing a frame header announced before checking it.
#[doc(hidden)]
pub fn decode_for_fuzzing(bytes: &[u8]) -> (usize, bool) {
    let limits = protocol::Limits { max_frame: 1 << 20, max_window: 4096 };
    let peer = PeerMetadata::default();
    let (mut at, mut events) = (0, 0);
    let (mut blocks, mut docs) = (Vec::new(), Vec::new());
    loop {
        docs.clear();
        blocks.clear();
        let len = match protocol::parse_frame(&bytes[at..], &limits) {
            Ok(None) => return (events, false),
            Err(_) => return (events, true),
            Ok(Some((protocol::FrameAt::Window(_), len))) => len,
            Ok(Some((protocol::FrameAt::Json { seq, payload }, len))) => {
                docs.push(protocol::DocAt { seq, block: None, range: at + payload.start..at + payload.end });
                len
            }
            Ok(Some((protocol::FrameAt::Compressed(payload), len))) => {
                let block = &bytes[at + payload.start..at + payload.end];
                if protocol::expand_compressed(block, &limits, &mut blocks, &mut docs).is_err() {
                    return (events, true);
                }
                len
            }
        };
        for doc in &docs {
            let _ = decode_event(doc.bytes(bytes, &blocks), 0, &peer);
            events += 1;
        }
        at += len;
    }
}
