//! The receiving side with a real listener and a recording pipeline: batches sent again are
//! answered, not taken twice.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sluice_core::{AckSet, Event};
use sluice_testkit::{eventually_async, wait_until_async};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::frame::{self, Kind};
use crate::{Cluster, ClusterConfig, Inbound};

/// Takes events and keeps their acknowledgements until told to complete them.
#[derive(Default)]
struct Recording {
    taken: Mutex<Vec<(usize, AckSet)>>,
}

#[async_trait::async_trait]
impl Inbound for Recording {
    async fn take(&self, events: Vec<Event>, acks: AckSet) -> Result<(), String> {
        self.taken.lock().push((events.len(), acks));
        Ok(())
    }
}

impl Recording {
    fn count(&self) -> usize {
        self.taken.lock().len()
    }

    fn complete_all(&self) {
        for (_, acks) in self.taken.lock().drain(..) {
            acks.complete();
        }
    }
}

async fn node() -> (Cluster, Arc<Recording>) {
    node_with(&[], sluice_core::KeySpec::new(Vec::new())).await
}

/// A node whose ring also holds `others` (never reached here), its pipeline keyed by `keys`.
async fn node_with(others: &[&str], keys: sluice_core::KeySpec) -> (Cluster, Arc<Recording>) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let members: Vec<String> =
        std::iter::once(format!("127.0.0.1:{port}")).chain(others.iter().map(|o| o.to_string())).collect();
    let yaml = format!("listen: 127.0.0.1:{port}\ndiscovery: {{static: [{}]}}\n", members.join(", "));
    let node = sluice_config::parse_yaml(&yaml, "test.yml").unwrap();
    let cluster = Cluster::start(ClusterConfig::from_node(&node).unwrap()).await.unwrap();
    let recording = Arc::new(Recording::default());
    cluster.register_inbound("web", keys, recording.clone());
    (cluster, recording)
}

/// A connection that has said hello as link `epoch` of node `a:1`.
async fn connect(cluster: &Cluster, epoch: u64) -> TcpStream {
    let mut tcp = TcpStream::connect(cluster.config().listen).await.unwrap();
    let mut hello = Vec::new();
    hello.extend_from_slice(&frame::VERSION.to_le_bytes());
    frame::put_str(&mut hello, "sluice");
    frame::put_str(&mut hello, "a:1");
    hello.extend_from_slice(&epoch.to_le_bytes());
    let mut out = Vec::new();
    frame::put_frame(&mut out, Kind::Hello, 0, &hello);
    tcp.write_all(&out).await.unwrap();
    let welcome = frame::read_frame(&mut tcp).await.unwrap().unwrap();
    assert_eq!(welcome.kind, Kind::Welcome);
    tcp
}

async fn send_batch(tcp: &mut TcpStream, seq: u64, low: u64) {
    let events = vec![Event::from_message_at("x", 0), Event::from_message_at("y", 1)];
    tcp.write_all(&batch(seq, low, 0, &events)).await.unwrap();
}

fn batch(seq: u64, low: u64, ring: u64, events: &[Event]) -> Vec<u8> {
    let mut body = Vec::new();
    sluice_segment::codec::encode_batch(events, &mut body).unwrap();
    frame::batch_frame(seq, low, ring, "web", events.len() as u32, &[&body], false)
}

async fn answer(tcp: &mut TcpStream) -> (u64, u8) {
    let f = tokio::time::timeout(Duration::from_secs(5), frame::read_frame(tcp))
        .await
        .expect("an answer")
        .unwrap()
        .unwrap();
    assert_eq!(f.kind, Kind::Ack);
    let mut p = frame::Payload::new(&f);
    (p.u64().unwrap(), p.u8().unwrap())
}

#[tokio::test]
async fn a_batch_sent_again_is_answered_not_taken_twice() {
    let (cluster, recording) = node().await;
    let mut first = connect(&cluster, 7).await;
    send_batch(&mut first, 0, 0).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(recording.count(), 1);
    // Sent again on a new connection while the first is still being taken: it waits for the
    // same answer, which both connections get.
    let mut second = connect(&cluster, 7).await;
    send_batch(&mut second, 0, 0).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(recording.count(), 1, "taken twice while in progress");
    recording.complete_all();
    assert_eq!(answer(&mut first).await, (0, frame::ACK_TAKEN));
    assert_eq!(answer(&mut second).await, (0, frame::ACK_TAKEN));
    // Sent once more after it was taken: answered at once.
    send_batch(&mut second, 0, 0).await;
    assert_eq!(answer(&mut second).await, (0, frame::ACK_TAKEN));
    assert_eq!(recording.count(), 0);
    // Another link (a new epoch: the sender restarted) starts anew.
    let mut third = connect(&cluster, 8).await;
    send_batch(&mut third, 0, 0).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(recording.count(), 1, "a new epoch's batch 0 is a new batch");
    recording.complete_all();
    assert_eq!(answer(&mut third).await, (0, frame::ACK_TAKEN));
    cluster.shutdown().await;
}

#[tokio::test]
async fn a_batch_not_taken_is_taken_when_sent_again() {
    let (cluster, recording) = node().await;
    let mut tcp = connect(&cluster, 1).await;
    send_batch(&mut tcp, 5, 5).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Dropped without completing: the pipeline did not take it.
    recording.taken.lock().clear();
    assert_eq!(answer(&mut tcp).await, (5, frame::ACK_RETRY));
    send_batch(&mut tcp, 5, 5).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(recording.count(), 1, "a batch answered 'retry' must be taken when it comes again");
    recording.complete_all();
    assert_eq!(answer(&mut tcp).await, (5, frame::ACK_TAKEN));
    // Below the sender's low mark: answered taken without a look.
    send_batch(&mut tcp, 3, 6).await;
    assert_eq!(answer(&mut tcp).await, (3, frame::ACK_TAKEN));
    assert_eq!(recording.count(), 0);
    cluster.shutdown().await;
}

/// Over a lossy network: a batch is taken, and its answer is lost with its connection (the
/// sender gave up on it after `request_timeout`). The resend comes on a new connection, maybe
/// once this node is stopping: it is answered "taken", not taken again, and not refused as
/// "stopping" (the sender would then process it itself: a duplicate).
#[tokio::test]
async fn a_batch_whose_answer_was_lost_with_its_connection_is_answered_taken_on_the_next() {
    let (cluster, recording) = node().await;
    let mut first = connect(&cluster, 3).await;
    send_batch(&mut first, 0, 0).await;
    send_batch(&mut first, 1, 0).await;
    wait_until_async("both batches taken", Duration::from_secs(5), || recording.count() == 2).await;
    recording.complete_all();
    // The answers are written; the sender never reads them.
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(first);
    let mut second = connect(&cluster, 3).await;
    send_batch(&mut second, 0, 0).await;
    assert_eq!(answer(&mut second).await, (0, frame::ACK_TAKEN));
    cluster.begin_stopping();
    cluster.unregister_inbound("web");
    drop(second);
    let mut third = connect(&cluster, 3).await;
    send_batch(&mut third, 1, 0).await;
    assert_eq!(answer(&mut third).await, (1, frame::ACK_TAKEN), "a batch taken before the stop, refused");
    send_batch(&mut third, 2, 0).await;
    assert_eq!(answer(&mut third).await, (2, frame::ACK_STOPPING), "a new batch is refused while stopping");
    assert_eq!(recording.count(), 0, "a batch was taken twice");
    assert_eq!(cluster.metrics().events_received.get(), 4, "two batches of two events, each taken once");
    cluster.shutdown().await;
}

#[tokio::test]
async fn a_pipeline_that_does_not_run_here_is_answered_retry_and_a_stopping_node_says_so() {
    let (cluster, _recording) = node().await;
    cluster.unregister_inbound("web");
    let mut tcp = connect(&cluster, 1).await;
    send_batch(&mut tcp, 0, 0).await;
    assert_eq!(answer(&mut tcp).await, (0, frame::ACK_RETRY));
    cluster.begin_stopping();
    send_batch(&mut tcp, 1, 0).await;
    assert_eq!(answer(&mut tcp).await, (1, frame::ACK_STOPPING));
    cluster.shutdown().await;
}

/// A frame damaged on the way ends the connection with nothing of it taken; sent again, it is
/// taken once.
#[tokio::test]
async fn a_damaged_frame_is_not_taken_and_its_resend_is() {
    let (cluster, recording) = node().await;
    let events = vec![Event::from_message_at("x", 0)];
    let mut damaged = batch(0, 0, 0, &events);
    let last = damaged.len() - 1;
    damaged[last] ^= 0x40;
    let mut tcp = connect(&cluster, 3).await;
    tcp.write_all(&damaged).await.unwrap();
    let end =
        tokio::time::timeout(Duration::from_secs(5), frame::read_frame(&mut tcp)).await.expect("the connection ends");
    assert!(!matches!(end, Ok(Some(_))), "answered a damaged frame: {end:?}");
    assert_eq!(recording.count(), 0);
    let mut again = connect(&cluster, 3).await;
    again.write_all(&batch(0, 0, 0, &events)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(recording.count(), 1);
    recording.complete_all();
    assert_eq!(answer(&mut again).await, (0, frame::ACK_TAKEN));
    cluster.shutdown().await;
}

/// Events from a sender with the same ring are not looked at again; from another ring, those
/// this node would not own are counted.
#[tokio::test]
async fn only_a_sender_with_another_ring_has_its_events_checked() {
    let keys = sluice_core::KeySpec::new(vec![sluice_core::FieldPath::parse("/user").unwrap()]);
    let (cluster, recording) = node_with(&["127.0.0.1:1"], keys).await;
    let events: Vec<Event> = (0..40)
        .map(|i| {
            let mut e = Event::from_message_at("x", 0);
            e.fields.insert("user", sluice_core::Value::from(format!("u{i}").as_str()));
            e
        })
        .collect();
    let not_owned = || cluster.metrics().events_received_not_owned.get();
    let mut tcp = connect(&cluster, 5).await;
    tcp.write_all(&batch(0, 0, cluster.shared.topology().ring.fingerprint(), &events)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!((recording.count(), not_owned()), (1, 0), "a sender with the same ring was second-guessed");
    tcp.write_all(&batch(1, 0, 0, &events)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(recording.count(), 2);
    assert!(not_owned() > 0 && not_owned() < 40, "{} of 40 counted as not owned", not_owned());
    recording.complete_all();
    cluster.shutdown().await;
}

/// Takes events and keeps their acknowledgements, but does not return from `take` until the
/// gate lets it: a pipeline whose queue is full.
struct Blocked {
    taken: Mutex<Vec<AckSet>>,
    gate: tokio::sync::Semaphore,
}

#[async_trait::async_trait]
impl Inbound for Blocked {
    async fn take(&self, _events: Vec<Event>, acks: AckSet) -> Result<(), String> {
        self.taken.lock().push(acks);
        self.gate.acquire().await.expect("never closed").forget();
        Ok(())
    }
}

/// The stall of a peer, step by step: every taker of a connection waits on a full pipeline, one
/// more batch has been read and waits for a taker, and the connection ends (the sender gave up
/// on it). That batch was never taken: a resend on a new connection — whether it comes before
/// the old connection is gone or after — must be taken and answered, not be told for ever that
/// it is being taken.
#[tokio::test]
async fn a_batch_left_waiting_for_a_taker_by_a_closed_connection_is_taken_when_sent_again() {
    let (cluster, _recording) = node().await;
    let blocked = Arc::new(Blocked { taken: Mutex::new(Vec::new()), gate: tokio::sync::Semaphore::new(0) });
    cluster.register_inbound("web", sluice_core::KeySpec::new(Vec::new()), blocked.clone());
    let mut first = connect(&cluster, 11).await;
    for seq in 0..5 {
        send_batch(&mut first, seq, 0).await;
    }
    wait_until_async("the four takers to start", Duration::from_secs(5), || blocked.taken.lock().len() >= 4).await;
    // Batch 4 is read and waits for a taker.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(blocked.taken.lock().len(), 4, "more than four batches of one connection taken at once");
    // The sender gives up on the connection (a reset: the next answer cannot be written)...
    // A linger of zero closes at once, with a reset (nothing blocks on drop).
    #[allow(deprecated)]
    first.set_linger(Some(Duration::ZERO)).unwrap();
    drop(first);
    // ...and sends batch 4 again on a new one, while the old one is not known to be gone yet.
    let mut second = connect(&cluster, 11).await;
    send_batch(&mut second, 4, 0).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The pipeline takes the first batches: their answers find the old connection gone, which
    // ends it, with batch 4 still waiting for a taker there.
    let firsts: Vec<AckSet> = blocked.taken.lock().drain(..).collect();
    for acks in firsts {
        acks.complete();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Batch 4 was not taken: the new connection hears "retry"...
    assert_eq!(answer(&mut second).await, (4, frame::ACK_RETRY), "the resend waits for an answer that never comes");
    blocked.gate.add_permits(1000);
    // ...and, sent again, it is taken and answered.
    send_batch(&mut second, 4, 0).await;
    wait_until_async("batch 4 sent again to be taken", Duration::from_secs(5), || !blocked.taken.lock().is_empty())
        .await;
    let acks: Vec<AckSet> = blocked.taken.lock().drain(..).collect();
    assert_eq!(acks.len(), 1);
    for a in acks {
        a.complete();
    }
    assert_eq!(answer(&mut second).await, (4, frame::ACK_TAKEN));
    // A resend on a third connection after the second was closed is answered at once.
    drop(second);
    let mut third = connect(&cluster, 11).await;
    send_batch(&mut third, 4, 0).await;
    assert_eq!(answer(&mut third).await, (4, frame::ACK_TAKEN));
    cluster.shutdown().await;
}

/// The answer to a batch being taken reaches the connection that sent it again, even when the
/// connections that sent it before are all gone.
#[tokio::test]
async fn the_answer_reaches_the_connection_that_resent_the_batch() {
    let (cluster, recording) = node().await;
    let mut gone = Vec::new();
    for _ in 0..3 {
        let mut tcp = connect(&cluster, 12).await;
        send_batch(&mut tcp, 0, 0).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        gone.push(tcp);
    }
    drop(gone);
    let mut last = connect(&cluster, 12).await;
    send_batch(&mut last, 0, 0).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(recording.count(), 1, "taken more than once");
    recording.complete_all();
    assert_eq!(answer(&mut last).await, (0, frame::ACK_TAKEN));
    cluster.shutdown().await;
}

/// Connections that never begin their handshake are capped (the oldest makes room), counted,
/// and timed out; a real peer still gets in.
#[tokio::test]
async fn connections_that_never_handshake_are_capped_and_counted() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let yaml = format!(
        "listen: 127.0.0.1:{port}\ndiscovery: {{static: [127.0.0.1:{port}]}}\nmax_pending_handshakes: 8\nhandshake_timeout: 2s\n"
    );
    let cluster =
        Cluster::start(ClusterConfig::from_node(&sluice_config::parse_yaml(&yaml, "test.yml").unwrap()).unwrap())
            .await
            .unwrap();
    let recording = Arc::new(Recording::default());
    cluster.register_inbound("web", sluice_core::KeySpec::new(Vec::new()), recording.clone());
    let mut silent = Vec::new();
    for _ in 0..40 {
        silent.push(TcpStream::connect(cluster.config().listen).await.unwrap());
    }
    let m = cluster.metrics();
    let evicted = eventually_async(Duration::from_secs(5), || m.handshakes_evicted.get() >= 32).await;
    assert!(evicted, "evicted only {}", m.handshakes_evicted.get());
    assert!(cluster.shared.handshakes.len() <= 8, "{} handshaking", cluster.shared.handshakes.len());
    // A real peer gets in while they hold their places.
    let mut tcp = connect(&cluster, 1).await;
    send_batch(&mut tcp, 0, 0).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    recording.complete_all();
    assert_eq!(answer(&mut tcp).await, (0, frame::ACK_TAKEN));
    let timed_out = eventually_async(Duration::from_secs(5), || m.handshakes_timed_out.get() >= 7).await;
    assert!(timed_out, "timed out only {}", m.handshakes_timed_out.get());
    assert_eq!(cluster.shared.handshakes.len(), 0);
    assert_eq!(m.handshakes_evicted.get() + m.handshakes_timed_out.get(), 40, "every silent connection counted once");
    drop(silent);
    cluster.shutdown().await;
}

#[test]
fn a_ring_that_differs_is_said_once_it_outlasts_the_grace_and_then_rarely() {
    let mut watch = crate::RingWatch::new(Duration::from_secs(10));
    let t0 = std::time::Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    assert_eq!(watch.observe("b", 2, 1, at(0)), None);
    assert_eq!(watch.observe("b", 2, 1, at(9)), None, "a ring change takes a moment to reach every node");
    assert_eq!(watch.observe("b", 2, 1, at(10)), Some(Duration::from_secs(10)));
    assert_eq!(watch.observe("b", 2, 1, at(30)), None, "said again too soon");
    assert_eq!(watch.observe("b", 2, 1, at(70)), Some(Duration::from_secs(70)));
    // Agreeing again starts over.
    assert_eq!(watch.observe("b", 1, 1, at(71)), None);
    assert_eq!(watch.observe("b", 2, 1, at(72)), None);
    assert_eq!(watch.observe("b", 2, 1, at(81)), None);
    assert_eq!(watch.observe("b", 2, 1, at(82)), Some(Duration::from_secs(10)));
}

/// The last answers a node owes are due at the very end of its stop (a stateful processor's
/// groups conclude last): they reach the peer before the process is gone, or the peer
/// processes those batches a second time.
#[test]
fn answers_due_as_the_node_stops_are_written_before_it_is_gone() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (cluster, recording, tcp) = rt.block_on(async {
        let (cluster, recording) = node().await;
        let mut tcp = connect(&cluster, 3).await;
        send_batch(&mut tcp, 0, 0).await;
        for _ in 0..500 {
            if recording.count() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(recording.count(), 1, "the batch was taken");
        (cluster, recording, tcp.into_std().unwrap())
    });
    rt.block_on(async {
        recording.complete_all();
        cluster.shutdown().await;
    });
    // What the process does next: its runtime, and every task in it, is gone.
    drop(rt);
    let mut tcp = tcp;
    tcp.set_nonblocking(false).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut received = Vec::new();
    let _ = std::io::Read::read_to_end(&mut tcp, &mut received);
    let parse = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let f = parse.block_on(frame::read_frame(&mut &received[..])).unwrap().expect("an answer before the close");
    assert_eq!(f.kind, Kind::Ack);
    let mut p = frame::Payload::new(&f);
    assert_eq!((p.u64().unwrap(), p.u8().unwrap()), (0, frame::ACK_TAKEN));
}
