//! The receiving side: peers' connections, their batches taken into this node's pipelines.
//!
//! A batch is answered only once the pipeline has taken it the way its own inputs' events
//! are taken — durable in its persisted queue, or delivered with a memory queue — through the
//! acknowledgement of the batch handed to [`Inbound::take`]. Batches are taken as soon as
//! they arrive (no batch delay is waited out here); while the pipeline's queue is full, the
//! connection is not read, and TCP pushes back on the sender.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::ack::AckOutcome;
use sluice_core::{AckSet, Acker, Event, KeySpec};
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::Shared;
use crate::frame::{self, Kind};
use crate::transport::{Acceptor, split_stream};

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

enum Taking {
    /// Taken into the pipeline; the answer is sent to these when the acknowledgement comes.
    InProgress(Vec<mpsc::UnboundedSender<Vec<u8>>>),
    Done,
}

pub(crate) enum Admission {
    /// Not seen: take it.
    New,
    /// Taken already: answer "taken".
    Done,
    /// Being taken: the answer will come with the first one's.
    Waiting,
}

impl TakenWindow {
    fn admit(&mut self, seq: u64, low: u64, answers: &mpsc::UnboundedSender<Vec<u8>>) -> Admission {
        if low > self.low {
            self.low = low;
            self.batches.retain(|&s, t| s >= low || matches!(t, Taking::InProgress(_)));
        }
        if seq < self.low {
            return Admission::Done;
        }
        match self.batches.get_mut(&seq) {
            Some(Taking::Done) => Admission::Done,
            Some(Taking::InProgress(waiting)) => {
                waiting.push(answers.clone());
                Admission::Waiting
            }
            None => {
                self.batches.insert(seq, Taking::InProgress(vec![answers.clone()]));
                Admission::New
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

/// A pipeline's inbound entry: where its forwarded events go, and its keys (to count
/// events this node would not route to itself).
#[derive(Clone)]
pub struct InboundEntry {
    pub sink: Arc<dyn Inbound>,
    pub keys: KeySpec,
}

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Frames of one connection decoded and taken at once.
const TAKERS_PER_CONNECTION: usize = 4;

pub(crate) async fn serve(listener: TcpListener, acceptor: Acceptor, shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let (tcp, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "cluster listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            _ = stop.cancelled() => return,
        };
        let (acceptor, shared, stop) = (acceptor.clone(), shared.clone(), stop.clone());
        tokio::spawn(async move {
            if let Err(e) = connection(tcp, peer, acceptor, &shared, &stop).await {
                tracing::warn!(peer = %peer, error = %e, "cluster connection from a peer ended");
            }
        });
    }
}

async fn connection(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    acceptor: Acceptor,
    shared: &Arc<Shared>,
    stop: &CancellationToken,
) -> Result<(), String> {
    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            shared.metrics.handshakes_refused.add(1);
            return Err(e);
        }
        Err(_) => return Err("no TLS handshake within 10s".to_string()),
    };
    let (mut reader, writer) = split_stream(stream);
    let mut writer = BufWriter::with_capacity(64 << 10, writer);
    let hello = match tokio::time::timeout(HANDSHAKE_TIMEOUT, frame::read_frame(&mut reader)).await {
        Ok(Ok(Some(f))) if f.kind == Kind::Hello => f,
        Ok(Ok(Some(f))) => return Err(format!("expected a handshake, got a {:?} frame", f.kind)),
        Ok(Ok(None)) => return Ok(()),
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err("no handshake within 10s".to_string()),
    };
    let mut p = frame::Payload::new(&hello);
    let (version, cluster, node, epoch) = match (p.u16(), p.str(), p.str(), p.u64()) {
        (Ok(v), Ok(c), Ok(n), Ok(e)) => (v, c.to_string(), n.to_string(), e),
        _ => return Err("malformed handshake".to_string()),
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
        shared.metrics.handshakes_refused.add(1);
        let mut payload = Vec::new();
        frame::put_str(&mut payload, &reason);
        frame::put_frame(&mut out, Kind::Refuse, 0, &payload);
        let _ = writer.write_all(&out).await;
        let _ = writer.flush().await;
        return Err(format!("refused node `{node}`: {reason}"));
    }
    let mut payload = Vec::new();
    frame::put_str(&mut payload, &shared.config.node);
    frame::put_frame(&mut out, Kind::Welcome, 0, &payload);
    writer.write_all(&out).await.map_err(|e| e.to_string())?;
    writer.flush().await.map_err(|e| e.to_string())?;
    tracing::debug!(peer = %peer, node = %node, "peer connected");
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
            // A batch sent again: answered when it is taken, never taken twice.
            match taken.lock().admit(seq, header.low, &answers) {
                Admission::New => {}
                Admission::Done => {
                    let _ = answers.send(frame::ack_payload(seq, frame::ACK_TAKEN, ""));
                    continue;
                }
                Admission::Waiting => continue,
            }
            let Some(entry) = shared.inbound(&header.pipeline) else {
                taken.lock().finish(seq, false);
                let (status, reason) = if shared.is_stopping() {
                    (frame::ACK_STOPPING, format!("node `{}` is stopping", shared.config.node))
                } else {
                    (
                        frame::ACK_RETRY,
                        format!("pipeline `{}` does not run on node `{}`", header.pipeline, shared.config.node),
                    )
                };
                let _ = answers.send(frame::ack_payload(seq, status, &reason));
                continue;
            };
            let permit = takers.clone().acquire_owned().await.expect("the semaphore is never closed");
            let (shared, taken, answers, node) = (shared.clone(), taken.clone(), answers.clone(), node.clone());
            tokio::spawn(async move {
                let _permit = permit;
                let events = match frame::decode_batch_events(&frame, &header) {
                    Ok(e) => e,
                    Err(e) => {
                        // It passed its checksum, so the sender built it so: say so, and leave
                        // it unanswered-as-taken (the sender keeps it).
                        tracing::error!(node = %node, pipeline = %header.pipeline, error = %e, "a forwarded batch cannot be decoded");
                        taken.lock().finish(seq, false);
                        let _ = answers.send(frame::ack_payload(seq, frame::ACK_RETRY, &e.to_string()));
                        return;
                    }
                };
                let n = events.len();
                shared.metrics.events_received.add(n as u64);
                // A sender with the same ring routed them here: no need to look again.
                if header.ring != shared.topology().ring.fingerprint() {
                    shared.count_not_owned(&entry.keys, &events);
                }
                let stopping = shared.clone();
                let window = taken.clone();
                let acker = Acker::new(n, move |outcome| {
                    let (status, reason) = match outcome {
                        AckOutcome::Handled => (frame::ACK_TAKEN, ""),
                        AckOutcome::Abandoned if stopping.is_stopping() => {
                            (frame::ACK_STOPPING, "the node is stopping")
                        }
                        AckOutcome::Abandoned => (frame::ACK_RETRY, "the batch was not taken (pipeline stopping)"),
                    };
                    let payload = frame::ack_payload(seq, status, reason);
                    for tx in window.lock().finish(seq, outcome == AckOutcome::Handled) {
                        let _ = tx.send(payload.clone());
                    }
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
