//! The node's figures at one moment, as one typed value: built once per read of the monitoring
//! API from the atomics of [`metrics`](crate::metrics), then rendered three ways. `/metrics`
//! encodes it ([`NodeSnapshot::encode`], OpenMetrics), `/stats` serializes it (serde, the JSON
//! document), and `sluice top` deserializes the same types from that document.
//!
//! A figure is named once: a field here (the node's, a pipeline's, every component's), a store's
//! snapshot type beside the store's interface ([`QueueStats`] in [`queue`](crate::queue), the
//! memory budget's in [`memory`](crate::memory), the dead letter queue's and the registry's in
//! [`metrics`](crate::metrics)), or a component's own [`Spec`](crate::figures::Spec) in the
//! component's module. Fields `/stats` does not carry (histograms' buckets) are skipped by serde
//! and read back as empty.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::exposition::{DescriptorEncoder, Labels, counter, gauge, histogram_snapshots};
use crate::figures::{Figure, FigureKind, FigureValue, OwnFigures};
use crate::health::Lifecycle;
use crate::memory::MemorySnapshot;
use crate::metrics::{
    ComponentKind, ComponentMetrics, DeadLetterSnapshot, LastError, MetricsRegistry, MetricsSection, OutputState,
    PipelineMetrics, RegistrySnapshot,
};
use crate::queue::{HistogramSnapshot, QueueStats};

/// Everything `/metrics` and `/stats` show.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct NodeSnapshot {
    pub version: Option<String>,
    pub commit: Option<String>,
    pub uptime_seconds: f64,
    pub draining: bool,
    pub reloads: Reloads,
    pub process: ProcessSnapshot,
    /// In the order the pipelines started; `/stats` gives them as an object by name.
    #[serde(with = "by_name")]
    pub pipelines: Vec<PipelineSnapshot>,
    pub registry: Option<RegistrySnapshot>,
    pub memory: Option<MemorySnapshot>,
    /// The sections' `/stats` documents (the cluster's), by key.
    #[serde(flatten)]
    pub sections: BTreeMap<String, serde_json::Value>,
    /// The sections themselves, which encode their own families.
    #[serde(skip)]
    pub section_sources: Vec<Arc<dyn MetricsSection>>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Reloads {
    pub succeeded: u64,
    /// Reloads whose config was invalid or could not start (the running config stayed).
    pub failed: u64,
    /// When the last reload ended (0: none yet).
    pub last_unix_seconds: u64,
}

/// What the process uses; a figure the system does not give is `None`, not zero.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProcessSnapshot {
    pub resident_bytes: Option<u64>,
    pub cpu_seconds: Option<f64>,
    pub open_fds: Option<u64>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct PipelineSnapshot {
    /// The key of the pipeline in `/stats`' `pipelines`.
    #[serde(skip)]
    pub name: String,
    pub events: PipelineEvents,
    pub rates: Rates,
    pub queue: Option<QueueStats>,
    /// Cluster mode: the queue of events peers forwarded to this pipeline.
    pub forwarded_queue: Option<QueueStats>,
    pub dead_letter_queue: Option<DeadLetterSnapshot>,
    pub ack_latency: AckLatency,
    pub workers: usize,
    /// Share of the workers' time with a batch in hand since the pipeline started (0 to 1).
    pub worker_utilization: f64,
    pub uptime_seconds: f64,
    pub components: Vec<ComponentSnapshot>,
    #[serde(skip)]
    pub batch_duration: HistogramSnapshot,
    #[serde(skip)]
    pub ack_latency_histogram: HistogramSnapshot,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PipelineEvents {
    /// Put in by the pipeline's inputs.
    #[serde(rename = "in")]
    pub in_: u64,
    /// Taken from the queues by the workers.
    pub taken: u64,
    pub out: u64,
    pub dropped: u64,
    pub failed: u64,
    pub dead_lettered: u64,
}

/// Events per second over the last minute and the last five, from the API's samples (zero at
/// `/metrics`, which has the counters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Rates {
    pub in_1m: f64,
    pub taken_1m: f64,
    pub out_1m: f64,
    pub in_5m: f64,
    pub taken_5m: f64,
    pub out_5m: f64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AckLatency {
    pub count: u64,
    /// `None` before the first acknowledgement.
    pub p50_seconds: Option<f64>,
    pub p99_seconds: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ComponentSnapshot {
    pub id: String,
    pub kind: ComponentKind,
    #[serde(rename = "type")]
    pub type_name: String,
    #[serde(default)]
    pub events: ComponentEvents,
    #[serde(default)]
    pub retries: u64,
    #[serde(default)]
    pub refused: u64,
    #[serde(default)]
    pub health: HealthSnapshot,
    /// The component's own figures, if it publishes any.
    #[serde(default)]
    pub state: Option<OwnFigures>,
    /// Inputs: bytes taken in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_in: Option<u64>,
    /// Outputs: bytes delivered, state and last error.
    #[serde(default, flatten)]
    pub output: Option<OutputSnapshot>,
    #[serde(skip)]
    pub duration: HistogramSnapshot,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ComponentEvents {
    #[serde(rename = "in")]
    pub in_: u64,
    pub out: u64,
    pub dropped: u64,
    pub failed: u64,
}

/// `starting`, `running`, `stopped` or `failed`, with the reason when it failed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HealthSnapshot {
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputSnapshot {
    #[serde(default)]
    pub bytes_out: u64,
    pub output_state: OutputState,
    #[serde(default)]
    pub last_error: Option<LastError>,
}

/// `Vec<PipelineSnapshot>` as an object by name, in `/stats`.
mod by_name {
    use serde::ser::SerializeMap;
    use serde::{Deserialize, Deserializer, Serializer};

    use super::PipelineSnapshot;

    pub fn serialize<S: Serializer>(pipelines: &[PipelineSnapshot], s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(pipelines.len()))?;
        for p in pipelines {
            map.serialize_entry(&p.name, p)?;
        }
        map.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<PipelineSnapshot>, D::Error> {
        let map = std::collections::BTreeMap::<String, PipelineSnapshot>::deserialize(d)?;
        Ok(map.into_iter().map(|(name, p)| PipelineSnapshot { name, ..p }).collect())
    }
}

impl NodeSnapshot {
    /// Reads every figure of `registry` now. Rates are left at zero (the API fills them from
    /// its samples); `process` is read by the caller, from the kernel.
    pub fn take(registry: &MetricsRegistry, uptime: Duration, process: ProcessSnapshot) -> NodeSnapshot {
        let node = &registry.node;
        let build = node.build.get();
        let sections = registry.sections();
        NodeSnapshot {
            version: build.map(|b| b.version.clone()),
            commit: build.map(|b| b.commit.clone()),
            uptime_seconds: uptime.as_secs_f64(),
            draining: node.draining(),
            reloads: Reloads {
                succeeded: node.reloads_succeeded.get(),
                failed: node.reloads_failed.get(),
                last_unix_seconds: node.last_reload_unix_seconds(),
            },
            process,
            pipelines: registry.pipelines().iter().map(|p| PipelineSnapshot::take(p)).collect(),
            registry: registry.registry().map(|r| r.snapshot()),
            memory: registry.memory().map(|m| m.snapshot()),
            sections: sections.iter().map(|s| (s.key(), s.stats())).collect(),
            section_sources: sections,
        }
    }

    /// Reads a `/stats` document back (what `sluice top` does).
    pub fn read(doc: &serde_json::Value) -> Result<NodeSnapshot, serde_json::Error> {
        NodeSnapshot::deserialize(doc)
    }

    /// Every family of `/metrics`, in the order a scrape has always given them.
    pub fn encode(&self, out: &mut DescriptorEncoder<'_>) -> fmt::Result {
        gauge(
            out,
            "sluice_uptime_seconds",
            "Seconds since the process started.",
            [(Labels::new(), self.uptime_seconds)],
        )?;
        self.encode_node(out)?;
        self.encode_pipelines(out)?;
        let label = |p: &PipelineSnapshot| vec![("pipeline", p.name.clone())];
        let queues: Vec<(Labels, &QueueStats)> =
            self.pipelines.iter().filter_map(|p| Some((label(p), p.queue.as_ref()?))).collect();
        QueueStats::encode(out, &queues)?;
        let dlqs: Vec<(Labels, &DeadLetterSnapshot)> =
            self.pipelines.iter().filter_map(|p| Some((label(p), p.dead_letter_queue.as_ref()?))).collect();
        DeadLetterSnapshot::encode(out, &dlqs)?;
        self.encode_components(out)?;
        if let Some(r) = &self.registry {
            r.encode(out)?;
        }
        if let Some(m) = &self.memory {
            m.encode(out)?;
        }
        for section in &self.section_sources {
            section.encode(out)?;
        }
        Ok(())
    }

    fn encode_node(&self, out: &mut DescriptorEncoder<'_>) -> fmt::Result {
        if let (Some(version), Some(commit)) = (&self.version, &self.commit) {
            let labels = vec![("version", version.clone()), ("commit", commit.clone())];
            gauge(
                out,
                "sluice_build_info",
                "The version and commit this binary was built from (always 1).",
                [(labels, 1u64)],
            )?;
        }
        counter(
            out,
            "sluice_config_reloads_total",
            "Config reloads (SIGHUP) by result; a failed one left the running config in place.",
            [
                (vec![("result", "succeeded".to_string())], self.reloads.succeeded),
                (vec![("result", "failed".to_string())], self.reloads.failed),
            ],
        )?;
        gauge(
            out,
            "sluice_config_last_reload_timestamp_seconds",
            "When the last config reload ended, in seconds since the Unix epoch (0: none yet).",
            [(Labels::new(), self.reloads.last_unix_seconds)],
        )?;
        gauge(
            out,
            "sluice_draining",
            "1 while the node stops and drains its pipelines.",
            [(Labels::new(), u64::from(self.draining))],
        )?;
        let process = &self.process;
        if let Some(v) = process.resident_bytes {
            gauge(out, "process_resident_memory_bytes", "Resident memory of the process.", [(Labels::new(), v)])?;
        }
        if let Some(v) = process.cpu_seconds {
            counter(
                out,
                "process_cpu_seconds_total",
                "User and system CPU time of the process.",
                [(Labels::new(), v)],
            )?;
        }
        if let Some(v) = process.open_fds {
            gauge(out, "process_open_fds", "File descriptors the process holds open.", [(Labels::new(), v)])?;
        }
        Ok(())
    }

    fn encode_pipelines(&self, out: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let pipelines = &self.pipelines;
        let pl = |p: &PipelineSnapshot| vec![("pipeline", p.name.clone())];
        type Pick = fn(&PipelineSnapshot) -> u64;
        let pipeline_counters: [(&str, &str, Pick); 6] = [
            ("sluice_pipeline_events_in_total", "Events the pipeline's inputs put in.", |p| p.events.in_),
            ("sluice_pipeline_events_taken_total", "Events the pipeline's workers took from its queues.", |p| {
                p.events.taken
            }),
            (
                "sluice_pipeline_events_out_total",
                "Events that passed the processors and were handed to every output.",
                |p| p.events.out,
            ),
            ("sluice_pipeline_events_dropped_total", "Events dropped on purpose by processors.", |p| p.events.dropped),
            (
                "sluice_pipeline_events_failed_total",
                "Events outputs rejected for good and did not hand to a dead letter queue.",
                |p| p.events.failed,
            ),
            (
                "sluice_pipeline_events_dead_lettered_total",
                "Events written to the pipeline's dead letter queue (by processors and outputs).",
                |p| p.events.dead_lettered,
            ),
        ];
        for (name, help, pick) in pipeline_counters {
            counter(out, name, help, pipelines.iter().map(|p| (pl(p), pick(p))))?;
        }
        histogram_snapshots(
            out,
            "sluice_pipeline_batch_duration_seconds",
            "Time a worker spent on one batch, processors and outputs.",
            pipelines.iter().map(|p| (pl(p), p.batch_duration.clone())),
        )?;
        histogram_snapshots(
            out,
            "sluice_pipeline_ack_latency_seconds",
            "Time from an input batch's push towards the queue to its acknowledgement, once per acknowledged batch.",
            pipelines.iter().map(|p| (pl(p), p.ack_latency_histogram.clone())),
        )?;
        gauge(
            out,
            "sluice_pipeline_workers",
            "Workers per pipeline.",
            pipelines.iter().map(|p| (pl(p), p.workers as u64)),
        )?;
        gauge(
            out,
            "sluice_pipeline_worker_utilization",
            "Share of the workers' time with at least one batch in hand since the pipeline started (0 to 1).",
            pipelines.iter().map(|p| (pl(p), p.worker_utilization)),
        )
    }

    fn encode_components(&self, out: &mut DescriptorEncoder<'_>) -> fmt::Result {
        let mut comps: Vec<(Labels, &ComponentSnapshot)> = Vec::new();
        for p in &self.pipelines {
            for c in &p.components {
                let labels = vec![
                    ("pipeline", p.name.clone()),
                    ("component", c.id.clone()),
                    ("kind", c.kind.as_str().to_string()),
                    ("type", c.type_name.clone()),
                ];
                comps.push((labels, c));
            }
        }
        type PickC = fn(&ComponentSnapshot) -> u64;
        let component_counters: [(&str, &str, PickC); 6] = [
            ("sluice_component_events_in_total", "Events a component received.", |c| c.events.in_),
            ("sluice_component_events_out_total", "Events a component passed on or delivered.", |c| c.events.out),
            ("sluice_component_events_dropped_total", "Events a component dropped on purpose.", |c| c.events.dropped),
            (
                "sluice_component_events_failed_total",
                "Events a component failed on (tagged, rejected, unparsable).",
                |c| c.events.failed,
            ),
            (
                "sluice_component_retries_total",
                "Output attempts that failed for a reason outside the events (disk full, peer down) and were retried.",
                |c| c.retries,
            ),
            (
                "sluice_component_refused_total",
                "Requests and connections an input refused because of a limit (size, events, memory budget, connections, timeouts).",
                |c| c.refused,
            ),
        ];
        for (name, help, pick) in component_counters {
            counter(out, name, help, comps.iter().map(|(l, c)| (l.clone(), pick(c))))?;
        }
        // Bytes only where they cross the node's edge: inputs take them in, outputs send them.
        counter(
            out,
            "sluice_component_received_bytes_total",
            "Bytes an input read from the network, a file or stdin, before framing, decoding and decompression.",
            comps.iter().filter_map(|(l, c)| Some((l.clone(), c.bytes_in?))),
        )?;
        counter(
            out,
            "sluice_component_sent_bytes_total",
            "Bytes an output delivered: written, or sent in requests and records the destination accepted.",
            comps.iter().filter_map(|(l, c)| Some((l.clone(), c.output.as_ref()?.bytes_out))),
        )?;
        let outputs: Vec<(&Labels, &OutputSnapshot)> =
            comps.iter().filter_map(|(l, c)| Some((l, c.output.as_ref()?))).collect();
        let mut states = Vec::with_capacity(outputs.len() * OutputState::ALL.len());
        for (labels, o) in &outputs {
            for state in OutputState::ALL {
                let mut labels = (*labels).clone();
                labels.push(("state", state.as_str().to_string()));
                states.push((labels, u64::from(state == o.output_state)));
            }
        }
        gauge(
            out,
            "sluice_component_output_state",
            "An output's state, 1 for the current one: up, retrying (attempts fail and are retried), down (failing for 60 s or more, or gave up).",
            states,
        )?;
        gauge(
            out,
            "sluice_component_last_error_timestamp_seconds",
            "When an output last failed an attempt, in seconds since the Unix epoch (0: never).",
            outputs.iter().map(|(l, o)| ((*l).clone(), o.last_error.as_ref().map_or(0.0, |e| e.at))),
        )?;
        // Components' own figures, one family per name: counts, then histograms.
        let own: Vec<(&Labels, &Figure)> = comps
            .iter()
            .flat_map(|(l, c)| c.state.iter().flat_map(|s| s.figures.iter()).map(move |f| (l, f)))
            .collect();
        let with_labels = |l: &Labels, f: &Figure| {
            let mut labels = l.clone();
            labels.extend(f.labels.iter().map(|(k, v)| (label_name(k.clone()), v.clone())));
            labels
        };
        let counts = |f: &Figure| matches!(f.value, FigureValue::Count(_));
        for name in family_names(own.iter().filter(|(_, f)| counts(f)).map(|(_, f)| *f)) {
            let rows = || own.iter().filter(move |(_, f)| counts(f) && f.name == name);
            let Some((_, first)) = rows().next() else { continue };
            let full = format!("sluice_component_{name}");
            let series = rows().map(|(l, f)| (with_labels(l, f), f.count()));
            if first.kind == FigureKind::Counter {
                counter(out, &full, &first.help, series)?;
            } else {
                gauge(out, &full, &first.help, series)?;
            }
        }
        for name in family_names(own.iter().filter(|(_, f)| !counts(f)).map(|(_, f)| *f)) {
            let rows = || {
                own.iter().filter(move |(_, f)| f.name == name).filter_map(|(l, f)| match &f.value {
                    FigureValue::Histogram(h) => Some((with_labels(l, f), h.clone())),
                    FigureValue::Count(_) => None,
                })
            };
            let help = own.iter().find(|(_, f)| f.name == name).map(|(_, f)| f.help.to_string()).unwrap_or_default();
            histogram_snapshots(out, &format!("sluice_component_{name}"), &help, rows())?;
        }
        histogram_snapshots(
            out,
            "sluice_component_duration_seconds",
            "Time a processor or output spent on one batch.",
            comps.iter().filter(|(_, c)| c.duration.count > 0).map(|(l, c)| (l.clone(), c.duration.clone())),
        )
    }
}

/// The distinct names, sorted: one family each.
fn family_names<'a>(figures: impl Iterator<Item = &'a Figure>) -> Vec<&'a str> {
    let mut names: Vec<&str> = figures.map(|f| f.name.as_ref()).collect();
    names.sort();
    names.dedup();
    names
}

/// Label names are `&'static str` in the encoder: a component's are (its [`Spec`]s give them);
/// one read back from `/stats` is kept once for the process.
fn label_name(name: std::borrow::Cow<'static, str>) -> &'static str {
    match name {
        std::borrow::Cow::Borrowed(s) => s,
        std::borrow::Cow::Owned(s) => {
            static NAMES: parking_lot::Mutex<Vec<&'static str>> = parking_lot::Mutex::new(Vec::new());
            let mut names = NAMES.lock();
            if let Some(known) = names.iter().find(|n| **n == s.as_str()) {
                return known;
            }
            let leaked: &'static str = Box::leak(s.into_boxed_str());
            names.push(leaked);
            leaked
        }
    }
}

impl PipelineSnapshot {
    pub fn take(p: &PipelineMetrics) -> PipelineSnapshot {
        let wall = p.started.elapsed().as_nanos() as f64 * p.workers.max(1) as f64;
        let utilisation = if wall > 0.0 { (p.worker_busy_nanos.get() as f64 / wall).min(1.0) } else { 0.0 };
        let ack = p.ack_latency.snapshot_struct();
        PipelineSnapshot {
            name: p.name.clone(),
            events: PipelineEvents {
                in_: p.events_in(),
                taken: p.events_taken.get(),
                out: p.events_out.get(),
                dropped: p.dropped.get(),
                failed: p.failed.get(),
                dead_lettered: p.dead_lettered.get(),
            },
            rates: Rates::default(),
            queue: p.queue.get().map(|q| q.stats()),
            forwarded_queue: p.forwarded_queue.get().map(|q| q.stats()),
            dead_letter_queue: p.dead_letter_queue.get().map(|d| DeadLetterSnapshot {
                stats: d.dead_letter_stats(),
                loop_rejected: p.dead_letter_loop_rejected.get(),
                lost: p.dead_letter_lost.get(),
                write_retries: p.dead_letter_write_retries.get(),
            }),
            ack_latency: AckLatency {
                count: ack.count,
                p50_seconds: crate::metrics::quantile_of(&ack.buckets, 0.5),
                p99_seconds: crate::metrics::quantile_of(&ack.buckets, 0.99),
            },
            workers: p.workers,
            worker_utilization: utilisation,
            uptime_seconds: p.started.elapsed().as_secs_f64(),
            components: p.components.read().iter().map(|c| ComponentSnapshot::take(c)).collect(),
            batch_duration: p.batch_duration.snapshot_struct(),
            ack_latency_histogram: ack,
        }
    }
}

impl ComponentSnapshot {
    pub fn take(c: &ComponentMetrics) -> ComponentSnapshot {
        let health = match c.health.get() {
            Lifecycle::Failed(reason) => HealthSnapshot { state: "failed".into(), reason: Some(reason) },
            state => HealthSnapshot { state: state.as_str().to_string(), reason: None },
        };
        let state = c.state.get().map(|s| OwnFigures {
            figures: s.figures(),
            detail: s.detail().map(|(key, detail)| (key.to_string(), detail)),
        });
        ComponentSnapshot {
            id: c.id.clone(),
            kind: c.kind,
            type_name: c.type_name.clone(),
            events: ComponentEvents {
                in_: c.events_in.get(),
                out: c.events_out.get(),
                dropped: c.dropped.get(),
                failed: c.failed.get(),
            },
            retries: c.retries.get(),
            refused: c.refused.get(),
            health,
            state,
            bytes_in: (c.kind == ComponentKind::Input).then(|| c.bytes_in.get()),
            output: (c.kind == ComponentKind::Output).then(|| OutputSnapshot {
                bytes_out: c.bytes_out.get(),
                output_state: c.output.state(),
                last_error: c.output.last_error(),
            }),
            duration: c.duration.snapshot_struct(),
        }
    }

    /// The component's own figure whose `/stats` key is `key`.
    pub fn own(&self, key: &str) -> Option<&Figure> {
        self.state.as_ref()?.get(key)
    }
}
