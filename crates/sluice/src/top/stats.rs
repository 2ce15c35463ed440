//! The `/stats` document read into a snapshot, and the rows `sluice top` shows: rates come from
//! two successive snapshots, so they cover exactly one refresh.
//!
//! The document is read with the types the server wrote it from
//! ([`sluice_core::snapshot::NodeSnapshot`]), so a figure has one name on both sides; a
//! component's own figures come with it, by their `/stats` keys. The rows keep every figure
//! optional (`-`) for what a document does not give, such as a queue a pipeline lacks or
//! rates before a second refresh.

use std::time::{Instant, SystemTime};

use serde_json::Value as Json;
use sluice_cluster::metrics::ClusterSnapshot;
use sluice_core::figures::FigureKind;
use sluice_core::snapshot::{NodeSnapshot, PipelineSnapshot};

/// One `/stats` document as read at one moment.
pub struct Snapshot {
    pub at: Instant,
    pub wall: SystemTime,
    pub uptime_seconds: Option<f64>,
    pub memory: Option<Memory>,
    /// This node's name in cluster mode.
    pub node: Option<String>,
    pub pipelines: Vec<PipelineSnap>,
    pub peers: Vec<PeerSnap>,
}

#[derive(Clone, Copy)]
pub struct Memory {
    pub used_bytes: Option<u64>,
    pub budget_bytes: Option<u64>,
}

pub struct PipelineSnap {
    pub name: String,
    pub events_in: Option<u64>,
    pub events_out: Option<u64>,
    pub events_taken: Option<u64>,
    pub failed: Option<u64>,
    pub dropped: Option<u64>,
    pub dead_lettered: Option<u64>,
    pub queue: Option<QueueSnap>,
    pub dlq: Option<DlqSnap>,
    pub workers: Option<u64>,
    pub utilization: Option<f64>,
    pub components: Vec<ComponentSnap>,
}

#[derive(Clone)]
pub struct QueueSnap {
    pub kind: Option<String>,
    pub events: Option<u64>,
    pub bytes: Option<u64>,
    pub max_events: Option<u64>,
    pub max_bytes: Option<u64>,
    pub blocked_nanos: Option<u64>,
}

#[derive(Clone, Copy)]
pub struct DlqSnap {
    pub entries: Option<u64>,
    pub bytes: Option<u64>,
    pub max_bytes: Option<u64>,
}

pub struct ComponentSnap {
    pub id: String,
    pub kind: Option<String>,
    pub type_name: Option<String>,
    pub events_in: Option<u64>,
    pub events_out: Option<u64>,
    pub failed: Option<u64>,
    pub dropped: Option<u64>,
    pub retries: Option<u64>,
    pub refused: Option<u64>,
    /// `starting`, `running`, `stopped` or `failed` (`/stats`' `health.state`).
    pub state: Option<String>,
    /// Why it failed.
    pub reason: Option<String>,
    /// Outputs: `up`, `retrying` or `down` (`/stats`' `output_state`).
    pub output_state: Option<String>,
    /// The component's own figures without labels, by their `/stats` key (in its `state`).
    pub own: Vec<(String, u64)>,
}

pub struct PeerSnap {
    pub name: String,
    pub state: Option<String>,
    pub events_forwarded: Option<u64>,
    pub failures: Option<u64>,
    pub batches_retried: Option<u64>,
    pub bytes_in_flight: Option<u64>,
    pub latency_mean_seconds: Option<f64>,
}

impl Snapshot {
    /// Reads a `/stats` document into the server's own types ([`NodeSnapshot`]): a figure
    /// renamed there is renamed here. A field the document lacks reads as zero; one of another
    /// type refuses the document, saying where.
    pub fn parse(doc: &Json, at_: Instant, wall: SystemTime) -> Result<Snapshot, String> {
        if !doc.is_object() {
            return Err("the /stats answer is not a JSON object".to_string());
        }
        let figures = NodeSnapshot::read(doc).map_err(|e| format!("the /stats answer does not read: {e}"))?;
        let pipelines = figures.pipelines.iter().map(PipelineSnap::of).collect();
        let memory =
            figures.memory.map(|m| Memory { used_bytes: Some(m.used_bytes), budget_bytes: Some(m.budget_bytes) });
        // The cluster's section, with its own crate's types.
        let cluster = match figures.sections.get("cluster") {
            Some(c) => Some(
                serde_json::from_value::<ClusterSnapshot>(c.clone())
                    .map_err(|e| format!("the /stats answer's cluster does not read: {e}"))?,
            ),
            None => None,
        };
        let peers = cluster
            .iter()
            .flat_map(|c| &c.peers)
            .map(|(name, p)| PeerSnap {
                name: name.clone(),
                state: Some(p.state.clone()),
                events_forwarded: Some(p.events_forwarded),
                failures: Some(p.failures),
                batches_retried: Some(p.batches_retried),
                bytes_in_flight: Some(p.bytes_in_flight),
                latency_mean_seconds: Some(p.latency_mean_seconds),
            })
            .collect();
        Ok(Snapshot {
            at: at_,
            wall,
            uptime_seconds: Some(figures.uptime_seconds),
            memory,
            node: cluster.map(|c| c.node),
            pipelines,
            peers,
        })
    }
}

impl PipelineSnap {
    fn of(p: &PipelineSnapshot) -> PipelineSnap {
        let queue = p.queue.as_ref().map(|q| QueueSnap {
            kind: Some(q.kind.to_string()),
            events: Some(q.events),
            bytes: Some(q.bytes),
            max_events: Some(q.max_events),
            max_bytes: Some(q.max_bytes),
            blocked_nanos: Some(q.blocked_nanos),
        });
        let dlq = p.dead_letter_queue.as_ref().map(|d| DlqSnap {
            entries: Some(d.stats.store.entries),
            bytes: Some(d.stats.store.bytes),
            max_bytes: Some(d.stats.max_bytes),
        });
        let components = p
            .components
            .iter()
            .map(|c| ComponentSnap {
                id: c.id.clone(),
                kind: Some(c.kind.as_str().to_string()),
                type_name: Some(c.type_name.clone()),
                events_in: Some(c.events.in_),
                events_out: Some(c.events.out),
                failed: Some(c.events.failed),
                dropped: Some(c.events.dropped),
                retries: Some(c.retries),
                refused: Some(c.refused),
                state: Some(c.health.state.clone()).filter(|s| !s.is_empty()),
                reason: c.health.reason.clone(),
                output_state: c.output.as_ref().map(|o| o.output_state.as_str().to_string()),
                own: c
                    .state
                    .iter()
                    .flat_map(|s| &s.figures)
                    .filter(|f| f.labels.is_empty() && f.kind != FigureKind::Histogram)
                    .map(|f| (f.stats_key().to_string(), f.count()))
                    .collect(),
            })
            .collect();
        PipelineSnap {
            name: p.name.clone(),
            events_in: Some(p.events.in_),
            events_out: Some(p.events.out),
            events_taken: Some(p.events.taken),
            failed: Some(p.events.failed),
            dropped: Some(p.events.dropped),
            dead_lettered: Some(p.events.dead_lettered),
            queue,
            dlq,
            workers: Some(p.workers as u64),
            utilization: Some(p.worker_utilization),
            components,
        }
    }
}

/// A pipeline as shown: its figures now and its rates over the last refresh.
pub struct PipelineRow {
    pub name: String,
    pub in_rate: Option<f64>,
    pub out_rate: Option<f64>,
    pub taken_rate: Option<f64>,
    pub failed: Option<u64>,
    pub dropped: Option<u64>,
    pub dead_lettered: Option<u64>,
    pub queue: Option<QueueSnap>,
    /// The fuller of the queue's two limits (events, bytes), 0 to 1.
    pub queue_fill: Option<f64>,
    /// Time inputs spent blocked on a full queue per second of the refresh, summed over the
    /// inputs (so it can pass 1 when several wait at once).
    pub blocked: Option<f64>,
    pub dlq: Option<DlqSnap>,
    pub workers: Option<u64>,
    pub utilization: Option<f64>,
    pub components: Vec<ComponentRow>,
}

pub struct ComponentRow {
    pub id: String,
    pub kind: Option<String>,
    pub type_name: Option<String>,
    pub in_rate: Option<f64>,
    pub out_rate: Option<f64>,
    pub failed: Option<u64>,
    pub dropped: Option<u64>,
    pub retries: Option<u64>,
    pub refused: Option<u64>,
    /// `starting`, `running`, `stopped` or `failed` (`/stats`' `health.state`).
    pub state: Option<String>,
    /// Why it failed.
    pub reason: Option<String>,
    /// Outputs: `up`, `retrying` or `down` (`/stats`' `output_state`).
    pub output_state: Option<String>,
    /// The component's own figures without labels, by their `/stats` key.
    pub own: Vec<(String, u64)>,
}

pub struct PeerRow {
    pub name: String,
    pub state: Option<String>,
    pub forwarded_rate: Option<f64>,
    pub failures: Option<u64>,
    pub batches_retried: Option<u64>,
    pub bytes_in_flight: Option<u64>,
    pub latency_mean_seconds: Option<f64>,
}

#[derive(Default)]
pub struct Rows {
    pub pipelines: Vec<PipelineRow>,
    pub peers: Vec<PeerRow>,
}

/// Per second between two readings of a counter. None without an earlier reading, and when
/// the counter went down: a reload restarts a pipeline's counters from zero.
fn per_second(now: Option<u64>, before: Option<u64>, secs: f64) -> Option<f64> {
    let (now, before) = (now?, before?);
    (secs > 0.0 && now >= before).then(|| (now - before) as f64 / secs)
}

fn fill(q: &QueueSnap) -> Option<f64> {
    let share = |n: Option<u64>, max: Option<u64>| match (n, max) {
        (Some(n), Some(max)) if max > 0 => Some(n as f64 / max as f64),
        _ => None,
    };
    match (share(q.events, q.max_events), share(q.bytes, q.max_bytes)) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    }
}

/// The rows for `cur`, with rates against `prev` (none for the first snapshot).
pub fn rows(prev: Option<&Snapshot>, cur: &Snapshot) -> Rows {
    let secs = prev.map_or(0.0, |p| cur.at.saturating_duration_since(p.at).as_secs_f64());
    let pipelines = cur
        .pipelines
        .iter()
        .map(|p| {
            let before = prev.and_then(|s| s.pipelines.iter().find(|b| b.name == p.name));
            let rate = |pick: fn(&PipelineSnap) -> Option<u64>| per_second(pick(p), before.and_then(pick), secs);
            let blocked = per_second(
                p.queue.as_ref().and_then(|q| q.blocked_nanos),
                before.and_then(|b| b.queue.as_ref()).and_then(|q| q.blocked_nanos),
                secs,
            )
            .map(|nanos| nanos / 1e9);
            let components = p
                .components
                .iter()
                .map(|c| {
                    let before = before.and_then(|b| b.components.iter().find(|x| x.id == c.id));
                    let rate =
                        |pick: fn(&ComponentSnap) -> Option<u64>| per_second(pick(c), before.and_then(pick), secs);
                    ComponentRow {
                        id: c.id.clone(),
                        kind: c.kind.clone(),
                        type_name: c.type_name.clone(),
                        in_rate: rate(|c| c.events_in),
                        out_rate: rate(|c| c.events_out),
                        failed: c.failed,
                        dropped: c.dropped,
                        retries: c.retries,
                        refused: c.refused,
                        state: c.state.clone(),
                        reason: c.reason.clone(),
                        output_state: c.output_state.clone(),
                        own: c.own.clone(),
                    }
                })
                .collect();
            PipelineRow {
                name: p.name.clone(),
                in_rate: rate(|p| p.events_in),
                out_rate: rate(|p| p.events_out),
                taken_rate: rate(|p| p.events_taken),
                failed: p.failed,
                dropped: p.dropped,
                dead_lettered: p.dead_lettered,
                queue_fill: p.queue.as_ref().and_then(fill),
                queue: p.queue.clone(),
                blocked,
                dlq: p.dlq,
                workers: p.workers,
                utilization: p.utilization,
                components,
            }
        })
        .collect();
    let peers = cur
        .peers
        .iter()
        .map(|p| {
            let before = prev.and_then(|s| s.peers.iter().find(|b| b.name == p.name));
            PeerRow {
                name: p.name.clone(),
                state: p.state.clone(),
                forwarded_rate: per_second(p.events_forwarded, before.and_then(|b| b.events_forwarded), secs),
                failures: p.failures,
                batches_retried: p.batches_retried,
                bytes_in_flight: p.bytes_in_flight,
                latency_mean_seconds: p.latency_mean_seconds,
            }
        })
        .collect();
    Rows { pipelines, peers }
}

/// What the view shows: the newest snapshot, its rows, and whether the API answers.
pub struct Tracker {
    prev: Option<Snapshot>,
    pub cur: Snapshot,
    pub rows: Rows,
    /// Since when the API has not answered, and the last error, while it does not.
    pub unreachable: Option<(SystemTime, String)>,
}

impl Tracker {
    pub fn new(first: Snapshot) -> Tracker {
        let rows = rows(None, &first);
        Tracker { prev: None, cur: first, rows, unreachable: None }
    }

    pub fn update(&mut self, snapshot: Snapshot) {
        self.rows = rows(Some(&self.cur), &snapshot);
        self.prev = Some(std::mem::replace(&mut self.cur, snapshot));
        self.unreachable = None;
    }

    pub fn failed(&mut self, wall: SystemTime, error: String) {
        let since = self.unreachable.as_ref().map_or(wall, |(since, _)| *since);
        self.unreachable = Some((since, error));
    }

    /// Whether the rates cover a refresh yet (the first snapshot has none).
    pub fn has_rates(&self) -> bool {
        self.prev.is_some()
    }
}

pub fn fmt_rate(r: Option<f64>) -> String {
    r.map_or_else(|| "-".to_string(), |r| format!("{r:.1}"))
}

pub fn fmt_count(n: Option<u64>) -> String {
    n.map_or_else(|| "-".to_string(), |n| n.to_string())
}

pub fn fmt_bytes(n: Option<u64>) -> String {
    let Some(n) = n else { return "-".to_string() };
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{v:.1} {}", UNITS[unit]) }
}

pub fn fmt_percent(share: Option<f64>) -> String {
    share.map_or_else(|| "-".to_string(), |s| format!("{:.1}%", s * 100.0))
}

/// Local wall-clock time of day, for "unreachable since".
pub fn fmt_clock(t: SystemTime) -> String {
    chrono::DateTime::<chrono::Local>::from(t).format("%H:%M:%S").to_string()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;

    fn snap(doc: Json, at: Instant) -> Snapshot {
        Snapshot::parse(&doc, at, SystemTime::now()).unwrap()
    }

    #[test]
    fn rates_come_from_two_snapshots() {
        let t0 = Instant::now();
        let a = snap(
            json!({"pipelines": {"web": {"events": {"in": 100, "out": 50},
                "queue": {"events": 10, "max_events": 100, "bytes": 500, "max_bytes": 1000, "blocked_nanos": 0},
                "components": [{"id": "gen", "kind": "input", "type": "generator", "events": {"in": 0, "out": 100}}]}}}),
            t0,
        );
        let b = snap(
            json!({"pipelines": {"web": {"events": {"in": 300, "out": 250},
                "queue": {"events": 10, "max_events": 100, "bytes": 500, "max_bytes": 1000, "blocked_nanos": 500_000_000u64},
                "components": [{"id": "gen", "kind": "input", "type": "generator", "events": {"in": 0, "out": 300}}]}}}),
            t0 + Duration::from_secs(2),
        );
        let first = rows(None, &a);
        assert_eq!(first.pipelines[0].in_rate, None, "no rate without an earlier snapshot");
        let r = rows(Some(&a), &b);
        let p = &r.pipelines[0];
        assert_eq!(p.in_rate, Some(100.0));
        assert_eq!(p.out_rate, Some(100.0));
        assert_eq!(p.blocked, Some(0.25));
        assert_eq!(p.queue_fill, Some(0.5), "the fuller limit (bytes) counts");
        assert_eq!(p.components[0].out_rate, Some(100.0));
        assert_eq!(p.taken_rate, Some(0.0), "a field the document lacks reads as zero");
    }

    #[test]
    fn missing_fields_read_as_zero_and_a_mistyped_one_is_refused_saying_what() {
        let t0 = Instant::now();
        let a = snap(
            json!({"pipelines": {"p": {"queue": null, "components": [{"id": "x", "kind": "input", "type": "tcp"}]}}}),
            t0,
        );
        let p = &rows(None, &a).pipelines[0];
        assert_eq!((p.failed, p.queue_fill), (Some(0), None), "no queue is no fill");
        assert_eq!(p.components[0].state, None, "no health given is `-`, not an empty state");
        assert!(snap(json!({}), t0).pipelines.is_empty());
        for odd in [
            json!({"pipelines": {"p": {"events": {"in": "many"}}}}),
            json!({"pipelines": {"p": {"components": "none"}}}),
            json!({"pipelines": {"p": {"events": {"out": -1}}}}),
        ] {
            let e = Snapshot::parse(&odd, t0, SystemTime::now()).err().unwrap_or_else(|| panic!("{odd} read"));
            assert!(e.starts_with("the /stats answer does not read: invalid"), "{e}");
        }
        assert!(Snapshot::parse(&json!([1, 2]), t0, SystemTime::now()).is_err());
    }

    /// A component's own figures come through by their `/stats` keys, whatever they are named:
    /// a figure renamed in its component is renamed here with no change to this module.
    #[test]
    fn a_components_own_figures_come_by_their_keys() {
        use sluice_core::figures::{Figure, OwnFigures, Spec};
        use sluice_core::metrics::{ComponentKind, MetricsRegistry, PipelineMetrics};

        struct Own;
        impl sluice_core::figures::Publish for Own {
            fn figures(&self) -> Vec<Figure> {
                const RENAMED: Spec = Spec::gauge("sockets_open", "Renamed from connections_open.");
                const LABELLED: Spec = Spec::counter("refused_total", "By reason.");
                vec![RENAMED.value(3), LABELLED.labelled(vec![("reason", "size".into())], 1)]
            }
        }
        let registry = MetricsRegistry::default();
        let p = std::sync::Arc::new(PipelineMetrics::new("web", 1));
        let _ = p.component("in", ComponentKind::Input, "tcp").state.set(std::sync::Arc::new(Own));
        registry.register(p);
        let figures = NodeSnapshot::take(&registry, Duration::from_secs(1), Default::default());
        let doc = serde_json::to_value(&figures).unwrap();
        let text = sluice_core::exposition::text(move |out| figures.encode(out)).unwrap();
        let series = "sluice_component_sockets_open{pipeline=\"web\",component=\"in\",kind=\"input\",type=\"tcp\"} 3\n";
        assert!(text.contains(series), "{text}");
        assert!(text.contains("# TYPE sluice_component_refused counter\n"), "{text}");
        assert_eq!(doc["pipelines"]["web"]["components"][0]["state"]["sockets_open"], 3, "{doc}");
        let s = snap(doc, Instant::now());
        let c = &rows(None, &s).pipelines[0].components[0];
        assert_eq!(c.own, [("sockets_open".to_string(), 3)], "labelled series stay at /stats and /metrics");
        let read: OwnFigures =
            serde_json::from_value(json!({"sockets_open": 3, "refused": [{"reason": "size", "value": 1}]})).unwrap();
        assert_eq!(read.get("sockets_open").map(Figure::count), Some(3));
        assert_eq!(read.get("refused").map(|f| f.labels.len()), Some(1));
    }

    #[test]
    fn counters_that_restart_show_no_rate() {
        let t0 = Instant::now();
        let a = snap(json!({"pipelines": {"p": {"events": {"in": 1000, "out": 1000}}}}), t0);
        let b = snap(json!({"pipelines": {"p": {"events": {"in": 10, "out": 10}}}}), t0 + Duration::from_secs(1));
        assert_eq!(rows(Some(&a), &b).pipelines[0].in_rate, None);
    }

    #[test]
    fn peers_are_read_from_the_cluster_section() {
        let t0 = Instant::now();
        let doc = |n: u64| json!({"pipelines": {}, "cluster": {"node": "a", "peers": {"b": {"state": "up", "events_forwarded": n, "failures": 0}}}});
        let r = rows(Some(&snap(doc(0), t0)), &snap(doc(40), t0 + Duration::from_secs(4)));
        assert_eq!(r.peers[0].name, "b");
        assert_eq!(r.peers[0].forwarded_rate, Some(10.0));
        assert_eq!(r.peers[0].state.as_deref(), Some("up"));
    }

    #[test]
    fn formats() {
        assert_eq!(fmt_bytes(Some(512)), "512 B");
        assert_eq!(fmt_bytes(Some(1536)), "1.5 KiB");
        assert_eq!(fmt_bytes(None), "-");
        assert_eq!(fmt_rate(Some(2.26)), "2.3");
        assert_eq!(fmt_percent(Some(0.5)), "50.0%");
    }
}
