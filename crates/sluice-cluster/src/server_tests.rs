//! The receiving side with a real listener and a recording pipeline: batches sent again are
//! answered, not taken twice.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use sluice_core::{AckSet, Event};
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
    cluster.shutdown();
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
    cluster.shutdown();
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
    cluster.shutdown();
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
    cluster.shutdown();
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
    cluster.shutdown();
}
