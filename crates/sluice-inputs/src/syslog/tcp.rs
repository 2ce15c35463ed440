//! `syslog` over TCP (RFC 6587), optionally in TLS (RFC 5425): one task per connection.
//!
//! A task reads up to [`READ_BUFFER`] bytes at a time, frames them ([`SyslogFramer`]: octet
//! counting or newlines, detected from the connection's first byte), parses each message and
//! pushes everything from one read as one batch, so a full queue stops the reads and TCP flow
//! control slows the sender down.
//!
//! Guarantees and limits:
//! - Before it decodes a read, a connection takes room in the node's memory budget for it.
//! - A newline-framed message longer than `max_message_bytes` is cut and tagged
//!   `_line_truncated` (the first one per connection is logged). An octet-counted frame that
//!   announces more than `max_message_bytes` closes the connection with an error naming the
//!   peer (counted in `refused`): what follows it cannot be framed.
//! - `max_connections` and `idle_timeout` work as for the `tcp` input ([`crate::limits`]):
//!   a newcomer makes room by evicting the connection idle the longest, never one not yet read
//!   or with bytes unread, and the evicted one reads what its sender still sends until it
//!   closes or pauses; when none can be evicted, the newcomer waits for a place a while.
//! - With `tls:`, the handshake is bounded by [`crate::limits::TLS_HANDSHAKE_TIMEOUT`] and by the connection's
//!   own limits; a failed one is logged with the peer and counted in `refused`. A client's
//!   certificate subject, when it sent one, is in each event's `@metadata.tls_peer.subject`.
//! - On shutdown the input stops accepting; each connection pushes what it has read (an
//!   unterminated last message included) and closes.

use std::net::SocketAddr;
use std::sync::Arc;

use sluice_core::value::now_nanos;
use sluice_core::{Batch, Event, Str};
use sluice_tls::{ServerStream, ServerTls};
use tokio::net::{TcpListener, TcpStream};

use super::frame::{Frame, SyslogFramer};
use super::{Sender, Settings};
use crate::limits::{
    Activity, ConnectionFigures, ConnectionSlots, HandshakeLog, Step, StreamReader, WatchedIo, serve_connections,
    tls_handshake,
};
use crate::tcp::WAIT_FOR_ROOM;
use crate::{InputContext, InputError};

/// The most read (and turned into one batch) at once per connection.
pub(super) const READ_BUFFER: usize = 64 << 10;

struct Shared {
    settings: Settings,
    tls: Option<Arc<ServerTls>>,
    ctx: InputContext,
    figures: Arc<ConnectionFigures>,
    handshakes: HandshakeLog,
}

/// Accepts connections on `listener` until shutdown, then waits for the connection tasks.
pub(super) async fn serve(
    settings: Settings,
    tls: Option<Arc<ServerTls>>,
    listener: TcpListener,
    ctx: InputContext,
) -> Result<(), InputError> {
    let local = listener.local_addr().map(|a| a.to_string()).unwrap_or_else(|_| settings.address.clone());
    tracing::info!(pipeline = %ctx.pipeline, input = %ctx.id, address = %local, tls = tls.is_some(),
        max_connections = settings.max_connections, "syslog input listening on tcp");
    let (max_connections, idle_timeout) = (settings.max_connections, settings.idle_timeout);
    let figures = Arc::new(ConnectionFigures::default());
    let _ = ctx.metrics.state.set(figures.clone());
    let slots = ConnectionSlots::counted_in(max_connections, figures.clone());
    let shared = Arc::new(Shared { settings, tls, ctx: ctx.clone(), figures, handshakes: HandshakeLog::default() });
    serve_connections(listener, &slots, idle_timeout, WAIT_FOR_ROOM, &ctx, "syslog", |stream, peer, activity| {
        let shared = shared.clone();
        async move {
            if let Some(stream) = handshake(&shared, stream, peer, &activity).await {
                connection(&shared, stream, peer, &activity).await;
            }
        }
    })
    .await;
    Ok(())
}

/// The connection as a stream to read: as is, or after its TLS handshake. `None` (logged and
/// counted) when the handshake fails, is too slow, or the input stops first.
async fn handshake(
    shared: &Shared,
    stream: TcpStream,
    peer: SocketAddr,
    activity: &Arc<Activity>,
) -> Option<ServerStream<WatchedIo<TcpStream>>> {
    let ctx = &shared.ctx;
    let stream = WatchedIo::new(stream, activity.clone());
    match tls_handshake(shared.tls.as_ref(), stream, activity, &ctx.shutdown).await {
        Ok(stream) => Some(stream),
        Err(_) if ctx.shutdown.is_cancelled() => None,
        Err(why) => {
            ctx.metrics.refused.add(1);
            shared.handshakes.refused(ctx, "syslog", peer, &why);
            None
        }
    }
}

/// Reads one sender until it closes, fails, breaks the framing, or shutdown is asked.
async fn connection(
    shared: &Shared,
    mut stream: ServerStream<WatchedIo<TcpStream>>,
    peer: SocketAddr,
    activity: &Activity,
) {
    let ctx = &shared.ctx;
    let settings = &shared.settings;
    let sender = Sender {
        peer: settings.peer_field.as_ref().map(|_| Str::from(peer.to_string())),
        tls_subject: stream.peer_certificate_subject().map(Str::from),
    };
    let mut framer = SyslogFramer::new(settings.max_message_bytes);
    let mut buf = Vec::with_capacity(READ_BUFFER);
    let mut truncated = 0u64;
    let mut expect = 16usize;
    let mut reader = StreamReader::new(ctx, "syslog", peer, activity, &shared.figures);
    tracing::debug!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %peer, "syslog connection opened");
    loop {
        buf.clear();
        let (n, end) = match reader.read(&mut stream, &mut buf).await {
            Step::Read(n) => (n, false),
            Step::End => (0, true),
        };
        let data = &buf[..n];
        let messages = memchr::memchr_iter(b'\n', data).count() + 1 + n / 256;
        let Some(mut charge) = ctx.reserve(Settings::estimate(n + framer.pending(), messages)).await else {
            break;
        };
        let received = now_nanos();
        let mut broken = false;
        let mut events: Vec<Event> = Vec::with_capacity(expect);
        let mut bytes = 0;
        let mut failed = 0;
        let before = truncated;
        {
            // Decoded as they are framed: a frame borrows the read buffer or the framer.
            let mut take = |frame: Frame<'_>| {
                bytes += frame.bytes.len();
                truncated += u64::from(frame.truncated);
                failed += u64::from(settings.decode(frame.bytes, frame.truncated, &sender, received, &mut events));
            };
            let framed = if end {
                framer.finish(&mut take);
                Ok(())
            } else {
                framer.feed(data, &mut take)
            };
            if let Err(e) = framed {
                ctx.metrics.refused.add(1);
                tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %peer,
                    max_message_bytes = settings.max_message_bytes,
                    "syslog input closed a connection: {e}; the messages before it are kept");
                broken = true;
            }
        }
        if framer.take_fell_back() {
            tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %peer,
                "a syslog sender that began with octet counting sent a frame without a length; \
                 reading the rest of its connection as newline-framed");
        }
        if before == 0 && truncated > 0 {
            tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %peer, max_message_bytes = settings.max_message_bytes,
                "a syslog message from this sender was longer than max_message_bytes and was cut (tagged _line_truncated); \
                 the count for the connection is logged when it closes");
        }
        if failed > 0 {
            ctx.metrics.failed.add(failed);
        }
        if !events.is_empty() {
            expect = events.len().next_power_of_two();
            charge.true_up(crate::admission::measure_each(&events, 0));
            if ctx.send(Batch::untracked(events, bytes).with_memory(charge)).await.is_err() {
                break;
            }
        }
        if end || broken {
            break;
        }
    }
    if truncated > 0 {
        tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %peer, messages = truncated,
            max_message_bytes = settings.max_message_bytes, "syslog connection closed; messages cut to max_message_bytes");
    }
    tracing::debug!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %peer, framing = framer.framing().map_or("none", |f| f.as_str()),
        "syslog connection closed");
}
