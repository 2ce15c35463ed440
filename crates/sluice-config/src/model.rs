//! The shape of a Sluice configuration file.
//!
//! ```yaml
//! data_dir: ./data
//! api: {enabled: true, address: 127.0.0.1:9600}
//! log: {level: info, format: text}
//! shutdown_timeout: 30s
//! registry: {flush_interval: 1s, compact_after: 16MiB}
//! memory: {budget: 256MiB}
//! pipelines:
//!   web:
//!     workers: 2
//!     batch: {size: 1000, delay: 50ms}
//!     queue: {type: memory, max_events: 8192, max_bytes: 32MiB}
//!     inputs:  [{type: tcp, address: 0.0.0.0:5000}]
//!     processors: [{type: json, if: 'exists(/message)'}]
//!     outputs: [{type: stdout}]
//!     dead_letter_queue: {enabled: true, max_bytes: 1GiB, storage_policy: drop_newer}
//! ```
//!
//! This module checks the layout and the settings that belong to the engine; each component's
//! own keys are left in [`ComponentSpec::settings`] for the component to read with
//! [`ComponentSpec::settings`], and the sections that belong to one crate (`registry`,
//! `cluster`, a pipeline's `dead_letter_queue`; `queue` and `tls` are components' sections) are
//! kept as written for that crate to read with [`from_node`], so that their keys and defaults are
//! declared once, where they are used. Every problem found is collected, so `sluice validate`
//! can list them all at once.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::de::from_node;
use crate::error::{ConfigError, ConfigErrors};
use crate::node::{Mark, Node, NodeKind, parse_yaml};
use crate::units::{ByteSize, HumanDuration};

#[derive(Debug, Clone)]
pub struct RootConfig {
    pub data_dir: PathBuf,
    pub api: ApiConfig,
    pub log: LogConfig,
    pub shutdown_timeout: Duration,
    /// The `registry:` section as written, read by the registry crate (`None`: not written).
    pub registry: Option<Node>,
    pub memory: MemoryConfig,
    /// The `cluster:` section as written, checked by the cluster crate (`None`: a single node).
    pub cluster: Option<Node>,
    pub pipelines: Vec<PipelineSpec>,
}

/// The node's one memory budget for events in flight (see `sluice_core::MemoryBudget`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryConfig {
    /// What the events decoded by every input, queued in memory, in batches and in outputs may
    /// cost in memory at once, across all pipelines.
    pub budget: ByteSize,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        MemoryConfig { budget: ByteSize(256 << 20) }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiConfig {
    pub enabled: bool,
    pub address: String,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig { enabled: true, address: "127.0.0.1:9600".to_string() }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// A `tracing` filter: `info`, `debug`, `sluice_topology=debug,info`.
    pub level: String,
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig { level: "info".to_string(), format: LogFormat::Text }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchConfig {
    /// Most events a worker takes at once.
    pub size: usize,
    /// Longest a worker waits for a batch to fill once it has one event.
    pub delay: HumanDuration,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig { size: 1000, delay: HumanDuration(Duration::from_millis(50)) }
    }
}

/// `ordered:` whether a pipeline keeps its events in the order they were queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ordered {
    /// Ordered when there is one worker (a persisted queue then defaults to one shard).
    #[default]
    Auto,
    /// Ordered: one worker and, for a persisted queue, one shard; more of either is an error.
    True,
    /// No promise of order; nothing is set for it.
    False,
}

impl<'de> Deserialize<'de> for OrderedValue {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = OrderedValue;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("`auto`, `true` or `false`")
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<OrderedValue, E> {
                Ok(OrderedValue(if v { Ordered::True } else { Ordered::False }))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<OrderedValue, E> {
                match v {
                    "auto" => Ok(OrderedValue(Ordered::Auto)),
                    "true" => Ok(OrderedValue(Ordered::True)),
                    "false" => Ok(OrderedValue(Ordered::False)),
                    other => Err(E::custom(format!("expected `auto`, `true` or `false`, found `{other}`"))),
                }
            }
        }
        d.deserialize_any(V)
    }
}

/// `ordered:` as written: `auto`, or a YAML boolean.
struct OrderedValue(Ordered);

#[derive(Debug, Clone)]
pub struct PipelineSpec {
    pub name: String,
    pub workers: usize,
    /// As written (`auto` by default); [`PipelineSpec::keeps_order`] says what it came to.
    pub ordered: Ordered,
    pub batch: BatchConfig,
    /// The `queue` section as a component (`type` defaults to `memory`).
    pub queue: ComponentSpec,
    pub inputs: Vec<ComponentSpec>,
    pub processors: Vec<ComponentSpec>,
    pub outputs: Vec<ComponentSpec>,
    /// The `dead_letter_queue:` section as written, read by the dead letter queue's crate
    /// (`None`: not written, so disabled).
    pub dead_letter_queue: Option<Node>,
    /// The pipeline's whole section, to tell on reload whether it changed.
    pub node: Node,
}

impl PipelineSpec {
    /// Whether the pipeline keeps events in the order they were queued: not `ordered: false`
    /// (which promises no order even where one worker would keep it), one worker, and a memory
    /// queue or a persisted one with one shard.
    pub fn keeps_order(&self) -> bool {
        let shards = self.queue.settings.get("shards").and_then(|n| n.as_str()).and_then(|s| s.parse::<u64>().ok());
        self.ordered != Ordered::False
            && self.workers == 1
            && (self.queue.type_name != "persisted" || shards == Some(1))
    }

    /// True when both were written the same way (places in the file do not count).
    pub fn same_as(&self, other: &PipelineSpec) -> bool {
        same_content(&self.node, &other.node)
    }
}

/// One input, processor or output (or the queue): its `type`, `id` and `if`, and the rest.
#[derive(Debug, Clone)]
pub struct ComponentSpec {
    pub type_name: String,
    pub id: String,
    /// False when `id` was made up from the type and position.
    pub id_given: bool,
    /// The `if:` expression and where it was written.
    pub condition: Option<(String, Mark)>,
    /// Every key but `type`, `id` and `if`.
    pub settings: Node,
    /// `pipelines.web.outputs[1]`
    pub path: String,
    pub mark: Mark,
}

impl ComponentSpec {
    /// Reads the component's own settings; unknown keys and wrong types name their place.
    pub fn settings<T: DeserializeOwned>(&self) -> Result<T, ConfigError> {
        from_node(&self.settings, &self.path)
    }

    /// Reads the component's settings when some of its keys belong to a block `B` that it
    /// shares with other components (the listener of every network input, the Kafka
    /// connection), written among its own keys `T`: each is declared once, the file stays flat.
    /// A key neither takes is an error at that key, listing the keys of both.
    pub fn settings_with<B: DeserializeOwned, T: DeserializeOwned>(&self) -> Result<(B, T), ConfigError> {
        let shared = crate::de::struct_fields::<B>();
        let own = crate::de::struct_fields::<T>();
        for (key, _) in self.settings.as_map().unwrap_or_default() {
            let k = key.as_str().unwrap_or_default();
            if !own.contains(&k) && !shared.contains(&k) {
                let expected: Vec<&str> = own.iter().chain(shared).copied().collect();
                return Err(ConfigError::at(
                    crate::de::unknown_field_message(k, &expected),
                    &format!("{}.{k}", self.path),
                    key.mark.clone(),
                ));
            }
        }
        let block = from_node(&self.settings.only_keys(shared), &self.path)?;
        let rest = from_node(&self.settings.without_keys(shared), &self.path)?;
        Ok((block, rest))
    }

    /// An error about the component as a whole.
    pub fn error(&self, message: impl Into<String>) -> ConfigError {
        ConfigError::at(message, &self.path, self.mark.clone())
    }

    /// An error about one of its keys, at that key's value when it was written.
    pub fn key_error(&self, key: &str, message: impl Into<String>) -> ConfigError {
        let path = format!("{}.{key}", self.path);
        let mark = self.settings.get(key).map(|n| n.mark.clone()).unwrap_or_else(|| self.mark.clone());
        ConfigError::at(message, &path, mark)
    }

    /// An error about a key inside one of its sections (`tls.cert`), at the deepest of those
    /// keys that was written.
    pub fn nested_key_error(&self, keys: &[&str], message: impl Into<String>) -> ConfigError {
        let path = std::iter::once(self.path.as_str()).chain(keys.iter().copied()).collect::<Vec<_>>().join(".");
        let mut node = &self.settings;
        let mut mark = self.mark.clone();
        for key in keys {
            match node.get(key) {
                Some(n) => {
                    mark = n.mark.clone();
                    node = n;
                }
                None => break,
            }
        }
        ConfigError::at(message, &path, mark)
    }
}

/// True when two nodes were written alike (places in the file do not count).
pub fn same_content(a: &Node, b: &Node) -> bool {
    match (&a.kind, &b.kind) {
        (NodeKind::Scalar { value: x, plain: p }, NodeKind::Scalar { value: y, plain: q }) => x == y && p == q,
        (NodeKind::Seq(x), NodeKind::Seq(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_content(a, b)),
        (NodeKind::Map(x), NodeKind::Map(y)) => {
            x.len() == y.len()
                && x.iter().zip(y).all(|((ka, va), (kb, vb))| same_content(ka, kb) && same_content(va, vb))
        }
        _ => false,
    }
}

/// Reads and checks a config file.
pub fn load_file(path: &std::path::Path) -> Result<RootConfig, ConfigErrors> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(format!("cannot read config file {}: {e}", path.display())))?;
    load_str(&text, &path.display().to_string())
}

/// Reads only the `api` section of a config file, for a command that talks to the API of a
/// running `sluice run` (`sluice top -c`): a `${VAR}` elsewhere in the file that this
/// environment lacks does not matter, one in `api` is an error naming it.
pub fn load_api_section(path: &std::path::Path) -> Result<ApiConfig, ConfigErrors> {
    const UNSET: char = '\u{1}';
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new(format!("cannot read config file {}: {e}", path.display())))?;
    let file = path.display().to_string();
    // An unset variable reads as a marker no address holds, so that only the section that
    // uses it fails.
    let lookup = |name: &str| Some(std::env::var(name).unwrap_or_else(|_| format!("{UNSET}{name}{UNSET}")));
    let root = crate::node::parse_yaml_with_env(&text, &file, &lookup)?;
    let Some(node) = root.get("api").filter(|n| !n.is_null()) else { return Ok(ApiConfig::default()) };
    let api = from_node::<ApiConfig>(node, "api")?;
    if let Some(name) = api.address.split(UNSET).nth(1) {
        return Err(ConfigError::at(
            format!("environment variable `{name}` is not set (write `${{{name}:-default}}` to give a default)"),
            "api.address",
            node.mark.clone(),
        )
        .into());
    }
    Ok(api)
}

/// Reads and checks config text; `file` names it in messages.
pub fn load_str(text: &str, file: &str) -> Result<RootConfig, ConfigErrors> {
    let root = parse_yaml(text, file)?;
    from_root(&root)
}

/// As [`load_str`], with `lookup` answering `${VAR}` instead of the process environment (for
/// tests, which must not change the environment other threads read).
pub fn load_str_with_env(
    text: &str,
    file: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<RootConfig, ConfigErrors> {
    let root = crate::node::parse_yaml_with_env(text, file, lookup)?;
    from_root(&root)
}

const ROOT_KEYS: &[&str] =
    &["data_dir", "api", "log", "shutdown_timeout", "registry", "memory", "cluster", "pipelines"];
const PIPELINE_KEYS: &[&str] =
    &["workers", "ordered", "batch", "queue", "inputs", "processors", "outputs", "dead_letter_queue"];
const COMPONENT_META_KEYS: &[&str] = &["type", "id", "if"];

/// A config read as far as it goes, with every error found on the way, so that `sluice validate`
/// can go on to build the components it could read and list their errors too.
#[derive(Debug)]
pub struct PartialConfig {
    /// What could be read (`None` when nothing could: no file, broken YAML, not a mapping).
    pub config: Option<RootConfig>,
    /// False when a pipeline or a component could not be read at all and is missing from
    /// `config`: checks across pipelines (links, addresses) would then be misled.
    pub complete: bool,
    pub errors: ConfigErrors,
}

/// Reads a config file as far as it goes; see [`PartialConfig`].
pub fn load_file_partial(path: &std::path::Path) -> PartialConfig {
    let failed = |errors: ConfigErrors| PartialConfig { config: None, complete: false, errors };
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => return failed(ConfigError::new(format!("cannot read config file {}: {e}", path.display())).into()),
    };
    let root = match parse_yaml(&text, &path.display().to_string()) {
        Ok(r) => r,
        Err(e) => return failed(e.into()),
    };
    let (config, errors) = read_root(&root);
    let complete = config.as_ref().is_some_and(|c| nothing_left_out(&root, c));
    PartialConfig { config, complete, errors }
}

/// True when every pipeline and every component written in the file made it into `config`.
fn nothing_left_out(root: &Node, config: &RootConfig) -> bool {
    let Some(entries) = root.get("pipelines").and_then(Node::as_map) else { return false };
    entries.len() == config.pipelines.len()
        && config.pipelines.iter().all(|p| {
            [("inputs", &p.inputs), ("processors", &p.processors), ("outputs", &p.outputs)].into_iter().all(
                |(section, read)| match p.node.get(section).filter(|n| !n.is_null()) {
                    None => true,
                    Some(n) => n.as_seq().is_some_and(|items| items.len() == read.len()),
                },
            )
        })
}

pub fn from_root(root: &Node) -> Result<RootConfig, ConfigErrors> {
    let (config, errors) = read_root(root);
    errors.into_result(()).map(|()| config.expect("a config without errors was read"))
}

/// Reads the whole config, collecting every error; returns what could be read.
fn read_root(root: &Node) -> (Option<RootConfig>, ConfigErrors) {
    let mut errors = ConfigErrors::default();
    if root.as_map().is_none() {
        errors.push(ConfigError::at(
            format!("expected a mapping at the top, found {}", root.describe()),
            "",
            root.mark.clone(),
        ));
        return (None, errors);
    }
    check_keys(root, "", ROOT_KEYS, &mut errors);

    let read = |key: &str| -> Option<&Node> { root.get(key).filter(|n| !n.is_null()) };
    let data_dir = match read("data_dir") {
        Some(n) => from_node::<PathBuf>(n, "data_dir").map_err(|e| errors.push(e)).unwrap_or_default(),
        None => PathBuf::from("./data"),
    };
    let api = read("api").map(|n| from_node::<ApiConfig>(n, "api")).transpose().unwrap_or_else(|e| {
        errors.push(e);
        None
    });
    let log = read("log").map(|n| from_node::<LogConfig>(n, "log")).transpose().unwrap_or_else(|e| {
        errors.push(e);
        None
    });
    let shutdown_timeout = read("shutdown_timeout")
        .map(|n| from_node::<HumanDuration>(n, "shutdown_timeout"))
        .transpose()
        .unwrap_or_else(|e| {
            errors.push(e);
            None
        });
    let memory = read("memory").map(|n| from_node::<MemoryConfig>(n, "memory")).transpose().unwrap_or_else(|e| {
        errors.push(e);
        None
    });
    if let Some(m) = &memory
        && m.budget.0 < 1 << 20
    {
        let node = root.get("memory").and_then(|n| n.get("budget")).unwrap_or(root);
        errors.push(ConfigError::at(
            format!("a memory `budget` of {} is too small; use at least 1MiB", m.budget),
            "memory.budget",
            node.mark.clone(),
        ));
    }

    let mut pipelines = Vec::new();
    match root.get("pipelines") {
        None => errors.push(ConfigError::at(
            "missing `pipelines`: a config defines at least one pipeline",
            "pipelines",
            root.mark.clone(),
        )),
        Some(node) => match node.as_map() {
            Some([]) => errors.push(ConfigError::at(
                "`pipelines` is empty: a config defines at least one pipeline",
                "pipelines",
                node.mark.clone(),
            )),
            Some(entries) => {
                for (key, value) in entries {
                    let name = key.as_str().unwrap_or_default();
                    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                        errors.push(ConfigError::at(
                            format!("pipeline name `{name}` may hold only letters, digits, `_` and `-`"),
                            &format!("pipelines.{name}"),
                            key.mark.clone(),
                        ));
                        continue;
                    }
                    if let Some(p) = read_pipeline(name, value, &mut errors) {
                        pipelines.push(p);
                    }
                }
            }
            _ => errors.push(ConfigError::at(
                format!("expected a mapping of pipeline names to pipelines, found {}", node.describe()),
                "pipelines",
                node.mark.clone(),
            )),
        },
    }

    let config = RootConfig {
        data_dir,
        api: api.unwrap_or_default(),
        log: log.unwrap_or_default(),
        shutdown_timeout: shutdown_timeout.map(|d| d.0).unwrap_or(Duration::from_secs(30)),
        registry: read("registry").cloned(),
        memory: memory.unwrap_or_default(),
        cluster: read("cluster").cloned(),
        pipelines,
    };
    (Some(config), errors)
}

fn check_keys(node: &Node, path: &str, allowed: &[&str], errors: &mut ConfigErrors) {
    for (key, _) in node.as_map().unwrap_or_default() {
        let k = key.as_str().unwrap_or_default();
        if !allowed.contains(&k) {
            let place = if path.is_empty() { k.to_string() } else { format!("{path}.{k}") };
            errors.push(ConfigError::at(
                format!(
                    "unknown key `{k}`, expected one of {}",
                    allowed.iter().map(|a| format!("`{a}`")).collect::<Vec<_>>().join(", ")
                ),
                &place,
                key.mark.clone(),
            ));
        }
    }
}

fn default_workers() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

fn read_pipeline(name: &str, node: &Node, errors: &mut ConfigErrors) -> Option<PipelineSpec> {
    let path = format!("pipelines.{name}");
    if node.as_map().is_none() {
        errors.push(ConfigError::at(
            format!("expected a mapping, found {}", node.describe()),
            &path,
            node.mark.clone(),
        ));
        return None;
    }
    check_keys(node, &path, PIPELINE_KEYS, errors);

    let workers = match node.get("workers").filter(|n| !n.is_null()) {
        Some(n) => match from_node::<usize>(n, &format!("{path}.workers")) {
            Ok(0) => {
                errors.push(ConfigError::at(
                    "at least one worker is needed",
                    &format!("{path}.workers"),
                    n.mark.clone(),
                ));
                1
            }
            Ok(w) => w,
            Err(e) => {
                errors.push(e);
                1
            }
        },
        None => default_workers(),
    };
    let workers_given = node.get("workers").is_some_and(|n| !n.is_null());
    let ordered = match node.get("ordered").filter(|n| !n.is_null()) {
        Some(n) => match from_node::<OrderedValue>(n, &format!("{path}.ordered")) {
            Ok(OrderedValue(o)) => o,
            Err(e) => {
                errors.push(e);
                Ordered::Auto
            }
        },
        None => Ordered::Auto,
    };
    let workers = match ordered {
        Ordered::True if workers_given && workers != 1 => {
            errors.push(ConfigError::at(
                format!("`ordered: true` keeps events in order, which takes one worker, but `workers` is {workers}"),
                &format!("{path}.ordered"),
                node.get("ordered").map_or_else(|| node.mark.clone(), |n| n.mark.clone()),
            ));
            workers
        }
        Ordered::True => 1,
        _ => workers,
    };
    let batch = match node.get("batch").filter(|n| !n.is_null()) {
        Some(n) => match from_node::<BatchConfig>(n, &format!("{path}.batch")) {
            Ok(b) if b.size == 0 => {
                errors.push(ConfigError::at("must be at least 1", &format!("{path}.batch.size"), n.mark.clone()));
                b
            }
            Ok(b) => b,
            Err(e) => {
                errors.push(e);
                BatchConfig::default()
            }
        },
        None => BatchConfig::default(),
    };

    let dead_letter_queue = node.get("dead_letter_queue").filter(|n| !n.is_null()).cloned();

    let queue_node = node.get("queue").cloned().unwrap_or_else(|| Node::empty_map(node.mark.clone()));
    let mut queue = read_component(&queue_node, &format!("{path}.queue"), Some("memory"), errors);
    // A persisted queue's shards are read in parallel: order across them needs one shard.
    if let Some(q) = queue.as_mut().filter(|q| q.type_name == "persisted")
        && (ordered == Ordered::True || (ordered == Ordered::Auto && workers == 1))
    {
        match q.settings.get("shards").filter(|n| !n.is_null()) {
            None => set_default(&mut q.settings, "shards", "1"),
            Some(n) if ordered == Ordered::True && n.as_str() != Some("1") => errors.push(ConfigError::at(
                format!(
                    "`ordered: true` keeps events in order, which takes one shard of the persisted queue, but `shards` is {}",
                    n.as_str().unwrap_or("set")
                ),
                &format!("{path}.queue.shards"),
                n.mark.clone(),
            )),
            Some(_) => {}
        }
    }

    let inputs = read_section(node, &path, "inputs", true, errors);
    let processors = read_section(node, &path, "processors", false, errors);
    let outputs = read_section(node, &path, "outputs", true, errors);

    let (mut inputs, mut processors, mut outputs) = (inputs, processors, outputs);
    // A made-up id that another component already has gets its section added.
    let mut taken: Vec<String> = Vec::new();
    for (section, list) in [("input", &mut inputs), ("processor", &mut processors), ("output", &mut outputs)] {
        for c in list.iter_mut() {
            if !c.id_given && taken.contains(&c.id) {
                let index = c.path.rsplit_once('[').map(|(_, i)| i.trim_end_matches(']')).unwrap_or("0");
                c.id = format!("{}_{section}_{index}", c.type_name);
            }
            taken.push(c.id.clone());
        }
    }
    let mut seen: Vec<(&str, &str)> = Vec::new();
    for c in inputs.iter().chain(&processors).chain(&outputs) {
        if let Some((_, first)) = seen.iter().find(|(id, _)| *id == c.id) {
            errors.push(ConfigError::at(
                format!("duplicate component id `{}` (also used by {first})", c.id),
                &format!("{}.id", c.path),
                c.mark.clone(),
            ));
        } else {
            seen.push((&c.id, &c.path));
        }
    }

    Some(PipelineSpec {
        name: name.to_string(),
        workers,
        ordered,
        batch,
        queue: queue?,
        inputs,
        processors,
        outputs,
        dead_letter_queue,
        node: node.clone(),
    })
}

/// Adds `key: value` to the mapping `node` (which lacks `key`).
fn set_default(node: &mut Node, key: &str, value: &str) {
    let mark = node.mark.clone();
    if let NodeKind::Map(entries) = &mut node.kind {
        let scalar =
            |v: &str| Node { kind: NodeKind::Scalar { value: v.to_string(), plain: true }, mark: mark.clone() };
        entries.push((scalar(key), scalar(value)));
    }
}

fn read_section(
    pipeline: &Node,
    path: &str,
    section: &str,
    required: bool,
    errors: &mut ConfigErrors,
) -> Vec<ComponentSpec> {
    let place = format!("{path}.{section}");
    let Some(node) = pipeline.get(section).filter(|n| !n.is_null()) else {
        if required {
            errors.push(ConfigError::at(
                format!("missing `{section}`: a pipeline needs at least one"),
                &place,
                pipeline.mark.clone(),
            ));
        }
        return Vec::new();
    };
    let Some(items) = node.as_seq() else {
        errors.push(ConfigError::at(format!("expected a list, found {}", node.describe()), &place, node.mark.clone()));
        return Vec::new();
    };
    if required && items.is_empty() {
        errors.push(ConfigError::at(
            format!("a pipeline needs at least one of its {section}"),
            &place,
            node.mark.clone(),
        ));
    }
    items
        .iter()
        .enumerate()
        .filter_map(|(i, item)| read_component(item, &format!("{place}[{i}]"), None, errors))
        .collect()
}

fn read_component(
    node: &Node,
    path: &str,
    default_type: Option<&str>,
    errors: &mut ConfigErrors,
) -> Option<ComponentSpec> {
    if node.as_map().is_none() {
        errors.push(ConfigError::at(
            format!("expected a mapping with a `type`, found {}", node.describe()),
            path,
            node.mark.clone(),
        ));
        return None;
    }
    let text = |key: &str| -> Result<Option<(String, Mark)>, ConfigError> {
        match node.get(key) {
            None => Ok(None),
            Some(n) => match &n.kind {
                NodeKind::Scalar { value, .. } if !value.is_empty() => Ok(Some((value.clone(), n.mark.clone()))),
                _ => Err(ConfigError::at(
                    format!("expected text, found {}", n.describe()),
                    &format!("{path}.{key}"),
                    n.mark.clone(),
                )),
            },
        }
    };
    let mut ok = true;
    let mut take = |key: &str| match text(key) {
        Ok(v) => v,
        Err(e) => {
            errors.push(e);
            ok = false;
            None
        }
    };
    let type_name = take("type").map(|(t, _)| t);
    let id = take("id").map(|(t, _)| t);
    let condition = take("if");
    let type_name = match (type_name, default_type) {
        (Some(t), _) => t,
        (None, Some(d)) => d.to_string(),
        (None, None) => {
            if ok {
                errors.push(ConfigError::at("missing `type`", path, node.mark.clone()));
            }
            return None;
        }
    };
    if !ok {
        return None;
    }
    let index = path.rsplit_once('[').map(|(_, i)| i.trim_end_matches(']')).unwrap_or("0");
    Some(ComponentSpec {
        id_given: id.is_some(),
        id: id.unwrap_or_else(|| format!("{type_name}_{index}")),
        type_name,
        condition,
        settings: node.without_keys(COMPONENT_META_KEYS),
        path: path.to_string(),
        mark: node.mark.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "\
pipelines:
  web:
    workers: 3
    batch: {size: 10, delay: 5ms}
    inputs:
      - type: tcp
        address: 127.0.0.1:5000
    processors:
      - {type: json, if: 'exists(/message)'}
    outputs:
      - {type: stdout, id: out}
";

    #[test]
    fn reads_a_pipeline() {
        let c = load_str(GOOD, "g.yml").unwrap();
        assert_eq!(c.data_dir, PathBuf::from("./data"));
        assert!(c.api.enabled);
        let p = &c.pipelines[0];
        assert_eq!((p.name.as_str(), p.workers, p.batch.size), ("web", 3, 10));
        assert_eq!(p.queue.type_name, "memory");
        assert_eq!(p.inputs[0].id, "tcp_0");
        assert_eq!(p.inputs[0].settings.get("address").unwrap().as_str(), Some("127.0.0.1:5000"));
        assert!(p.inputs[0].settings.get("type").is_none());
        assert_eq!(p.processors[0].condition.as_ref().unwrap().0, "exists(/message)");
        assert_eq!(p.outputs[0].id, "out");
        assert_eq!(p.outputs[0].path, "pipelines.web.outputs[0]");
    }

    #[test]
    fn memory_section() {
        let c = load_str(GOOD, "g.yml").unwrap();
        assert_eq!(c.memory.budget.0, 256 << 20);
        let c = load_str(&format!("memory: {{budget: 64MiB}}\n{GOOD}"), "g.yml").unwrap();
        assert_eq!(c.memory.budget.0, 64 << 20);
        let e = load_str(&format!("memory:\n  budget: 1KiB\n{GOOD}"), "g.yml").unwrap_err().to_string();
        assert!(e.contains("memory.budget") && e.contains("too small") && e.contains("g.yml:2"), "{e}");
        let e = load_str(&format!("memory: {{bugdet: 1GiB}}\n{GOOD}"), "g.yml").unwrap_err().to_string();
        assert!(e.contains("bugdet") && e.contains("memory"), "{e}");
    }

    #[test]
    fn collects_every_error_with_places() {
        let text = "\
dat_dir: x
pipelines:
  web:
    workers: zero
    inputs: []
    outputs:
      - {id: a}
      - {type: stdout, id: a}
      - {type: stdout, id: a}
";
        let errs = load_str(text, "b.yml").unwrap_err();
        let all = errs.to_string();
        assert!(all.contains("b.yml:1:1: dat_dir: unknown key `dat_dir`"), "{all}");
        assert!(all.contains("b.yml:4:14: pipelines.web.workers: expected a whole number, found `zero`"), "{all}");
        assert!(all.contains("pipelines.web.inputs: a pipeline needs at least one of its inputs"), "{all}");
        assert!(all.contains("b.yml:7:9: pipelines.web.outputs[0]: missing `type`"), "{all}");
        assert!(
            all.contains(
                "pipelines.web.outputs[2].id: duplicate component id `a` (also used by pipelines.web.outputs[1])"
            ),
            "{all}"
        );
    }

    #[test]
    fn missing_pipelines() {
        let errs = load_str("api: {enabled: false}\n", "m.yml").unwrap_err();
        assert!(errs.to_string().contains("missing `pipelines`"));
    }

    #[test]
    fn empty_pipelines() {
        let all = load_str("api: {enabled: false}\npipelines: {}\n", "m.yml").unwrap_err().to_string();
        assert_eq!(all, "m.yml:2:12: pipelines: `pipelines` is empty: a config defines at least one pipeline");
    }

    #[test]
    fn sameness_ignores_places() {
        let a = load_str(GOOD, "a.yml").unwrap();
        let b = load_str(&format!("\n\n{GOOD}"), "a.yml").unwrap();
        assert!(a.pipelines[0].same_as(&b.pipelines[0]));
        let c = load_str(&GOOD.replace("workers: 3", "workers: 4"), "a.yml").unwrap();
        assert!(!a.pipelines[0].same_as(&c.pipelines[0]));
    }

    fn pipeline(extra: &str) -> Result<PipelineSpec, ConfigErrors> {
        let text = format!("pipelines:\n  p:\n{extra}    inputs: [{{type: stdin}}]\n    outputs: [{{type: stdout}}]\n");
        load_str(&text, "o.yml").map(|mut c| c.pipelines.remove(0))
    }

    #[test]
    fn ordered_true_takes_one_worker_and_one_shard() {
        let p = pipeline("    ordered: true\n    queue: {type: persisted}\n").unwrap();
        assert_eq!((p.ordered, p.workers), (Ordered::True, 1));
        assert_eq!(p.queue.settings.get("shards").and_then(|n| n.as_str()), Some("1"));
        assert!(p.keeps_order());
        let e = pipeline("    ordered: true\n    workers: 4\n").unwrap_err().to_string();
        assert!(
            e.contains(
                "pipelines.p.ordered: `ordered: true` keeps events in order, which takes one worker, but `workers` is 4"
            ),
            "{e}"
        );
        let e = pipeline("    ordered: true\n    queue: {type: persisted, shards: 4}\n").unwrap_err().to_string();
        assert!(e.contains("pipelines.p.queue.shards") && e.contains("one shard"), "{e}");
        let e = pipeline("    ordered: sometimes\n").unwrap_err().to_string();
        assert!(e.contains("pipelines.p.ordered") && e.contains("`auto`, `true` or `false`"), "{e}");
    }

    #[test]
    fn ordered_auto_keeps_order_with_one_worker_only() {
        let p = pipeline("    workers: 1\n    queue: {type: persisted}\n").unwrap();
        assert_eq!(p.ordered, Ordered::Auto);
        assert!(p.keeps_order(), "one worker: the persisted queue gets one shard");
        let p = pipeline("    workers: 2\n    queue: {type: persisted}\n").unwrap();
        assert!(!p.keeps_order());
        assert!(p.queue.settings.get("shards").is_none(), "shards left to the queue's default");
        let p = pipeline("    workers: 1\n    queue: {type: persisted, shards: 3}\n").unwrap();
        assert!(!p.keeps_order(), "shards written out win under auto");
        let p = pipeline("    workers: 1\n").unwrap();
        assert!(p.keeps_order());
        let p = pipeline("    ordered: false\n    workers: 1\n    queue: {type: persisted}\n").unwrap();
        assert_eq!(p.ordered, Ordered::False);
        assert!(p.queue.settings.get("shards").is_none(), "false sets nothing");
        assert!(!p.keeps_order(), "false promises no order");
    }
}
