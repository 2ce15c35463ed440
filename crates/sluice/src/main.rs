//! The `sluice` command: `run`, `validate`, `queue stats|verify`, `registry show`,
//! `dlq stats|list|show|replay|purge`, `cluster ring|route`, `top`, `version`.
//!
//! `run` starts every pipeline of the config (or, without `-c`, an embedded default that reads
//! stdin and writes JSON lines to stdout), serves the monitoring API, and then:
//! - SIGTERM or SIGINT: stops the inputs, drains the queues through the outputs (bounded by
//!   `shutdown_timeout`), prints one summary line per pipeline on stderr, and exits;
//! - SIGHUP: reads the config file again; if it is valid, restarts only the pipelines whose
//!   section changed; if not, logs every error and keeps running the old config;
//! - when every input that has an end (a generator with a count, stdin) has ended, it drains
//!   and exits as on SIGTERM.

mod cluster_cli;
mod dlq_cli;
mod top;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use sluice_config::model::{LogFormat, PartialConfig, RootConfig, load_file, load_file_partial, load_str};
use sluice_topology::Engine;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

sluice_alloc::install!();

// Ordered (one worker): lines typed or piped in come out in the order they went in. A filter
// between two pipes needs no monitoring API, and one on the default port would stop it from
// starting wherever another sluice runs.
const DEFAULT_CONFIG: &str = "\
api:
  enabled: false
pipelines:
  main:
    ordered: true
    inputs:
      - type: stdin
    outputs:
      - type: stdout
        codec: json
";

#[derive(Parser)]
#[command(name = "sluice", version, about = "A log and event pipeline that loses nothing and keeps up.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs the pipelines of a config (without -c: stdin lines to stdout as JSON).
    Run {
        /// The YAML config file.
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// Overrides `log.level` (a tracing filter such as `debug` or `sluice_topology=debug,info`).
        #[arg(long)]
        log_level: Option<String>,
    },
    /// Checks a config: every key, type, condition, pattern and pipeline link. Exit 0 if valid.
    Validate {
        #[arg(short, long)]
        config: PathBuf,
    },
    /// Inspects a persisted queue directory offline, without writing to it.
    Queue {
        #[command(subcommand)]
        command: QueueCommand,
    },
    /// Inspects the registry of input positions offline, without writing to it.
    Registry {
        #[command(subcommand)]
        command: RegistryCommand,
    },
    /// Inspects, replays and purges a pipeline's dead letter queue, offline.
    Dlq {
        #[command(subcommand)]
        command: dlq_cli::DlqCommand,
    },
    /// Shows the hash ring a cluster config makes, and which node owns a key.
    Cluster {
        #[command(subcommand)]
        command: cluster_cli::ClusterCommand,
    },
    /// A live view of a running sluice over its monitoring API: per pipeline, component and
    /// cluster peer, events per second, queue fill, time blocked, failures, dead letters.
    Top(top::TopArgs),
    /// Prints the version.
    Version,
}

#[derive(Subcommand)]
enum RegistryCommand {
    /// Lists every key with its offset, metadata (path, identity) and last update. Read-only:
    /// safe while sluice runs (it then shows what was last flushed). Exit 2 if there is none.
    Show {
        /// The data directory whose `registry/` to read (default `./data`).
        #[arg(long, conflicts_with = "config")]
        data_dir: Option<PathBuf>,
        /// Takes the data directory from this config file.
        #[arg(short, long)]
        config: Option<PathBuf>,
        /// Prints the entries as JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum QueueCommand {
    /// Per shard and segment: checkpoint, events acknowledged and not, damage found. Exit 0.
    Stats {
        /// The queue directory (by default `<data_dir>/queue/<pipeline>`).
        path: PathBuf,
        /// Prints the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Like `stats`, and decodes every event. Exit 0 if intact, 1 if damaged, 2 if not a queue.
    Verify {
        /// The queue directory (by default `<data_dir>/queue/<pipeline>`).
        path: PathBuf,
        /// Prints the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    sluice_core::memory::on_pressure(sluice_alloc::pressure);
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!("sluice {} ({})", env!("CARGO_PKG_VERSION"), env!("SLUICE_COMMIT"));
            ExitCode::SUCCESS
        }
        Command::Validate { config } => validate(&config),
        Command::Queue { command } => queue(command),
        Command::Registry { command: RegistryCommand::Show { data_dir, config, json } } => {
            registry_show(data_dir, config.as_deref(), json)
        }
        Command::Dlq { command } => dlq_cli::run(command),
        Command::Cluster { command } => cluster_cli::run(command),
        Command::Top(args) => top::run(args),
        Command::Run { config, log_level } => match run(config.as_deref(), log_level) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

fn load(path: Option<&Path>) -> Result<RootConfig, sluice_config::ConfigErrors> {
    match path {
        Some(p) => load_file(p),
        None => load_str(DEFAULT_CONFIG, "<embedded default>"),
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("sluice")
        .build()
        .context("starting the runtime")
}

fn validate(path: &Path) -> ExitCode {
    // The components are built even when the layout has errors, so that one pass lists both.
    let PartialConfig { config, complete, mut errors } = load_file_partial(path);
    let Some(config) = config else {
        eprintln!("{errors}");
        eprintln!("{}: {} error(s)", path.display(), errors.0.len());
        return ExitCode::from(2);
    };
    for warning in sluice_topology::build::warnings(&config) {
        eprintln!("warning: {warning}");
    }
    // Building the outputs needs a runtime (HTTP clients); nothing is started or bound.
    let checked = match runtime() {
        Ok(rt) => rt.block_on(async {
            if complete {
                Engine::validate(&config)
            } else {
                // A pipeline or component could not be read: checks across pipelines would
                // report what is only missing, so build each pipeline on its own.
                let bus = Arc::new(sluice_core::bus::PipelineBus::default());
                let mut errors = sluice_topology::engine::registry_options(&config).err().unwrap_or_default();
                for p in &config.pipelines {
                    sluice_topology::build::build_pipeline(p, &bus, &config.data_dir, &mut errors);
                }
                errors.into_result(())
            }
        }),
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = checked {
        errors.0.extend(e.0);
    }
    match errors.into_result(()) {
        Ok(()) => {
            let names: Vec<&str> = config.pipelines.iter().map(|p| p.name.as_str()).collect();
            println!("{}: valid ({} pipeline(s): {})", path.display(), names.len(), names.join(", "));
            ExitCode::SUCCESS
        }
        Err(errors) => {
            eprintln!("{errors}");
            eprintln!("{}: {} error(s)", path.display(), errors.0.len());
            ExitCode::from(2)
        }
    }
}

fn queue(command: QueueCommand) -> ExitCode {
    let (path, json, verify) = match command {
        QueueCommand::Stats { path, json } => (path, json, false),
        QueueCommand::Verify { path, json } => (path, json, true),
    };
    let report = match sluice_queue::persisted::inspect::inspect(&path, verify) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report).expect("a report serializes"));
    } else {
        print!("{report}");
    }
    if verify && report.totals.damaged > 0 {
        eprintln!("{}: {} damaged spot(s)", path.display(), report.totals.damaged);
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

fn registry_show(data_dir: Option<PathBuf>, config: Option<&Path>, json: bool) -> ExitCode {
    let data_dir = match (config, data_dir) {
        (Some(path), _) => match load_file(path) {
            Ok(c) => c.data_dir,
            Err(errors) => {
                eprintln!("{errors}");
                return ExitCode::from(2);
            }
        },
        (None, Some(d)) => d,
        (None, None) => load_str(DEFAULT_CONFIG, "<embedded default>").map(|c| c.data_dir).unwrap_or_default(),
    };
    let dir = data_dir.join("registry");
    let view = match sluice_registry::Registry::read(&dir) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    for w in &view.warnings {
        eprintln!("warning: {w}");
    }
    if view.in_use {
        eprintln!(
            "note: a running sluice holds this registry; offsets acknowledged since its last flush are not shown"
        );
    }
    let unix_ms =
        |t: std::time::SystemTime| t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let rfc3339 = |t: std::time::SystemTime| humantime::format_rfc3339_millis(t).to_string();
    if json {
        let entries: Vec<serde_json::Value> = view
            .entries
            .iter()
            .map(|e| {
                serde_json::json!({
                    "key": e.key,
                    "offset": e.offset,
                    "meta": e.meta,
                    "updated": rfc3339(e.updated),
                    "updated_unix_ms": unix_ms(e.updated),
                })
            })
            .collect();
        let out = serde_json::json!({
            "dir": dir.display().to_string(),
            "in_use": view.in_use,
            "warnings": view.warnings,
            "entries": entries,
        });
        println!("{}", serde_json::to_string_pretty(&out).expect("JSON values serialize"));
        return ExitCode::SUCCESS;
    }
    // The path gets a column of its own; the rest of the metadata is shown as compact JSON.
    let rows: Vec<[String; 5]> = view
        .entries
        .iter()
        .map(|e| {
            let path = e.meta.get("path").and_then(|p| p.as_str()).unwrap_or("-").to_string();
            let rest = match &e.meta {
                serde_json::Value::Object(m) => {
                    let mut m = m.clone();
                    m.remove("path");
                    if m.is_empty() { "-".to_string() } else { serde_json::Value::Object(m).to_string() }
                }
                serde_json::Value::Null => "-".to_string(),
                other => other.to_string(),
            };
            [e.key.clone(), e.offset.to_string(), rfc3339(e.updated), path, rest]
        })
        .collect();
    let header = ["KEY", "OFFSET", "UPDATED", "PATH", "META"];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: [&str; 5]| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i == 4 {
                out.push_str(cell);
            } else if i == 1 {
                out.push_str(&format!("{cell:>w$}  "));
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        out.trim_end().to_string()
    };
    println!("{}", line(header));
    for row in &rows {
        println!("{}", line([&row[0], &row[1], &row[2], &row[3], &row[4]]));
    }
    println!("{} key(s) in {}", rows.len(), dir.display());
    ExitCode::SUCCESS
}

fn init_logging(config: &RootConfig, level: Option<String>) {
    let filter = level.or_else(|| std::env::var("SLUICE_LOG").ok()).unwrap_or_else(|| config.log.level.clone());
    let filter = tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|e| {
        eprintln!("warning: log level `{filter}` is not a valid filter ({e}); using info");
        tracing_subscriber::EnvFilter::new("info")
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match config.log.format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

fn run(path: Option<&Path>, log_level: Option<String>) -> anyhow::Result<ExitCode> {
    let config = match load(path) {
        Ok(c) => c,
        Err(errors) => {
            eprintln!("{errors}");
            return Ok(ExitCode::from(2));
        }
    };
    init_logging(&config, log_level);
    runtime()?.block_on(serve(path, config))
}

async fn serve(path: Option<&Path>, config: RootConfig) -> anyhow::Result<ExitCode> {
    let source = path.map_or_else(|| "embedded default".to_string(), |p| p.display().to_string());
    tracing::info!(version = %env!("CARGO_PKG_VERSION"), config = %source, data_dir = %config.data_dir.display(),
        "sluice starting");
    for warning in sluice_topology::build::warnings(&config) {
        tracing::warn!("{warning}");
    }
    let api = config.api.clone();
    let log_format = config.log.format;
    let api_listener = if api.enabled {
        match sluice_api::bind(&api.address).await {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!("api.address: the monitoring API cannot listen on {}: {e}", api.address);
                return Ok(ExitCode::from(2));
            }
        }
    } else {
        None
    };
    let engine = match Engine::start(config).await {
        Ok(e) => Arc::new(e),
        Err(errors) => {
            eprintln!("{errors}");
            return Ok(ExitCode::from(2));
        }
    };
    let _ = engine.metrics.node.build.set(sluice_core::metrics::BuildInfo {
        version: env!("CARGO_PKG_VERSION").to_string(),
        commit: env!("SLUICE_COMMIT").to_string(),
    });
    let api_stop = CancellationToken::new();
    if let Some(listener) = api_listener {
        let state = sluice_api::ApiState::new(engine.metrics.clone());
        let addr = sluice_api::serve(listener, state, api_stop.clone()).context("serving the monitoring API")?;
        tracing::info!(address = %addr, "monitoring API listening");
    }

    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let drain_persisted = loop {
        tokio::select! {
            _ = term.recv() => { tracing::info!("SIGTERM: stopping"); break false; }
            _ = int.recv() => { tracing::info!("SIGINT: stopping"); break false; }
            _ = engine.inputs_finished() => { tracing::info!("every input has ended: draining"); break true; }
            _ = hup.recv() => reload(&engine, path).await,
        }
    };

    // A second signal during the drain exits at once.
    let drain = engine.shutdown(drain_persisted);
    let summaries = tokio::select! {
        s = drain => s,
        _ = term.recv() => { eprintln!("second signal: exiting without finishing the drain"); return Ok(ExitCode::from(130)); }
        _ = int.recv() => { eprintln!("second signal: exiting without finishing the drain"); return Ok(ExitCode::from(130)); }
    };
    api_stop.cancel();
    let mut failed = false;
    let mut rejected = 0;
    for s in &summaries {
        // Once each: a pipeline a reload stopped was reported then. With JSON logs the summary
        // is a log event with a field per figure, so the stream stays JSON.
        if !s.reported {
            match log_format {
                LogFormat::Json => s.log("pipeline stopped"),
                LogFormat::Text => eprintln!("{s}"),
            }
        }
        failed |= s.input_errors > 0 || s.unfinished > 0;
        rejected += s.failed;
    }
    // Over a finite input (stdin, a generator with a count, files read once), events an output
    // rejected for good with no dead letter queue to keep them are a failed run: say so in the
    // exit code, not only in a counter.
    if drain_persisted && rejected > 0 {
        tracing::error!(events = rejected, "events were rejected for good by outputs and kept in no dead letter queue");
        failed = true;
    }
    Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// Pipeline names for a log line: `web, api`, or `none`.
fn names(list: &[String]) -> String {
    if list.is_empty() { "none".to_string() } else { list.join(", ") }
}

async fn reload(engine: &Engine, path: Option<&Path>) {
    let Some(path) = path else {
        tracing::warn!("SIGHUP: running the embedded default config; there is no file to reload");
        return;
    };
    tracing::info!(config = %path.display(), "SIGHUP: reloading");
    // Certificates first, so that listeners of pipelines the reload leaves alone serve the
    // rotated ones too; pipelines it restarts read their files as they are built.
    let certificates = sluice_tls::reload_all();
    if certificates.reloaded + certificates.failed > 0 {
        tracing::info!(
            reloaded = certificates.reloaded,
            failed = certificates.failed,
            "SIGHUP: TLS certificates re-read"
        );
    }
    let config = match load_file(path) {
        Ok(c) => c,
        Err(errors) => {
            for e in &errors.0 {
                tracing::error!("{e}");
            }
            engine.metrics.node.reloaded(false);
            tracing::error!(errors = errors.0.len(), "the new config is invalid; keeping the running one");
            return;
        }
    };
    match engine.reload(config).await {
        Ok(r) => {
            engine.metrics.node.reloaded(true);
            tracing::info!(started = %names(&r.started), restarted = %names(&r.restarted),
                stopped = %names(&r.stopped), unchanged = %names(&r.unchanged), "config reloaded")
        }
        Err(errors) => {
            engine.metrics.node.reloaded(false);
            for e in &errors.0 {
                tracing::error!("{e}");
            }
            tracing::error!(
                errors = errors.0.len(),
                "the new config is invalid or could not start; keeping the running one"
            );
        }
    }
}
