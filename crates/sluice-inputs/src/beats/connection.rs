//! One client connection: the TLS handshake, then a reader and a writer side by side.
//!
//! The reader reads what the client sends, a read at a time (counted in the input's
//! `bytes_in` as sent: compressed frames compressed), cuts the complete frames off it,
//! inflates compressed ones a step at a time ([`protocol::Inflater`]), and sends the events to
//! the queue in slices of about [`SLICE_BYTES`] of memory, each a batch whose acknowledgement
//! holds one acker per window part in it ([`super::window`]). The writer sends the ACKs as they
//! become due, in window order, and a keep-alive when it has written nothing for
//! `keepalive_interval` while a window is open.
//!
//! Memory: the connection charges the node's budget for what it is about to hold — its read
//! buffer, the inflated bytes not yet decoded, the next slice's events — before it holds it.
//! What it holds is bounded by one frame and a read, plus one inflating step or one data frame,
//! plus one slice, whatever the window's size. When what it needs is not free at once it gives
//! back all it holds and waits, holding nothing, in line for the total (as the http input
//! does): connections that each held part of the budget and waited for the rest would wedge
//! the node. Meanwhile its buffers stay allocated, so the process may hold that much more
//! than the budget per waiting connection. A need larger than the whole budget can never be
//! met and closes the connection with a warning saying so.
//!
//! Guarantees:
//! - a protocol error or a limit closes the connection at once, with a warning naming the peer
//!   and the reason; nothing of the frame at fault is allocated;
//! - `idle_timeout` runs only while the server owes the client nothing (no window fully
//!   received and waiting for its ACK): a client waiting on a slow pipeline is never cut off,
//!   one that stops in the middle of a window is;
//! - the reader stops reading while [`MAX_AWAITING`] windows wait for their ACK to be written,
//!   so a client that does not read its ACKs cannot make the server keep ever more windows;
//!   an ACK (or keep-alive) the client does not take within `write_timeout` closes the
//!   connection, counted in `beats_write_timeouts_total` and logged with the peer;
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
use sluice_config::ByteSize;
use sluice_core::value::now_nanos;
use sluice_core::{AckSet, Batch, MemoryCharge};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::protocol::{self, DocAt, FrameAt, Inflated, Inflater};
use super::window::{WindowId, Windows};
use super::{OpenConnection, PeerMetadata, Shared, decode_event};
use crate::admission;
use crate::codec::Decoded;
use crate::limits::{self, Activity};

/// Bytes asked of the socket at a time (more only to finish a larger frame).
const READ_SIZE: usize = 256 << 10;
/// Inflated bytes per step of a compressed frame (more only to finish a larger data frame).
const INFLATE_STEP: usize = 256 << 10;
/// The memory the events of one batch are estimated to take, at which the reader sends them
/// (a quarter of the budget if that is less; at least one event).
pub const SLICE_BYTES: usize = 4 << 20;
/// Windows a connection may have awaiting their ACK (opened, and the ACK not yet written)
/// before it reads no further. A Beat keeps a few windows out (Filebeat's `pipelining`: 2).
pub const MAX_AWAITING: usize = 256;
/// How long a connection that stopped reading still waits to send the ACKs it owes.
pub const GRACE: Duration = Duration::from_secs(5);

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
            shared.handshakes.refused(ctx, "beats", peer, &why);
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

/// The events decoded from the frames read so far and not yet sent: one batch to be. Kept from
/// one batch to the next, for its allocations.
#[derive(Default)]
struct Slice {
    /// Where each event's document is, in order.
    docs: Vec<DocAt>,
    /// The documents of the inflated block just handed out, before they join `docs`.
    inner: Vec<DocAt>,
    /// Inflated blocks of data frames, which `docs` may point into.
    blocks: Vec<Vec<u8>>,
    blocks_bytes: usize,
    doc_bytes: usize,
    groups: Vec<Group>,
    /// A window's last event is in this slice: its client now waits for the ACK.
    completes_window: bool,
}

impl Slice {
    /// What the slice's events are estimated to take once decoded.
    fn estimate(&self) -> usize {
        2 * self.doc_bytes + self.docs.len() * admission::line_event_bytes()
    }

    fn clear(&mut self) {
        self.docs.clear();
        self.blocks.clear();
        self.blocks_bytes = 0;
        self.doc_bytes = 0;
        self.groups.clear();
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
        self.doc_bytes += doc.range.len();
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

    /// Makes `mem` (what the connection holds of the memory budget) at least `total` bytes.
    /// When they are not free at once, gives back all of it and waits, holding nothing, in
    /// line for the total and a slice more (so that the next steps need not wait again). A
    /// total larger than the whole budget closes the connection.
    async fn ensure(&self, mem: &mut MemoryCharge, total: usize, what: &str) -> Result<(), End> {
        if total <= mem.bytes() {
            return Ok(());
        }
        let ctx = &self.shared.ctx;
        let limit = ctx.memory.limit();
        if total > limit {
            let why = format!(
                "{what} needs {} of memory, more than the node's whole memory budget ({}); raise memory.budget, or \
                 lower the client's batch size (a Beat's bulk_max_size) or this input's max_frame_bytes",
                ByteSize(total as u64),
                ByteSize(limit as u64)
            );
            return Err(self.protocol_error(why, true));
        }
        if mem.try_grow(total - mem.bytes()) {
            return Ok(());
        }
        mem.shrink_to(0);
        let want = (total + self.shared.slice + INFLATE_STEP).min(limit);
        tokio::select! {
            biased;
            _ = self.stop.cancelled() => Err(End::Failed),
            _ = ctx.shutdown.cancelled() => Err(End::Shutdown),
            r = mem.grow(want, limit, None) => r.map_err(|_| End::Failed),
        }
    }

    /// Waits until fewer than [`MAX_AWAITING`] windows await their ACK.
    async fn wait_for_room(&self) -> Result<(), End> {
        while self.windows.awaiting() >= MAX_AWAITING {
            tokio::select! {
                biased;
                _ = self.stop.cancelled() => return Err(End::Failed),
                _ = self.shared.ctx.shutdown.cancelled() => return Err(End::Shutdown),
                _ = self.windows.room_made() => {}
            }
        }
        Ok(())
    }

    async fn read<R: AsyncRead + Unpin>(&self, mut rd: R, meta: &PeerMetadata) -> End {
        let ctx = &self.shared.ctx;
        let mut buf = BytesMut::new();
        // What the connection holds of the budget: the bytes in `buf`, and while a read's
        // frames are decoded, the inflated bytes and the events of the next slice.
        let mut mem = ctx.memory.empty();
        let mut current: Option<Current> = None;
        let mut failed_logged = false;
        let mut slice = Slice::default();
        loop {
            // Room for one more read, charged first. Toward a large frame (its length checked
            // against max_frame_bytes when its header came) the buffer doubles, so that a slow
            // client holds about what it has sent, and a large frame is not copied over and over.
            let need = protocol::frame_len(&buf).map_or(0, |len| len.saturating_sub(buf.len()));
            let target = buf.len() + need.min(buf.len()).max(READ_SIZE);
            if let Err(end) = self.ensure(&mut mem, target, "a frame").await {
                return end;
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
                Ok(n) => ctx.metrics.bytes_in.add(n as u64),
                Err(e) => {
                    tracing::debug!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %self.peer, error = %e,
                        "beats connection read failed");
                    return End::Failed;
                }
            }
            match self.round(&mut buf, &mut current, meta, &mut slice, &mut mem).await {
                Ok(failed) if failed > 0 && !failed_logged => {
                    failed_logged = true;
                    tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %self.peer,
                        "a document from this beats client is not a JSON object: kept in `message`, tagged \
                         _jsonparsefailure (logged once per connection)");
                }
                Ok(_) => {}
                Err(end) => return end,
            }
            mem.shrink_to(buf.len());
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

    /// Decodes the complete frames in `buf` and sends their events, a slice at a time; the
    /// number of documents that were not JSON objects. The frames are found first (their
    /// headers only), compressed ones inflated a step at a time, and each slice's memory is
    /// charged before its documents are decoded where they lie.
    async fn round(
        &self,
        buf: &mut BytesMut,
        current: &mut Option<Current>,
        meta: &PeerMetadata,
        slice: &mut Slice,
        mem: &mut MemoryCharge,
    ) -> Result<u64, End> {
        let limits = &self.shared.limits;
        let mut failed = 0;
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
                    if self.windows.awaiting() >= MAX_AWAITING {
                        // The events read so far go first: their windows' ACKs are what is
                        // waited for.
                        failed += self.flush(buf, 0, meta, slice, mem).await?;
                        self.wait_for_room().await?;
                    }
                    self.shared.figures.windows.add(1);
                    let id = self.windows.open(n);
                    *current = Some(Current { id, expected: n, received: 0, highest: 0, last: 0, increasing: true });
                }
                FrameAt::Json { seq, payload } => {
                    let doc = DocAt { seq, block: None, range: at + payload.start..at + payload.end };
                    slice.event(current, doc).map_err(|why| self.protocol_error(why, false))?;
                    if slice.estimate() >= self.shared.slice {
                        failed += self.flush(buf, 0, meta, slice, mem).await?;
                    }
                }
                FrameAt::Compressed(payload) => {
                    let payload = at + payload.start..at + payload.end;
                    let mut inflater = Inflater::new(limits);
                    loop {
                        let held = buf.len() + slice.blocks_bytes + inflater.held();
                        self.ensure(mem, held + inflater.next_needs(INFLATE_STEP), "a compressed frame").await?;
                        let block = slice.blocks.len();
                        let inflated = inflater
                            .next(&buf[payload.clone()], INFLATE_STEP, &mut slice.inner, block)
                            .map_err(|e| self.protocol_error(&e, e.is_limit()))?;
                        match inflated {
                            Inflated::Done => break,
                            Inflated::More => {}
                            Inflated::Block(frames) => {
                                slice.blocks_bytes += frames.len();
                                slice.blocks.push(frames);
                                let mut inner = std::mem::take(&mut slice.inner);
                                for doc in inner.drain(..) {
                                    slice.event(current, doc).map_err(|why| self.protocol_error(why, false))?;
                                }
                                slice.inner = inner;
                                if slice.estimate() >= self.shared.slice {
                                    failed += self.flush(buf, inflater.held(), meta, slice, mem).await?;
                                }
                            }
                        }
                    }
                }
            }
            at += len;
        }
        failed += self.flush(buf, 0, meta, slice, mem).await?;
        buf.advance(at);
        Ok(failed)
    }

    /// Decodes the slice's documents and sends them as one batch, carrying their charge;
    /// `inflating` is what the compressed frame being read holds besides. The number of
    /// documents that were not JSON objects.
    async fn flush(
        &self,
        buf: &[u8],
        inflating: usize,
        meta: &PeerMetadata,
        slice: &mut Slice,
        mem: &mut MemoryCharge,
    ) -> Result<u64, End> {
        if slice.docs.is_empty() {
            return Ok(0);
        }
        let ctx = &self.shared.ctx;
        let estimate = slice.estimate();
        self.ensure(mem, buf.len() + slice.blocks_bytes + inflating + estimate, "a slice of events").await?;
        let now = now_nanos();
        let meta = meta.reshared();
        let mut failed = 0u64;
        let events: Vec<_> = slice
            .docs
            .iter()
            .map(|doc| {
                let (event, decoded) = decode_event(doc.bytes(buf, &slice.blocks), now, &meta);
                failed += u64::from(decoded == Decoded::Failed);
                event
            })
            .collect();
        let bytes = slice.doc_bytes;
        let completes_window = slice.completes_window;
        let mut acks = AckSet::none();
        for g in slice.groups.drain(..) {
            let acker = self.windows.part(g.window, g.events, g.through, g.increasing);
            acks.append(AckSet::single(acker, g.events as usize));
        }
        // The events own their text: the inflated blocks can go.
        slice.clear();
        let mut charge = mem.split_off(estimate);
        charge.true_up(admission::measure_each(&events, 0));
        mem.shrink_to(buf.len() + inflating);
        if failed > 0 {
            ctx.metrics.failed.add(failed);
        }
        // The writer counts keep-alives from now for a window that just became whole.
        self.windows.poke();
        let mut batch = Batch::new(events, acks, bytes).with_memory(charge);
        if completes_window {
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
                self.windows.written(due.windows_done);
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
        let timeout = self.shared.write_timeout;
        let r = tokio::time::timeout(timeout, async {
            wr.write_all(bytes).await?;
            wr.flush().await
        })
        .await;
        let ctx = &self.shared.ctx;
        match r {
            Ok(Ok(())) => return true,
            Ok(Err(e)) => {
                tracing::debug!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %self.peer, error = %e,
                    "beats connection write failed");
            }
            Err(_) => {
                self.shared.figures.write_timeouts.add(1);
                let mut logged = self.shared.write_timeout_logged.lock();
                if logged.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
                    *logged = Some(Instant::now());
                    tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %self.peer,
                        awaiting = self.windows.awaiting(),
                        "beats input closed the connection of {}: the client did not read its ACKs for write_timeout \
                         ({timeout:?}); it sends its windows again (logged at most once per 10 s; the count is \
                         sluice_component_beats_write_timeouts_total)", self.peer);
                }
            }
        }
        self.stop.cancel();
        false
    }
}
