//! Cluster mode: several `sluice` nodes form a hash ring over the identification keys of
//! stateful processors, and every event with the same key values is processed by the one node
//! that owns them.
//!
//! - [`ring`]: the consistent-hash ring every node computes alike from the same membership.
//! - [`config`]: the `cluster:` section.
//! - [`router`]: the forwarding stage a worker runs before the first processor that declares
//!   identification keys: events this node owns go on; the others go to their owner's link.
//! - [`link`]: one peer's outbound link: window, coalescing, pipelining, retries, down/probing.
//! - [`server`]: the receiving side; a batch is answered once its pipeline has taken it.
//! - `limits`: the cap on connections still in their handshake, and log lines a peer can
//!   trigger written at most once per interval.
//! - [`frame`]: the checksummed wire format; [`transport`]: TCP or TLS connections.
//! - [`discovery`]: the membership, static or from DNS, and the ring rebuilt when it changes.
//! - [`metrics`]: per peer and node-wide figures for `/metrics` and `/stats`.
//!
//! Guarantees: the origin's acknowledgement of a forwarded event is released only when the
//! owner has taken it durably (its queue) or delivered it; a worker never waits on a peer's
//! answer, only for room in its window; nothing handed to a link is dropped: it is delivered,
//! resent, or handed back to this node (`on_peer_failure: local`, or the peer left the ring).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use sluice_core::{AckSet, Acker, Event, KeySpec};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub mod config;
pub mod discovery;
pub mod frame;
mod limits;
pub mod link;
pub mod metrics;
pub mod ring;
pub mod router;
pub mod server;
pub mod transport;

pub use config::{ClusterConfig, PeerFailurePolicy};
pub use router::{RouteError, RouteReport, Router};
pub use server::Inbound;

use crate::limits::{LogEvery, PendingHandshakes};
use crate::link::{Fallback, LinkSettings, PeerLink, Returned};
use crate::metrics::{ClusterView, NodeMetrics, PeerMetrics};
use crate::ring::Ring;
use crate::server::{InboundEntry, SharedWindow, TakenWindow};

/// The ring as one node sees it at one moment, with the link of every other member.
pub(crate) struct Topology {
    pub ring: Ring,
    /// This node's index in `ring.members()`.
    pub me: usize,
    /// By member index; `None` for this node.
    pub links: Vec<Option<Arc<PeerLink>>>,
}

pub(crate) struct Shared {
    pub config: ClusterConfig,
    topology: RwLock<Arc<Topology>>,
    links: Mutex<HashMap<String, Arc<PeerLink>>>,
    inbound: RwLock<HashMap<String, InboundEntry>>,
    /// Per sending node: its current link epoch and what this node took from it.
    taken: Mutex<HashMap<String, (u64, SharedWindow)>>,
    pub metrics: NodeMetrics,
    link_settings: Arc<LinkSettings>,
    stop: CancellationToken,
    /// This node is shutting down: peers hear "stopping" for what it no longer takes, and
    /// what it could not forward is processed here.
    stopping: std::sync::atomic::AtomicBool,
    /// Connections to the cluster port still in their handshake.
    pub(crate) handshakes: Arc<PendingHandshakes>,
    /// Handshake failures: anyone who reaches the port can cause one per connection.
    pub(crate) handshake_log: LogEvery,
    /// Accept failures (out of file descriptors): they come again every retry.
    pub(crate) accept_log: LogEvery,
    /// Senders whose batches come routed by another ring than this node's.
    rings: Mutex<RingWatch>,
    /// Peer connections past their handshake: at shutdown, each writes the answers already
    /// due before it closes, and the node waits for that ([`Cluster::shutdown`]).
    pub(crate) serving: tokio::sync::watch::Sender<usize>,
    me: std::sync::Weak<Shared>,
}

/// How long a stopping node waits for its peers to read the answers it owes them: a peer
/// that reads nothing (stopped, or its network gone) must not hold the stop any longer.
pub const ANSWERS_FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a peer's ring may differ from this node's before it is worth a warning: about
/// as long as a membership change takes to reach every node. Discovery by DNS: its `refresh`.
const RING_GRACE_STATIC: Duration = Duration::from_secs(10);

/// The warning that a peer's ring differs is repeated at most this often per peer.
const RING_WARN_EVERY: Duration = Duration::from_secs(60);

/// Per sending node: since when its batches have come with another ring than this node's,
/// and when that was last said. Rings differ for a moment during every membership change;
/// for longer than `grace` they mean the nodes' member lists differ (a configuration mistake
/// that splits every group between two owners, which nothing else would show).
#[derive(Debug)]
pub(crate) struct RingWatch {
    grace: Duration,
    differing: HashMap<String, (std::time::Instant, Option<std::time::Instant>)>,
}

impl RingWatch {
    fn new(grace: Duration) -> RingWatch {
        RingWatch { grace, differing: HashMap::new() }
    }

    /// A batch from `node` routed with ring `theirs`, this node's being `mine`; returns how
    /// long they have differed when that is to be said now.
    pub(crate) fn observe(&mut self, node: &str, theirs: u64, mine: u64, now: std::time::Instant) -> Option<Duration> {
        if theirs == mine {
            self.differing.remove(node);
            return None;
        }
        let (since, warned) = self.differing.entry(node.to_string()).or_insert((now, None));
        let differed = now.saturating_duration_since(*since);
        if differed < self.grace || warned.is_some_and(|w| now.saturating_duration_since(w) < RING_WARN_EVERY) {
            return None;
        }
        *warned = Some(now);
        Some(differed)
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cluster({})", self.config.node)
    }
}

impl Shared {
    pub(crate) fn topology(&self) -> Arc<Topology> {
        self.topology.read().clone()
    }

    /// What this node took from `node`'s link `epoch`. A new epoch (the sender restarted, or
    /// made a new link) starts a new window; the old one lives on in its batches' callbacks.
    pub(crate) fn taken_window(&self, node: &str, epoch: u64) -> SharedWindow {
        let mut taken = self.taken.lock();
        match taken.get(node) {
            Some((e, w)) if *e == epoch => w.clone(),
            _ => {
                let w = Arc::new(Mutex::new(TakenWindow::default()));
                taken.insert(node.to_string(), (epoch, w.clone()));
                w
            }
        }
    }

    /// Warns when `node`'s batches have come routed by another ring than this node's for
    /// longer than a membership change takes.
    pub(crate) fn observe_ring(&self, node: &str, theirs: u64) {
        let topo = self.topology();
        let mine = topo.ring.fingerprint();
        let differed = self.rings.lock().observe(node, theirs, mine, std::time::Instant::now());
        if let Some(differed) = differed {
            tracing::warn!(peer = %node, for_at_least = ?differed, members = %topo.ring.members().join(", "),
                "a peer routes with another ring than this node's: the nodes' member lists differ, and \
                 events of one key are processed on two nodes; give every node the same `discovery` \
                 (repeated at most once a minute per peer)");
        }
    }

    pub(crate) fn is_stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub(crate) fn inbound(&self, pipeline: &str) -> Option<InboundEntry> {
        self.inbound.read().get(pipeline).cloned()
    }

    /// Counts received events that this node's ring gives to another node.
    pub(crate) fn count_not_owned(&self, keys: &KeySpec, events: &[Event]) {
        let topo = self.topology();
        if topo.ring.len() <= 1 {
            return;
        }
        let mut scratch = Vec::new();
        let not_owned = events.iter().filter(|e| topo.ring.owner(keys.hash(e, &mut scratch).hash) != topo.me).count();
        if not_owned > 0 {
            self.metrics.events_received_not_owned.add(not_owned as u64);
            tracing::debug!(events = not_owned, "received events this node does not own (rings disagree for now)");
        }
    }

    /// Builds the ring from a membership and starts or stops links to match it.
    pub(crate) fn set_members(&self, mut members: Vec<String>) {
        if !members.contains(&self.config.node) {
            members.push(self.config.node.clone());
        }
        members.sort();
        members.dedup();
        {
            let current = self.topology();
            if current.ring.members() == members.as_slice() {
                return;
            }
        }
        let ring = Ring::new(&members, self.config.virtual_nodes);
        let me = ring.index_of(&self.config.node).expect("this node is a member");
        let mut removed = Vec::new();
        let links = {
            let mut links = self.links.lock();
            for (name, link) in links.iter() {
                if !members.contains(name) {
                    removed.push(link.clone());
                }
            }
            links.retain(|name, _| members.contains(name));
            let mut by_index = Vec::with_capacity(members.len());
            for (i, name) in ring.members().iter().enumerate() {
                if i == me {
                    by_index.push(None);
                    continue;
                }
                let link = links.entry(name.clone()).or_insert_with(|| {
                    let link = PeerLink::new(name.clone(), self.link_settings.clone());
                    let fallback: Arc<dyn Fallback> = self.me.upgrade().expect("the cluster is alive");
                    tokio::spawn(link.clone().run(fallback));
                    link
                });
                by_index.push(Some(link.clone()));
            }
            by_index
        };
        let old = std::mem::replace(&mut *self.topology.write(), Arc::new(Topology { ring, me, links }));
        if !old.ring.is_empty() {
            self.metrics.ring_changes.add(1);
            tracing::info!(members = %members.join(", "), "cluster membership changed; ring rebuilt");
        }
        // After the new ring is in place: what they hold is routed by it.
        for link in removed {
            tracing::info!(peer = %link.name, "peer left the ring; routing what was meant for it again");
            link.close();
        }
    }

    /// Routes events again with the current ring (from a link that left the ring, or went
    /// down with `local`). `acks` covers `events`.
    async fn route_again(self: Arc<Self>, pipeline: Arc<str>, events: Vec<Event>, acks: AckSet, local_only: bool) {
        let Some(entry) = self.inbound(&pipeline) else {
            tracing::error!(pipeline = %pipeline, events = events.len(),
                "events handed back by a peer link have no pipeline to go to here; they are not acknowledged");
            return;
        };
        let n = events.len();
        if local_only {
            self.metrics.events_local_fallback.add(n as u64);
            if let Err(e) = entry.sink.take(events, acks).await {
                tracing::error!(pipeline = %pipeline, error = %e, "events handed back by a peer link were not taken");
            }
            return;
        }
        let router = Router::new(self.clone(), pipeline.clone(), entry.keys.clone());
        let mut events = events;
        let mut acks = acks;
        let mut memory = sluice_core::MemoryCharge::none();
        let never = CancellationToken::new();
        match router.route(&mut events, &mut acks, &mut memory, &never).await {
            Ok(_) => {
                if !events.is_empty()
                    && let Err(e) = entry.sink.take(events, acks).await
                {
                    tracing::error!(pipeline = %pipeline, error = %e, "events routed again were not taken");
                }
            }
            Err(_) => tracing::error!(pipeline = %pipeline, "routing handed-back events again was aborted"),
        }
    }
}

impl Fallback for Shared {
    fn reroute(&self, _from: &str, returned: Vec<Returned>, down: bool) {
        let Some(shared) = self.me.upgrade() else { return };
        for r in returned {
            tokio::spawn(shared.clone().route_again(r.pipeline, r.events, r.acks, down));
        }
    }
}

impl ClusterView for Shared {
    fn node(&self) -> &str {
        &self.config.node
    }

    fn node_metrics(&self) -> &NodeMetrics {
        &self.metrics
    }

    fn members(&self) -> Vec<String> {
        self.topology().ring.members().to_vec()
    }

    fn pending_handshakes(&self) -> u64 {
        self.handshakes.len() as u64
    }

    fn peers(&self) -> Vec<(String, Arc<PeerMetrics>)> {
        let mut v: Vec<_> = self.links.lock().iter().map(|(n, l)| (n.clone(), l.metrics.clone())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

/// This node's part in a cluster.
#[derive(Clone)]
pub struct Cluster {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shared.fmt(f)
    }
}

impl Cluster {
    /// Binds the listener, learns the membership and starts the links. Fails with a message
    /// naming the address, the name or the file at fault.
    pub async fn start(config: ClusterConfig) -> Result<Cluster, String> {
        let acceptor = transport::Acceptor::new(config.tls.as_ref())?;
        let connector = transport::Connector::new(config.tls.as_ref())?;
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|e| format!("cluster.listen: cannot listen on {}: {e}", config.listen))?;
        let link_settings = Arc::new(LinkSettings {
            node: config.node.clone(),
            cluster_name: config.cluster_name.clone(),
            forwarding: config.forwarding.clone(),
            policy: config.on_peer_failure,
            connector,
        });
        let alone = Ring::new(std::slice::from_ref(&config.node), config.virtual_nodes);
        let shared = Arc::new_cyclic(|me| Shared {
            topology: RwLock::new(Arc::new(Topology { ring: alone, me: 0, links: vec![None] })),
            links: Mutex::new(HashMap::new()),
            inbound: RwLock::new(HashMap::new()),
            taken: Mutex::new(HashMap::new()),
            metrics: NodeMetrics::default(),
            link_settings,
            stop: CancellationToken::new(),
            stopping: std::sync::atomic::AtomicBool::new(false),
            handshakes: PendingHandshakes::new(config.max_pending_handshakes),
            handshake_log: LogEvery::new(Duration::from_secs(10)),
            accept_log: LogEvery::new(Duration::from_secs(10)),
            serving: tokio::sync::watch::Sender::new(0),
            rings: Mutex::new(RingWatch::new(match &config.discovery {
                config::Discovery::Dns(d) => d.refresh.0,
                config::Discovery::Static(_) => RING_GRACE_STATIC,
            })),
            me: me.clone(),
            config,
        });
        discovery::start(&shared).await?;
        tokio::spawn(server::serve(listener, acceptor, shared.clone(), shared.stop.clone()));
        tracing::info!(node = %shared.config.node, listen = %shared.config.listen,
            members = %shared.topology().ring.members().join(", "), "cluster node started");
        Ok(Cluster { shared })
    }

    pub fn node(&self) -> &str {
        &self.shared.config.node
    }

    pub fn config(&self) -> &ClusterConfig {
        &self.shared.config
    }

    /// The forwarding stage of one pipeline.
    pub fn router(&self, pipeline: &str, keys: KeySpec) -> Router {
        Router::new(self.shared.clone(), Arc::from(pipeline), keys)
    }

    /// Where events forwarded for `pipeline` are taken on this node.
    pub fn register_inbound(&self, pipeline: &str, keys: KeySpec, sink: Arc<dyn Inbound>) {
        self.shared.inbound.write().insert(pipeline.to_string(), InboundEntry { sink, keys });
    }

    /// From now on peers' batches for `pipeline` are answered "retry".
    pub fn unregister_inbound(&self, pipeline: &str) {
        self.shared.inbound.write().remove(pipeline);
    }

    /// The node is shutting down (SIGTERM): from now on peers hear "stopping" for what this
    /// node no longer takes, and [`Cluster::drain`] processes here what peers will not take.
    pub fn begin_stopping(&self) {
        self.shared.stopping.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Waits until every link has had everything it holds acknowledged, or `timeout`. When the
    /// node is stopping, what is left then — or as soon as every link still holding something
    /// is stuck (its peer down, or stopping too and refusing it) — is taken back and processed
    /// on this node, rather than left unacknowledged. Returns the bytes still held.
    pub async fn drain(&self, timeout: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let links: Vec<Arc<PeerLink>> = self.shared.links.lock().values().cloned().collect();
            let holding: Vec<&Arc<PeerLink>> = links.iter().filter(|l| l.bytes() > 0).collect();
            if holding.is_empty() {
                return 0;
            }
            let stopping = self.shared.is_stopping();
            let out_of_time = tokio::time::Instant::now() >= deadline;
            if stopping && (out_of_time || holding.iter().all(|l| l.stuck())) {
                let mut events = 0;
                for link in holding {
                    for r in link.take_all() {
                        events += r.events.len();
                        link.metrics.events_rerouted.add(r.events.len() as u64);
                        self.shared.clone().route_again(r.pipeline, r.events, r.acks, true).await;
                    }
                }
                tracing::warn!(
                    events,
                    "events forwarded to peers that are down or stopping were processed on this node"
                );
                continue;
            }
            if out_of_time {
                return holding.iter().map(|l| l.bytes()).sum();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops listening and stops every link (what they still hold is not acknowledged), then
    /// waits up to [`ANSWERS_FLUSH_TIMEOUT`] for the peers' connections to write the answers
    /// already due. Those answers are the last the pipelines produce (a stateful processor's
    /// groups conclude at the end of its stop): a peer that does not hear them treats the
    /// batches as not taken and processes them itself, a second time.
    pub async fn shutdown(&self) {
        self.shared.stop.cancel();
        for l in self.shared.links.lock().values() {
            l.close();
        }
        let mut serving = self.shared.serving.subscribe();
        let flushed = tokio::time::timeout(ANSWERS_FLUSH_TIMEOUT, serving.wait_for(|open| *open == 0)).await.is_ok();
        if !flushed {
            tracing::warn!(
                connections = *serving.borrow(),
                "peer connections did not take this node's last answers in time; those peers will process the batches again"
            );
        }
    }

    /// The section `/metrics` and `/stats` render.
    pub fn metrics_section(&self) -> Arc<dyn sluice_core::metrics::MetricsSection> {
        Arc::new(metrics::ClusterSection(self.shared.clone()))
    }

    pub fn metrics(&self) -> &NodeMetrics {
        &self.shared.metrics
    }

    pub fn members(&self) -> Vec<String> {
        self.shared.topology().ring.members().to_vec()
    }
}

/// An acknowledgement that completes `inner` once `count` events are handled through it: lets
/// a worker split one batch (with any number of input ackers) into parts handled in different
/// places, each part holding a share of one acker.
pub fn join_acks(inner: AckSet, count: usize) -> Acker {
    Acker::new(count, move |outcome| {
        if outcome == sluice_core::ack::AckOutcome::Handled {
            inner.complete();
        }
        // Abandoned: dropping `inner` uncompleted lets its inputs hear so.
    })
}
