//! The receiving side: peers' connections, their batches taken into this node's pipelines.
//!
//! A batch is answered only once the pipeline has taken it the way its own inputs' events
//! are taken — durable in its persisted queue, or delivered with a memory queue — through the
//! acknowledgement of the batch handed to [`Inbound::take`]. Batches are taken as soon as
//! they arrive (no batch delay is waited out here); while the pipeline's queue is full, the
//! connection is not read, and TCP pushes back on the sender.
//!
//! A batch sent again (the sender's link epoch and seq name it) is never taken twice: it is
//! answered "taken" if it was, or gets the first one's answer if it is being taken. What
//! records a batch as being taken is an `InProgress` guard that travels with the batch into
//! the pipeline's acknowledgement; if the batch is dropped before it gets there (its
//! connection ended while it waited for a taker), the guard forgets it and answers "retry" to
//! whoever waits, so the next resend is taken — a stall can never leave a batch answered
//! "being taken" for ever.
//!
//! Before its handshake (TLS, then the cluster hello) a connection is anyone's: at most
//! `max_pending_handshakes` are held at once (the oldest makes room for a new one), each for at
//! most `handshake_timeout`; they are counted (refused, timed out, evicted) and their failures
//! logged at most once per 10 s.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sluice_core::ack::AckOutcome;
use sluice_core::{AckSet, Acker, Event, KeySpec};
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::Shared;
use crate::frame::{self, Kind};
use crate::transport::{Acceptor, BoxStream, split_stream};

/// Where a pipeline takes forwarded events: right after its forwarding stage.
#[async_trait::async_trait]
pub trait Inbound: Send + Sync {
    /// Takes events (waiting while the pipeline is full); `acks` is completed once they are
    /// taken for good, and dropped uncompleted if they never are. An error says why not.
    async fn take(&self, events: Vec<Event>, acks: AckSet) -> Result<(), String>;
}

/// What a receiver remembers of one sender's link (node and epoch): the batches above the
/// sender's `low` that it has taken, or is taking (with the connections waiting for the answer).
#[derive(Default)]
pub(crate) struct TakenWindow {
    low: u64,
    batches: std::collections::HashMap<u64, Taking>,
}

pub(crate) type SharedWindow = Arc<Mutex<TakenWindow>>;

enum Taking {
    /// Being taken into the pipeline; the answer is sent to these when it is known.
    InProgress(Vec<mpsc::UnboundedSender<Vec<u8>>>),
    Done,
}

pub(crate) enum Admission {
    /// Not seen: take it, and say how that ended through the guard.
    New(InProgress),
    /// Taken already: answer "taken".
    Done,
    /// Being taken: the answer will come with the first one's.
    Waiting,
}

impl TakenWindow {
    fn admit_seq(&mut self, seq: u64, low: u64, answers: &mpsc::UnboundedSender<Vec<u8>>) -> Option<Admission> {
        if low > self.low {
            self.low = low;
            self.batches.retain(|&s, t| s >= low || matches!(t, Taking::InProgress(_)));
        }
        if seq < self.low {
            return Some(Admission::Done);
        }
        match self.batches.get_mut(&seq) {
            Some(Taking::Done) => Some(Admission::Done),
            Some(Taking::InProgress(waiting)) => {
                // A sender that resends over and over through a stall leaves one sender per
                // connection here; those of connections gone are of no use.
                waiting.retain(|tx| !tx.is_closed() && !tx.same_channel(answers));
                waiting.push(answers.clone());
                Some(Admission::Waiting)
            }
            None => {
                self.batches.insert(seq, Taking::InProgress(vec![answers.clone()]));
                None
            }
        }
    }

    /// The batch's outcome: remembered if taken, forgotten if not (a resend is taken anew);
    /// returns who waits for the answer.
    fn finish(&mut self, seq: u64, taken: bool) -> Vec<mpsc::UnboundedSender<Vec<u8>>> {
        let previous = if taken { self.batches.insert(seq, Taking::Done) } else { self.batches.remove(&seq) };
        match previous {
            Some(Taking::InProgress(waiting)) => waiting,
            _ => Vec::new(),
        }
    }
}

/// Admits batch `seq` of the sender whose window this is.
pub(crate) fn admit(
    window: &SharedWindow,
    shared: &Arc<Shared>,
    seq: u64,
    low: u64,
    answers: &mpsc::UnboundedSender<Vec<u8>>,
) -> Admission {
    match window.lock().admit_seq(seq, low, answers) {
        Some(admission) => admission,
        None => Admission::New(InProgress { window: window.clone(), shared: shared.clone(), seq, ended: false }),
    }
}

/// A batch recorded as being taken. Whoever holds it says how that ended ([`InProgress::end`]);
/// it goes with the batch from the connection's reader to its taker and into the acknowledgement
/// handed to the pipeline. Dropped without a word — the connection ended, or the node began to
/// stop, before the batch reached the pipeline — the batch is forgotten and whoever waits for
/// it hears "retry": the sender's next resend is taken anew, never answered "being taken" for
/// ever by a record nothing will finish.
pub(crate) struct InProgress {
    window: SharedWindow,
    shared: Arc<Shared>,
    seq: u64,
    ended: bool,
}

impl InProgress {
    /// Records the outcome and answers everyone waiting for it.
    pub(crate) fn end(mut self, status: u8, reason: &str) {
        self.ended = true;
        self.answer(status, reason);
    }

    fn answer(&self, status: u8, reason: &str) {
        let payload = frame::ack_payload(self.seq, status, reason);
        for tx in self.window.lock().finish(self.seq, status == frame::ACK_TAKEN) {
            let _ = tx.send(payload.clone());
        }
    }

    /// "Not taken": "stopping" when the node is, "retry" otherwise.
    fn not_taken(self, reason: &str) {
        let status = if self.shared.is_stopping() { frame::ACK_STOPPING } else { frame::ACK_RETRY };
        self.end(status, reason);
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        if !self.ended {
            let status = if self.shared.is_stopping() { frame::ACK_STOPPING } else { frame::ACK_RETRY };
            self.answer(status, "the connection that brought the batch ended before the batch was taken");
        }
    }
}

/// A pipeline's inbound entry: where its forwarded events go, and its keys (to count
/// events this node would not route to itself).
#[derive(Clone)]
pub struct InboundEntry {
    pub sink: Arc<dyn Inbound>,
    pub keys: KeySpec,
}

/// Frames of one connection decoded and taken at once.
const TAKERS_PER_CONNECTION: usize = 4;

/// Why a connection ended before its handshake was done.
#[derive(Debug)]
enum HandshakeFailure {
    /// Refused: a failed TLS handshake, bytes that are no cluster handshake, another cluster
    /// or protocol version.
    Refused(String),
    TimedOut(Duration),
    /// Closed to make room: `max_pending_handshakes` connections were handshaking.
    Evicted(usize),
}

impl std::fmt::Display for HandshakeFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HandshakeFailure::Refused(why) => f.write_str(why),
            HandshakeFailure::TimedOut(d) => write!(f, "no handshake within handshake_timeout ({d:?})"),
            HandshakeFailure::Evicted(max) => write!(
                f,
                "closed in its handshake to make room: max_pending_handshakes ({max}) connections were handshaking"
            ),
        }
    }
}

/// A peer that said hello and was welcomed.
struct Welcomed {
    reader: tokio::io::ReadHalf<BoxStream>,
    writer: BufWriter<tokio::io::WriteHalf<BoxStream>>,
    node: String,
    epoch: u64,
}

pub(crate) async fn serve(listener: TcpListener, acceptor: Acceptor, shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    if let Some(held_back) = shared.accept_log.due() {
                        tracing::warn!(error = %e, also_since_last_log = held_back,
                            "cluster listener: accept failed (logged at most once per 10 s)");
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => return,
        };
        let (slot, evicted) = shared.handshakes.enter();
        if evicted {
            shared.metrics.handshakes_evicted.add(1);
        }
        let (acceptor, shared, stop) = (acceptor.clone(), shared.clone(), stop.clone());
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(shared.config.handshake_timeout, handshake(tcp, &acceptor, &shared));
            let outcome = tokio::select! {
                r = handshake => r.unwrap_or(Err(HandshakeFailure::TimedOut(shared.config.handshake_timeout))),
                _ = slot.evicted() => Err(HandshakeFailure::Evicted(shared.config.max_pending_handshakes)),
                _ = stop.cancelled() => return,
            };
            drop(slot);
            let welcomed = match outcome {
                Ok(Some(w)) => w,
                // Closed before a word: a port probe.
                Ok(None) => return,
                Err(failure) => {
                    match &failure {
                        HandshakeFailure::Refused(_) => shared.metrics.handshakes_refused.add(1),
                        HandshakeFailure::TimedOut(_) => shared.metrics.handshakes_timed_out.add(1),
                        // Counted when it was pushed out.
                        HandshakeFailure::Evicted(_) => {}
                    }
                    // Anyone who reaches the port can make this happen once per connection.
                    if let Some(held_back) = shared.handshake_log.due() {
                        let m = &shared.metrics;
                        tracing::warn!(peer = %peer, error = %failure, also_since_last_log = held_back,
                            refused_total = m.handshakes_refused.get(), timed_out_total = m.handshakes_timed_out.get(),
                            evicted_total = m.handshakes_evicted.get(),
                            "cluster connection ended in its handshake (logged at most once per 10 s)");
                    }
                    return;
                }
            };
            let node = welcomed.node.clone();
            let _serving = Serving::enter(&shared.serving);
            if let Err(e) = connection(welcomed, &shared, &stop).await {
                tracing::warn!(peer = %peer, node = %node, error = %e, "cluster connection from a peer ended");
            }
        });
    }
}

/// Counts a connection in [`Shared::serving`] for as long as it lives.
struct Serving<'a>(&'a tokio::sync::watch::Sender<usize>);

impl<'a> Serving<'a> {
    fn enter(count: &'a tokio::sync::watch::Sender<usize>) -> Serving<'a> {
        count.send_modify(|open| *open += 1);
        Serving(count)
    }
}

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|open| *open -= 1);
    }
}

/// The TLS handshake and the cluster hello. `Ok(None)`: the connection closed before a word.
async fn handshake(
    tcp: tokio::net::TcpStream,
    acceptor: &Acceptor,
    shared: &Arc<Shared>,
) -> Result<Option<Welcomed>, HandshakeFailure> {
    if acceptor.has_tls() {
        // A peer without `cluster.tls` starts with a plain hello, which the TLS handshake would
        // only call a corrupt message: say what is wrong, on both sides.
        let mut first = [0u8; frame::MAGIC.len()];
        let n = tcp.peek(&mut first).await.map_err(|e| HandshakeFailure::Refused(format!("reading: {e}")))?;
        if n == 0 {
            return Ok(None);
        }
        if first[..n] == frame::MAGIC[..n] {
            let mut out = Vec::new();
            let mut payload = Vec::new();
            frame::put_str(
                &mut payload,
                &format!(
                    "node `{}` has `cluster.tls` and this node has none: give every node the same `tls` section",
                    shared.config.node
                ),
            );
            frame::put_frame(&mut out, Kind::Refuse, 0, &payload);
            let mut tcp = tcp;
            let _ = tcp.write_all(&out).await;
            let _ = tcp.shutdown().await;
            return Err(HandshakeFailure::Refused(
                "the peer has no `cluster.tls` (it sent a plain cluster handshake) and this node has one: give every node the same `tls` section"
                    .to_string(),
            ));
        }
    }
    let stream = acceptor.accept(tcp).await.map_err(HandshakeFailure::Refused)?;
    let (mut reader, writer) = split_stream(stream);
    let mut writer = BufWriter::with_capacity(64 << 10, writer);
    let hello = match frame::read_frame(&mut reader).await {
        Ok(Some(f)) if f.kind == Kind::Hello => f,
        Ok(Some(f)) => {
            return Err(HandshakeFailure::Refused(format!("expected a handshake, got a {:?} frame", f.kind)));
        }
        Ok(None) => return Ok(None),
        Err(e) => return Err(HandshakeFailure::Refused(e.to_string())),
    };
    let mut p = frame::Payload::new(&hello);
    let (version, cluster, node, epoch) = match (p.u16(), p.str(), p.str(), p.u64()) {
        (Ok(v), Ok(c), Ok(n), Ok(e)) => (v, c.to_string(), n.to_string(), e),
        _ => return Err(HandshakeFailure::Refused("malformed handshake".to_string())),
    };
    let refusal = if version != frame::VERSION {
        Some(format!("protocol version {version}, this node speaks {}", frame::VERSION))
    } else if cluster != shared.config.cluster_name {
        Some(format!("cluster `{cluster}`, this node is in cluster `{}`", shared.config.cluster_name))
    } else {
        None
    };
    let mut out = Vec::new();
    if let Some(reason) = refusal {
        let mut payload = Vec::new();
        frame::put_str(&mut payload, &reason);
        frame::put_frame(&mut out, Kind::Refuse, 0, &payload);
        let _ = writer.write_all(&out).await;
        let _ = writer.flush().await;
        return Err(HandshakeFailure::Refused(format!("refused node `{node}`: {reason}")));
    }
    let mut payload = Vec::new();
    frame::put_str(&mut payload, &shared.config.node);
    frame::put_frame(&mut out, Kind::Welcome, 0, &payload);
    let written = async {
        writer.write_all(&out).await?;
        writer.flush().await
    };
    written.await.map_err(|e| HandshakeFailure::Refused(format!("welcoming node `{node}`: {e}")))?;
    Ok(Some(Welcomed { reader, writer, node, epoch }))
}

async fn connection(welcomed: Welcomed, shared: &Arc<Shared>, stop: &CancellationToken) -> Result<(), String> {
    let Welcomed { mut reader, mut writer, node, epoch } = welcomed;
    tracing::debug!(node = %node, "peer connected");
    let taken = shared.taken_window(&node, epoch);

    // Answers are written by their own task, in the order the acknowledgements complete.
    let (answers, mut to_send) = mpsc::unbounded_channel::<Vec<u8>>();
    // At shutdown, answers already due are still written: a peer that does not hear them
    // would wait its drain out and then process the batches a second time.
    let flush_stop = stop.clone();
    let write_answers = async move {
        let mut buf = Vec::new();
        loop {
            let payload = tokio::select! {
                p = to_send.recv() => match p {
                    Some(p) => p,
                    None => break,
                },
                _ = flush_stop.cancelled() => {
                    buf.clear();
                    while let Ok(p) = to_send.try_recv() {
                        frame::put_frame(&mut buf, Kind::Ack, 0, &p);
                    }
                    let _ = writer.write_all(&buf).await;
                    let _ = writer.flush().await;
                    return String::new();
                }
            };
            buf.clear();
            frame::put_frame(&mut buf, Kind::Ack, 0, &payload);
            while let Ok(more) = to_send.try_recv() {
                frame::put_frame(&mut buf, Kind::Ack, 0, &more);
            }
            if let Err(e) = writer.write_all(&buf).await {
                return format!("answering: {e}");
            }
            if let Err(e) = writer.flush().await {
                return format!("answering: {e}");
            }
        }
        String::new()
    };
    // Frames are read in order; each is decoded and taken by a task of its own (up to
    // `TAKERS_PER_CONNECTION` at once), so one connection's decoding spreads over the cores
    // and a frame waiting for room in the pipeline does not hold the next one's decoding.
    // A frame admitted here and waiting for a taker when the connection ends is dropped with
    // its `InProgress` guard, which un-admits it.
    let takers = Arc::new(tokio::sync::Semaphore::new(TAKERS_PER_CONNECTION));
    let read_batches = async {
        loop {
            let frame = match frame::read_frame(&mut reader).await {
                Ok(Some(f)) => f,
                Ok(None) => return Ok(()),
                Err(e) => return Err(format!("node `{node}`: {e}")),
            };
            if frame.kind != Kind::Batch {
                return Err(format!("node `{node}`: unexpected {:?} frame", frame.kind));
            }
            let header = frame::batch_header(&frame).map_err(|e| format!("node `{node}`: {e}"))?;
            let seq = header.seq;
            shared.observe_ring(&node, header.ring);
            // A batch sent again: answered when it is taken, never taken twice.
            let in_progress = match admit(&taken, shared, seq, header.low, &answers) {
                Admission::New(guard) => guard,
                Admission::Done => {
                    let _ = answers.send(frame::ack_payload(seq, frame::ACK_TAKEN, ""));
                    continue;
                }
                Admission::Waiting => continue,
            };
            let Some(entry) = shared.inbound(&header.pipeline) else {
                let reason = if shared.is_stopping() {
                    format!("node `{}` is stopping", shared.config.node)
                } else {
                    format!("pipeline `{}` does not run on node `{}`", header.pipeline, shared.config.node)
                };
                in_progress.not_taken(&reason);
                continue;
            };
            let permit = takers.clone().acquire_owned().await.expect("the semaphore is never closed");
            let (shared, node) = (shared.clone(), node.clone());
            tokio::spawn(async move {
                let _permit = permit;
                let events = match frame::decode_batch_events(&frame, &header) {
                    Ok(e) => e,
                    Err(e) => {
                        // It passed its checksum, so the sender built it so: say so, and leave
                        // it unanswered-as-taken (the sender keeps it).
                        tracing::error!(node = %node, pipeline = %header.pipeline, error = %e, "a forwarded batch cannot be decoded");
                        in_progress.end(frame::ACK_RETRY, &e.to_string());
                        return;
                    }
                };
                let n = events.len();
                shared.metrics.events_received.add(n as u64);
                // A sender with the same ring routed them here: no need to look again.
                if header.ring != shared.topology().ring.fingerprint() {
                    shared.count_not_owned(&entry.keys, &events);
                }
                let acker = Acker::new(n, move |outcome| match outcome {
                    AckOutcome::Handled => in_progress.end(frame::ACK_TAKEN, ""),
                    AckOutcome::Abandoned => in_progress.not_taken("the batch was not taken (pipeline stopping)"),
                });
                if let Err(e) = entry.sink.take(events, AckSet::single(acker, n)).await {
                    tracing::warn!(node = %node, pipeline = %header.pipeline, error = %e, "forwarded batch not taken");
                }
            });
        }
    };
    let read_batches = async {
        tokio::select! {
            r = read_batches => r,
            _ = stop.cancelled() => std::future::pending().await,
        }
    };
    tokio::select! {
        r = read_batches => r,
        e = write_answers => if e.is_empty() { Ok(()) } else { Err(e) },
    }
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
