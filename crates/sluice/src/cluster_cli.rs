//! `sluice cluster ring` and `sluice cluster route`: the ring a config makes, offline.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;
use sluice_cluster::ClusterConfig;
use sluice_cluster::config::Discovery;
use sluice_cluster::ring::Ring;
use sluice_core::{Event, FieldPath, Value};

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Lists the ring's members (DNS discovery is resolved now) and each one's share of the keys.
    Ring {
        #[arg(short, long)]
        config: PathBuf,
        /// Prints the ring as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Prints the node that owns a key tuple: `sluice cluster route -c FILE user=alice`.
    /// A value that reads as JSON (`5`, `true`, `null`, `"5"`) is taken as that; any other
    /// text is a string. Keys are the first keyed processor's `identification_keys`, named
    /// with or without their leading `/`.
    Route {
        #[arg(short, long)]
        config: PathBuf,
        /// The pipeline whose keys to use (needed when several have keyed processors).
        #[arg(long)]
        pipeline: Option<String>,
        /// `key=value` pairs.
        #[arg(required = true)]
        keys: Vec<String>,
    },
}

pub fn run(command: ClusterCommand) -> ExitCode {
    let result = match command {
        ClusterCommand::Ring { config, json } => ring(&config, json),
        ClusterCommand::Route { config, pipeline, keys } => route(&config, pipeline.as_deref(), &keys),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}

/// The config's cluster section and the ring it makes now.
fn load(path: &Path) -> Result<(sluice_config::model::RootConfig, ClusterConfig, Ring), String> {
    let config = sluice_config::model::load_file(path).map_err(|e| e.to_string())?;
    let cluster = sluice_topology::engine::cluster_config(&config)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{}: has no `cluster:` section", path.display()))?;
    let mut members = match &cluster.discovery {
        Discovery::Static(m) => m.clone(),
        Discovery::Dns(d) => {
            use std::net::ToSocketAddrs;
            let addrs =
                (d.name.as_str(), d.port).to_socket_addrs().map_err(|e| format!("resolving `{}`: {e}", d.name))?;
            addrs.map(|a| a.to_string()).collect()
        }
    };
    if !members.contains(&cluster.node) {
        members.push(cluster.node.clone());
    }
    let ring = Ring::new(&members, cluster.virtual_nodes);
    Ok((config, cluster, ring))
}

fn ring(path: &Path, json: bool) -> Result<(), String> {
    let (_, cluster, ring) = load(path)?;
    let shares = ring.shares();
    if json {
        let members: Vec<_> = ring
            .members()
            .iter()
            .zip(&shares)
            .map(|(m, s)| serde_json::json!({"node": m, "share": s, "this_node": *m == cluster.node}))
            .collect();
        let doc = serde_json::json!({"virtual_nodes": ring.virtual_nodes(), "members": members});
        println!("{}", serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())?);
        return Ok(());
    }
    println!("{} node(s), {} virtual nodes each:", ring.len(), ring.virtual_nodes());
    for (m, s) in ring.members().iter().zip(&shares) {
        let me = if *m == cluster.node { "  (this node)" } else { "" };
        println!("  {m:<32} {:>6.2}% of the keys{me}", s * 100.0);
    }
    Ok(())
}

fn route(path: &Path, pipeline: Option<&str>, pairs: &[String]) -> Result<(), String> {
    let (config, _, ring) = load(path)?;
    let keyed: Vec<(String, sluice_core::KeySpec)> = {
        let bus = std::sync::Arc::new(sluice_core::bus::PipelineBus::default());
        let built = sluice_topology::build::build_all(&config, &bus).map_err(|e| e.to_string())?;
        built.into_iter().filter_map(|b| b.keyed.map(|(_, k)| (b.spec.name, k))).collect()
    };
    let (name, keys) = match pipeline {
        Some(p) => keyed
            .iter()
            .find(|(n, _)| n == p)
            .ok_or_else(|| format!("pipeline `{p}` has no processor with identification keys"))?,
        None => match keyed.as_slice() {
            [one] => one,
            [] => return Err("no pipeline has a processor with identification keys".to_string()),
            _ => {
                let names: Vec<&str> = keyed.iter().map(|(n, _)| n.as_str()).collect();
                return Err(format!(
                    "several pipelines have keyed processors ({}): say which with --pipeline",
                    names.join(", ")
                ));
            }
        },
    };
    let mut event = Event::default();
    for pair in pairs {
        let (key, value) = pair.split_once('=').ok_or_else(|| format!("`{pair}` is not key=value"))?;
        let key = if key.starts_with('/') { key.to_string() } else { format!("/{key}") };
        let field = FieldPath::parse(&key).map_err(|e| format!("`{key}`: {e}"))?;
        if !keys.paths().contains(&field) {
            let known: Vec<&str> = keys.paths().iter().map(FieldPath::as_str).collect();
            return Err(format!("`{key}` is not an identification key of pipeline `{name}` ({})", known.join(", ")));
        }
        let value = Value::from_json_slice(value.as_bytes()).unwrap_or_else(|_| Value::from(value));
        event.insert(&field, value).map_err(|_| format!("cannot set `{key}`"))?;
    }
    let mut scratch = Vec::new();
    let h = keys.hash(&event, &mut scratch);
    let owner = &ring.members()[ring.owner(h.hash)];
    println!("{owner}");
    if h.missing > 0 {
        let missing: Vec<&str> =
            keys.paths().iter().filter(|p| event.get(p).is_none()).map(FieldPath::as_str).collect();
        eprintln!("note: without {}: routed like every event that lacks them", missing.join(", "));
    }
    eprintln!("hash {:016x}, pipeline `{name}`", h.hash);
    Ok(())
}
