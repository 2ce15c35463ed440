//! One client connection: the TLS handshake, then a reader and a writer side by side.
//!
//! The reader reads what the client sends, a read at a time: it charges the read to the memory
//! budget, cuts the complete frames off it, inflates compressed ones, charges the events it
//! will make before it decodes them, and sends them to the queue as one batch whose
//! acknowledgement holds one acker per window part in it ([`super::window`]). The writer sends
//! the ACKs as they become due, in window order, and a keep-alive when it has written nothing
//! for `keepalive_interval` while a window is open.
//!
//! Guarantees:
//! - a protocol error or a limit closes the connection at once, with a warning naming the peer
//!   and the reason; nothing of the frame at fault is allocated;
//! - `idle_timeout` runs only while the server owes the client nothing (no window fully
//!   received and waiting for its ACK): a client waiting on a slow pipeline is never cut off,
//!   one that stops in the middle of a window is;
//! - on shutdown, or when the client closes, the reader stops; the writer still sends the ACKs
//!   of windows already fully received as they become due, for at most [`GRACE`], then the
//!   connection closes. What is not ACKed by then the client sends again;
//! - once a batch is abandoned before the ack point, the connection closes without another
//!   ACK.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use sluice_core::value::now_nanos;
use sluice_core::{AckSet, Batch, MemoryCharge};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::protocol::{self, DocAt, FrameAt};
use super::window::{WindowId, Windows};
use super::{OpenConnection, PeerMetadata, Shared, decode_event};
use crate::admission;
use crate::codec::Decoded;
use crate::limits::{self, Activity};

/// Bytes asked of the socket at a time (more only to finish a larger frame).
const READ_SIZE: usize = 256 << 10;
/// How long a connection that stopped reading still waits to send the ACKs it owes.
pub const GRACE: Duration = Duration::from_secs(5);
/// How long one write of ACKs may take before the client is given up on.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the reader stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The client closed its side.
    Closed,
    /// The input is shutting down.
    Shutdown,
    /// A protocol error, a read or write error: close now.
    Failed,
}

struct Conn<'a> {
    shared: &'a Shared,
    peer: SocketAddr,
    windows: Arc<Windows>,
    activity: Arc<Activity>,
    /// Cancelled when the connection must close now.
    stop: CancellationToken,
    ended: OnceLock<End>,
    /// The reader waits on the client.
    reading: AtomicBool,
}

/// Serves one client until it closes, breaks the protocol, times out, or shutdown.
pub(super) async fn run(shared: &Shared, tcp: TcpStream, peer: SocketAddr, activity: Arc<Activity>) {
    let ctx = &shared.ctx;
    let _open = OpenConnection::new(&shared.figures);
    let stream = match limits::tls_handshake(shared.tls.as_ref(), tcp, &activity, &ctx.shutdown).await {
        Ok(s) => s,
        Err(why) => {
            ctx.metrics.refused.add(1);
            tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %peer,
                "beats input refused a connection from {peer}: {why}");
            return;
        }
    };
    let meta = PeerMetadata::new(Some(&peer.ip().to_string()), stream.peer_certificate_subject().as_deref());
    tracing::debug!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %peer, "beats connection opened");
    let (rd, wr) = tokio::io::split(stream);
    let conn = Conn {
        shared,
        peer,
        windows: Windows::new(),
        activity,
        stop: CancellationToken::new(),
        ended: OnceLock::new(),
        reading: AtomicBool::new(false),
    };
    tokio::select! {
        _ = async { tokio::join!(conn.read_loop(rd, &meta), conn.write_loop(wr)) } => {}
        why = conn.activity.expired() => {
            ctx.metrics.refused.add(1);
            tracing::info!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %peer,
                open_windows = conn.windows.open_windows(), "beats input closed a connection that {why}");
        }
    }
    tracing::debug!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %peer, "beats connection closed");
}

/// The window whose events are arriving.
#[derive(Debug)]
struct Current {
    id: WindowId,
    expected: u32,
    received: u32,
    highest: u32,
    last: u32,
    increasing: bool,
}

/// A run of events of one window within a batch.
#[derive(Debug)]
struct Group {
    window: WindowId,
    events: u32,
    through: u32,
    increasing: bool,
}

/// What one read's complete frames hold. Kept from one round to the next, for its allocations.
#[derive(Default)]
struct Round {
    /// Where each event's document is, in order.
    docs: Vec<DocAt>,
    /// The documents of the compressed frame being expanded, before they join `docs`.
    inner: Vec<DocAt>,
    /// Inflated compressed frames, which `docs` may point into.
    blocks: Vec<Vec<u8>>,
    groups: Vec<Group>,
    /// What the inflated blocks are charged.
    inflated: MemoryCharge,
    /// A window's last event is in this round: its client now waits for the ACK.
    completes_window: bool,
}

impl Round {
    fn clear(&mut self) {
        self.docs.clear();
        self.blocks.clear();
        self.groups.clear();
        self.inflated = MemoryCharge::default();
        self.completes_window = false;
    }

    fn event(&mut self, current: &mut Option<Current>, doc: DocAt) -> Result<(), String> {
        let Some(c) = current.as_mut() else {
            return Err("a data frame came before any window frame".to_string());
        };
        if c.received == c.expected {
            return Err(format!("more data frames came than the {} events its window announced", c.expected));
        }
        let seq = doc.seq;
        c.received += 1;
        self.completes_window |= c.received == c.expected;
        c.increasing &= seq > c.last;
        c.last = seq;
        c.highest = c.highest.max(seq);
        match self.groups.last_mut() {
            Some(g) if g.window == c.id => {
                g.events += 1;
                g.through = c.highest;
                g.increasing = c.increasing;
            }
            _ => self.groups.push(Group { window: c.id, events: 1, through: c.highest, increasing: c.increasing }),
        }
        self.docs.push(doc);
        Ok(())
    }
}

impl Conn<'_> {
    async fn read_loop<R: AsyncRead + Unpin>(&self, rd: R, meta: &PeerMetadata) {
        let end = self.read(rd, meta).await;
        let _ = self.ended.set(end);
        if end == End::Failed {
            self.stop.cancel();
        }
        self.windows.poke();
    }

    /// Waits for `bytes` of the memory budget; `Err` when the connection must end first.
    async fn reserve(&self, bytes: usize) -> Result<MemoryCharge, End> {
        tokio::select! {
            biased;
            _ = self.stop.cancelled() => Err(End::Failed),
            c = self.shared.ctx.reserve(bytes) => c.ok_or(End::Shutdown),
        }
    }

    async fn read<R: AsyncRead + Unpin>(&self, mut rd: R, meta: &PeerMetadata) -> End {
        let ctx = &self.shared.ctx;
        let mut buf = BytesMut::new();
        // What the bytes held in `buf` are charged.
        let mut held = ctx.memory.empty();
        let mut current: Option<Current> = None;
        let mut failed_logged = false;
        let mut round = Round::default();
        loop {
            // Room for one more read, charged first. Toward a large frame (its length checked
            // against max_frame_bytes when its header came) the buffer doubles, so that a slow
            // client holds about what it has sent, and a large frame is not copied over and over.
            let need = protocol::frame_len(&buf).map_or(0, |len| len.saturating_sub(buf.len()));
            let target = buf.len() + need.min(buf.len()).max(READ_SIZE);
            if target > held.bytes() {
                match self.reserve(target - held.bytes()).await {
                    Ok(more) => held.merge(more),
                    Err(end) => return end,
                }
            }
            buf.reserve(target - buf.len());
            // Waiting on the client: idle time counts unless a window waits for its ACK.
            self.reading.store(true, Ordering::Release);
            if self.windows.owed() == 0 {
                self.activity.request_finished();
            } else {
                self.activity.body_received();
            }
            let read = tokio::select! {
                biased;
                _ = self.stop.cancelled() => return End::Failed,
                _ = ctx.shutdown.cancelled() => return End::Shutdown,
                r = rd.read_buf(&mut buf) => r,
            };
            self.reading.store(false, Ordering::Release);
            self.activity.body_received();
            match read {
                Ok(0) => {
                    if !buf.is_empty() || current.as_ref().is_some_and(|c| c.received < c.expected) {
                        tracing::debug!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %self.peer,
                            "beats client closed its connection in the middle of a window; it sends it again");
                    }
                    return End::Closed;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %self.peer, error = %e,
                        "beats connection read failed");
                    return End::Failed;
                }
            }
            match self.round(&mut buf, &mut current, meta, &mut round).await {
                Ok(failed) if failed > 0 && !failed_logged => {
                    failed_logged = true;
                    tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %self.peer,
                        "a document from this beats client is not a JSON object: kept in `message`, tagged \
                         _jsonparsefailure (logged once per connection)");
                }
                Ok(_) => {}
                Err(end) => return end,
            }
            held.shrink_to(buf.len());
        }
    }

    /// Logs and counts a protocol error; the connection closes.
    fn protocol_error(&self, why: impl std::fmt::Display, limit: bool) -> End {
        let ctx = &self.shared.ctx;
        self.shared.figures.protocol_errors.add(1);
        if limit {
            ctx.metrics.refused.add(1);
        }
        tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %self.peer,
            "beats input closed the connection of {}: {why}", self.peer);
        End::Failed
    }

    /// Decodes the complete frames in `buf` and sends their events as one batch; the number of
    /// documents that were not JSON objects. The frames are found first (their headers only),
    /// then the events' memory is charged, then each document is decoded where it lies.
    async fn round(
        &self,
        buf: &mut BytesMut,
        current: &mut Option<Current>,
        meta: &PeerMetadata,
        round: &mut Round,
    ) -> Result<u64, End> {
        let ctx = &self.shared.ctx;
        let limits = &self.shared.limits;
        round.clear();
        let mut at = 0;
        loop {
            let (frame, len) = match protocol::parse_frame(&buf[at..], limits) {
                Ok(Some(f)) => f,
                Ok(None) => break,
                Err(e) => return Err(self.protocol_error(&e, e.is_limit())),
            };
            match frame {
                FrameAt::Window(n) => {
                    if let Some(c) = current.as_ref()
                        && c.received < c.expected
                    {
                        let why = format!(
                            "a new window began after {} of the {} events of the one before",
                            c.received, c.expected
                        );
                        return Err(self.protocol_error(why, false));
                    }
                    self.shared.figures.windows.add(1);
                    let id = self.windows.open(n);
                    *current = Some(Current { id, expected: n, received: 0, highest: 0, last: 0, increasing: true });
                }
                FrameAt::Json { seq, payload } => {
                    let doc = DocAt { seq, block: None, range: at + payload.start..at + payload.end };
                    round.event(current, doc).map_err(|why| self.protocol_error(why, false))?;
                }
                FrameAt::Compressed(payload) => {
                    let block = &buf[at + payload.start..at + payload.end];
                    // Charged before inflating: an estimate, trued up to what it inflated to.
                    let mut charge = self.reserve((block.len() * 4).min(limits.max_frame)).await?;
                    round.inner.clear();
                    let inflated = protocol::expand_compressed(block, limits, &mut round.blocks, &mut round.inner)
                        .map_err(|e| self.protocol_error(&e, e.is_limit()))?;
                    charge.true_up(inflated);
                    round.inflated.merge(charge);
                    for i in 0..round.inner.len() {
                        let doc = round.inner[i].clone();
                        round.event(current, doc).map_err(|why| self.protocol_error(why, false))?;
                    }
                }
            }
            at += len;
        }
        if round.docs.is_empty() {
            buf.advance(at);
            return Ok(0);
        }
        let bytes: usize = round.docs.iter().map(|d| d.range.len()).sum();
        let estimate = 2 * bytes + round.docs.len() * admission::line_event_bytes();
        let mut charge = self.reserve(estimate).await?;
        let now = now_nanos();
        let meta = meta.reshared();
        let mut failed = 0u64;
        let events: Vec<_> = round
            .docs
            .iter()
            .map(|doc| {
                let (event, decoded) = decode_event(doc.bytes(buf, &round.blocks), now, &meta);
                failed += u64::from(decoded == Decoded::Failed);
                event
            })
            .collect();
        // The events own their text: the frames' bytes and the inflated blocks can go.
        buf.advance(at);
        round.blocks.clear();
        round.inflated = MemoryCharge::default();
        charge.true_up(admission::measure_each(&events, 0));
        if failed > 0 {
            ctx.metrics.failed.add(failed);
        }
        let mut acks = AckSet::none();
        for g in round.groups.drain(..) {
            let acker = self.windows.part(g.window, g.events, g.through, g.increasing);
            acks.append(AckSet::single(acker, g.events as usize));
        }
        // The writer counts keep-alives from now for a window that just became whole.
        self.windows.poke();
        let mut batch = Batch::new(events, acks, bytes).with_memory(charge);
        if round.completes_window {
            // The client sends nothing more of that window until its ACK: no worker should hold
            // these events back for a fuller batch (a Filebeat keeps only 2 windows out).
            batch = batch.awaited();
        }
        tokio::select! {
            biased;
            _ = self.stop.cancelled() => Err(End::Failed),
            r = ctx.send(batch) => match r {
                Ok(()) => Ok(failed),
                Err(_) => Err(End::Shutdown),
            },
        }
    }

    async fn write_loop<W: AsyncWrite + Unpin>(&self, mut wr: W) {
        let ctx = &self.shared.ctx;
        let figures = &self.shared.figures;
        let mut last_write = Instant::now();
        let mut grace: Option<Instant> = None;
        let mut was_owed = false;
        let mut out = Vec::with_capacity(64);
        loop {
            let due = self.windows.due();
            if !due.acks.is_empty() {
                out.clear();
                due.acks.iter().for_each(|seq| out.extend_from_slice(&protocol::ack(*seq)));
                if !self.write(&mut wr, &out).await {
                    return;
                }
                figures.acks.add(due.acks.len() as u64);
                last_write = Instant::now();
            }
            if self.windows.abandoned() {
                tracing::debug!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %self.peer,
                    "beats events were abandoned before the ack point; closing so that the client sends them again");
                self.stop.cancel();
                return;
            }
            let owed = self.windows.owed();
            if owed == 0 && was_owed && self.reading.load(Ordering::Acquire) {
                // Owed nothing any more while the reader waits on the client: idle from now.
                self.activity.request_finished();
            }
            was_owed = owed > 0;
            match self.ended.get() {
                Some(End::Failed) => return,
                Some(_) if owed == 0 => {
                    let _ = tokio::time::timeout(Duration::from_secs(1), wr.shutdown()).await;
                    return;
                }
                Some(_) => {
                    grace.get_or_insert_with(|| Instant::now() + GRACE);
                }
                None => {}
            }
            let keepalive = self.windows.keepalive();
            if keepalive.is_none() {
                // Keep-alives count from when a window opens, not from the last ACK before it.
                last_write = Instant::now();
            }
            tokio::select! {
                _ = self.windows.changed() => {}
                _ = self.stop.cancelled() => return,
                _ = tokio::time::sleep_until(last_write + self.shared.keepalive), if keepalive.is_some() => {
                    let seq = keepalive.unwrap_or(0);
                    if !self.write(&mut wr, &protocol::ack(seq)).await {
                        return;
                    }
                    figures.keepalives.add(1);
                    last_write = Instant::now();
                }
                _ = tokio::time::sleep_until(grace.unwrap_or_else(Instant::now)), if grace.is_some() => {
                    tracing::debug!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %self.peer, owed,
                        "beats connection closing with windows not yet ACKed; the client sends them again");
                    return;
                }
            }
        }
    }

    /// Writes ACK frames; false (and the connection told to close) if that fails.
    async fn write<W: AsyncWrite + Unpin>(&self, wr: &mut W, bytes: &[u8]) -> bool {
        let r = tokio::time::timeout(WRITE_TIMEOUT, async {
            wr.write_all(bytes).await?;
            wr.flush().await
        })
        .await;
        let error = match r {
            Ok(Ok(())) => return true,
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("the client did not read its ACKs for {WRITE_TIMEOUT:?}"),
        };
        let ctx = &self.shared.ctx;
        tracing::debug!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %self.peer, error = %error,
            "beats connection write failed");
        self.stop.cancel();
        false
    }
}
