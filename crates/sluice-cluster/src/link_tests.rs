//! The link's own retry and acknowledgement logic, against a scripted peer speaking the frame
//! protocol (the real receiving side is tested by the multi-process tests).

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sluice_core::ack::AckOutcome;
use sluice_core::{AckSet, Acker, Event, MemoryCharge};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::config::{ForwardingConfig, PeerFailurePolicy};
use crate::transport::Connector;
use sluice_config::{ByteSize, HumanDuration};

/// What the scripted peer does with a batch frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Taken,
    Retry,
    /// Closes the connection without answering.
    Hang,
    /// Reads it and never answers (the connection stays open).
    Silent,
    /// Reads it, closes the connection without answering, and listens no more: a peer that
    /// took a batch and stopped before its answer reached the sender.
    Vanish,
}

/// A peer that welcomes every connection and answers batches as `script` says, one answer per
/// batch received (the last one repeats); reports every batch's seq and event count.
async fn scripted_peer(script: Vec<Answer>) -> (String, mpsc::UnboundedReceiver<(u64, usize)>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let (seen, rx) = mpsc::unbounded_channel();
    let script = Arc::new(Mutex::new(script.into_iter().collect::<std::collections::VecDeque<_>>()));
    let gone = CancellationToken::new();
    tokio::spawn(async move {
        loop {
            let (mut tcp, _) = tokio::select! {
                accepted = listener.accept() => accepted.unwrap(),
                _ = gone.cancelled() => return,
            };
            let (seen, script, gone) = (seen.clone(), script.clone(), gone.clone());
            tokio::spawn(async move {
                let hello = frame::read_frame(&mut tcp).await.unwrap().unwrap();
                assert_eq!(hello.kind, Kind::Hello);
                let mut out = Vec::new();
                let mut name = Vec::new();
                frame::put_str(&mut name, "peer");
                frame::put_frame(&mut out, Kind::Welcome, 0, &name);
                tcp.write_all(&out).await.unwrap();
                while let Ok(Some(f)) = frame::read_frame(&mut tcp).await {
                    let b = frame::decode_batch(&f).unwrap();
                    let _ = seen.send((b.seq, b.events.len()));
                    let answer = {
                        let mut s = script.lock();
                        if s.len() > 1 { s.pop_front().unwrap() } else { *s.front().unwrap() }
                    };
                    let status = match answer {
                        Answer::Taken => frame::ACK_TAKEN,
                        Answer::Retry => frame::ACK_RETRY,
                        Answer::Hang => return,
                        Answer::Silent => continue,
                        Answer::Vanish => {
                            gone.cancel();
                            return;
                        }
                    };
                    let mut out = Vec::new();
                    frame::put_frame(&mut out, Kind::Ack, 0, &frame::ack_payload(b.seq, status, "scripted"));
                    if tcp.write_all(&out).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (address, rx)
}

#[derive(Default)]
struct Collect(Mutex<Vec<(Returned, bool)>>);

impl Fallback for Collect {
    fn reroute(&self, _from: &str, returned: Vec<Returned>, down: bool) {
        self.0.lock().extend(returned.into_iter().map(|r| (r, down)));
    }
}

fn settings(policy: PeerFailurePolicy, request_timeout_ms: u64, max_in_flight: u64) -> Arc<LinkSettings> {
    Arc::new(LinkSettings {
        node: "me:1".to_string(),
        cluster_name: "sluice".to_string(),
        forwarding: ForwardingConfig {
            batch_timeout: HumanDuration(Duration::from_millis(1)),
            request_timeout: HumanDuration(Duration::from_millis(request_timeout_ms)),
            retry_backoff: HumanDuration(Duration::from_millis(20)),
            retry_backoff_max: HumanDuration(Duration::from_millis(50)),
            failures_before_down: 2,
            max_in_flight: ByteSize(max_in_flight),
            batch_bytes: ByteSize(1024),
            ..ForwardingConfig::default()
        },
        policy,
        connector: Connector::new(None).unwrap(),
    })
}

fn piece(n: usize) -> (Piece, tokio::sync::oneshot::Receiver<AckOutcome>) {
    let events: Vec<Event> = (0..n).map(|i| Event::from_message_at(format!("event {i}"), i as i64)).collect();
    let mut body = Vec::new();
    sluice_segment::codec::encode_batch(&events, &mut body).unwrap();
    let (acker, done) = Acker::with_notify(n);
    let piece = Piece {
        pipeline: Arc::from("web"),
        body,
        events: n as u32,
        acks: AckSet::single(acker, n),
        memory: MemoryCharge::none(),
        enqueued: Instant::now(),
        ring: 0,
    };
    (piece, done)
}

async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), f).await.unwrap_or_else(|_| panic!("timed out: {what}"))
}

#[tokio::test]
async fn acknowledgements_wait_for_the_peer_to_take_the_batch() {
    let (address, mut seen) = scripted_peer(vec![Answer::Taken]).await;
    let link = PeerLink::new(address, settings(PeerFailurePolicy::Hold, 5_000, 1 << 20));
    tokio::spawn(link.clone().run(Arc::new(Collect::default())));
    let (p, done) = piece(10);
    link.submit(p, &CancellationToken::new()).await.unwrap();
    assert_eq!(within("the batch", seen.recv()).await.unwrap().1, 10);
    assert_eq!(within("the acknowledgement", done).await.unwrap(), AckOutcome::Handled);
    assert_eq!(within("drained", link.drained(Duration::from_secs(5))).await, 0);
    assert_eq!((link.metrics.events_forwarded.get(), link.metrics.batches_forwarded.get()), (10, 1));
    link.close();
}

#[tokio::test]
async fn a_silent_peer_gets_no_acknowledgement_released() {
    let (address, mut seen) = scripted_peer(vec![Answer::Silent]).await;
    let link = PeerLink::new(address, settings(PeerFailurePolicy::Hold, 60_000, 1 << 20));
    tokio::spawn(link.clone().run(Arc::new(Collect::default())));
    let (p, mut done) = piece(3);
    link.submit(p, &CancellationToken::new()).await.unwrap();
    within("the batch", seen.recv()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(done.try_recv().is_err(), "acknowledged before the peer took it");
    assert!(link.bytes() > 0);
    link.close();
}

#[tokio::test]
async fn a_lost_connection_sends_what_was_not_answered_again() {
    let (address, mut seen) = scripted_peer(vec![Answer::Hang, Answer::Taken]).await;
    let link = PeerLink::new(address, settings(PeerFailurePolicy::Hold, 5_000, 1 << 20));
    tokio::spawn(link.clone().run(Arc::new(Collect::default())));
    let (p, done) = piece(4);
    link.submit(p, &CancellationToken::new()).await.unwrap();
    let first = within("the first send", seen.recv()).await.unwrap();
    let again = within("the resend", seen.recv()).await.unwrap();
    assert_eq!(first, again, "the same frame (seq and events) is sent again");
    assert_eq!(within("the acknowledgement", done).await.unwrap(), AckOutcome::Handled);
    assert!(link.metrics.batches_retried.get() >= 1 && link.metrics.failures.get() >= 1);
    link.close();
}

#[tokio::test]
async fn a_retry_answer_sends_the_frame_again_after_the_backoff() {
    let (address, mut seen) = scripted_peer(vec![Answer::Retry, Answer::Retry, Answer::Taken]).await;
    let link = PeerLink::new(address, settings(PeerFailurePolicy::Hold, 5_000, 1 << 20));
    tokio::spawn(link.clone().run(Arc::new(Collect::default())));
    let (p, done) = piece(2);
    link.submit(p, &CancellationToken::new()).await.unwrap();
    for _ in 0..3 {
        assert_eq!(within("a send", seen.recv()).await.unwrap().1, 2);
    }
    assert_eq!(within("the acknowledgement", done).await.unwrap(), AckOutcome::Handled);
    assert_eq!(link.metrics.batches_retried.get(), 2);
    link.close();
}

#[tokio::test]
async fn with_local_a_peer_that_stops_answering_is_marked_down_and_its_events_come_back() {
    let (address, mut seen) = scripted_peer(vec![Answer::Silent]).await;
    let link = PeerLink::new(address, settings(PeerFailurePolicy::Local, 200, 1 << 20));
    let fallback = Arc::new(Collect::default());
    tokio::spawn(link.clone().run(fallback.clone()));
    let (p, _done) = piece(5);
    link.submit(p, &CancellationToken::new()).await.unwrap();
    within("the batch", seen.recv()).await.unwrap();
    within("handed back", async {
        while fallback.0.lock().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let back = std::mem::take(&mut *fallback.0.lock());
    assert_eq!(back.len(), 1);
    assert!(back[0].1, "handed back as down");
    assert_eq!(back[0].0.events.len(), 5, "decoded from the frame, every event");
    assert_eq!(back[0].0.events[4].message(), Some("event 4"));
    assert_eq!(back[0].0.acks.covered(), 5, "with its acknowledgements");
    assert!(matches!(link.metrics.state(), PeerState::Down | PeerState::Probing));
    let (p, _) = piece(1);
    assert_eq!(link.submit(p, &CancellationToken::new()).await.unwrap_err().1, Refusal::Down);
    link.close();
}

#[tokio::test]
async fn with_hold_a_full_window_makes_the_worker_wait_until_the_peer_answers() {
    let (address, mut seen) = scripted_peer(vec![Answer::Silent, Answer::Taken]).await;
    // A window that holds one piece: the second waits for room.
    let (first, _first_done) = piece(50);
    let window = first.body.len() as u64;
    let link = PeerLink::new(address, settings(PeerFailurePolicy::Hold, 300, window));
    tokio::spawn(link.clone().run(Arc::new(Collect::default())));
    link.submit(first, &CancellationToken::new()).await.unwrap();
    within("the first batch", seen.recv()).await.unwrap();
    let (second, second_done) = piece(50);
    // The silent peer times out; the frame goes again and is taken, which makes room.
    let waited = within("room", link.submit(second, &CancellationToken::new())).await.unwrap();
    assert!(waited >= Duration::from_millis(100), "the worker did not wait for room ({waited:?})");
    assert_eq!(within("the second acknowledgement", second_done).await.unwrap(), AckOutcome::Handled);
    // An abort ends a wait for room.
    let abort = CancellationToken::new();
    abort.cancel();
    link.close();
    let (third, _) = piece(50);
    assert!(link.submit(third, &abort).await.is_err());
}

/// The window at-least-once leaves: the peer took a batch and is gone before the sender heard
/// so. The sender cannot tell "taken" from "lost", so the frame is kept — never dropped — and
/// the link counts as stuck: a stopping node then processes it itself (`Cluster::drain`), a
/// second time. The lossy-link test waits for every answer before it stops its nodes.
#[tokio::test]
async fn a_batch_taken_by_a_peer_gone_before_its_answer_is_kept_and_handed_back() {
    let (address, mut seen) = scripted_peer(vec![Answer::Vanish]).await;
    let link = PeerLink::new(address, settings(PeerFailurePolicy::Hold, 5_000, 1 << 20));
    let fallback = Arc::new(Collect::default());
    tokio::spawn(link.clone().run(fallback.clone()));
    let (p, mut done) = piece(6);
    link.submit(p, &CancellationToken::new()).await.unwrap();
    assert_eq!(within("the batch", seen.recv()).await.unwrap().1, 6);
    within("the peer marked down", async {
        while !link.stuck() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    assert!(done.try_recv().is_err(), "acknowledged without an answer");
    assert!(fallback.0.lock().is_empty(), "with `hold` nothing is handed back while the node runs");
    let back = link.take_all();
    assert_eq!(back.len(), 1);
    assert_eq!(back[0].events.len(), 6, "the frame the peer took is still held, every event");
    assert_eq!(back[0].acks.covered(), 6);
    link.close();
}
