//! The `cluster:` section of the config.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;
use sluice_config::Node;
use sluice_config::{ByteSize, HumanDuration};
use sluice_config::{ConfigError, ConfigErrors, from_node};

/// What the section looks like in YAML (serde shape); [`ClusterConfig`] is the checked form.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCluster {
    listen: String,
    #[serde(default)]
    advertise: Option<String>,
    discovery: RawDiscovery,
    #[serde(default)]
    cluster_name: Option<String>,
    #[serde(default)]
    virtual_nodes: Option<u32>,
    #[serde(default)]
    tls: Option<sluice_tls::TlsConfig>,
    #[serde(default)]
    forwarding: ForwardingConfig,
    #[serde(default)]
    on_peer_failure: PeerFailurePolicy,
    #[serde(default)]
    max_pending_handshakes: Option<usize>,
    #[serde(default)]
    handshake_timeout: Option<HumanDuration>,
}

/// `discovery: {static: [...]}` or `discovery: {dns: {...}}`: exactly one of the two.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDiscovery {
    #[serde(default, rename = "static")]
    fixed: Option<Vec<String>>,
    #[serde(default)]
    dns: Option<DnsDiscovery>,
}

/// `discovery: {dns: {...}}`: the members are every address the name resolves to.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsDiscovery {
    /// Resolved with the system resolver (so `/etc/hosts` counts).
    pub name: String,
    /// The cluster port of every member.
    pub port: u16,
    /// How often the name is resolved again.
    #[serde(default = "default_refresh")]
    pub refresh: HumanDuration,
}

fn default_refresh() -> HumanDuration {
    HumanDuration(Duration::from_secs(10))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discovery {
    /// Members as written (`host:port`); names are resolved when connecting.
    Static(Vec<String>),
    Dns(DnsDiscovery),
}

/// What a node does with events whose owner does not take them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PeerFailurePolicy {
    /// Keep them for the owner and retry until it takes them: workers wait for room in its
    /// window (backpressure); nothing is processed twice or lost.
    #[default]
    Hold,
    /// Once the owner is marked down, process them on this node (warned and counted): the
    /// pipeline keeps flowing, but those keys' state is split across two nodes for a while.
    Local,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    #[default]
    None,
    Lz4,
}

/// `forwarding:` limits of the transport between nodes.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ForwardingConfig {
    /// A forwarded batch is sent once it holds this many encoded bytes...
    pub batch_bytes: ByteSize,
    /// ...or once its oldest event has waited this long.
    pub batch_timeout: HumanDuration,
    /// Encoded bytes sent or waiting to be sent to one peer and not yet acknowledged; past it,
    /// workers wait for room (backpressure).
    pub max_in_flight: ByteSize,
    /// A batch not acknowledged by then is sent again on a new connection, and counts as a
    /// failure of the peer.
    pub request_timeout: HumanDuration,
    /// How long connecting to a peer may take.
    pub connect_timeout: HumanDuration,
    /// First pause before retrying a failed peer; doubles up to `retry_backoff_max`.
    pub retry_backoff: HumanDuration,
    pub retry_backoff_max: HumanDuration,
    /// Failures in a row after which a peer is marked down (then probed until it answers).
    pub failures_before_down: u32,
    pub compression: Compression,
}

impl Default for ForwardingConfig {
    fn default() -> Self {
        ForwardingConfig {
            batch_bytes: ByteSize(256 << 10),
            batch_timeout: HumanDuration(Duration::from_millis(5)),
            max_in_flight: ByteSize(128 << 20),
            request_timeout: HumanDuration(Duration::from_secs(10)),
            connect_timeout: HumanDuration(Duration::from_secs(5)),
            retry_backoff: HumanDuration(Duration::from_millis(100)),
            retry_backoff_max: HumanDuration(Duration::from_secs(10)),
            failures_before_down: 3,
            compression: Compression::None,
        }
    }
}

/// The checked `cluster:` section.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub listen: SocketAddr,
    /// This node's name on the ring: `advertise`, or `listen` as written.
    pub node: String,
    pub discovery: Discovery,
    /// Nodes of another cluster name are refused at the handshake.
    pub cluster_name: String,
    pub virtual_nodes: u32,
    pub tls: Option<sluice_tls::TlsConfig>,
    pub forwarding: ForwardingConfig,
    pub on_peer_failure: PeerFailurePolicy,
    /// Connections to the cluster port that have not finished their handshake (TLS and the
    /// cluster hello) held at once; past it the oldest of them is closed to make room.
    pub max_pending_handshakes: usize,
    /// How long an accepted connection may take to finish its handshake.
    pub handshake_timeout: Duration,
}

pub const DEFAULT_VIRTUAL_NODES: u32 = 256;
pub const DEFAULT_MAX_PENDING_HANDSHAKES: usize = 64;
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

impl ClusterConfig {
    /// Reads and checks the section; every problem names its key.
    pub fn from_node(node: &Node) -> Result<ClusterConfig, ConfigErrors> {
        let raw: RawCluster = from_node(node, "cluster")?;
        let mut errors = ConfigErrors::default();
        let at = |key: &str, message: String| {
            let mark = node.get(key).map(|n| n.mark.clone()).unwrap_or_else(|| node.mark.clone());
            ConfigError::at(message, &format!("cluster.{key}"), mark)
        };
        let listen = match raw.listen.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                errors.push(at("listen", format!("`{}` is not an address like 127.0.0.1:7100", raw.listen)));
                None
            }
        };
        let node_name = raw.advertise.clone().unwrap_or_else(|| raw.listen.clone());
        if raw.advertise.as_deref().is_some_and(|a| !looks_like_host_port(a)) {
            errors.push(at("advertise", format!("`{node_name}` is not a `host:port`")));
        }
        if listen.is_some_and(|l| l.ip().is_unspecified()) && raw.advertise.is_none() {
            errors.push(at(
                "advertise",
                format!("`listen: {}` is every interface: say which address the other nodes reach this one at with `advertise:`", raw.listen),
            ));
        }
        let discovery = match (raw.discovery.fixed, raw.discovery.dns) {
            (Some(_), Some(d)) => {
                errors.push(at("discovery", "give either `static` or `dns`, not both".to_string()));
                Discovery::Dns(d)
            }
            (None, None) => {
                errors.push(at("discovery", "give `static: [host:port, ...]` or `dns: {name, port}`".to_string()));
                Discovery::Static(Vec::new())
            }
            (Some(members), None) => {
                if members.is_empty() {
                    errors.push(at("discovery", "`static` lists no node".to_string()));
                }
                for m in &members {
                    if !looks_like_host_port(m) {
                        errors.push(at("discovery", format!("`{m}` is not a `host:port`")));
                    }
                }
                if !members.is_empty() && !members.contains(&node_name) {
                    errors.push(at(
                        "discovery",
                        format!("this node (`{node_name}`, from `advertise` or `listen`) is not in the `static` list {members:?}"),
                    ));
                }
                Discovery::Static(members)
            }
            (None, Some(d)) => {
                if d.refresh.0.is_zero() {
                    errors.push(at("discovery", "`dns.refresh` must be more than 0".to_string()));
                }
                Discovery::Dns(d)
            }
        };
        let virtual_nodes = raw.virtual_nodes.unwrap_or(DEFAULT_VIRTUAL_NODES);
        if !(1..=4096).contains(&virtual_nodes) {
            errors.push(at("virtual_nodes", format!("{virtual_nodes} is out of range 1..=4096")));
        }
        let f = &raw.forwarding;
        if f.batch_bytes.0 < 1024 || f.batch_bytes.0 > 64 << 20 {
            errors.push(at("forwarding", format!("`batch_bytes` of {} is out of range 1KiB..=64MiB", f.batch_bytes)));
        }
        if f.max_in_flight.0 < f.batch_bytes.0 {
            errors.push(at(
                "forwarding",
                format!("`max_in_flight` ({}) must be at least `batch_bytes` ({})", f.max_in_flight, f.batch_bytes),
            ));
        }
        if f.request_timeout.0.is_zero() || f.connect_timeout.0.is_zero() || f.retry_backoff.0.is_zero() {
            errors.push(at(
                "forwarding",
                "`request_timeout`, `connect_timeout` and `retry_backoff` must be more than 0".into(),
            ));
        }
        if f.retry_backoff_max.0 < f.retry_backoff.0 {
            errors.push(at("forwarding", "`retry_backoff_max` must be at least `retry_backoff`".into()));
        }
        let max_pending_handshakes = raw.max_pending_handshakes.unwrap_or(DEFAULT_MAX_PENDING_HANDSHAKES);
        if !(1..=65_536).contains(&max_pending_handshakes) {
            errors.push(at("max_pending_handshakes", format!("{max_pending_handshakes} is out of range 1..=65536")));
        }
        let handshake_timeout = raw.handshake_timeout.map_or(DEFAULT_HANDSHAKE_TIMEOUT, |d| d.0);
        if handshake_timeout.is_zero() {
            errors.push(at("handshake_timeout", "must be more than 0".to_string()));
        }
        if f.failures_before_down == 0 {
            errors.push(at("forwarding", "`failures_before_down` must be at least 1".into()));
        }
        // Both sides of every connection: this node serves and dials.
        if let Some(tls) = &raw.tls
            && let Err(e) = tls.server_config().map(|_| ()).and_then(|_| tls.client_config().map(|_| ()))
        {
            errors.push(at("tls", e.to_string()));
        }
        let listen = match listen {
            Some(l) if errors.is_empty() => l,
            _ => return Err(errors),
        };
        Ok(ClusterConfig {
            listen,
            node: node_name,
            discovery,
            cluster_name: raw.cluster_name.unwrap_or_else(|| "sluice".to_string()),
            virtual_nodes,
            tls: raw.tls,
            forwarding: raw.forwarding,
            on_peer_failure: raw.on_peer_failure,
            max_pending_handshakes,
            handshake_timeout,
        })
    }
}

fn looks_like_host_port(s: &str) -> bool {
    match s.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0),
        None => false,
    }
}
