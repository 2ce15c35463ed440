//! All pipelines of the process: start, reload, shut down.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sluice_cluster::{Cluster, ClusterConfig};
use sluice_config::ConfigErrors;
use sluice_config::model::RootConfig;
use sluice_core::MemoryBudget;
use sluice_core::bus::PipelineBus;
use sluice_core::metrics::MetricsRegistry;
use tokio::sync::{Mutex, Notify};

use sluice_registry::{Registry, RegistryOptions};

use crate::build::{
    build_all, build_pipeline, check_dead_letter_queue_paths, check_links, check_stdin_inputs, upstream_first,
};
use crate::dead_letter::OpenDeadLetterQueue;
use crate::pipeline::{NodeServices, PipelineSummary, RunningPipeline};

#[derive(Debug, Clone)]
pub struct EngineOptions {
    pub data_dir: PathBuf,
    pub shutdown_timeout: Duration,
}

/// What a reload did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReloadReport {
    pub started: Vec<String>,
    pub restarted: Vec<String>,
    pub stopped: Vec<String>,
    pub unchanged: Vec<String>,
}

struct State {
    config: RootConfig,
    running: BTreeMap<String, RunningPipeline>,
    feeds: BTreeMap<String, BTreeSet<String>>,
    /// Summaries of pipelines stopped by reloads, reported again at shutdown.
    stopped: Vec<PipelineSummary>,
    /// Durable (in `data_dir/registry`) once some input uses it, opened once (at start or at
    /// the reload that brings the first such input), kept across reloads, closed at shutdown.
    registry: Arc<Registry>,
}

pub struct Engine {
    bus: Arc<PipelineBus>,
    pub metrics: Arc<MetricsRegistry>,
    state: Mutex<State>,
    inputs_changed: Arc<Notify>,
    /// The one memory budget of every pipeline's inputs; its size is read at start (a reload
    /// that changes `memory` takes effect at the next restart).
    memory: Arc<MemoryBudget>,
    /// Cluster mode: this node's part in the cluster (its section is read at start).
    cluster: Option<Cluster>,
}

impl Engine {
    /// Builds every component of a config without starting anything.
    pub fn validate(config: &RootConfig) -> Result<(), ConfigErrors> {
        let mut errors = ConfigErrors::default();
        for section in [cluster_config(config).map(|_| ()), registry_options(config).map(|_| ())] {
            if let Err(e) = section {
                errors.0.extend(e.0);
            }
        }
        if let Err(e) = build_all(config, &Arc::new(PipelineBus::default())) {
            errors.0.extend(e.0);
        }
        errors.into_result(())
    }

    /// Builds and starts every pipeline; nothing starts if anything fails to build.
    pub async fn start(config: RootConfig) -> Result<Engine, ConfigErrors> {
        let bus = Arc::new(PipelineBus::default());
        let metrics = Arc::new(MetricsRegistry::default());
        let inputs_changed = Arc::new(Notify::new());
        let feeds = check_links(&config)?;
        let cluster_config = cluster_config(&config)?;
        registry_options(&config)?;
        let built = build_all(&config, &bus)?;
        let cluster = match cluster_config {
            Some(c) => {
                let cluster = Cluster::start(c).await.map_err(sluice_config::ConfigError::new)?;
                metrics.add_section(cluster.metrics_section());
                Some(cluster)
            }
            None => None,
        };
        let memory = MemoryBudget::new(config.memory.budget.as_usize());
        metrics.set_memory(memory.clone());
        let registry = if built.iter().any(uses_registry) {
            open_registry(&config, &metrics).await?
        } else {
            Registry::in_memory()
        };
        let mut running: BTreeMap<String, RunningPipeline> = BTreeMap::new();
        for b in built {
            metrics.register(b.metrics.clone());
            let name = b.spec.name.clone();
            let node = NodeServices {
                bus: &bus,
                data_dir: &config.data_dir,
                registry: &registry,
                memory: &memory,
                inputs_changed: &inputs_changed,
                cluster: cluster.as_ref(),
            };
            match RunningPipeline::start(b, &node, None).await {
                Ok(p) => {
                    running.insert(name, p);
                }
                Err(e) => {
                    abandon_start(running, &feeds, &config, &registry, cluster.as_ref()).await;
                    return Err(sluice_config::ConfigError::new(e).into());
                }
            }
        }
        // Every pipeline is started before any is waited on, so that one start reports every
        // address that is taken, not the first.
        let mut failed = ConfigErrors::default();
        for p in running.values() {
            if let Err(reasons) = p.started().await {
                reasons.into_iter().for_each(|r| failed.push(sluice_config::ConfigError::new(r)));
            }
        }
        if !failed.is_empty() {
            abandon_start(running, &feeds, &config, &registry, cluster.as_ref()).await;
            return Err(failed);
        }
        Ok(Engine {
            bus,
            metrics,
            state: Mutex::new(State { config, running, feeds, stopped: Vec::new(), registry }),
            inputs_changed,
            memory,
            cluster,
        })
    }

    /// Applies a new config: pipelines whose section changed are restarted, removed ones
    /// stopped, new ones started, the rest left running. If anything in the new config is
    /// wrong, nothing changes and the errors are returned.
    pub async fn reload(&self, config: RootConfig) -> Result<ReloadReport, ConfigErrors> {
        let mut state = self.state.lock().await;
        // The registry's settings take effect at the next start, but a reload to a config that
        // would not start is refused, as one with any other error.
        registry_options(&config)?;
        let feeds = check_links(&config)?;
        check_dead_letter_queue_paths(&config)?;
        check_stdin_inputs(&config)?;
        let mut errors = ConfigErrors::default();
        let mut report = ReloadReport::default();
        let mut fresh = Vec::new();
        for spec in &config.pipelines {
            match state.running.get(&spec.name) {
                Some(r) if r.spec.same_as(spec) => report.unchanged.push(spec.name.clone()),
                existing => {
                    if let Some(b) = build_pipeline(spec, &self.bus, &config.data_dir, &mut errors) {
                        if existing.is_some() {
                            report.restarted.push(spec.name.clone());
                        } else {
                            report.started.push(spec.name.clone());
                        }
                        fresh.push(b);
                    }
                }
            }
        }
        if !errors.is_empty() {
            return Err(errors.into_result(()).unwrap_err());
        }
        report.stopped =
            state.running.keys().filter(|n| !config.pipelines.iter().any(|p| &p.name == *n)).cloned().collect();

        if !state.registry.is_persistent() && fresh.iter().any(uses_registry) {
            state.registry = open_registry(&config, &self.metrics).await?;
        }

        let timeout = config.shutdown_timeout;
        let to_stop: BTreeSet<&String> = report.stopped.iter().chain(&report.restarted).collect();
        // A restarted pipeline whose dead letter queue settings did not change keeps it open.
        let mut kept_dead_letter_queues: BTreeMap<String, OpenDeadLetterQueue> = BTreeMap::new();
        for name in upstream_first(&state.feeds) {
            if to_stop.contains(&name)
                && let Some(mut p) = state.running.remove(&name)
            {
                let new_spec = config.pipelines.iter().find(|s| s.name == name);
                if let Some(spec) = new_spec
                    && p.dead_letter_queue().is_some_and(|d| d.fits(spec, &config.data_dir))
                    && let Some(d) = p.take_dead_letter_queue()
                {
                    kept_dead_letter_queues.insert(name.clone(), d);
                }
                let mut summary = p.stop(timeout, false).await;
                summary.log("pipeline stopped by the reload");
                summary.reported = true;
                self.metrics.unregister(&name);
                state.stopped.push(summary);
            }
        }
        let mut failed = ConfigErrors::default();
        let mut started = Vec::new();
        for b in fresh {
            let name = b.spec.name.clone();
            let reuse = kept_dead_letter_queues.remove(&name);
            match self.start_pipeline(b, &config.data_dir, &state.registry, reuse).await {
                Ok(p) => {
                    state.running.insert(name.clone(), p);
                    started.push(name);
                }
                Err(e) => failed.push(sluice_config::ConfigError::new(e)),
            }
        }
        for name in &started {
            if let Some(p) = state.running.get(name)
                && let Err(reasons) = p.started().await
            {
                reasons.into_iter().for_each(|r| failed.push(sluice_config::ConfigError::new(r)));
            }
        }
        if !failed.is_empty() {
            // The old config keeps running: what this reload started goes, what it stopped
            // comes back as it was.
            for e in &failed.0 {
                tracing::error!("{e}");
            }
            tracing::error!(pipelines = %started.join(", "),
                "the reloaded config could not start; going back to the running one");
            let mut stop_order = upstream_first(&feeds);
            stop_order.extend(started.iter().cloned());
            for name in stop_order.iter().filter(|n| started.contains(n)) {
                if let Some(mut p) = state.running.remove(name) {
                    if let Some(d) = p.take_dead_letter_queue() {
                        kept_dead_letter_queues.insert(name.clone(), d);
                    }
                    p.stop(timeout, false).await;
                    self.metrics.unregister(name);
                }
            }
            let old = state.config.clone();
            let mut errors = ConfigErrors::default();
            for spec in old.pipelines.iter().filter(|p| to_stop.contains(&p.name)) {
                let Some(b) = build_pipeline(spec, &self.bus, &old.data_dir, &mut errors) else { continue };
                let reuse = kept_dead_letter_queues.remove(&spec.name).filter(|d| d.fits(spec, &old.data_dir));
                match self.start_pipeline(b, &old.data_dir, &state.registry, reuse).await {
                    Ok(p) => {
                        if let Err(reasons) = p.started().await {
                            reasons.iter().for_each(|r| tracing::error!("{r}"));
                        }
                        state.running.insert(spec.name.clone(), p);
                    }
                    Err(e) => tracing::error!(pipeline = %spec.name, error = %e, "the pipeline could not start again"),
                }
            }
            for e in &errors.0 {
                tracing::error!("{e}");
            }
            for (name, d) in kept_dead_letter_queues {
                d.close(&name);
            }
            self.inputs_changed.notify_waiters();
            return Err(failed);
        }
        for (name, d) in kept_dead_letter_queues {
            d.close(&name);
        }
        if state.config.api != config.api
            || state.config.data_dir != config.data_dir
            || state.config.registry != config.registry
            || state.config.memory != config.memory
            || !same_cluster(&state.config, &config)
        {
            tracing::warn!(
                "changes to `api`, `data_dir`, `registry`, `memory` and `cluster` take effect at the next restart"
            );
        }
        state.feeds = feeds;
        state.config = config;
        self.inputs_changed.notify_waiters();
        Ok(report)
    }

    /// Registers a built pipeline's figures and starts it.
    async fn start_pipeline(
        &self,
        built: crate::build::BuiltPipeline,
        data_dir: &std::path::Path,
        registry: &Arc<Registry>,
        reuse: Option<OpenDeadLetterQueue>,
    ) -> Result<RunningPipeline, String> {
        self.metrics.register(built.metrics.clone());
        let name = built.spec.name.clone();
        let node = NodeServices {
            bus: &self.bus,
            data_dir,
            registry,
            memory: &self.memory,
            inputs_changed: &self.inputs_changed,
            cluster: self.cluster.as_ref(),
        };
        RunningPipeline::start(built, &node, reuse).await.inspect_err(|e| {
            tracing::error!(pipeline = %name, error = %e, "pipeline could not start");
            self.metrics.unregister(&name);
        })
    }

    /// Resolves once every input not fed by another pipeline has ended (a generator with a
    /// count, stdin at its end); the process then drains and exits as on SIGTERM.
    pub async fn inputs_finished(&self) {
        loop {
            let notified = self.inputs_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let state = self.state.lock().await;
                if state.running.values().all(|p| p.external_inputs.load(Ordering::SeqCst) == 0) {
                    return;
                }
            }
            notified.await;
        }
    }

    /// Stops every pipeline, upstream pipelines first, and returns their summaries. Memory
    /// queues are always emptied; persisted queues only if `drain` (the inputs ran out), since
    /// on a signal what they hold is safe on disk.
    pub async fn shutdown(&self, drain: bool) -> Vec<PipelineSummary> {
        self.metrics.node.begin_draining();
        if let Some(c) = &self.cluster {
            c.begin_stopping();
        }
        let mut state = self.state.lock().await;
        let deadline = tokio::time::Instant::now() + state.config.shutdown_timeout;
        let mut summaries = std::mem::take(&mut state.stopped);
        // No input takes anything more from outside, from now on.
        state.running.values().for_each(RunningPipeline::stop_accepting);
        // Every pipeline drains at once, within one drain timeout; one that other pipelines
        // feed waits for them to have stopped first, so that what they send it is taken.
        let running = std::mem::take(&mut state.running);
        let stopped: BTreeMap<String, tokio::sync::watch::Sender<bool>> =
            running.keys().map(|n| (n.clone(), tokio::sync::watch::Sender::new(false))).collect();
        let stops = running.into_iter().map(|(name, p)| {
            let upstream: Vec<_> = state
                .feeds
                .iter()
                .filter(|(from, to)| to.contains(&name) && **from != name)
                .filter_map(|(from, _)| stopped.get(from).map(|s| s.subscribe()))
                .collect();
            let done = stopped[&name].clone();
            async move {
                for mut up in upstream {
                    let _ = up.wait_for(|stopped| *stopped).await;
                }
                let summary = p.stop_by(deadline, drain).await;
                done.send_replace(true);
                summary
            }
        });
        summaries.extend(futures_util::future::join_all(stops).await);
        // Every input has stopped and every acknowledgement has arrived: write what is pending.
        close_registry(&state.registry).await;
        if let Some(c) = &self.cluster {
            c.shutdown().await;
        }
        summaries
    }

    /// Cluster mode: this node's part in the cluster.
    pub fn cluster(&self) -> Option<&Cluster> {
        self.cluster.as_ref()
    }

    /// The registry of input positions.
    pub async fn registry(&self) -> Arc<Registry> {
        self.state.lock().await.registry.clone()
    }

    /// Summaries of the running pipelines, as they stand.
    pub async fn summaries(&self) -> Vec<PipelineSummary> {
        self.state.lock().await.running.values().map(RunningPipeline::summary).collect()
    }

    pub fn bus(&self) -> &Arc<PipelineBus> {
        &self.bus
    }
}

/// Stops what a start that failed had started, upstream pipelines first, and closes the
/// node's services.
async fn abandon_start(
    mut running: BTreeMap<String, RunningPipeline>,
    feeds: &BTreeMap<String, BTreeSet<String>>,
    config: &RootConfig,
    registry: &Arc<Registry>,
    cluster: Option<&Cluster>,
) {
    for name in upstream_first(feeds) {
        if let Some(p) = running.remove(&name) {
            p.stop(config.shutdown_timeout, false).await;
        }
    }
    for (_, p) in running {
        p.stop(config.shutdown_timeout, false).await;
    }
    close_registry(registry).await;
    if let Some(c) = cluster {
        c.shutdown().await;
    }
}

/// How the registry writes, from the checked `registry:` section.
pub fn registry_options(config: &RootConfig) -> Result<RegistryOptions, ConfigErrors> {
    RegistryOptions::from_section(config.registry.as_ref())
}

/// The checked `cluster:` section, if there is one.
pub fn cluster_config(config: &RootConfig) -> Result<Option<ClusterConfig>, ConfigErrors> {
    config.cluster.as_ref().map(ClusterConfig::from_node).transpose()
}

fn same_cluster(a: &RootConfig, b: &RootConfig) -> bool {
    match (&a.cluster, &b.cluster) {
        (None, None) => true,
        (Some(x), Some(y)) => sluice_config::model::same_content(x, y),
        _ => false,
    }
}

fn uses_registry(b: &crate::build::BuiltPipeline) -> bool {
    b.inputs.iter().any(|i| i.input.uses_registry())
}

/// Opens the registry in `data_dir/registry` with the config's options and publishes its figures.
async fn open_registry(config: &RootConfig, metrics: &MetricsRegistry) -> Result<Arc<Registry>, ConfigErrors> {
    let dir = config.data_dir.join("registry");
    let opts = registry_options(config)?;
    let opened = tokio::task::spawn_blocking({
        let dir = dir.clone();
        move || Registry::open(&dir, opts)
    })
    .await;
    match opened {
        Ok(Ok(r)) => {
            metrics.set_registry(r.metrics());
            Ok(r)
        }
        Ok(Err(e)) => Err(sluice_config::ConfigError::new(format!("cannot open the registry: {e}")).into()),
        Err(e) => {
            Err(sluice_config::ConfigError::new(format!("cannot open the registry in {}: {e}", dir.display())).into())
        }
    }
}

/// Writes everything pending in the registry and stops its writer (off the async threads: it fsyncs).
async fn close_registry(registry: &Arc<Registry>) {
    let r = registry.clone();
    match tokio::task::spawn_blocking(move || r.close()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!("closing the registry: {e}"),
        Err(e) => tracing::error!(dir = %registry.dir().display(), "closing the registry: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(data_dir: &std::path::Path) -> RootConfig {
        let text = format!(
            "data_dir: {}\napi: {{enabled: false}}\npipelines:\n  p:\n    inputs: [{{type: generator, count: 10}}]\n    outputs: [{{type: blackhole}}]\n",
            data_dir.display()
        );
        sluice_config::model::load_str(&text, "test.yml").unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_reload_with_a_bad_registry_or_dead_letter_queue_section_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let engine = Engine::start(config(&data)).await.unwrap();
        let good = format!(
            "data_dir: {}\napi: {{enabled: false}}\npipelines:\n  p:\n    inputs: [{{type: generator, count: 10}}]\n    outputs: [{{type: blackhole}}]\n",
            data.display()
        );
        let bad = sluice_config::model::load_str(&format!("registry: {{compact_after: 10}}\n{good}"), "r.yml").unwrap();
        let e = engine.reload(bad).await.unwrap_err().to_string();
        assert!(e.contains("r.yml:1:27: registry.compact_after: `compact_after` of 10B is too small"), "{e}");
        let bad = format!("{good}    dead_letter_queue: {{enabled: true, sync: sometimes}}\n");
        let e = engine.reload(sluice_config::model::load_str(&bad, "d.yml").unwrap()).await.unwrap_err().to_string();
        assert!(e.contains("d.yml:7:46: pipelines.p.dead_letter_queue.sync: unknown variant `sometimes`"), "{e}");
        engine.shutdown(true).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn without_positioned_inputs_the_registry_stays_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let engine = Engine::start(config(&data)).await.unwrap();
        assert!(!engine.registry().await.is_persistent());
        engine.inputs_finished().await;
        engine.shutdown(true).await;
        assert!(!data.join("registry").exists(), "a registry directory was created for nothing");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_registry_that_cannot_open_is_an_error_naming_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let not_a_dir = dir.path().join("plain-file");
        std::fs::write(&not_a_dir, b"x").unwrap();
        let e = open_registry(&config(&not_a_dir), &MetricsRegistry::default()).await.unwrap_err().to_string();
        assert!(e.contains("cannot open the registry") && e.contains("plain-file/registry"), "{e}");

        let data = dir.path().join("data");
        let metrics = MetricsRegistry::default();
        let held = open_registry(&config(&data), &metrics).await.unwrap();
        let e = open_registry(&config(&data), &metrics).await.unwrap_err().to_string();
        assert!(e.contains("in use by another process") && e.contains("data/registry"), "{e}");
        close_registry(&held).await;
        assert!(held.is_persistent());
        assert!(metrics.registry().is_some(), "the registry's figures were not published");
    }
}
