//! `sluice dlq stats|list|show|replay|purge`: a pipeline's dead letter queue, offline.
//!
//! The queue is found by `--path DIR`, or by `--pipeline P` under a data directory
//! (`--data-dir D`, or the `data_dir` of `-c CONFIG`, where the pipeline's own
//! `dead_letter_queue.path` wins). Nothing here changes a segment but `purge`, which asks for
//! `--yes` and refuses while a writer has the queue open. `replay` without `--to` prints the
//! events as JSON lines; with `--to PIPELINE` it runs that pipeline of the config, its inputs
//! replaced by one `dead_letter_queue` input that reads the queue once, and exits when every
//! entry is acknowledged. Replay leaves the entries in place (purge them afterwards).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, anyhow, bail};
use clap::{Args, Subcommand};
use sluice_config::model::{RootConfig, load_file, load_str};
use sluice_core::value::format_timestamp;
use sluice_dlq::ReadFrom;
use sluice_dlq::inspect::{self, Item};
use sluice_dlq::{DeadLetterQueueConfig, default_dir as default_dead_letter_queue_dir};
use sluice_topology::Engine;

#[derive(Args, Clone)]
pub struct Location {
    /// The data directory the queue is under (`<data-dir>/dlq/<pipeline>`).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// A config file: its `data_dir`, and the pipeline's `dead_letter_queue.path` if it sets one.
    #[arg(short, long)]
    config: Option<PathBuf>,
    /// Whose dead letter queue.
    #[arg(long)]
    pipeline: Option<String>,
    /// The queue's directory itself.
    #[arg(long, conflicts_with_all = ["pipeline", "data_dir"])]
    path: Option<PathBuf>,
}

#[derive(Subcommand)]
pub enum DlqCommand {
    /// Totals: segments, entries, bytes, oldest and newest entry, whether a writer has it open.
    Stats {
        #[command(flatten)]
        at: Location,
        /// Prints JSON.
        #[arg(long)]
        json: bool,
    },
    /// The segments, oldest first.
    List {
        #[command(flatten)]
        at: Location,
        #[arg(long)]
        json: bool,
    },
    /// The entries as JSON lines: reason, plugin, pipeline, time, attempts and the event.
    Show {
        #[command(flatten)]
        at: Location,
        /// At most this many entries.
        #[arg(long)]
        limit: Option<usize>,
        /// Only entries written at or after this RFC 3339 time.
        #[arg(long)]
        since: Option<String>,
    },
    /// The events to stdout as JSON lines, or with `--to` through a pipeline of the config.
    Replay {
        #[command(flatten)]
        at: Location,
        /// Runs this pipeline of `--config` with the entries as its only input.
        #[arg(long, requires = "config")]
        to: Option<String>,
    },
    /// Deletes every segment (asks for --yes).
    Purge {
        #[command(flatten)]
        at: Location,
        /// Really delete.
        #[arg(long)]
        yes: bool,
    },
}

pub fn run(command: DlqCommand) -> ExitCode {
    match dispatch(command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn load_config(path: &Path) -> anyhow::Result<RootConfig> {
    load_file(path).map_err(|errors| anyhow!("{errors}"))
}

/// The directory of the queue named by `at`.
fn resolve(at: &Location) -> anyhow::Result<PathBuf> {
    if let Some(p) = &at.path {
        return Ok(p.clone());
    }
    let Some(pipeline) = &at.pipeline else {
        bail!("say whose dead letter queue: --pipeline NAME (with --data-dir or -c), or --path DIR");
    };
    if let Some(d) = &at.data_dir {
        return Ok(default_dead_letter_queue_dir(d, pipeline));
    }
    let Some(config) = &at.config else {
        bail!("--pipeline needs --data-dir DIR or -c CONFIG to find the data directory");
    };
    let c = load_config(config)?;
    Ok(match c.pipelines.iter().find(|p| &p.name == pipeline) {
        Some(spec) => DeadLetterQueueConfig::of(spec).map_err(|e| anyhow!("{e}"))?.dir(&c.data_dir, pipeline),
        None => default_dead_letter_queue_dir(&c.data_dir, pipeline),
    })
}

fn existing(at: &Location) -> anyhow::Result<PathBuf> {
    let dir = resolve(at)?;
    if !dir.is_dir() {
        bail!("{}: no dead letter queue here (no such directory)", dir.display());
    }
    Ok(dir)
}

fn time(ns: Option<i64>) -> String {
    ns.map(format_timestamp).unwrap_or_else(|| "-".to_string())
}

fn dispatch(command: DlqCommand) -> anyhow::Result<ExitCode> {
    match command {
        DlqCommand::Stats { at, json } => {
            let dir = existing(&at)?;
            let s = inspect::stats(&dir)?;
            if json {
                let doc = serde_json::json!({
                    "path": dir.display().to_string(),
                    "segments": s.segments, "sealed_segments": s.sealed_segments,
                    "entries": s.entries, "bytes": s.bytes,
                    "oldest_entry_time": s.oldest_entry_time.map(format_timestamp),
                    "newest_entry_time": s.newest_entry_time.map(format_timestamp),
                    "writer_active": s.writer_active,
                });
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                println!("dead letter queue {}", dir.display());
                println!("  segments: {} ({} sealed)", s.segments, s.sealed_segments);
                println!("  entries:  {}", s.entries);
                println!("  bytes:    {}", s.bytes);
                println!("  oldest:   {}", time(s.oldest_entry_time));
                println!("  newest:   {}", time(s.newest_entry_time));
                println!("  writer:   {}", if s.writer_active { "open (a process is writing)" } else { "none" });
            }
            Ok(ExitCode::SUCCESS)
        }
        DlqCommand::List { at, json } => {
            let dir = existing(&at)?;
            let segments = inspect::segments(&dir)?;
            if json {
                let docs: Vec<_> = segments
                    .iter()
                    .map(|s| {
                        serde_json::json!({
                            "id": s.id, "path": s.path.display().to_string(), "sealed": s.sealed,
                            "bytes": s.bytes, "entries": s.entries,
                            "oldest_entry_time": s.oldest_entry_time.map(format_timestamp),
                            "newest_entry_time": s.newest_entry_time.map(format_timestamp),
                            "damaged_frames": s.damaged_frames,
                        })
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&docs)?);
            } else {
                println!(
                    "{:>10}  {:6}  {:>8}  {:>12}  {:30}  {:30}",
                    "segment", "state", "entries", "bytes", "oldest", "newest"
                );
                for s in &segments {
                    println!(
                        "{:>10}  {:6}  {:>8}  {:>12}  {:30}  {:30}",
                        s.id,
                        if s.sealed { "sealed" } else { "open" },
                        s.entries,
                        s.bytes,
                        time(s.oldest_entry_time),
                        time(s.newest_entry_time)
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        DlqCommand::Show { at, limit, since } => {
            let dir = existing(&at)?;
            let from = match since {
                None => ReadFrom::Beginning,
                Some(t) => ReadFrom::Time(
                    chrono::DateTime::parse_from_rfc3339(&t)
                        .with_context(|| format!("--since `{t}` is not an RFC 3339 time"))?
                        .timestamp_nanos_opt()
                        .ok_or_else(|| anyhow!("--since `{t}` is out of range"))?,
                ),
            };
            let mut out = std::io::stdout().lock();
            let (mut shown, mut damaged) = (0usize, 0u64);
            for item in inspect::entries(&dir, from)? {
                if limit.is_some_and(|l| shown >= l) {
                    break;
                }
                match item? {
                    Item::Entry { entry, position, offset } => {
                        let event: serde_json::Value = serde_json::from_str(&entry.event.to_json_string())?;
                        let doc = serde_json::json!({
                            "segment": position.segment, "offset": offset,
                            "time": format_timestamp(entry.time),
                            "reason": entry.reason, "plugin_id": entry.plugin_id, "plugin_type": entry.plugin_type,
                            "pipeline": entry.pipeline, "attempts": entry.attempts,
                            "event": event,
                        });
                        writeln!(out, "{doc}")?;
                        shown += 1;
                    }
                    Item::Damaged { segment, path, offset, reason } => {
                        damaged += 1;
                        eprintln!(
                            "damaged entry skipped: segment {segment} ({}) at offset {offset}: {reason}",
                            path.display()
                        );
                    }
                }
            }
            out.flush()?;
            if damaged > 0 {
                eprintln!(
                    "{}: {damaged} damaged entr{} skipped",
                    dir.display(),
                    if damaged == 1 { "y" } else { "ies" }
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        DlqCommand::Replay { at, to: None } => {
            let dir = existing(&at)?;
            let mut out = std::io::stdout().lock();
            let mut line = Vec::with_capacity(1024);
            let mut damaged = 0u64;
            for item in inspect::entries(&dir, ReadFrom::Beginning)? {
                match item? {
                    Item::Entry { entry, .. } => {
                        line.clear();
                        entry.event.write_json(&mut line);
                        line.push(b'\n');
                        out.write_all(&line)?;
                    }
                    Item::Damaged { segment, offset, reason, .. } => {
                        damaged += 1;
                        eprintln!("damaged entry skipped: segment {segment} at offset {offset}: {reason}");
                    }
                }
            }
            out.flush()?;
            if damaged > 0 {
                eprintln!("{}: {damaged} damaged entries skipped", dir.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        DlqCommand::Replay { at, to: Some(target) } => {
            let dir = existing(&at)?;
            let config_path = at.config.as_deref().expect("clap requires --config with --to");
            replay_into(&dir, config_path, &target)
        }
        DlqCommand::Purge { at, yes } => {
            let dir = existing(&at)?;
            if !yes {
                let s = inspect::stats(&dir)?;
                eprintln!(
                    "this deletes {} entries in {} segments of {}; run again with --yes to do it",
                    s.entries,
                    s.segments,
                    dir.display()
                );
                return Ok(ExitCode::FAILURE);
            }
            let removed = inspect::purge(&dir)?;
            println!("{}: deleted {removed} segment file(s)", dir.display());
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Runs `target` of the config with one `dead_letter_queue` input reading `dir` once.
fn replay_into(dir: &Path, config_path: &Path, target: &str) -> anyhow::Result<ExitCode> {
    let mut config = load_config(config_path)?;
    let Some(index) = config.pipelines.iter().position(|p| p.name == target) else {
        let names: Vec<&str> = config.pipelines.iter().map(|p| p.name.as_str()).collect();
        bail!("{}: no pipeline `{target}` (it has: {})", config_path.display(), names.join(", "));
    };
    let mut spec = config.pipelines.swap_remove(index);
    // The input's settings are written as YAML so they are checked like any config.
    let path_text = serde_json::to_string(&dir.display().to_string())?;
    let snippet = format!(
        "pipelines:\n  replay:\n    inputs:\n      - {{type: dead_letter_queue, id: dead_letter_queue_replay, \
         path: {path_text}, follow: false, commit_offsets: false}}\n    outputs: [{{type: stdout}}]\n"
    );
    let mut input = load_str(&snippet, "<replay input>").map_err(|e| anyhow!("{e}"))?;
    spec.inputs = input.pipelines.remove(0).inputs;
    config.pipelines = vec![spec];
    config.api.enabled = false;

    let filter = std::env::var("SLUICE_LOG").unwrap_or_else(|_| "warn".to_string());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .try_init();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the runtime")?;
    rt.block_on(async move {
        let engine = match Engine::start(config).await {
            Ok(e) => e,
            Err(errors) => bail!("pipeline `{target}` cannot replay: {errors}"),
        };
        engine.inputs_finished().await;
        let summaries = engine.shutdown(true).await;
        let mut ok = true;
        for s in &summaries {
            eprintln!("{s}");
            ok &= s.input_errors == 0 && s.unfinished == 0;
        }
        Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
    })
}
