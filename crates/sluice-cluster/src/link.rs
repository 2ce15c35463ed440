//! One peer link: the events this node forwards to one peer, and the connection that carries them.
//!
//! Workers hand the link encoded pieces ([`Piece`]) with the acknowledgements they stand for and
//! go on; they never wait for the peer's answer, only — when the link already holds
//! `max_in_flight` bytes — for room. A task per link keeps one connection open, coalesces
//! pieces into batch frames (up to `batch_bytes`, or once the oldest has waited
//! `batch_timeout`), pipelines them, and completes a frame's acknowledgements when the peer
//! answers that it has taken it (durably in its queue, or delivered). Until then every frame
//! is kept: on a lost connection, a timeout (`request_timeout`) or a "retry" answer it is sent
//! again, after a backoff. After `failures_before_down` failures in a row the peer is marked
//! down and probed until it answers; with `on_peer_failure: local` what the link holds (and
//! whatever comes while it is down) goes back to this node ([`Fallback`]). A link removed from
//! the ring hands everything it holds to the fallback to be routed again.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use sluice_core::{AckSet, Event, MemoryCharge};
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::{Compression, ForwardingConfig, PeerFailurePolicy};
use crate::frame::{self, Kind};
use crate::metrics::{PeerMetrics, PeerState};
use crate::transport::{Connector, split_stream};

/// Part of one worker batch bound for one peer, encoded.
#[derive(Debug)]
pub struct Piece {
    pub pipeline: Arc<str>,
    /// One `sluice_segment` batch encoding.
    pub body: Vec<u8>,
    pub events: u32,
    pub acks: AckSet,
    pub memory: MemoryCharge,
    pub enqueued: Instant,
    /// The fingerprint of the ring the piece was routed with (pieces of different rings are
    /// not put in one frame).
    pub ring: u64,
}

/// Events a link gives back, with the acknowledgements they hold.
#[derive(Debug)]
pub struct Returned {
    pub pipeline: Arc<str>,
    pub events: Vec<Event>,
    pub acks: AckSet,
}

/// Where a link sends what it cannot deliver: back to this node to be routed again (the peer
/// left the ring) or processed here (the peer is down and the policy is `local`).
pub trait Fallback: Send + Sync {
    fn reroute(&self, from: &str, returned: Vec<Returned>, down: bool);
}

struct Sent {
    pieces: Vec<Piece>,
    /// The whole frame, shared with the writer (no copy per send).
    frame: Arc<Vec<u8>>,
    bytes: usize,
    events: u64,
    sent_at: Instant,
    /// Set when the peer answered "retry": resend at this time.
    retry_at: Option<Instant>,
    /// The peer's last answer was "not taken: stopping".
    refused_stopping: bool,
}

#[derive(Default)]
struct LinkState {
    pending: VecDeque<Piece>,
    unacked: BTreeMap<u64, Sent>,
    next_seq: u64,
    /// Body bytes pending or unacknowledged.
    bytes: usize,
    /// Removed from the ring (or the node is stopping for good): take nothing more.
    closed: bool,
}

pub struct LinkSettings {
    pub node: String,
    pub cluster_name: String,
    pub forwarding: ForwardingConfig,
    pub policy: PeerFailurePolicy,
    pub connector: Connector,
}

pub struct PeerLink {
    pub name: String,
    settings: Arc<LinkSettings>,
    state: Mutex<LinkState>,
    /// Bytes were freed, or the link's state changed: waiting workers look again.
    room: Notify,
    /// Pieces were added, or answers arrived: the sender looks again.
    work: Notify,
    pub metrics: Arc<PeerMetrics>,
    /// Failures in a row; reset by an acknowledgement.
    failures: AtomicU32,
    /// Drawn at random: with `seq`, names each batch for the receiver, which takes a batch sent
    /// again only once.
    epoch: u64,
    stop: CancellationToken,
}

/// Why [`PeerLink::submit`] gave a piece back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The peer is down and the policy is `local`, or no room came within `request_timeout`
    /// with `local`.
    Down,
    /// The link was removed from the ring.
    Closed,
    /// The pipeline is being aborted (drain timeout).
    Aborted,
}

impl PeerLink {
    pub fn new(name: String, settings: Arc<LinkSettings>) -> Arc<PeerLink> {
        Arc::new(PeerLink {
            name,
            settings,
            state: Mutex::new(LinkState::default()),
            room: Notify::new(),
            work: Notify::new(),
            metrics: Arc::new(PeerMetrics::default()),
            failures: AtomicU32::new(0),
            epoch: {
                use std::hash::{BuildHasher, Hasher};
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_u64(
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_nanos() as u64),
                );
                h.finish()
            },
            stop: CancellationToken::new(),
        })
    }

    pub fn bytes(&self) -> usize {
        self.state.lock().bytes
    }

    /// Hands a piece to the link, waiting only for room in its window. Gives the piece back
    /// (with why) when it will not take it; the caller then processes or routes it elsewhere.
    pub async fn submit(&self, piece: Piece, abort: &CancellationToken) -> Result<Duration, (Piece, Refusal)> {
        let started = Instant::now();
        let f = &self.settings.forwarding;
        let len = piece.body.len();
        let mut piece = Some(piece);
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.state.lock();
                if st.closed {
                    return Err((piece.take().expect("piece kept until placed"), Refusal::Closed));
                }
                let down = matches!(self.metrics.state(), PeerState::Down | PeerState::Probing);
                if down && self.settings.policy == PeerFailurePolicy::Local {
                    return Err((piece.take().expect("piece kept until placed"), Refusal::Down));
                }
                if st.bytes == 0 || st.bytes + len <= f.max_in_flight.as_usize() {
                    if st.bytes == 0 {
                        // Held for the peer from now: unanswered time counts from here.
                        self.metrics.progressed();
                    }
                    st.bytes += len;
                    st.pending.push_back(piece.take().expect("piece kept until placed"));
                    self.metrics.bytes_in_flight.store(st.bytes as u64, Ordering::Relaxed);
                    drop(st);
                    self.work.notify_one();
                    return Ok(started.elapsed());
                }
            }
            let waited = started.elapsed();
            match self.settings.policy {
                PeerFailurePolicy::Local => {
                    let left = f.request_timeout.0.saturating_sub(waited);
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = tokio::time::sleep(left) => {
                            // No room within the request timeout: the peer counts as down from
                            // now, so the next batches do not wait too.
                            if self.metrics.state() == PeerState::Up || self.metrics.state() == PeerState::Connecting {
                                tracing::warn!(peer = %self.name, timeout = ?f.request_timeout.0,
                                    "peer took nothing within the request timeout; processing its events on this node (on_peer_failure: local)");
                                self.metrics.set_state(PeerState::Down);
                                self.work.notify_one();
                            }
                            return Err((piece.take().expect("piece kept until placed"), Refusal::Down));
                        }
                        _ = abort.cancelled() => return Err((piece.take().expect("piece kept until placed"), Refusal::Aborted)),
                    }
                }
                PeerFailurePolicy::Hold => {
                    tokio::select! {
                        _ = &mut notified => {}
                        _ = abort.cancelled() => return Err((piece.take().expect("piece kept until placed"), Refusal::Aborted)),
                    }
                }
            }
        }
    }

    /// Resolves once the link holds nothing (everything handed to it was acknowledged or
    /// given to the fallback), or `timeout` passes; returns the bytes still held.
    pub async fn drained(&self, timeout: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let bytes = self.bytes();
            if bytes == 0 {
                return 0;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.bytes();
            }
        }
    }

    /// True when what the link holds cannot be delivered soon: the peer is down, or it is
    /// stopping and refused every frame still held.
    pub fn stuck(&self) -> bool {
        if matches!(self.metrics.state(), PeerState::Down | PeerState::Probing) {
            return true;
        }
        let st = self.state.lock();
        st.pending.is_empty() && !st.unacked.is_empty() && st.unacked.values().all(|s| s.refused_stopping)
    }

    /// Takes the link off the ring: it accepts nothing more, and what it holds goes to the
    /// fallback once its task has stopped.
    pub fn close(&self) {
        self.state.lock().closed = true;
        self.stop.cancel();
        self.room.notify_waiters();
    }

    /// Everything held, decoded, for the fallback. Sent frames are decoded from the frame
    /// (their pieces' bodies were let go when it was built), in the pieces' order.
    pub(crate) fn take_all(&self) -> Vec<Returned> {
        let (sent, pending) = {
            let mut st = self.state.lock();
            let sent = std::mem::take(&mut st.unacked);
            let pending: Vec<Piece> = st.pending.drain(..).collect();
            st.bytes = 0;
            self.metrics.bytes_in_flight.store(0, Ordering::Relaxed);
            (sent, pending)
        };
        self.room.notify_waiters();
        let mut returned = Vec::new();
        for (_, s) in sent {
            let payload =
                frame::Frame { kind: Kind::Batch, flags: s.frame[5], payload: s.frame[frame::HEADER_LEN..].to_vec() };
            let mut events = match frame::decode_batch(&payload) {
                Ok(b) => b.events,
                Err(e) => {
                    // Built by this process: a failure here is a bug, said loudly.
                    tracing::error!(peer = %self.name, error = %e, "cannot decode a frame held for a peer; its events are not acknowledged");
                    continue;
                }
            };
            for p in s.pieces {
                let rest = events.split_off((p.events as usize).min(events.len()));
                returned.push(Returned {
                    pipeline: p.pipeline,
                    events: std::mem::replace(&mut events, rest),
                    acks: p.acks,
                });
            }
        }
        for p in pending {
            let mut events = Vec::with_capacity(p.events as usize);
            let mut body = &p.body[..];
            if let Err(e) = sluice_segment::codec::decode_batch_into(&mut body, &mut events) {
                tracing::error!(peer = %self.name, error = %e, "cannot decode events held for a peer; they are not acknowledged");
                continue;
            }
            returned.push(Returned { pipeline: p.pipeline, events, acks: p.acks });
        }
        returned
    }

    fn hand_back(&self, fallback: &dyn Fallback, down: bool) {
        let returned = self.take_all();
        if !returned.is_empty() {
            let events: usize = returned.iter().map(|r| r.events.len()).sum();
            self.metrics.events_rerouted.add(events as u64);
            fallback.reroute(&self.name, returned, down);
        }
    }

    /// The link's task: connects, sends, resends, until the link is closed.
    pub async fn run(self: Arc<Self>, fallback: Arc<dyn Fallback>) {
        let f = self.settings.forwarding.clone();
        let mut backoff = f.retry_backoff.0;
        let mut last_error = String::new();
        loop {
            if self.stop.is_cancelled() {
                break;
            }
            let failures = self.failures.load(Ordering::Relaxed);
            if failures >= f.failures_before_down {
                self.metrics.set_state(PeerState::Probing);
            } else if failures == 0 && self.metrics.state() != PeerState::Up {
                self.metrics.set_state(PeerState::Connecting);
            }
            let outcome = tokio::select! {
                r = self.connect_and_serve() => r,
                _ = self.stop.cancelled() => break,
            };
            let Err(error) = outcome else { break };
            let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
            self.metrics.failures.add(1);
            let was_up = self.metrics.state() == PeerState::Up;
            // `Down` already: a worker found no room within the request timeout (`local`).
            let marked_down = self.metrics.state() == PeerState::Down;
            if failures >= f.failures_before_down || marked_down {
                if !matches!(self.metrics.state(), PeerState::Down | PeerState::Probing) || error != last_error {
                    let what = match self.settings.policy {
                        PeerFailurePolicy::Hold => "holding its events (backpressure) until it answers",
                        PeerFailurePolicy::Local => "processing its events on this node (on_peer_failure: local)",
                    };
                    tracing::warn!(peer = %self.name, failures, error = %error, "peer is down; {what}");
                }
                self.metrics.set_state(PeerState::Down);
                self.room.notify_waiters();
                if self.settings.policy == PeerFailurePolicy::Local {
                    self.hand_back(&*fallback, true);
                }
            } else {
                if was_up || error != last_error {
                    tracing::warn!(peer = %self.name, failures, error = %error, retry_in = ?backoff, "peer link failed; retrying");
                }
                self.metrics.set_state(PeerState::Connecting);
            }
            last_error = error;
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = self.stop.cancelled() => break,
            }
            // The backoff grows while failures follow each other, and starts over after an
            // acknowledgement.
            backoff = if self.failures.load(Ordering::Relaxed) <= 1 {
                f.retry_backoff.0
            } else {
                (backoff * 2).min(f.retry_backoff_max.0)
            };
        }
        // Closed: whatever is left is routed again.
        self.hand_back(&*fallback, false);
    }

    /// One connection's life, until it fails; returns the cause.
    async fn connect_and_serve(&self) -> Result<(), String> {
        let f = &self.settings.forwarding;
        let stream = tokio::time::timeout(f.connect_timeout.0, self.settings.connector.connect(&self.name))
            .await
            .map_err(|_| format!("connecting timed out after {:?}", f.connect_timeout.0))??;
        let (mut reader, writer) = split_stream(stream);
        let mut writer = BufWriter::with_capacity(256 << 10, writer);
        let mut hello = Vec::new();
        hello.extend_from_slice(&frame::VERSION.to_le_bytes());
        frame::put_str(&mut hello, &self.settings.cluster_name);
        frame::put_str(&mut hello, &self.settings.node);
        hello.extend_from_slice(&self.epoch.to_le_bytes());
        let mut out = Vec::new();
        frame::put_frame(&mut out, Kind::Hello, 0, &hello);
        writer.write_all(&out).await.map_err(|e| format!("sending the handshake: {e}"))?;
        writer.flush().await.map_err(|e| format!("sending the handshake: {e}"))?;
        let answer = tokio::time::timeout(f.request_timeout.0, frame::read_frame(&mut reader))
            .await
            .map_err(|_| format!("no answer to the handshake within {:?}", f.request_timeout.0))?
            .map_err(|e| match e {
                // TLS 1.3: a server refusing our certificate says so on the first read.
                frame::FrameError::Io(io) => format!("handshake: {}", sluice_tls::describe_handshake_error(&io)),
                other => format!("handshake: {other}"),
            })?
            .ok_or("the peer closed the connection during the handshake")?;
        match answer.kind {
            Kind::Welcome => {
                let mut p = frame::Payload::new(&answer);
                let name = p.str().map_err(|e| e.to_string())?;
                if name != self.name {
                    tracing::debug!(peer = %self.name, says = %name, "peer names itself differently");
                }
            }
            Kind::Refuse => {
                let mut p = frame::Payload::new(&answer);
                let reason = p.str().unwrap_or("no reason given");
                return Err(format!("the peer refused this node: {reason}"));
            }
            other => return Err(format!("unexpected {other:?} frame in the handshake")),
        }
        if self.metrics.state() != PeerState::Up {
            if self.failures.load(Ordering::Relaxed) > 0 {
                tracing::info!(peer = %self.name, "peer link is up again");
            }
            self.metrics.set_state(PeerState::Up);
            self.room.notify_waiters();
        }
        // Everything unacknowledged goes again, in order, on this connection.
        let resend: Vec<u64> = {
            let st = self.state.lock();
            st.unacked.keys().copied().collect()
        };
        if !resend.is_empty() {
            self.metrics.batches_retried.add(resend.len() as u64);
        }
        let acks_seen = Arc::new(Notify::new());
        let reader_task = {
            let acks_seen = acks_seen.clone();
            async move {
                loop {
                    let frame = match frame::read_frame(&mut reader).await {
                        Ok(Some(f)) => f,
                        Ok(None) => return "the peer closed the connection".to_string(),
                        Err(e) => return format!("reading: {e}"),
                    };
                    if frame.kind != Kind::Ack {
                        return format!("unexpected {:?} frame from the peer", frame.kind);
                    }
                    let mut p = frame::Payload::new(&frame);
                    let (Ok(seq), Ok(status), Ok(reason)) = (p.u64(), p.u8(), p.str()) else {
                        return "malformed acknowledgement".to_string();
                    };
                    self.on_answer(seq, status, reason);
                    acks_seen.notify_one();
                }
            }
        };
        // A write that does not finish within the request timeout is a stalled connection (a
        // cut network: no answer, no reset); without this limit the writer would wait for TCP
        // to give up, minutes later, and the peer would never be marked down.
        let limit = f.request_timeout.0;
        let stalled = || format!("sending stalled for the request timeout ({limit:?}): no room in the connection");
        let writer_task = async {
            let mut resend = resend.into_iter();
            loop {
                // Resends first, then new frames.
                let mut wrote = false;
                for seq in resend.by_ref() {
                    let frame = {
                        let mut st = self.state.lock();
                        st.unacked.get_mut(&seq).map(|s| {
                            s.sent_at = Instant::now();
                            s.frame.clone()
                        })
                    };
                    if let Some(frame) = frame {
                        timed(limit, writer.write_all(&frame))
                            .await
                            .ok_or_else(stalled)?
                            .map_err(|e| format!("sending: {e}"))?;
                        wrote = true;
                    }
                }
                while let Some(frame) = self.next_frame() {
                    timed(limit, writer.write_all(&frame))
                        .await
                        .ok_or_else(stalled)?
                        .map_err(|e| format!("sending: {e}"))?;
                    wrote = true;
                }
                let due_retries = self.due_retries();
                for frame in due_retries {
                    self.metrics.batches_retried.add(1);
                    timed(limit, writer.write_all(&frame))
                        .await
                        .ok_or_else(stalled)?
                        .map_err(|e| format!("sending: {e}"))?;
                    wrote = true;
                }
                if wrote {
                    timed(limit, writer.flush()).await.ok_or_else(stalled)?.map_err(|e| format!("sending: {e}"))?;
                }
                let (wait, overdue) = self.next_wakeup();
                if overdue {
                    return Err::<(), String>(format!(
                        "no acknowledgement within the request timeout ({:?})",
                        f.request_timeout.0
                    ));
                }
                let notified = self.work.notified();
                tokio::select! {
                    _ = notified => {}
                    _ = acks_seen.notified() => {}
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        };
        tokio::select! {
            reason = reader_task => Err(reason),
            r = writer_task => r,
        }
    }

    /// The answer to a frame.
    fn on_answer(&self, seq: u64, status: u8, reason: &str) {
        let mut st = self.state.lock();
        if status == frame::ACK_TAKEN {
            let Some(sent) = st.unacked.remove(&seq) else { return };
            st.bytes -= sent.bytes;
            self.metrics.bytes_in_flight.store(st.bytes as u64, Ordering::Relaxed);
            self.metrics.progressed();
            drop(st);
            self.failures.store(0, Ordering::Relaxed);
            if self.metrics.state() != PeerState::Up {
                tracing::info!(peer = %self.name, "peer is taking batches again");
                self.metrics.set_state(PeerState::Up);
            }
            self.metrics.latency.observe(sent.sent_at.elapsed());
            self.metrics.batches_forwarded.add(1);
            self.metrics.events_forwarded.add(sent.events);
            for p in sent.pieces {
                p.acks.complete();
            }
            self.room.notify_waiters();
        } else {
            let backoff = self.settings.forwarding.retry_backoff.0;
            if let Some(sent) = st.unacked.get_mut(&seq) {
                sent.retry_at = Some(Instant::now() + backoff);
                sent.refused_stopping = status == frame::ACK_STOPPING;
            }
            drop(st);
            self.metrics.failures.add(1);
            tracing::warn!(peer = %self.name, reason = %reason, "peer did not take a batch; it will be sent again");
        }
    }

    /// Frames whose "retry" backoff has passed.
    fn due_retries(&self) -> Vec<Arc<Vec<u8>>> {
        let now = Instant::now();
        let mut st = self.state.lock();
        st.unacked
            .values_mut()
            .filter(|s| s.retry_at.is_some_and(|t| t <= now))
            .map(|s| {
                s.retry_at = None;
                s.sent_at = now;
                s.frame.clone()
            })
            .collect()
    }

    /// How long the sender may sleep, and whether the oldest frame is past its timeout.
    fn next_wakeup(&self) -> (Duration, bool) {
        let f = &self.settings.forwarding;
        let now = Instant::now();
        let st = self.state.lock();
        let mut wait = f.request_timeout.0;
        if let Some(oldest) = st.unacked.values().filter(|s| s.retry_at.is_none()).map(|s| s.sent_at).min() {
            let due = oldest + f.request_timeout.0;
            if due <= now {
                return (Duration::ZERO, true);
            }
            wait = wait.min(due - now);
        }
        for s in st.unacked.values() {
            if let Some(t) = s.retry_at {
                wait = wait.min(t.saturating_duration_since(now));
            }
        }
        if let Some(first) = st.pending.front() {
            wait = wait.min((first.enqueued + f.batch_timeout.0).saturating_duration_since(now));
        }
        (wait.max(Duration::from_micros(100)), false)
    }

    /// Coalesces pending pieces of one pipeline into a frame, if the batch is full or its
    /// oldest piece has waited `batch_timeout`.
    fn next_frame(&self) -> Option<Arc<Vec<u8>>> {
        let f = &self.settings.forwarding;
        let mut st = self.state.lock();
        let first = st.pending.front()?;
        let (pipeline, ring) = (first.pipeline.clone(), first.ring);
        let limit = f.batch_bytes.as_usize();
        let mut size = 0;
        let mut count = 0;
        for p in st.pending.iter() {
            if p.pipeline != pipeline || p.ring != ring || (count > 0 && size + p.body.len() > limit) {
                break;
            }
            size += p.body.len();
            count += 1;
        }
        let full = size >= limit || count < st.pending.len();
        if !full && first.enqueued.elapsed() < f.batch_timeout.0 {
            return None;
        }
        let mut pieces: Vec<Piece> = st.pending.drain(..count).collect();
        let seq = st.next_seq;
        st.next_seq += 1;
        let low = st.unacked.keys().next().copied().unwrap_or(seq);
        drop(st);
        let events: u64 = pieces.iter().map(|p| p.events as u64).sum();
        let compress = f.compression == Compression::Lz4;
        let bodies: Vec<&[u8]> = pieces.iter().map(|p| &p.body[..]).collect();
        let wire = Arc::new(frame::batch_frame(seq, low, ring, &pipeline, events as u32, &bodies, compress));
        for p in &mut pieces {
            // The frame holds them now; one copy is enough (the memory charge stays).
            p.body = Vec::new();
        }
        let sent = Sent {
            pieces,
            frame: wire.clone(),
            bytes: size,
            events,
            sent_at: Instant::now(),
            retry_at: None,
            refused_stopping: false,
        };
        self.state.lock().unacked.insert(seq, sent);
        Some(wire)
    }
}

/// `f`, or `None` if it takes longer than `limit`.
async fn timed<T>(limit: Duration, f: impl std::future::Future<Output = T>) -> Option<T> {
    tokio::time::timeout(limit, f).await.ok()
}

#[cfg(test)]
#[path = "link_tests.rs"]
mod tests;
