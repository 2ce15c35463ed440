//! The cluster's figures: per peer and for the node, rendered at `/metrics` and `/stats`.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64, Ordering};

use sluice_core::exposition::{DescriptorEncoder, Labels, counter, gauge, histogram};
use sluice_core::metrics::{Counter, Histogram, MetricsSection};

/// A peer link's state, as shown in metrics (`sluice_cluster_peer_up` and `/stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PeerState {
    /// Not connected yet.
    Connecting = 0,
    Up = 1,
    /// Failed `failures_before_down` times in a row; probed until it answers.
    Down = 2,
    /// Down, and a probe (a new connection) is under way.
    Probing = 3,
}

impl PeerState {
    pub fn name(self) -> &'static str {
        match self {
            PeerState::Connecting => "connecting",
            PeerState::Up => "up",
            PeerState::Down => "down",
            PeerState::Probing => "probing",
        }
    }

    fn from_u8(v: u8) -> PeerState {
        match v {
            1 => PeerState::Up,
            2 => PeerState::Down,
            3 => PeerState::Probing,
            _ => PeerState::Connecting,
        }
    }
}

#[derive(Debug, Default)]
pub struct PeerMetrics {
    pub events_forwarded: Counter,
    pub batches_forwarded: Counter,
    /// Batches sent again (after a timeout, a lost connection, or a "retry" answer).
    pub batches_retried: Counter,
    /// Connections that failed or timed out, and batches the peer answered "not taken".
    pub failures: Counter,
    /// Events handed back to this node's own processing (`on_peer_failure: local`) or re-routed
    /// because the peer left the ring.
    pub events_rerouted: Counter,
    /// From sending a batch to its acknowledgement.
    pub latency: Histogram,
    pub bytes_in_flight: AtomicU64,
    state: AtomicU8,
    /// When the peer last took something (or when something was first held for it after it
    /// had taken everything), in nanoseconds since the Unix epoch: how long a held batch has
    /// gone unanswered.
    last_progress_nanos: AtomicI64,
}

impl PeerMetrics {
    /// The peer took a batch, or the link starts holding one again after holding none.
    pub fn progressed(&self) {
        self.last_progress_nanos.store(sluice_core::value::now_nanos(), Ordering::Relaxed);
    }

    /// How long batches have been held for the peer without it taking any; `None` when
    /// nothing is held.
    pub fn unanswered_for(&self) -> Option<std::time::Duration> {
        if self.bytes_in_flight.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let since = sluice_core::value::now_nanos().saturating_sub(self.last_progress_nanos.load(Ordering::Relaxed));
        Some(std::time::Duration::from_nanos(since.max(0) as u64))
    }

    pub fn state(&self) -> PeerState {
        PeerState::from_u8(self.state.load(Ordering::Relaxed))
    }

    pub fn set_state(&self, s: PeerState) {
        self.state.store(s as u8, Ordering::Relaxed);
    }
}

/// Node-wide counters.
#[derive(Debug, Default)]
pub struct NodeMetrics {
    /// Events routed to this node by its own ring and processed here.
    pub events_local: Counter,
    /// Events handed to a peer link.
    pub events_forwarded: Counter,
    /// Events received from peers and taken into a pipeline.
    pub events_received: Counter,
    /// Received events this node's ring says another node owns (rings disagreeing for a
    /// moment, during a membership change); processed here anyway.
    pub events_received_not_owned: Counter,
    /// Events whose key tuple lacked some identification key (routed with the others lacking
    /// the same keys).
    pub events_missing_keys: Counter,
    /// Events processed here because their owner was down (`on_peer_failure: local`).
    pub events_local_fallback: Counter,
    /// Time workers waited for room in a peer's window.
    pub worker_wait_nanos: Counter,
    /// The longest single wait of a worker on a peer, in nanoseconds.
    pub worker_wait_max_nanos: AtomicU64,
    /// Connections refused at the handshake (wrong cluster, version, a failed TLS handshake,
    /// bytes that are no cluster handshake).
    pub handshakes_refused: Counter,
    /// Connections that did not finish their handshake within `handshake_timeout`.
    pub handshakes_timed_out: Counter,
    /// Connections closed in their handshake to make room for a newer one, when
    /// `max_pending_handshakes` were handshaking.
    pub handshakes_evicted: Counter,
    pub ring_changes: Counter,
}

/// What `/metrics` and `/stats` show of the cluster; filled by the running cluster.
pub trait ClusterView: Send + Sync + std::fmt::Debug {
    fn node(&self) -> &str;
    fn node_metrics(&self) -> &NodeMetrics;
    /// The ring's members, this node included.
    fn members(&self) -> Vec<String>;
    /// Connections accepted and still in their handshake.
    fn pending_handshakes(&self) -> u64 {
        0
    }
    fn peers(&self) -> Vec<(String, Arc<PeerMetrics>)>;
}

type PickPeer = fn(&PeerMetrics) -> u64;

#[derive(Debug)]
pub struct ClusterSection(pub Arc<dyn ClusterView>);

impl MetricsSection for ClusterSection {
    fn key(&self) -> String {
        "cluster".to_string()
    }

    fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        let v = &self.0;
        let n = v.node_metrics();
        let node: [(&str, &str, &Counter); 9] = [
            (
                "sluice_cluster_events_local_total",
                "Events this node owns by its ring and processed here.",
                &n.events_local,
            ),
            ("sluice_cluster_events_forwarded_total", "Events handed to peers that own them.", &n.events_forwarded),
            ("sluice_cluster_events_received_total", "Events received from peers.", &n.events_received),
            (
                "sluice_cluster_events_received_not_owned_total",
                "Received events this node's ring gives to another node (processed here anyway).",
                &n.events_received_not_owned,
            ),
            (
                "sluice_cluster_events_missing_keys_total",
                "Events lacking some identification key.",
                &n.events_missing_keys,
            ),
            (
                "sluice_cluster_events_local_fallback_total",
                "Events processed here because their owner was down (on_peer_failure: local).",
                &n.events_local_fallback,
            ),
            (
                "sluice_cluster_handshakes_refused_total",
                "Peer connections refused at the handshake.",
                &n.handshakes_refused,
            ),
            (
                "sluice_cluster_handshakes_timed_out_total",
                "Peer connections that did not finish their handshake within handshake_timeout.",
                &n.handshakes_timed_out,
            ),
            (
                "sluice_cluster_handshakes_evicted_total",
                "Peer connections closed in their handshake to make room (max_pending_handshakes).",
                &n.handshakes_evicted,
            ),
        ];
        for (name, help, c) in node {
            counter(encoder, name, help, [(Labels::new(), c.get())])?;
        }
        counter(
            encoder,
            "sluice_cluster_worker_wait_seconds_total",
            "Time workers waited for room in a peer's window.",
            [(Labels::new(), n.worker_wait_nanos.get() as f64 / 1e9)],
        )?;
        gauge(
            encoder,
            "sluice_cluster_worker_wait_max_seconds",
            "The longest single wait of a worker on a peer.",
            [(Labels::new(), n.worker_wait_max_nanos.load(Ordering::Relaxed) as f64 / 1e9)],
        )?;
        gauge(
            encoder,
            "sluice_cluster_handshakes_pending",
            "Connections to the cluster port accepted and still in their handshake.",
            [(Labels::new(), v.pending_handshakes())],
        )?;
        gauge(
            encoder,
            "sluice_cluster_ring_members",
            "Nodes on this node's ring, itself included.",
            [(Labels::new(), v.members().len() as u64)],
        )?;

        let peers: Vec<(Labels, Arc<PeerMetrics>)> =
            v.peers().into_iter().map(|(name, m)| (vec![("peer", name)], m)).collect();
        let per_peer: [(&str, &str, PickPeer); 5] = [
            ("sluice_cluster_peer_events_forwarded_total", "Events sent to the peer and acknowledged.", |p| {
                p.events_forwarded.get()
            }),
            ("sluice_cluster_peer_batches_forwarded_total", "Batches sent to the peer and acknowledged.", |p| {
                p.batches_forwarded.get()
            }),
            ("sluice_cluster_peer_batches_retried_total", "Batches sent to the peer again.", |p| {
                p.batches_retried.get()
            }),
            ("sluice_cluster_peer_failures_total", "Connections to the peer that failed or timed out.", |p| {
                p.failures.get()
            }),
            (
                "sluice_cluster_peer_events_rerouted_total",
                "Events meant for the peer processed elsewhere (down with on_peer_failure: local, or left the ring).",
                |p| p.events_rerouted.get(),
            ),
        ];
        for (name, help, pick) in per_peer {
            counter(encoder, name, help, peers.iter().map(|(l, m)| (l.clone(), pick(m))))?;
        }
        gauge(
            encoder,
            "sluice_cluster_peer_bytes_in_flight",
            "Encoded bytes for the peer not yet acknowledged.",
            peers.iter().map(|(l, m)| (l.clone(), m.bytes_in_flight.load(Ordering::Relaxed))),
        )?;
        gauge(
            encoder,
            "sluice_cluster_peer_up",
            "1 when the link to the peer is up; see /stats for its state.",
            peers.iter().map(|(l, m)| {
                let mut labels = l.clone();
                labels.push(("state", m.state().name().to_string()));
                (labels, (m.state() == PeerState::Up) as u64)
            }),
        )?;
        histogram(
            encoder,
            "sluice_cluster_peer_latency_seconds",
            "From sending a batch to the peer's acknowledgement.",
            peers.iter().map(|(l, m)| (l.clone(), &m.latency)),
        )
    }

    fn wedged(&self, after: std::time::Duration) -> Option<String> {
        let stuck: Vec<String> = self
            .0
            .peers()
            .into_iter()
            .filter_map(|(name, m)| {
                let held = m.unanswered_for().filter(|d| *d >= after)?;
                Some(format!(
                    "peer `{name}` has taken nothing for {}s with {} bytes held for it",
                    held.as_secs(),
                    m.bytes_in_flight.load(Ordering::Relaxed)
                ))
            })
            .collect();
        (!stuck.is_empty()).then(|| stuck.join("; "))
    }

    fn stats(&self) -> serde_json::Value {
        serde_json::to_value(self.snapshot()).unwrap_or_default()
    }
}

impl ClusterSection {
    /// The cluster's figures now, as `/stats` gives them under `cluster`.
    pub fn snapshot(&self) -> ClusterSnapshot {
        let v = &self.0;
        let n = v.node_metrics();
        let peers = v
            .peers()
            .into_iter()
            .map(|(name, m)| {
                let (_, sum, count) = m.latency.snapshot();
                let peer = PeerSnapshot {
                    state: m.state().name().to_string(),
                    events_forwarded: m.events_forwarded.get(),
                    batches_forwarded: m.batches_forwarded.get(),
                    batches_retried: m.batches_retried.get(),
                    failures: m.failures.get(),
                    events_rerouted: m.events_rerouted.get(),
                    bytes_in_flight: m.bytes_in_flight.load(Ordering::Relaxed),
                    unanswered_seconds: m.unanswered_for().map(|d| d.as_secs_f64()),
                    latency_mean_seconds: if count > 0 { sum / count as f64 } else { 0.0 },
                };
                (name, peer)
            })
            .collect();
        ClusterSnapshot {
            node: v.node().to_string(),
            members: v.members(),
            events: ClusterEvents {
                local: n.events_local.get(),
                forwarded: n.events_forwarded.get(),
                received: n.events_received.get(),
                received_not_owned: n.events_received_not_owned.get(),
                missing_keys: n.events_missing_keys.get(),
                local_fallback: n.events_local_fallback.get(),
            },
            worker_wait_seconds: n.worker_wait_nanos.get() as f64 / 1e9,
            worker_wait_max_seconds: n.worker_wait_max_nanos.load(Ordering::Relaxed) as f64 / 1e9,
            handshakes_refused: n.handshakes_refused.get(),
            handshakes_timed_out: n.handshakes_timed_out.get(),
            handshakes_evicted: n.handshakes_evicted.get(),
            handshakes_pending: v.pending_handshakes(),
            ring_changes: n.ring_changes.get(),
            peers,
        }
    }
}

/// The cluster's figures at one moment: `/stats`' `cluster`, read back by `sluice top`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ClusterSnapshot {
    /// This node's name.
    pub node: String,
    /// The ring's members, this node included.
    pub members: Vec<String>,
    pub events: ClusterEvents,
    pub worker_wait_seconds: f64,
    pub worker_wait_max_seconds: f64,
    pub handshakes_refused: u64,
    pub handshakes_timed_out: u64,
    pub handshakes_evicted: u64,
    pub handshakes_pending: u64,
    pub ring_changes: u64,
    pub peers: std::collections::BTreeMap<String, PeerSnapshot>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ClusterEvents {
    pub local: u64,
    pub forwarded: u64,
    pub received: u64,
    pub received_not_owned: u64,
    pub missing_keys: u64,
    pub local_fallback: u64,
}

/// One peer link at one moment.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct PeerSnapshot {
    /// `connecting`, `up`, `down` or `probing`.
    pub state: String,
    pub events_forwarded: u64,
    pub batches_forwarded: u64,
    pub batches_retried: u64,
    pub failures: u64,
    pub events_rerouted: u64,
    pub bytes_in_flight: u64,
    /// How long the oldest unanswered batch has waited, if one does.
    pub unanswered_seconds: Option<f64>,
    pub latency_mean_seconds: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default)]
    struct View {
        node: NodeMetrics,
        peer: Arc<PeerMetrics>,
    }

    impl ClusterView for View {
        fn node(&self) -> &str {
            "a:1"
        }
        fn node_metrics(&self) -> &NodeMetrics {
            &self.node
        }
        fn members(&self) -> Vec<String> {
            vec!["a:1".into(), "b:1".into()]
        }
        fn peers(&self) -> Vec<(String, Arc<PeerMetrics>)> {
            vec![("b:1".into(), self.peer.clone())]
        }
    }

    #[test]
    fn the_exposition_types_fit_the_names_and_peers_are_labelled() {
        let view = Arc::new(View::default());
        view.node.events_forwarded.add(5);
        view.peer.set_state(PeerState::Up);
        view.peer.latency.observe(std::time::Duration::from_millis(2));
        let section = ClusterSection(view);
        let out = sluice_core::exposition::text(move |encoder| section.encode(encoder)).unwrap();
        assert!(out.contains("\nsluice_cluster_events_forwarded_total 5\n"), "{out}");
        assert!(out.contains("sluice_cluster_peer_up{peer=\"b:1\",state=\"up\"} 1\n"), "{out}");
        assert!(out.contains("sluice_cluster_peer_latency_seconds_count{peer=\"b:1\"} 1\n"), "{out}");
        assert!(out.contains("# TYPE sluice_cluster_worker_wait_seconds counter\n"), "{out}");
        assert!(out.contains("# TYPE sluice_cluster_worker_wait_max_seconds gauge\n"), "{out}");
        for line in out.lines() {
            assert!(!line.contains("{}"), "{line}");
        }
    }

    #[test]
    fn a_peer_holding_batches_it_does_not_take_wedges_the_node_and_one_holding_none_does_not() {
        let view = Arc::new(View::default());
        let section = ClusterSection(view.clone());
        assert_eq!(view.peer.unanswered_for(), None);
        assert_eq!(section.wedged(std::time::Duration::ZERO), None, "nothing held");
        view.peer.progressed();
        view.peer.bytes_in_flight.store(4096, Ordering::Relaxed);
        std::thread::sleep(std::time::Duration::from_millis(30));
        let held = view.peer.unanswered_for().unwrap();
        assert!(held >= std::time::Duration::from_millis(30), "{held:?}");
        assert_eq!(section.wedged(std::time::Duration::from_secs(60)), None, "held briefly is not wedged");
        let why = section.wedged(std::time::Duration::from_millis(20)).expect("held past the threshold");
        assert!(why.contains("peer `b:1`") && why.contains("4096 bytes"), "{why}");
        assert!(section.stats()["peers"]["b:1"]["unanswered_seconds"].as_f64().unwrap() > 0.0);
        view.peer.progressed();
        assert_eq!(section.wedged(std::time::Duration::from_millis(20)), None, "it took something");
    }

    /// `/stats`' `cluster` keeps its keys, and reads back as the same snapshot.
    #[test]
    fn the_stats_document_has_every_key_and_reads_back() {
        let section = ClusterSection(Arc::new(View::default()));
        let doc = section.stats();
        let keys = |v: &serde_json::Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>().join(" ");
        assert_eq!(
            keys(&doc),
            "events handshakes_evicted handshakes_pending handshakes_refused handshakes_timed_out members node \
             peers ring_changes worker_wait_max_seconds worker_wait_seconds"
        );
        assert_eq!(keys(&doc["events"]), "forwarded local local_fallback missing_keys received received_not_owned");
        assert_eq!(
            keys(&doc["peers"]["b:1"]),
            "batches_forwarded batches_retried bytes_in_flight events_forwarded events_rerouted failures \
             latency_mean_seconds state unanswered_seconds"
        );
        let read: ClusterSnapshot = serde_json::from_value(doc).unwrap();
        assert_eq!(read, section.snapshot());
        assert_eq!(read.node, "a:1");
    }
}
