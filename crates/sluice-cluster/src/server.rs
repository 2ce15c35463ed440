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

/// A pipeline's inbound entry: where its forwarded events go, and its keys (to count
/// events this node would not route to itself).
#[derive(Clone)]
pub struct InboundEntry {
    pub sink: Arc<dyn Inbound>,
    pub keys: KeySpec,
}

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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
    let (version, cluster, node) = match (p.u16(), p.str(), p.str()) {
        (Ok(v), Ok(c), Ok(n)) => (v, c.to_string(), n.to_string()),
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
            let batch = frame::decode_batch(&frame).map_err(|e| format!("node `{node}`: {e}"))?;
            let seq = batch.seq;
            let Some(entry) = shared.inbound(&batch.pipeline) else {
                let (status, reason) = if shared.is_stopping() {
                    (frame::ACK_STOPPING, format!("node `{}` is stopping", shared.config.node))
                } else {
                    (
                        frame::ACK_RETRY,
                        format!("pipeline `{}` does not run on node `{}`", batch.pipeline, shared.config.node),
                    )
                };
                let _ = answers.send(frame::ack_payload(seq, status, &reason));
                continue;
            };
            let n = batch.events.len();
            shared.metrics.events_received.add(n as u64);
            shared.count_not_owned(&entry.keys, &batch.events);
            let tx = answers.clone();
            let stopping = shared.clone();
            let acker = Acker::new(n, move |outcome| {
                let (status, reason) = match outcome {
                    AckOutcome::Handled => (frame::ACK_TAKEN, ""),
                    AckOutcome::Abandoned if stopping.is_stopping() => (frame::ACK_STOPPING, "the node is stopping"),
                    AckOutcome::Abandoned => (frame::ACK_RETRY, "the batch was not taken (pipeline stopping)"),
                };
                let _ = tx.send(frame::ack_payload(seq, status, reason));
            });
            if let Err(e) = entry.sink.take(batch.events, AckSet::single(acker, n)).await {
                tracing::warn!(node = %node, pipeline = %batch.pipeline, error = %e, "forwarded batch not taken");
            }
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
