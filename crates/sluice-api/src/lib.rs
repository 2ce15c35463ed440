//! The monitoring API.
//!
//! - `GET /health`: `{"status":"ok"}` while the process runs.
//! - `GET /metrics`: Prometheus text: per pipeline and per component events in / out /
//!   dropped / failed, batch and component durations, queue depth in events and bytes, time
//!   inputs spent blocked, worker utilisation.
//! - `GET /stats`: the same as JSON, with event rates over the last 1 and 5 minutes taken from
//!   samples every 5 seconds.
//!
//! Reading the API never takes a lock the workers need: every figure is an atomic counter or
//! a queue's own short-lived snapshot.

use std::collections::{HashMap, VecDeque};
use std::fmt::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use parking_lot::Mutex;
use serde_json::{Value as Json, json};
use sluice_core::exposition::{counter, counter_f64, esc, gauge, histogram, unlabelled};
use sluice_core::metrics::{DeadLetterStats, LATENCY_BUCKETS, MetricsRegistry, PipelineMetrics};
use tokio_util::sync::CancellationToken;

const SAMPLE_EVERY: Duration = Duration::from_secs(5);
const KEEP_SAMPLES: usize = 62; // a little over 5 minutes

#[derive(Clone, Copy, Default)]
struct Counts {
    events_in: u64,
    events_out: u64,
}

struct Sample {
    at: Instant,
    pipelines: HashMap<String, Counts>,
}

pub struct ApiState {
    registry: Arc<MetricsRegistry>,
    started: Instant,
    samples: Mutex<VecDeque<Sample>>,
}

impl ApiState {
    pub fn new(registry: Arc<MetricsRegistry>) -> Arc<ApiState> {
        Arc::new(ApiState { registry, started: Instant::now(), samples: Mutex::new(VecDeque::new()) })
    }

    fn current(&self) -> Sample {
        let pipelines = self
            .registry
            .pipelines()
            .iter()
            .map(|p| (p.name.clone(), Counts { events_in: p.events_in.get(), events_out: p.events_out.get() }))
            .collect();
        Sample { at: Instant::now(), pipelines }
    }

    /// Takes one sample now; the API calls this every few seconds.
    pub fn sample(&self) {
        let s = self.current();
        let mut samples = self.samples.lock();
        samples.push_back(s);
        while samples.len() > KEEP_SAMPLES {
            samples.pop_front();
        }
    }

    /// Events per second over about `window`, or over what has been sampled if less.
    fn rates(&self, now: &Sample, window: Duration) -> HashMap<String, (f64, f64)> {
        let samples = self.samples.lock();
        let base =
            samples.iter().find(|s| now.at.duration_since(s.at) <= window + SAMPLE_EVERY / 2).or(samples.front());
        let mut out = HashMap::new();
        for (name, c) in &now.pipelines {
            let (t0, b) = match base {
                Some(s) => (s.at, s.pipelines.get(name).copied().unwrap_or_default()),
                None => (self.started, Counts::default()),
            };
            let secs = now.at.duration_since(t0).as_secs_f64();
            let rate = |a: u64, b: u64| if secs > 0.0 { a.saturating_sub(b) as f64 / secs } else { 0.0 };
            out.insert(name.clone(), (rate(c.events_in, b.events_in), rate(c.events_out, b.events_out)));
        }
        out
    }
}

pub fn router(state: Arc<ApiState>) -> Router {
    Router::new()
        .route("/health", get(|| async { axum::Json(json!({"status": "ok"})) }))
        .route("/metrics", get(metrics))
        .route("/stats", get(stats))
        .with_state(state)
}

/// Binds the API and serves it until `shutdown` is cancelled; returns the bound address.
pub async fn serve(address: &str, state: Arc<ApiState>, shutdown: CancellationToken) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    let local = listener.local_addr()?;
    let sampler_state = state.clone();
    let sampler_stop = shutdown.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        loop {
            tokio::select! {
                _ = tick.tick() => sampler_state.sample(),
                _ = sampler_stop.cancelled() => break,
            }
        }
    });
    let app = router(state);
    tokio::spawn(async move {
        let served = axum::serve(listener, app).with_graceful_shutdown(async move { shutdown.cancelled().await }).await;
        if let Err(e) = served {
            tracing::error!(error = %e, "monitoring API stopped");
        }
    });
    Ok(local)
}

fn utilisation(p: &PipelineMetrics) -> f64 {
    let wall = p.started.elapsed().as_nanos() as f64 * p.workers.max(1) as f64;
    if wall > 0.0 { (p.worker_busy_nanos.get() as f64 / wall).min(1.0) } else { 0.0 }
}

/// Renders every metric in the Prometheus text format.
pub fn render_prometheus(registry: &MetricsRegistry, uptime: Duration) -> String {
    let pipelines = registry.pipelines();
    let mut out = String::with_capacity(8192);
    gauge(
        &mut out,
        "sluice_uptime_seconds",
        "Seconds since the process started.",
        &[(String::new(), uptime.as_secs_f64())],
    );
    let pl = |p: &PipelineMetrics| format!("pipeline=\"{}\"", esc(&p.name));
    type Pick = fn(&PipelineMetrics) -> u64;
    let pipeline_counters: [(&str, &str, Pick); 5] = [
        ("sluice_pipeline_events_in_total", "Events workers took from the queue.", |p| p.events_in.get()),
        (
            "sluice_pipeline_events_out_total",
            "Events that passed the processors and were handed to every output.",
            |p| p.events_out.get(),
        ),
        ("sluice_pipeline_events_dropped_total", "Events dropped on purpose by processors.", |p| p.dropped.get()),
        (
            "sluice_pipeline_events_failed_total",
            "Events outputs rejected for good and did not hand to a dead letter queue.",
            |p| p.failed.get(),
        ),
        (
            "sluice_pipeline_events_dead_lettered_total",
            "Events written to the pipeline's dead letter queue (by processors and outputs).",
            |p| p.dead_lettered.get(),
        ),
    ];
    for (name, help, pick) in pipeline_counters {
        counter(&mut out, name, help, &pipelines.iter().map(|p| (pl(p), pick(p))).collect::<Vec<_>>());
    }
    histogram(
        &mut out,
        "sluice_pipeline_batch_duration_seconds",
        "Time a worker spent on one batch, processors and outputs.",
        &pipelines.iter().map(|p| (pl(p), &p.batch_duration)).collect::<Vec<_>>(),
    );
    gauge(
        &mut out,
        "sluice_pipeline_workers",
        "Workers per pipeline.",
        &pipelines.iter().map(|p| (pl(p), p.workers as f64)).collect::<Vec<_>>(),
    );
    gauge(
        &mut out,
        "sluice_pipeline_worker_utilization",
        "Share of the workers' time with at least one batch in hand since the pipeline started (0 to 1).",
        &pipelines.iter().map(|p| (pl(p), utilisation(p))).collect::<Vec<_>>(),
    );

    let queues: Vec<_> = pipelines.iter().filter_map(|p| Some((pl(p), p.queue.get()?.stats()))).collect();
    gauge(
        &mut out,
        "sluice_queue_events",
        "Events waiting in the queue.",
        &queues.iter().map(|(l, s)| (l.clone(), s.events as f64)).collect::<Vec<_>>(),
    );
    gauge(
        &mut out,
        "sluice_queue_bytes",
        "Bytes waiting in the queue.",
        &queues.iter().map(|(l, s)| (l.clone(), s.bytes as f64)).collect::<Vec<_>>(),
    );
    gauge(
        &mut out,
        "sluice_queue_max_events",
        "Queue capacity in events.",
        &queues.iter().map(|(l, s)| (l.clone(), s.max_events as f64)).collect::<Vec<_>>(),
    );
    gauge(
        &mut out,
        "sluice_queue_max_bytes",
        "Queue capacity in bytes.",
        &queues.iter().map(|(l, s)| (l.clone(), s.max_bytes as f64)).collect::<Vec<_>>(),
    );
    counter_f64(
        &mut out,
        "sluice_queue_blocked_seconds_total",
        "Time inputs spent waiting because the queue was full (backpressure), waits in progress included.",
        &queues.iter().map(|(l, s)| (l.clone(), s.blocked_nanos as f64 / 1e9)).collect::<Vec<_>>(),
    );

    let persisted: Vec<_> = queues.iter().filter(|(_, s)| s.kind == "persisted").collect();
    if !persisted.is_empty() {
        let mut shard_rows = (Vec::new(), Vec::new());
        for (l, s) in &persisted {
            for sh in &s.shards {
                let labels = format!("{l},shard=\"{}\"", sh.shard);
                shard_rows.0.push((labels.clone(), sh.bytes as f64));
                shard_rows.1.push((labels, sh.events as f64));
            }
        }
        gauge(
            &mut out,
            "sluice_queue_shard_bytes",
            "Unacknowledged bytes per shard of a persisted queue.",
            &shard_rows.0,
        );
        gauge(
            &mut out,
            "sluice_queue_shard_events",
            "Unacknowledged events per shard of a persisted queue.",
            &shard_rows.1,
        );
        type QueueCounter = (&'static str, &'static str, fn(&sluice_core::QueueStats) -> u64);
        let queue_counters: [QueueCounter; 7] = [
            ("sluice_queue_fsyncs_total", "fdatasync calls of a persisted queue.", |s| s.fsyncs),
            (
                "sluice_queue_fsync_failures_total",
                "fdatasync calls of a persisted queue that failed; with sync: commit, the events they covered were \
                 not acknowledged.",
                |s| s.fsync_failures,
            ),
            ("sluice_queue_corrupt_frames_total", "Damaged frames a persisted queue found and skipped.", |s| {
                s.corrupt_frames
            }),
            (
                "sluice_queue_unstored_events_total",
                "Events a persisted queue accepted but could not store (unencodable, or a full disk at shutdown).",
                |s| s.unstored,
            ),
            (
                "sluice_queue_events_from_memory_total",
                "Events a persisted queue handed to the workers from memory, as they were written.",
                |s| s.events_from_memory,
            ),
            (
                "sluice_queue_events_read_back_total",
                "Events a persisted queue read back from its segments (beyond memory_bytes, or after a restart).",
                |s| s.events_read_back,
            ),
            ("sluice_queue_read_back_bytes_total", "Frame bytes a persisted queue read back from its segments.", |s| {
                s.bytes_read_back
            }),
        ];
        for (name, help, value) in queue_counters {
            counter(&mut out, name, help, &persisted.iter().map(|(l, s)| (l.clone(), value(s))).collect::<Vec<_>>());
        }
        gauge(
            &mut out,
            "sluice_queue_checkpoint_lag_events",
            "Events the workers finished that no durable checkpoint of a persisted queue records yet: what a \
             restart now would deliver again.",
            &persisted.iter().map(|(l, s)| (l.clone(), s.checkpoint_lag_events as f64)).collect::<Vec<_>>(),
        );
        counter_f64(
            &mut out,
            "sluice_queue_stalled_seconds_total",
            "Time a persisted queue's writers waited on the disk (full or failing).",
            &persisted.iter().map(|(l, s)| (l.clone(), s.stalled_nanos as f64 / 1e9)).collect::<Vec<_>>(),
        );
        let name = "sluice_queue_commit_duration_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} Time from a group's write to its fdatasync returning.\n# TYPE {name} histogram"
        );
        for (l, s) in &persisted {
            if let Some(h) = &s.commit_latency {
                for (i, c) in h.buckets.iter().enumerate() {
                    let le = LATENCY_BUCKETS.get(i).map(|b| b.to_string()).unwrap_or_else(|| "+Inf".to_string());
                    let _ = writeln!(out, "{name}_bucket{{{l},le=\"{le}\"}} {c}");
                }
                let _ = writeln!(out, "{name}_sum{{{l}}} {}\n{name}_count{{{l}}} {}", h.sum, h.count);
            }
        }
    }

    let dlqs: Vec<_> =
        pipelines.iter().filter_map(|p| Some((pl(p), p.dead_letter_queue.get()?.dead_letter_stats(), p))).collect();
    if !dlqs.is_empty() {
        type PickD = fn(&DeadLetterStats, &PipelineMetrics) -> u64;
        let dlq_counters: [(&str, &str, PickD); 8] = [
            (
                "sluice_dlq_entries_written_total",
                "Entries written to the dead letter queue since it was opened.",
                |d, _| d.store.written,
            ),
            (
                "sluice_dlq_dropped_newer_total",
                "New entries the full dead letter queue refused (drop_newer, or larger than max_bytes).",
                |d, _| d.store.dropped_newer,
            ),
            ("sluice_dlq_dropped_older_total", "Stored entries deleted to make room (drop_older).", |d, _| {
                d.store.dropped_older
            }),
            ("sluice_dlq_expired_total", "Stored entries deleted by retain_age.", |d, _| d.store.expired),
            ("sluice_dlq_corrupt_frames_total", "Damaged dead letter entries found at start-up.", |d, _| {
                d.store.corrupt_frames
            }),
            (
                "sluice_dlq_loop_rejected_total",
                "Events replayed from a dead letter queue that failed again and were not written back.",
                |_, p| p.dead_letter_loop_rejected.get(),
            ),
            (
                "sluice_dlq_lost_total",
                "Events meant for the dead letter queue that its storage policy refused (full, or too large).",
                |_, p| p.dead_letter_lost.get(),
            ),
            (
                "sluice_dlq_write_retries_total",
                "Dead letter writes that failed (disk full, I/O error) and were retried, holding their batch back.",
                |_, p| p.dead_letter_write_retries.get(),
            ),
        ];
        for (name, help, pick) in dlq_counters {
            counter(&mut out, name, help, &dlqs.iter().map(|(l, d, p)| (l.clone(), pick(d, p))).collect::<Vec<_>>());
        }
        type PickG = fn(&DeadLetterStats) -> u64;
        let dlq_gauges: [(&str, &str, PickG); 4] = [
            ("sluice_dlq_entries", "Entries stored in the dead letter queue.", |d| d.store.entries),
            ("sluice_dlq_bytes", "Bytes of the dead letter queue's segment files.", |d| d.store.bytes),
            ("sluice_dlq_segments", "Segment files of the dead letter queue.", |d| d.store.segments),
            ("sluice_dlq_max_bytes", "The dead letter queue's max_bytes.", |d| d.max_bytes),
        ];
        for (name, help, pick) in dlq_gauges {
            gauge(&mut out, name, help, &dlqs.iter().map(|(l, d, _)| (l.clone(), pick(d) as f64)).collect::<Vec<_>>());
        }
    }

    let mut comps = Vec::new();
    for p in &pipelines {
        for c in p.components.read().iter() {
            let labels = format!(
                "pipeline=\"{}\",component=\"{}\",kind=\"{}\",type=\"{}\"",
                esc(&p.name),
                esc(&c.id),
                c.kind.as_str(),
                esc(&c.type_name)
            );
            comps.push((labels, c.clone()));
        }
    }
    type PickC = fn(&sluice_core::metrics::ComponentMetrics) -> u64;
    let component_counters: [(&str, &str, PickC); 6] = [
        ("sluice_component_events_in_total", "Events a component received.", |c| c.events_in.get()),
        ("sluice_component_events_out_total", "Events a component passed on or delivered.", |c| c.events_out.get()),
        ("sluice_component_events_dropped_total", "Events a component dropped on purpose.", |c| c.dropped.get()),
        ("sluice_component_events_failed_total", "Events a component failed on (tagged, rejected, unparsable).", |c| {
            c.failed.get()
        }),
        (
            "sluice_component_retries_total",
            "Output attempts that failed for a reason outside the events (disk full, peer down) and were retried.",
            |c| c.retries.get(),
        ),
        (
            "sluice_component_refused_total",
            "Requests and connections an input refused because of a limit (size, events, memory budget, connections, timeouts).",
            |c| c.refused.get(),
        ),
    ];
    for (name, help, pick) in component_counters {
        counter(&mut out, name, help, &comps.iter().map(|(l, c)| (l.clone(), pick(c))).collect::<Vec<_>>());
    }
    // Components' own state figures (a stateful processor's groups), one series per name.
    let mut figures: Vec<(sluice_core::metrics::StateFigure, String)> = Vec::new();
    for (labels, c) in &comps {
        if let Some(state) = c.state.get() {
            figures.extend(state.figures().into_iter().map(|f| (f, labels.clone())));
            for l in state.labelled_figures() {
                let mut labels = labels.clone();
                for (k, v) in &l.labels {
                    labels.push_str(&format!(",{k}=\"{}\"", esc(v)));
                }
                figures.push((l.figure, labels));
            }
        }
    }
    let mut names: Vec<&'static str> = figures.iter().map(|(f, _)| f.name).collect();
    names.dedup();
    names.sort();
    names.dedup();
    for name in names {
        let rows: Vec<&(sluice_core::metrics::StateFigure, String)> =
            figures.iter().filter(|(f, _)| f.name == name).collect();
        let full = format!("sluice_component_{name}");
        let (help, is_counter) = (rows[0].0.help, rows[0].0.counter);
        if is_counter {
            counter(&mut out, &full, help, &rows.iter().map(|(f, l)| (l.clone(), f.value)).collect::<Vec<_>>());
        } else {
            gauge(&mut out, &full, help, &rows.iter().map(|(f, l)| (l.clone(), f.value as f64)).collect::<Vec<_>>());
        }
    }
    // Components' own histograms (an output's request latency), one family per name.
    let mut own: Vec<(&'static str, &'static str, String, &sluice_core::metrics::Histogram)> = Vec::new();
    let states: Vec<_> = comps.iter().filter_map(|(l, c)| c.state.get().map(|s| (l, s.clone()))).collect();
    for (labels, state) in &states {
        for h in state.histograms() {
            own.push((h.name, h.help, (*labels).clone(), h.histogram));
        }
    }
    let mut names: Vec<&'static str> = own.iter().map(|(n, ..)| *n).collect();
    names.sort();
    names.dedup();
    for name in names {
        let rows: Vec<(String, &sluice_core::metrics::Histogram)> =
            own.iter().filter(|(n, ..)| *n == name).map(|(_, _, l, h)| (l.clone(), *h)).collect();
        let help = own.iter().find(|(n, ..)| *n == name).map(|(_, h, ..)| *h).unwrap_or_default();
        histogram(&mut out, &format!("sluice_component_{name}"), help, &rows);
    }
    histogram(
        &mut out,
        "sluice_component_duration_seconds",
        "Time a processor or output spent on one batch.",
        &comps
            .iter()
            .filter(|(_, c)| c.duration.snapshot().2 > 0)
            .map(|(l, c)| (l.clone(), &c.duration))
            .collect::<Vec<_>>(),
    );
    if let Some(r) = registry.registry() {
        registry_metrics(&mut out, &r);
    }
    if let Some(m) = registry.memory() {
        memory_metrics(&mut out, &m);
    }
    for section in registry.sections() {
        section.render_prometheus(&mut out);
    }
    out
}

fn memory_metrics(out: &mut String, m: &sluice_core::MemoryBudget) {
    let gauges: [(&str, &str, f64); 3] = [
        ("sluice_memory_budget_bytes", "The node's memory budget for events in flight.", m.limit() as f64),
        (
            "sluice_memory_used_bytes",
            "Memory the events in flight hold now, as charged to the budget.",
            m.used() as f64,
        ),
        ("sluice_memory_waiting", "Inputs waiting now for room in the memory budget.", m.waiting() as f64),
    ];
    for (name, help, v) in gauges {
        unlabelled(out, name, "gauge", help, v);
    }
    let counters: [(&str, &str, f64); 2] = [
        (
            "sluice_memory_wait_seconds_total",
            "Time inputs waited for room in the memory budget, waits in progress included.",
            m.wait_nanos() as f64 / 1e9,
        ),
        (
            "sluice_memory_refused_total",
            "Charges refused: larger than the budget allows, or not granted in time.",
            m.refused() as f64,
        ),
    ];
    for (name, help, v) in counters {
        unlabelled(out, name, "counter", help, v);
    }
}

fn registry_metrics(out: &mut String, r: &sluice_core::metrics::RegistryMetrics) {
    use sluice_core::metrics::Counter;
    let counters: [(&str, &str, &Counter); 6] = [
        (
            "sluice_registry_flushes_total",
            "Batches of position updates the registry appended to its op log.",
            &r.flushes,
        ),
        ("sluice_registry_fsyncs_total", "fsync calls of the registry's op log.", &r.fsyncs),
        (
            "sluice_registry_records_written_total",
            "Records the registry appended (one per changed key per flush).",
            &r.records_written,
        ),
        ("sluice_registry_bytes_written_total", "Bytes the registry appended to its op log.", &r.bytes_written),
        ("sluice_registry_compactions_total", "Op log compactions into the snapshot.", &r.compactions),
        ("sluice_registry_write_errors_total", "Failed registry writes (retried).", &r.write_errors),
    ];
    for (name, help, c) in counters {
        unlabelled(out, name, "counter", help, c.get() as f64);
    }
    let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let gauges: [(&str, &str, f64); 4] = [
        ("sluice_registry_keys", "Keys the registry holds.", load(&r.keys) as f64),
        ("sluice_registry_flushed_keys", "Keys the last flush wrote.", load(&r.flushed_keys) as f64),
        ("sluice_registry_log_bytes", "Size of the registry's op log.", load(&r.log_bytes) as f64),
        (
            "sluice_registry_lag_seconds",
            "Time since everything handed to the registry writer was last durable.",
            registry_lag(r),
        ),
    ];
    for (name, help, v) in gauges {
        unlabelled(out, name, "gauge", help, v);
    }
}

fn registry_lag(r: &sluice_core::metrics::RegistryMetrics) -> f64 {
    let durable = r.durable_unix_ms.load(std::sync::atomic::Ordering::Relaxed);
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    now.saturating_sub(durable) as f64 / 1000.0
}

async fn metrics(State(state): State<Arc<ApiState>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        render_prometheus(&state.registry, state.started.elapsed()),
    )
}

/// The `/stats` document.
pub fn render_stats(state: &ApiState) -> Json {
    let now = state.current();
    let r1 = state.rates(&now, Duration::from_secs(60));
    let r5 = state.rates(&now, Duration::from_secs(300));
    let mut pipelines = serde_json::Map::new();
    for p in state.registry.pipelines() {
        let components: Vec<Json> = p
            .components
            .read()
            .iter()
            .map(|c| {
                json!({
                    "id": c.id, "kind": c.kind, "type": c.type_name,
                    "events": {"in": c.events_in.get(), "out": c.events_out.get(), "dropped": c.dropped.get(), "failed": c.failed.get()},
                    "retries": c.retries.get(),
                    "refused": c.refused.get(),
                    "state": c.state.get().map(|s| {
                        let mut state = s.figures().into_iter().map(|f| (f.name.trim_end_matches("_total").to_string(), json!(f.value))).collect::<serde_json::Map<_, _>>();
                        for l in s.labelled_figures() {
                            let key = l.figure.name.trim_end_matches("_total").to_string();
                            let mut row = l.labels.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>();
                            row.insert("value".into(), json!(l.figure.value));
                            if let Some(rows) = state.entry(key).or_insert_with(|| json!([])).as_array_mut() {
                                rows.push(serde_json::Value::Object(row));
                            }
                        }
                        for h in s.histograms() {
                            let (_, sum, count) = h.histogram.snapshot();
                            state.insert(h.name.trim_end_matches("_seconds").to_string(), json!({"count": count, "sum_seconds": sum}));
                        }
                        state
                    }),
                })
            })
            .collect();
        let (in1, out1) = r1.get(&p.name).copied().unwrap_or_default();
        let (in5, out5) = r5.get(&p.name).copied().unwrap_or_default();
        pipelines.insert(
            p.name.clone(),
            json!({
                "events": {"in": p.events_in.get(), "out": p.events_out.get(), "dropped": p.dropped.get(), "failed": p.failed.get(), "dead_lettered": p.dead_lettered.get()},
                "rates": {"in_1m": in1, "out_1m": out1, "in_5m": in5, "out_5m": out5},
                "queue": p.queue.get().map(|q| q.stats()),
                "forwarded_queue": p.forwarded_queue.get().map(|q| q.stats()),
                "dead_letter_queue": p.dead_letter_queue.get().map(|d| {
                    let mut v = serde_json::to_value(d.dead_letter_stats()).unwrap_or_default();
                    v["loop_rejected"] = json!(p.dead_letter_loop_rejected.get());
                    v["lost"] = json!(p.dead_letter_lost.get());
                    v["write_retries"] = json!(p.dead_letter_write_retries.get());
                    v
                }),
                "workers": p.workers,
                "worker_utilization": utilisation(&p),
                "uptime_seconds": p.started.elapsed().as_secs_f64(),
                "components": components,
            }),
        );
    }
    let registry = state.registry.registry().map(|r| {
        let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        json!({
            "keys": load(&r.keys),
            "lag_seconds": registry_lag(&r),
            "flushes": r.flushes.get(),
            "fsyncs": r.fsyncs.get(),
            "records_written": r.records_written.get(),
            "compactions": r.compactions.get(),
            "write_errors": r.write_errors.get(),
            "log_bytes": load(&r.log_bytes),
        })
    });
    let memory = state.registry.memory().map(|m| {
        json!({
            "budget_bytes": m.limit(),
            "used_bytes": m.used(),
            "waiting": m.waiting(),
            "wait_seconds": m.wait_nanos() as f64 / 1e9,
            "waits": m.waits(),
            "refused": m.refused(),
        })
    });
    let mut doc = json!({"uptime_seconds": state.started.elapsed().as_secs_f64(), "pipelines": pipelines, "registry": registry, "memory": memory});
    for section in state.registry.sections() {
        doc[section.key()] = section.stats();
    }
    doc
}

async fn stats(State(state): State<Arc<ApiState>>) -> impl IntoResponse {
    axum::Json(render_stats(&state))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::metrics::ComponentKind;

    #[tokio::test]
    async fn memory_budget_figures() {
        let reg = Arc::new(MetricsRegistry::default());
        assert!(!render_prometheus(&reg, Duration::from_secs(1)).contains("sluice_memory_"));
        let budget = sluice_core::MemoryBudget::new(1 << 20);
        reg.set_memory(budget.clone());
        let held = budget.charge(1 << 20, None).await.unwrap();
        let b = budget.clone();
        let waiter = tokio::spawn(async move { b.charge(4096, None).await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(30)).await;
        let text = render_prometheus(&reg, Duration::from_secs(1));
        assert!(text.contains("sluice_memory_budget_bytes 1048576\n"), "{text}");
        assert!(text.contains("sluice_memory_used_bytes 1048576\n"), "{text}");
        assert!(text.contains("sluice_memory_waiting 1\n"), "{text}");
        let waited: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("sluice_memory_wait_seconds_total "))
            .and_then(|v| v.parse().ok())
            .unwrap();
        assert!(waited > 0.0, "a wait in progress shows while it lasts: {text}");
        let stats = render_stats(&ApiState::new(reg.clone()));
        assert_eq!(stats["memory"]["used_bytes"], 1 << 20);
        drop(held);
        waiter.await.unwrap().unwrap();
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn registry_figures_appear_once_published() {
        let reg = Arc::new(MetricsRegistry::default());
        assert!(!render_prometheus(&reg, Duration::from_secs(1)).contains("sluice_registry_"));
        assert!(render_stats(&ApiState::new(reg.clone()))["registry"].is_null());
        let r = Arc::new(sluice_core::metrics::RegistryMetrics::default());
        r.fsyncs.add(3);
        r.keys.store(10, std::sync::atomic::Ordering::Relaxed);
        reg.set_registry(r);
        let text = render_prometheus(&reg, Duration::from_secs(1));
        assert!(text.contains("\nsluice_registry_fsyncs_total 3\n"), "{text}");
        assert!(text.contains("\nsluice_registry_keys 10\n"), "{text}");
        let stats = render_stats(&ApiState::new(reg));
        assert_eq!(stats["registry"]["keys"], 10);
        assert_eq!(stats["registry"]["fsyncs"], 3);
    }

    /// A queue that only reports figures, as a persisted queue would.
    struct FiguresOnly;

    #[async_trait::async_trait]
    impl sluice_core::Queue for FiguresOnly {
        async fn push(&self, _: sluice_core::Batch) -> Result<(), sluice_core::QueueClosed> {
            Err(sluice_core::QueueClosed)
        }
        async fn pop(&self, _: usize, _: Duration) -> Option<sluice_core::Batch> {
            None
        }
        fn close(&self) {}
        fn stats(&self) -> sluice_core::QueueStats {
            sluice_core::QueueStats {
                kind: "persisted",
                shards: vec![sluice_core::ShardStats::default()],
                commit_latency: Some(Default::default()),
                ..Default::default()
            }
        }
    }

    /// Every family's type fits its name (a `_total` is a counter), and a series without
    /// labels has no braces.
    #[test]
    fn types_follow_the_names() {
        let reg = MetricsRegistry::default();
        let p = Arc::new(PipelineMetrics::new("web", 2));
        p.component("out", ComponentKind::Output, "blackhole");
        let _ = p.queue.set(Arc::new(FiguresOnly));
        reg.register(p);
        reg.set_memory(sluice_core::MemoryBudget::new(1 << 20));
        reg.set_registry(Arc::new(sluice_core::metrics::RegistryMetrics::default()));
        let text = render_prometheus(&reg, Duration::from_secs(1));
        for line in text.lines() {
            assert!(!line.contains("{}"), "empty braces: {line}");
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                if name.ends_with("_total") {
                    assert_eq!(kind, "counter", "{line}");
                }
            }
        }
        assert!(text.contains("\nsluice_uptime_seconds 1\n"), "{text}");
        assert!(text.contains("# TYPE sluice_queue_blocked_seconds_total counter"), "{text}");
        assert!(text.contains("# TYPE sluice_queue_stalled_seconds_total counter"), "{text}");
    }

    #[test]
    fn prometheus_text_has_labels_and_values() {
        let reg = MetricsRegistry::default();
        let p = Arc::new(PipelineMetrics::new("web", 2));
        p.events_in.add(7);
        let c = p.component("out", ComponentKind::Output, "blackhole");
        c.events_out.add(5);
        c.duration.observe(Duration::from_millis(1));
        reg.register(p);
        let text = render_prometheus(&reg, Duration::from_secs(1));
        assert!(text.contains("sluice_pipeline_events_in_total{pipeline=\"web\"} 7"), "{text}");
        assert!(text.contains(
            "sluice_component_events_out_total{pipeline=\"web\",component=\"out\",kind=\"output\",type=\"blackhole\"} 5"
        ));
        assert!(text.contains("sluice_component_duration_seconds_count{pipeline=\"web\",component=\"out\",kind=\"output\",type=\"blackhole\"} 1"));
    }

    #[test]
    fn stats_rates_use_samples() {
        let reg = Arc::new(MetricsRegistry::default());
        let p = Arc::new(PipelineMetrics::new("web", 1));
        reg.register(p.clone());
        let state = ApiState::new(reg);
        state.sample();
        p.events_in.add(1000);
        p.events_out.add(1000);
        std::thread::sleep(Duration::from_millis(50));
        let s = render_stats(&state);
        let rate = s["pipelines"]["web"]["rates"]["in_1m"].as_f64().unwrap();
        assert!(rate > 1000.0, "1000 events in ~50ms is well over 1000/s, got {rate}");
        assert_eq!(s["pipelines"]["web"]["events"]["in"], 1000);
    }
}
