//! `tcp` input: newline-delimited text or JSON from any number of TCP clients.
//!
//! Every connection runs in a task of its own. A task reads up to `read_buffer` bytes at a time
//! into a buffer from the input's pool, frames the bytes with a [`LineFramer`] and decodes each
//! line with the configured [`Codec`]; everything decoded from one read goes to the queue as one
//! batch, with one clock reading. A text line's `message` points into the read's buffer (see
//! [`SharedText`]), which goes back to the pool once every event made from it is finished. The
//! fast path therefore makes one allocation per line (the event itself), copies no line, and
//! makes no system call per line; a full queue stops the reads, so backpressure reaches the
//! client through TCP flow control.
//!
//! Guarantees and limits:
//! - Lines longer than `max_line_bytes` are cut, tagged `_line_truncated` and passed on; the
//!   rest of the line is skipped. The first one on a connection is logged at warn, and the count
//!   is logged again when the connection closes.
//! - With `codec: json_lines`, a line that is not a JSON object is kept in `message`, tagged
//!   `_jsonparsefailure` and counted as failed.
//! - With `max_connections` open, a new connection makes room by evicting the one that has waited
//!   for its client the longest (see [`crate::limits`]): never one not yet read or with bytes
//!   unread, and an evicted one reads what its client still sends until it closes or pauses
//!   ([`crate::limits::StreamReader`]), so an eviction loses no byte already sent unless the
//!   client keeps sending for [`crate::limits::EVICTION_LINGER`]. When none can be evicted, the
//!   new one waits up to [`WAIT_FOR_ROOM`] for a place, then is closed with a warning naming the
//!   peer. A connection that sends nothing for `idle_timeout` is closed. Evictions, bytes
//!   discarded at them and connections reset by their client are counted at `/metrics`.
//! - On shutdown the input stops accepting, and each connection pushes what it has already read
//!   (an unterminated last line included) and closes. An unterminated line at end of stream is
//!   also passed on.
//! - With `tls:`, each connection's handshake runs in its own task, bounded by
//!   [`crate::limits::TLS_HANDSHAKE_TIMEOUT`]; a failed one is logged with the peer and the
//!   reason and counted as refused. Certificates are re-read on SIGHUP. The server sends no
//!   session tickets, so a client that writes and closes without reading leaves nothing unread
//!   and its close is no reset.
//! - There are no acknowledgements: TCP clients cannot be told what was delivered.

mod config;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::BufMut;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::value::now_nanos;
use sluice_core::{Batch, Event, SharedText, Str, TextPool, Value};
use sluice_tls::ServerTls;
use tokio::net::{TcpListener, TcpStream};

use crate::admission;
use crate::codec::Decoded;
use crate::framing::{Line, LineFramer};
use crate::limits::{
    Activity, ConnectionFigures, ConnectionSlots, HandshakeLog, Step, StreamReader, WatchedIo, serve_connections,
    tls_handshake,
};
use crate::listener::Listener;
use crate::{Input, InputContext, InputError};
use config::TcpConfig;

struct Tcp {
    listener: Listener,
    config: TcpConfig,
    tls: Option<Arc<ServerTls>>,
}

pub(crate) fn build(spec: &ComponentSpec) -> Result<Box<dyn Input>, ConfigError> {
    let (listener, config) = config::read(spec)?;
    let tls = listener.server_tls(spec)?;
    Ok(Box::new(Tcp { listener, config, tls }))
}

#[async_trait]
impl Input for Tcp {
    async fn run(self: Box<Self>, ctx: InputContext) -> Result<(), InputError> {
        let socket = ctx.listen_tcp(&self.listener.address).await?;
        serve(self.listener, self.config, self.tls, socket, ctx).await
    }

    fn listens(&self) -> bool {
        true
    }
}

/// What every connection task shares.
struct Shared {
    config: TcpConfig,
    tls: Option<Arc<ServerTls>>,
    ctx: InputContext,
    /// Read buffers, back once the events sharing them are finished.
    texts: Arc<TextPool>,
    figures: Arc<ConnectionFigures>,
    handshakes: HandshakeLog,
}

/// Read buffers the input keeps for reuse, whatever the number of connections: about a full
/// memory queue's worth at the default `read_buffer`. A buffer is kept only up to twice
/// `read_buffer`, and only while the memory budget has room for it: kept buffers are charged
/// (after a flood, 64 idle buffers were 16 MiB the budget did not see).
const TEXTS_KEPT: usize = 64;

/// How long a new connection waits for a slot when every open one is busy queueing what it
/// read (or still has bytes unread), before it is closed: meanwhile the others wait in the
/// listen backlog with their bytes.
pub(crate) const WAIT_FOR_ROOM: Duration = Duration::from_secs(5);

/// Accepts connections on `listener` until shutdown, then waits for the connection tasks.
async fn serve(
    keys: Listener,
    config: TcpConfig,
    tls: Option<Arc<ServerTls>>,
    listener: TcpListener,
    ctx: InputContext,
) -> Result<(), InputError> {
    let local = listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| keys.address.clone());
    tracing::info!(pipeline = %ctx.pipeline, input = %ctx.id, address = %local, tls = tls.is_some(), "tcp input listening");
    let (max_connections, idle_timeout) = (keys.max_connections, keys.idle_timeout);
    let texts = TextPool::charged(TEXTS_KEPT, config.read_buffer.as_usize() * 2, &ctx.memory);
    let figures = Arc::new(ConnectionFigures::default());
    let _ = ctx.metrics.state.set(figures.clone());
    let slots = ConnectionSlots::counted_in(max_connections, figures.clone());
    let shared =
        Arc::new(Shared { config, tls, ctx: ctx.clone(), texts, figures, handshakes: HandshakeLog::default() });
    serve_connections(listener, &slots, idle_timeout, WAIT_FOR_ROOM, &ctx, "tcp", |stream, peer, activity| {
        let shared = shared.clone();
        async move { connection(&shared, stream, peer, &activity).await }
    })
    .await;
    Ok(())
}

/// Reads one client until it closes, fails, or shutdown is asked.
async fn connection(shared: &Shared, stream: TcpStream, peer: SocketAddr, activity: &Arc<Activity>) {
    let ctx = &shared.ctx;
    let stream = WatchedIo::new(stream, activity.clone());
    let mut stream = match tls_handshake(shared.tls.as_ref(), stream, activity, &ctx.shutdown).await {
        Ok(stream) => stream,
        Err(why) => {
            ctx.metrics.refused.add(1);
            shared.handshakes.refused(ctx, "tcp", peer, &why);
            return;
        }
    };
    let config = &shared.config;
    let codec = config.codec;
    let peer_value = config.peer_field.as_ref().map(|p| (p, Str::from(peer.to_string())));
    let mut framer = LineFramer::new(config.max_line_bytes.as_usize());
    let read_buffer = config.read_buffer.as_usize();
    let mut truncated = 0u64;
    // Sizes the next batch's vector like the last one, so it is allocated once per read.
    let mut expect = 64usize;
    let mut reader = StreamReader::new(ctx, "tcp", peer, activity, &shared.figures);
    tracing::debug!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %peer, "tcp connection opened");
    loop {
        // Room for exactly `read_buffer` bytes, so that a read never grows the buffer.
        let mut buf = shared.texts.take(read_buffer);
        let mut room = (&mut buf).limit(read_buffer);
        let (n, end) = match reader.read(&mut stream, &mut room).await {
            Step::Read(n) => (n, false),
            Step::End => (0, true),
        };
        // Room in the memory budget before decoding: the read's bytes and an event per line.
        let estimate = admission::estimate(codec, n, admission::count_lines(&buf[..n]));
        let Some(mut charge) = ctx.reserve(estimate).await else {
            break;
        };
        let text = SharedText::pooled(buf, &shared.texts);
        let ts = now_nanos();
        let mut events: Vec<Event> = Vec::with_capacity(expect);
        let mut bytes = 0;
        let mut failed = 0u64;
        let before = truncated;
        let mut take = |line: Line<'_>| {
            bytes += line.bytes.len() + 1;
            truncated += u64::from(line.truncated);
            let (mut event, decoded) = codec.decode_in(&text, line.bytes, line.truncated, ts);
            failed += u64::from(decoded == Decoded::Failed);
            if let Some((path, value)) = &peer_value {
                let _ = event.insert(path, Value::String(value.clone()));
            }
            events.push(event);
        };
        if end {
            framer.finish(&mut take);
        } else {
            framer.feed(&text.as_bytes()[..n], &mut take);
        }
        if before == 0 && truncated > 0 {
            tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %peer, max_line_bytes = config.max_line_bytes.0,
                "a line from this tcp client was longer than max_line_bytes and was cut (tagged _line_truncated); \
                 the count for the connection is logged when it closes");
        }
        if failed > 0 {
            ctx.metrics.failed.add(failed);
        }
        if !events.is_empty() {
            expect = events.len().next_power_of_two();
            charge.true_up(admission::measure(codec, &events, n));
            if ctx.send(Batch::untracked(events, bytes).with_memory(charge)).await.is_err() {
                break;
            }
        }
        if end {
            break;
        }
    }
    if truncated > 0 {
        tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %peer, lines = truncated,
            max_line_bytes = config.max_line_bytes.0, "tcp connection closed; lines cut to max_line_bytes");
    }
    tracing::debug!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %peer, "tcp connection closed");
}

#[cfg(test)]
pub(crate) mod tests;
