//! The monitoring API.
//!
//! - `GET /health`: 200 `ok`, or 503 `failed` (a component ended with an error), `wedged`
//!   (the memory budget's waits last a minute on average) or `draining`, with each pipeline's
//!   components and their states ([`render_health`]).
//! - The node's own figures everywhere: build, reloads, draining, and the process's resident
//!   memory, CPU time and open file descriptors.
//! - `GET /metrics`: OpenMetrics text: the node's figures read once into a
//!   [`NodeSnapshot`] and encoded by it (per pipeline, component and store; the families and
//!   their names are declared there, with the stores and in the components, not here).
//! - `GET /stats`: the same snapshot serialized as JSON, with event rates over the last 1 and
//!   5 minutes taken from samples every 5 seconds.
//!
//! Reading the API never takes a lock the workers need: every figure is an atomic counter or
//! a queue's own short-lived snapshot.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use parking_lot::Mutex;
use serde_json::{Value as Json, json};
use sluice_core::exposition;
use sluice_core::health::Lifecycle;
use sluice_core::metrics::{ComponentMetrics, MetricsRegistry};
use sluice_core::snapshot::NodeSnapshot;
use tokio_util::sync::CancellationToken;

mod process;
pub use process::ProcessFigures;

const SAMPLE_EVERY: Duration = Duration::from_secs(5);
const KEEP_SAMPLES: usize = 62; // a little over 5 minutes

/// A pipeline's event counts at one sample, by the names `/stats` gives them.
#[derive(Clone, Copy, Default)]
struct Counts {
    /// Put in by the pipeline's inputs.
    events_in: u64,
    /// Taken from the queues by the workers.
    events_taken: u64,
    events_out: u64,
}

/// Events per second of each of [`Counts`].
#[derive(Clone, Copy, Default)]
struct Rates {
    events_in: f64,
    events_taken: f64,
    events_out: f64,
}

struct Sample {
    at: Instant,
    pipelines: HashMap<String, Counts>,
}

impl Sample {
    fn of(figures: &NodeSnapshot) -> Sample {
        let pipelines = figures
            .pipelines
            .iter()
            .map(|p| {
                let counts = Counts { events_in: p.events.in_, events_taken: p.events.taken, events_out: p.events.out };
                (p.name.clone(), counts)
            })
            .collect();
        Sample { at: Instant::now(), pipelines }
    }
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

    /// Takes one sample now; the API calls this every few seconds.
    pub fn sample(&self) {
        let s = Sample {
            at: Instant::now(),
            pipelines: self
                .registry
                .pipelines()
                .iter()
                .map(|p| {
                    let counts = Counts {
                        events_in: p.events_in(),
                        events_taken: p.events_taken.get(),
                        events_out: p.events_out.get(),
                    };
                    (p.name.clone(), counts)
                })
                .collect(),
        };
        let mut samples = self.samples.lock();
        samples.push_back(s);
        while samples.len() > KEEP_SAMPLES {
            samples.pop_front();
        }
    }

    /// Events per second over about `window`, or over what has been sampled if less.
    fn rates(&self, now: &Sample, window: Duration) -> HashMap<String, Rates> {
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
            let rates = Rates {
                events_in: rate(c.events_in, b.events_in),
                events_taken: rate(c.events_taken, b.events_taken),
                events_out: rate(c.events_out, b.events_out),
            };
            out.insert(name.clone(), rates);
        }
        out
    }
}

/// A charge of the memory budget waiting longer than this, on average, is a wedged node: healthy
/// backpressure keeps every wait short, since the budget is served in arrival order.
pub const WEDGED_AFTER: Duration = Duration::from_secs(60);

/// What `/health` answers: the node's status, each pipeline's, and each component's state.
/// `ok` is 200; `failed`, `wedged` and `draining` are 503.
pub fn render_health(registry: &MetricsRegistry, wedged_after: Duration) -> (StatusCode, Json) {
    let mut status = "ok";
    let mut pipelines = serde_json::Map::new();
    for p in registry.pipelines() {
        let mut pipeline_status = "ok";
        let components: Vec<Json> = p
            .components
            .read()
            .iter()
            .map(|c| {
                let mut row = component_health(c);
                if row["state"] == "failed" {
                    pipeline_status = "failed";
                }
                row["id"] = json!(c.id);
                row["kind"] = json!(c.kind);
                row["type"] = json!(c.type_name);
                row
            })
            .collect();
        if pipeline_status != "ok" {
            status = pipeline_status;
        }
        pipelines.insert(p.name.clone(), json!({"status": pipeline_status, "components": components}));
    }
    let mut body = json!({"pipelines": pipelines});
    if let Some(m) = registry.memory() {
        let waited = m.ongoing_wait_mean();
        if waited >= wedged_after {
            status = "wedged";
            body["memory"] = json!({
                "waiting": m.waiting(), "waited_seconds": waited.as_secs(),
                "reason": format!("{} charges of the memory budget have waited {}s on average", m.waiting(), waited.as_secs()),
            });
        }
    }
    for section in registry.sections() {
        if let Some(reason) = section.wedged(wedged_after) {
            status = "wedged";
            body[section.key()] = json!({"reason": reason});
        }
    }
    if registry.node.draining() {
        status = "draining";
    }
    body["status"] = json!(status);
    let code = if status == "ok" { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (code, body)
}

/// A component's state for `/stats`, with the reason when it failed.
fn component_health(c: &ComponentMetrics) -> Json {
    match c.health.get() {
        Lifecycle::Failed(reason) => json!({"state": "failed", "reason": reason}),
        state => json!({"state": state.as_str()}),
    }
}

async fn health(State(state): State<Arc<ApiState>>) -> impl IntoResponse {
    let (code, body) = render_health(&state.registry, WEDGED_AFTER);
    (code, axum::Json(body))
}

pub fn router(state: Arc<ApiState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/stats", get(stats))
        .with_state(state)
}

/// Binds the API's address: before anything starts, so that a node whose API cannot listen
/// does not start at all (it would run unobservable).
pub async fn bind(address: &str) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(address).await
}

/// Serves the API on `listener` until `shutdown` is cancelled; returns the bound address.
pub fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<ApiState>,
    shutdown: CancellationToken,
) -> std::io::Result<SocketAddr> {
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

/// The node's figures now, with the process's; rates are zero (see [`render_stats`]).
pub fn snapshot(registry: &MetricsRegistry, uptime: Duration) -> NodeSnapshot {
    NodeSnapshot::take(registry, uptime, ProcessFigures::now().into())
}

/// The whole `/metrics` exposition (OpenMetrics text, `# EOF` included), read from the
/// registry's figures now.
pub fn render_prometheus(registry: Arc<MetricsRegistry>, uptime: Duration) -> Result<String, std::fmt::Error> {
    let figures = snapshot(&registry, uptime);
    exposition::text(move |encoder| figures.encode(encoder))
}

async fn metrics(State(state): State<Arc<ApiState>>) -> axum::response::Response {
    match render_prometheus(state.registry.clone(), state.started.elapsed()) {
        Ok(text) => ([(header::CONTENT_TYPE, exposition::CONTENT_TYPE)], text).into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "the metrics could not be encoded\n").into_response(),
    }
}

/// The `/stats` document: the snapshot with each pipeline's rates over the last 1 and 5
/// minutes.
pub fn render_stats(state: &ApiState) -> Json {
    let mut figures = snapshot(&state.registry, state.started.elapsed());
    let now = Sample::of(&figures);
    let r1 = state.rates(&now, Duration::from_secs(60));
    let r5 = state.rates(&now, Duration::from_secs(300));
    for p in &mut figures.pipelines {
        let (m1, m5) = (r1.get(&p.name).copied().unwrap_or_default(), r5.get(&p.name).copied().unwrap_or_default());
        p.rates = sluice_core::snapshot::Rates {
            in_1m: m1.events_in,
            taken_1m: m1.events_taken,
            out_1m: m1.events_out,
            in_5m: m5.events_in,
            taken_5m: m5.events_taken,
            out_5m: m5.events_out,
        };
    }
    serde_json::to_value(&figures).unwrap_or_else(|e| json!({"error": e.to_string()}))
}

async fn stats(State(state): State<Arc<ApiState>>) -> impl IntoResponse {
    axum::Json(render_stats(&state))
}

#[cfg(test)]
mod tests {
    use super::*;
    use openmetrics_parser::{MetricsExposition, OpenMetricsType, OpenMetricsValue};
    use sluice_core::QueueStats;
    use sluice_core::exposition::{DescriptorEncoder, counter};
    use sluice_core::figures::{Figure, Publish, Spec};
    use sluice_core::metrics::{
        ComponentKind, DeadLetterStats, DeadLetterStatsSource, DlqStats, MetricsSection, PipelineMetrics,
        RegistryMetrics,
    };
    use std::fmt;
    use std::sync::atomic::Ordering;

    fn scrape(reg: &Arc<MetricsRegistry>) -> String {
        render_prometheus(reg.clone(), Duration::from_secs(1)).unwrap()
    }

    #[tokio::test]
    async fn health_is_503_with_the_reason_while_a_component_failed_the_budget_is_wedged_or_the_node_drains() {
        let reg = Arc::new(MetricsRegistry::default());
        let p = Arc::new(PipelineMetrics::new("web", 1));
        let input = p.component("in", ComponentKind::Input, "tcp");
        let output = p.component("out", ComponentKind::Output, "http");
        reg.register(p);
        let (code, body) = render_health(&reg, WEDGED_AFTER);
        assert_eq!((code, &body["status"]), (StatusCode::OK, &json!("ok")), "{body}");
        assert_eq!(body["pipelines"]["web"]["components"][0]["state"], "starting", "{body}");
        input.health.running();
        output.health.running();
        let (code, body) = render_health(&reg, WEDGED_AFTER);
        assert_eq!(code, StatusCode::OK, "{body}");
        assert_eq!(body["pipelines"]["web"]["components"][1]["state"], "running", "{body}");

        input.health.failed("tcp input cannot listen on 127.0.0.1:1: permission denied");
        let (code, body) = render_health(&reg, WEDGED_AFTER);
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert_eq!(body["status"], "failed", "{body}");
        assert_eq!(body["pipelines"]["web"]["status"], "failed", "{body}");
        assert_eq!(
            body["pipelines"]["web"]["components"][0]["reason"],
            "tcp input cannot listen on 127.0.0.1:1: permission denied"
        );

        let reg = Arc::new(MetricsRegistry::default());
        let budget = sluice_core::MemoryBudget::new(1 << 20);
        reg.set_memory(budget.clone());
        let held = budget.charge(1 << 20, None).await.unwrap();
        let b = budget.clone();
        let waiter = tokio::spawn(async move { b.charge(4096, None).await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let (code, body) = render_health(&reg, Duration::from_millis(20));
        assert_eq!((code, &body["status"]), (StatusCode::SERVICE_UNAVAILABLE, &json!("wedged")), "{body}");
        assert_eq!(body["memory"]["waiting"], 1, "{body}");
        assert_eq!(render_health(&reg, WEDGED_AFTER).0, StatusCode::OK, "a short wait is backpressure, not a wedge");
        drop(held);
        waiter.await.unwrap().unwrap();
        assert_eq!(render_health(&reg, Duration::from_millis(20)).0, StatusCode::OK);

        reg.add_section(Arc::new(Section));
        let (code, body) = render_health(&reg, Duration::from_millis(20));
        assert_eq!((code, &body["status"]), (StatusCode::SERVICE_UNAVAILABLE, &json!("wedged")), "{body}");
        assert_eq!(body["extra"]["reason"], "peer `b:1` has taken nothing for 1s", "{body}");
        assert_eq!(render_health(&reg, WEDGED_AFTER).0, StatusCode::OK);

        reg.node.begin_draining();
        let (code, body) = render_health(&reg, WEDGED_AFTER);
        assert_eq!((code, &body["status"]), (StatusCode::SERVICE_UNAVAILABLE, &json!("draining")), "{body}");
    }

    #[test]
    fn reloads_and_the_build_are_exposed() {
        let reg = Arc::new(MetricsRegistry::default());
        reg.node.build.set(sluice_core::metrics::BuildInfo { version: "1.2.3".into(), commit: "abc".into() }).unwrap();
        reg.node.reloaded(true);
        reg.node.reloaded(false);
        reg.node.reloaded(false);
        let text = scrape(&reg);
        assert!(text.contains("sluice_build_info{version=\"1.2.3\",commit=\"abc\"} 1\n"), "{text}");
        assert!(text.contains("sluice_config_reloads_total{result=\"succeeded\"} 1\n"), "{text}");
        assert!(text.contains("sluice_config_reloads_total{result=\"failed\"} 2\n"), "{text}");
        for family in ["process_resident_memory_bytes ", "process_cpu_seconds_total ", "process_open_fds "] {
            assert!(text.contains(&format!("\n{family}")), "no {family}in {text}");
        }
        let stats = render_stats(&ApiState::new(reg));
        assert!(stats["process"]["resident_bytes"].as_u64().unwrap() > 0, "{stats}");
        assert_eq!((stats["version"].as_str(), stats["commit"].as_str()), (Some("1.2.3"), Some("abc")));
        assert_eq!(stats["reloads"]["failed"], 2);
        assert!(stats["reloads"]["last_unix_seconds"].as_u64().unwrap() > 1_000_000_000);
    }

    #[tokio::test]
    async fn memory_budget_figures() {
        let reg = Arc::new(MetricsRegistry::default());
        assert!(!scrape(&reg).contains("sluice_memory_"));
        let budget = sluice_core::MemoryBudget::new(1 << 20);
        reg.set_memory(budget.clone());
        let held = budget.charge(1 << 20, None).await.unwrap();
        let b = budget.clone();
        let waiter = tokio::spawn(async move { b.charge(4096, None).await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(30)).await;
        let text = scrape(&reg);
        assert!(text.contains("\nsluice_memory_budget_bytes 1048576\n"), "{text}");
        assert!(text.contains("\nsluice_memory_used_bytes 1048576\n"), "{text}");
        assert!(text.contains("\nsluice_memory_waiting 1\n"), "{text}");
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
    fn stats_give_inputs_bytes_in_and_outputs_bytes_out() {
        let stats = render_stats(&ApiState::new(full_registry()));
        let components = stats["pipelines"]["web"]["components"].as_array().unwrap().clone();
        let c = |id: &str| components.iter().find(|c| c["id"] == id).unwrap().clone();
        assert_eq!(c("http_in")["bytes_in"], 1234);
        assert!(c("http_in").get("bytes_out").is_none(), "{}", c("http_in"));
        assert_eq!(c("es")["bytes_out"], 567);
        assert!(c("es").get("bytes_in").is_none(), "{}", c("es"));
        let json = c("json");
        assert!(json.get("bytes_in").is_none() && json.get("bytes_out").is_none(), "a processor has no bytes: {json}");
    }

    #[test]
    fn registry_figures_appear_once_published() {
        let reg = Arc::new(MetricsRegistry::default());
        assert!(!scrape(&reg).contains("sluice_registry_"));
        assert!(render_stats(&ApiState::new(reg.clone()))["registry"].is_null());
        let r = Arc::new(RegistryMetrics::default());
        r.fsyncs.add(3);
        r.keys.store(10, Ordering::Relaxed);
        reg.set_registry(r);
        let text = scrape(&reg);
        assert!(text.contains("\n# TYPE sluice_registry_fsyncs counter\nsluice_registry_fsyncs_total 3\n"), "{text}");
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
        fn stats(&self) -> QueueStats {
            let commit = sluice_core::metrics::Histogram::default();
            commit.observe(Duration::from_millis(2));
            commit.observe(Duration::from_secs(5));
            QueueStats {
                kind: "persisted",
                events: 40,
                max_events: 1000,
                blocked_nanos: 1_500_000_000,
                fsyncs: 9,
                shards: vec![
                    sluice_core::ShardStats { shard: 0, events: 30, ..Default::default() },
                    sluice_core::ShardStats { shard: 1, events: 10, ..Default::default() },
                ],
                commit_latency: Some(commit.snapshot_struct()),
                ..Default::default()
            }
        }
    }

    struct Dlq;

    impl DeadLetterStatsSource for Dlq {
        fn dead_letter_stats(&self) -> DeadLetterStats {
            DeadLetterStats {
                path: "/var/dlq".into(),
                max_bytes: 1 << 30,
                store: DlqStats { entries: 4, written: 6, ..Default::default() },
            }
        }
    }

    /// An output's own figures, with labels of its own that need escaping.
    struct Refusals(sluice_core::metrics::Histogram);

    impl Publish for Refusals {
        fn figures(&self) -> Vec<Figure> {
            const IN_FLIGHT: Spec = Spec::gauge("requests_in_flight", "Requests in flight.");
            const REFUSED: Spec = Spec::counter("documents_refused_total", "Documents refused for good.");
            const DURATION: Spec = Spec::histogram("request_duration_seconds", "Request time.");
            let mut out = vec![IN_FLIGHT.value(2)];
            for (i, reason) in ["mapper \"parsing\" failed\nat C:\\data", "version_conflict"].into_iter().enumerate() {
                out.push(REFUSED.labelled(vec![("status", "400".into()), ("error_type", reason.into())], i as u64 + 1));
            }
            out.push(DURATION.observed(&self.0));
            out
        }
    }

    #[derive(Debug)]
    struct Section;

    impl MetricsSection for Section {
        fn key(&self) -> String {
            "extra".into()
        }
        fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> fmt::Result {
            counter(encoder, "sluice_extra_events_total", "Extra events.", [(vec![("peer", "b:1".into())], 3u64)])
        }
        fn stats(&self) -> Json {
            json!({})
        }
        fn wedged(&self, after: Duration) -> Option<String> {
            (after < Duration::from_secs(1)).then(|| "peer `b:1` has taken nothing for 1s".to_string())
        }
    }

    /// A registry with every kind of figure: two pipelines (one named with characters the
    /// format escapes), components with state, a persisted queue, a dead letter queue, the
    /// memory budget, the registry and a section.
    fn full_registry() -> Arc<MetricsRegistry> {
        let reg = Arc::new(MetricsRegistry::default());
        reg.node
            .build
            .set(sluice_core::metrics::BuildInfo { version: "0.1.0".into(), commit: "c0ffee".into() })
            .unwrap();
        let p = Arc::new(PipelineMetrics::new("web", 2));
        let input = p.component("http_in", ComponentKind::Input, "http");
        input.events_out.add(7);
        input.refused.add(1);
        input.bytes_in.add(1234);
        p.events_taken.add(5);
        p.events_out.add(4);
        p.batch_duration.observe(Duration::from_millis(1));
        p.ack_latency.observe(Duration::from_millis(15));
        let proc = p.component("json", ComponentKind::Processor, "json");
        proc.events_in.add(5);
        proc.duration.observe(Duration::from_micros(30));
        let out = p.component("es", ComponentKind::Output, "elasticsearch");
        out.events_out.add(4);
        out.bytes_out.add(567);
        out.duration.observe(Duration::from_millis(20));
        out.output.retrying("connection refused");
        let own = Refusals(Default::default());
        own.0.observe(Duration::from_millis(7));
        let _ = out.state.set(Arc::new(own));
        let _ = p.queue.set(Arc::new(FiguresOnly));
        let _ = p.dead_letter_queue.set(Arc::new(Dlq));
        p.dead_lettered.add(6);
        reg.register(p);
        let odd = Arc::new(PipelineMetrics::new("a \"quoted\" \\ name\nnext line", 1));
        odd.component("gen", ComponentKind::Input, "generator").events_out.add(3);
        reg.register(odd);
        reg.set_memory(sluice_core::MemoryBudget::new(1 << 20));
        let r = Arc::new(RegistryMetrics::default());
        r.fsyncs.add(2);
        reg.set_registry(r);
        reg.add_section(Arc::new(Section));
        reg
    }

    fn parse(text: &str) -> MetricsExposition<OpenMetricsType, OpenMetricsValue> {
        openmetrics_parser::openmetrics::parse_openmetrics(text).unwrap_or_else(|e| panic!("{e:?}\n{text}"))
    }

    /// The value of one series, named by its labels; the parser keeps a series' label values in
    /// the order of their names.
    fn value(
        parsed: &MetricsExposition<OpenMetricsType, OpenMetricsValue>,
        family: &str,
        labels: &[(&str, &str)],
    ) -> f64 {
        let f = parsed.families.get(family).unwrap_or_else(|| panic!("no family {family}"));
        let mut labels = labels.to_vec();
        labels.sort();
        let labels: Vec<String> = labels.iter().map(|(_, v)| v.to_string()).collect();
        let s = f.get_sample_by_label_values(&labels).unwrap_or_else(|| panic!("{family}: no sample {labels:?}"));
        match &s.value {
            OpenMetricsValue::Counter(c) => c.value.as_f64(),
            OpenMetricsValue::Gauge(g) => g.as_f64(),
            OpenMetricsValue::Histogram(h) => h.count.unwrap_or_default() as f64,
            other => panic!("{family}: {other:?}"),
        }
    }

    fn component<'a>(pipeline: &'a str, id: &'a str, kind: &'a str, type_name: &'a str) -> Vec<(&'a str, &'a str)> {
        vec![("pipeline", pipeline), ("component", id), ("kind", kind), ("type", type_name)]
    }

    /// A full scrape parses with an OpenMetrics parser: every line belongs to a family of the
    /// right type, labels that need escaping come back as they were, and values match.
    #[test]
    fn a_full_scrape_parses_as_openmetrics() {
        let text = scrape(&full_registry());
        assert!(text.ends_with("\n# EOF\n"), "{text}");
        assert!(!text.contains("{}"), "a series without labels has no braces: {text}");
        let parsed = parse(&text);
        let type_lines = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
        assert_eq!(parsed.families.len(), type_lines, "every family parsed: {text}");
        let samples = |f: &str| parsed.families[f].iter_samples().count();

        for (family, f) in &parsed.families {
            let kind = f.family_type;
            // A counter family is named without `_total`, its samples with it.
            if kind == OpenMetricsType::Counter {
                assert!(!family.ends_with("_total"), "{family}");
                assert!(text.contains(&format!("\n{family}_total")), "{family}");
            } else {
                assert!(!family.ends_with("_total"), "{family} is a {kind:?} named like a counter");
            }
            // Seconds in a histogram are the lengths of something: a duration or a latency.
            if family.ends_with("_seconds")
                && !family.ends_with("_duration_seconds")
                && !family.ends_with("_latency_seconds")
            {
                assert_ne!(kind, OpenMetricsType::Histogram, "{family}");
            }
        }
        let kind = |f: &str| parsed.families.get(f).map(|f| f.family_type).unwrap_or_else(|| panic!("no {f}"));
        for f in [
            "sluice_pipeline_events_in",
            "sluice_pipeline_events_taken",
            "sluice_queue_blocked_seconds",
            "sluice_queue_stalled_seconds",
            "sluice_queue_fsyncs",
            "sluice_dlq_entries_written",
            "sluice_component_events_out",
            "sluice_component_received_bytes",
            "sluice_component_sent_bytes",
            "sluice_component_documents_refused",
            "sluice_memory_wait_seconds",
            "sluice_registry_fsyncs",
            "sluice_extra_events",
            "sluice_config_reloads",
            "process_cpu_seconds",
        ] {
            assert_eq!(kind(f), OpenMetricsType::Counter, "{f}");
        }
        for f in [
            "sluice_uptime_seconds",
            "sluice_pipeline_workers",
            "sluice_queue_events",
            "sluice_queue_shard_events",
            "sluice_dlq_entries",
            "sluice_component_requests_in_flight",
            "sluice_component_output_state",
            "sluice_component_last_error_timestamp_seconds",
            "sluice_memory_budget_bytes",
            "sluice_registry_lag_seconds",
            "sluice_build_info",
            "sluice_config_last_reload_timestamp_seconds",
            "sluice_draining",
            "process_resident_memory_bytes",
            "process_open_fds",
        ] {
            assert_eq!(kind(f), OpenMetricsType::Gauge, "{f}");
        }
        for f in [
            "sluice_pipeline_batch_duration_seconds",
            "sluice_pipeline_ack_latency_seconds",
            "sluice_queue_commit_duration_seconds",
            "sluice_component_duration_seconds",
            "sluice_component_request_duration_seconds",
        ] {
            assert_eq!(kind(f), OpenMetricsType::Histogram, "{f}");
        }

        let odd = "a \"quoted\" \\ name\nnext line";
        assert_eq!(value(&parsed, "sluice_uptime_seconds", &[]), 1.0);
        assert_eq!(value(&parsed, "sluice_pipeline_events_in", &[("pipeline", "web")]), 7.0);
        assert_eq!(value(&parsed, "sluice_pipeline_events_in", &[("pipeline", odd)]), 3.0);
        assert_eq!(value(&parsed, "sluice_pipeline_events_taken", &[("pipeline", "web")]), 5.0);
        assert_eq!(value(&parsed, "sluice_pipeline_events_out", &[("pipeline", "web")]), 4.0);
        assert_eq!(value(&parsed, "sluice_component_events_out", &component(odd, "gen", "input", "generator")), 3.0);
        assert_eq!(value(&parsed, "sluice_component_refused", &component("web", "http_in", "input", "http")), 1.0);
        let http_in = component("web", "http_in", "input", "http");
        assert_eq!(value(&parsed, "sluice_component_received_bytes", &http_in), 1234.0);
        assert_eq!(
            value(&parsed, "sluice_component_received_bytes", &component(odd, "gen", "input", "generator")),
            0.0
        );
        assert_eq!(
            value(&parsed, "sluice_component_sent_bytes", &component("web", "es", "output", "elasticsearch")),
            567.0
        );
        // Bytes cross the node's edge at inputs and outputs only: no processor series.
        assert_eq!((samples("sluice_component_received_bytes"), samples("sluice_component_sent_bytes")), (2, 1));
        let es = component("web", "es", "output", "elasticsearch");
        let es_state = |state: &'static str| {
            let mut labels = es.clone();
            labels.push(("state", state));
            value(&parsed, "sluice_component_output_state", &labels)
        };
        assert_eq!((es_state("up"), es_state("retrying"), es_state("down")), (0.0, 1.0, 0.0));
        assert!(value(&parsed, "sluice_component_last_error_timestamp_seconds", &es) > 1.0e9);
        let refused = |reason: &str| {
            let labels: Vec<(&str, &str)> =
                es.iter().copied().chain([("status", "400"), ("error_type", reason)]).collect();
            value(&parsed, "sluice_component_documents_refused", &labels)
        };
        assert_eq!(refused("mapper \"parsing\" failed\nat C:\\data"), 1.0, "escaped label values round-trip");
        assert_eq!(refused("version_conflict"), 2.0);
        assert_eq!(value(&parsed, "sluice_component_requests_in_flight", &es), 2.0);
        assert_eq!(value(&parsed, "sluice_component_request_duration_seconds", &es), 1.0);
        assert_eq!(value(&parsed, "sluice_component_duration_seconds", &es), 1.0);
        assert_eq!(samples("sluice_component_duration_seconds"), 2, "components that never ran are left out");
        assert_eq!(value(&parsed, "sluice_queue_events", &[("pipeline", "web")]), 40.0);
        assert_eq!(value(&parsed, "sluice_queue_blocked_seconds", &[("pipeline", "web")]), 1.5);
        assert_eq!(value(&parsed, "sluice_queue_fsyncs", &[("pipeline", "web")]), 9.0);
        assert_eq!(value(&parsed, "sluice_queue_shard_events", &[("pipeline", "web"), ("shard", "1")]), 10.0);
        assert_eq!(value(&parsed, "sluice_queue_commit_duration_seconds", &[("pipeline", "web")]), 2.0);
        let OpenMetricsValue::Histogram(commit) =
            &parsed.families["sluice_queue_commit_duration_seconds"].iter_samples().next().unwrap().value
        else {
            panic!("not a histogram")
        };
        let at = |bound: f64| commit.buckets.iter().find(|b| b.upper_bound == bound).map(|b| b.count.as_f64());
        assert_eq!((at(0.001), at(0.0025), at(2.5), at(f64::INFINITY)), (Some(0.0), Some(1.0), Some(1.0), Some(2.0)));
        assert_eq!(value(&parsed, "sluice_pipeline_ack_latency_seconds", &[("pipeline", "web")]), 1.0);
        assert_eq!(value(&parsed, "sluice_dlq_entries", &[("pipeline", "web")]), 4.0);
        assert_eq!(value(&parsed, "sluice_dlq_entries_written", &[("pipeline", "web")]), 6.0);
        assert_eq!(value(&parsed, "sluice_pipeline_events_dead_lettered", &[("pipeline", "web")]), 6.0);
        assert_eq!(value(&parsed, "sluice_memory_budget_bytes", &[]), (1 << 20) as f64);
        assert_eq!(value(&parsed, "sluice_registry_fsyncs", &[]), 2.0);
        assert_eq!(value(&parsed, "sluice_extra_events", &[("peer", "b:1")]), 3.0);
        assert!(text.contains("\n# HELP sluice_pipeline_events_in Events the pipeline's inputs put in.\n"), "{text}");
        assert!(
            text.contains(
                "\n# HELP sluice_pipeline_events_taken Events the pipeline's workers took from its queues.\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn prometheus_text_has_labels_and_values() {
        let reg = Arc::new(MetricsRegistry::default());
        let p = Arc::new(PipelineMetrics::new("web", 2));
        p.component("gen", ComponentKind::Input, "generator").events_out.add(7);
        p.events_taken.add(6);
        let c = p.component("out", ComponentKind::Output, "blackhole");
        c.events_out.add(5);
        c.duration.observe(Duration::from_millis(1));
        reg.register(p);
        let text = scrape(&reg);
        assert!(text.contains("\nsluice_pipeline_events_in_total{pipeline=\"web\"} 7\n"), "{text}");
        assert!(text.contains("\nsluice_pipeline_events_taken_total{pipeline=\"web\"} 6\n"), "{text}");
        assert!(text.contains(
            "\nsluice_component_events_out_total{pipeline=\"web\",component=\"out\",kind=\"output\",type=\"blackhole\"} 5\n"
        ));
        assert!(text.contains("\nsluice_component_duration_seconds_count{pipeline=\"web\",component=\"out\",kind=\"output\",type=\"blackhole\"} 1\n"));
        assert!(text.contains("\n# TYPE sluice_uptime_seconds gauge\nsluice_uptime_seconds 1.0\n"), "{text}");
    }

    #[tokio::test]
    async fn metrics_are_served_as_openmetrics() {
        let response = metrics(State(ApiState::new(full_registry()))).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        );
    }

    #[test]
    fn stats_rates_use_samples() {
        let reg = Arc::new(MetricsRegistry::default());
        let p = Arc::new(PipelineMetrics::new("web", 1));
        let input = p.component("gen", ComponentKind::Input, "generator");
        reg.register(p.clone());
        let state = ApiState::new(reg);
        state.sample();
        input.events_out.add(1000);
        p.events_taken.add(600);
        p.events_out.add(500);
        std::thread::sleep(Duration::from_millis(50));
        let s = render_stats(&state);
        let web = &s["pipelines"]["web"];
        let rate = web["rates"]["in_1m"].as_f64().unwrap();
        assert!(rate > 1000.0, "1000 events in ~50ms is well over 1000/s, got {rate}");
        let (taken, out) = (web["rates"]["taken_1m"].as_f64().unwrap(), web["rates"]["out_1m"].as_f64().unwrap());
        assert!(rate > taken && taken > out && out > 0.0, "{web}");
        assert_eq!(web["events"]["in"], 1000, "in: what the inputs put in");
        assert_eq!(web["events"]["taken"], 600, "taken: what the workers took");
        assert_eq!(web["events"]["out"], 500);
        assert_eq!(web["ack_latency"]["count"], 0);
        assert!(web["ack_latency"]["p50_seconds"].is_null(), "no quantile before the first acknowledgement");
        for _ in 0..99 {
            p.ack_latency.observe(Duration::from_millis(3));
        }
        p.ack_latency.observe(Duration::from_millis(200));
        let web = &render_stats(&state)["pipelines"]["web"];
        let (p50, p99) =
            (web["ack_latency"]["p50_seconds"].as_f64().unwrap(), web["ack_latency"]["p99_seconds"].as_f64().unwrap());
        assert_eq!(web["ack_latency"]["count"], 100);
        assert!(0.0025 < p50 && p50 <= 0.005 && 0.0025 < p99 && p99 <= 0.005, "{web}");
    }
}
