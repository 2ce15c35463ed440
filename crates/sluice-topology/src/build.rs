//! Building (and so validating) pipelines from their specs, and the checks across pipelines:
//! links between them (from the links each component's settings declare), dead letter queue
//! directories, the one stdin. Every error is collected, none stops the others.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use sluice_config::model::{ComponentSpec, PipelineSpec, RootConfig};
use sluice_config::{ConfigError, ConfigErrors, Link};
use sluice_core::bus::PipelineBus;
use sluice_core::metrics::{ComponentKind, PipelineMetrics};
use sluice_dlq::DeadLetterQueueConfig;
use sluice_expr::Condition;
use sluice_outputs::OutputContext;
use tokio_util::sync::CancellationToken;

pub use crate::built::{BuiltInput, BuiltOutput, BuiltPipeline, BuiltProcessor};

fn condition(spec: &ComponentSpec) -> Result<Option<Condition>, ConfigError> {
    let Some((text, mark)) = &spec.condition else { return Ok(None) };
    // The error's message gives the column inside the expression; the mark is where it starts.
    Condition::parse(text)
        .map(Some)
        .map_err(|e| ConfigError::at(format!("invalid condition: {e}"), &format!("{}.if", spec.path), mark.clone()))
}

/// Builds one pipeline. Errors are collected into `errors`; `None` means it could not be built.
pub fn build_pipeline(
    spec: &PipelineSpec,
    bus: &Arc<PipelineBus>,
    data_dir: &Path,
    errors: &mut ConfigErrors,
) -> Option<BuiltPipeline> {
    let before = errors.0.len();
    let metrics = Arc::new(PipelineMetrics::new(&spec.name, spec.workers));
    let abort = CancellationToken::new();
    let queue = sluice_queue::build(&spec.queue, &spec.name, data_dir).map_err(|e| errors.push(e)).ok();
    let dead_letter_queue = DeadLetterQueueConfig::of(spec).unwrap_or_else(|e| {
        errors.0.extend(e.0);
        DeadLetterQueueConfig::of_or_assumed(spec)
    });

    let mut inputs = Vec::new();
    for c in &spec.inputs {
        if c.condition.is_some() {
            errors.push(ConfigError::at(
                "inputs take no `if:` (put a condition on a processor or an output)",
                &format!("{}.if", c.path),
                c.mark.clone(),
            ));
        }
        match sluice_inputs::build(c) {
            Ok(input) => inputs.push(BuiltInput {
                id: c.id.clone(),
                input,
                metrics: metrics.component(&c.id, ComponentKind::Input, &c.type_name),
            }),
            Err(e) => errors.push(e),
        }
    }

    let mut processors = Vec::new();
    for c in &spec.processors {
        let cond = condition(c).map_err(|e| errors.push(e)).ok().flatten();
        for link in sluice_processors::links(c) {
            if let Link::WritesDeadLetterQueue { key } = link
                && !dead_letter_queue.enabled
            {
                errors.push(c.key_error(
                    key,
                    format!(
                        "`on_failure: dlq` needs the pipeline's dead letter queue: set \
                         `pipelines.{}.dead_letter_queue.enabled: true`",
                        spec.name
                    ),
                ));
            }
        }
        match sluice_processors::build(c) {
            Ok(processor) => {
                let m = metrics.component(&c.id, ComponentKind::Processor, &c.type_name);
                if processor.stateful().is_some() {
                    let _ = m.state.set(Arc::new(crate::stateful::StatefulFigures(processor.clone())));
                }
                processors.push(BuiltProcessor { id: c.id.clone(), processor, condition: cond, metrics: m })
            }
            Err(e) => errors.push(e),
        }
    }

    let mut outputs = Vec::new();
    for c in &spec.outputs {
        let cond = condition(c).map_err(|e| errors.push(e)).ok().flatten();
        let m = metrics.component(&c.id, ComponentKind::Output, &c.type_name);
        let ctx = OutputContext {
            pipeline: spec.name.clone(),
            id: c.id.clone(),
            metrics: m.clone(),
            bus: bus.clone(),
            abort: abort.clone(),
        };
        match sluice_outputs::build(c, ctx) {
            Ok(output) => outputs.push(BuiltOutput { id: c.id.clone(), output, condition: cond, metrics: m }),
            Err(e) => errors.push(e),
        }
    }

    if errors.0.len() > before {
        return None;
    }
    let queue = queue?;
    let _ = metrics.queue.set(queue.clone());
    let keyed = processors
        .iter()
        .enumerate()
        .find_map(|(i, p)| p.processor.stateful().map(|s| (i, s.identification_keys().clone())));
    Some(BuiltPipeline {
        spec: spec.clone(),
        metrics,
        queue,
        inputs,
        processors: Arc::new(processors),
        outputs: Arc::new(outputs),
        abort,
        keyed,
    })
}

/// Checks the links between pipelines: every address is served once, every target exists,
/// and no pipeline feeds itself through a chain. Returns the pipelines each one feeds.
pub fn check_links(config: &RootConfig) -> Result<BTreeMap<String, BTreeSet<String>>, ConfigErrors> {
    let mut errors = ConfigErrors::default();
    let mut served: BTreeMap<String, (&str, &ComponentSpec)> = BTreeMap::new();
    for p in &config.pipelines {
        for c in &p.inputs {
            for link in sluice_inputs::links(c) {
                let Link::Serves { address, key } = link else { continue };
                if let Some((owner, first)) = served.get(&address) {
                    errors.push(c.key_error(
                        key,
                        format!(
                            "pipeline address `{address}` is already served by pipeline `{owner}` ({})",
                            first.path
                        ),
                    ));
                } else {
                    served.insert(address, (&p.name, c));
                }
            }
        }
    }
    let mut feeds: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for p in &config.pipelines {
        feeds.entry(p.name.clone()).or_default();
        for c in &p.outputs {
            for link in sluice_outputs::links(c) {
                let Link::SendsTo { address, key } = link else { continue };
                match served.get(&address) {
                    Some((target, _)) => {
                        feeds.entry(p.name.clone()).or_default().insert(target.to_string());
                    }
                    None => errors
                        .push(c.key_error(key, format!("no pipeline has a `pipeline` input with address `{address}`"))),
                }
            }
        }
    }
    if let Some(cycle) = find_cycle(&feeds) {
        let p = config.pipelines.iter().find(|p| p.name == cycle[0]).expect("cycle names a pipeline");
        errors.push(ConfigError::at(
            format!("pipelines feed each other in a loop: {}", cycle.join(" -> ")),
            &format!("pipelines.{}", p.name),
            p.node.mark.clone(),
        ));
    }
    errors.into_result(feeds)
}

fn find_cycle(feeds: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        feeds: &BTreeMap<String, BTreeSet<String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = stack.iter().position(|s| s == n) {
            let mut cycle = stack[i..].to_vec();
            cycle.push(n.to_string());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        stack.push(n.to_string());
        for next in feeds.get(n).into_iter().flatten() {
            if let Some(c) = visit(next, feeds, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    feeds.keys().find_map(|n| visit(n, feeds, &mut Vec::new(), &mut done))
}

/// Pipelines ordered so that every pipeline comes before the ones it feeds.
pub fn upstream_first(feeds: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut order = Vec::new();
    let mut placed = BTreeSet::new();
    fn place(
        n: &str,
        feeds: &BTreeMap<String, BTreeSet<String>>,
        placed: &mut BTreeSet<String>,
        order: &mut Vec<String>,
    ) {
        if placed.contains(n) {
            return;
        }
        placed.insert(n.to_string());
        // Everything that feeds `n` goes first.
        for (from, to) in feeds {
            if to.contains(n) {
                place(from, feeds, placed, order);
            }
        }
        order.push(n.to_string());
    }
    for n in feeds.keys() {
        place(n, feeds, &mut placed, &mut order);
    }
    order
}

/// Two pipelines cannot write one dead letter queue directory (the second could not open it),
/// and a `dead_letter_queue` input naming a pipeline must find its queue where it looks.
pub fn check_dead_letter_queue_paths(config: &RootConfig) -> Result<(), ConfigErrors> {
    let mut errors = ConfigErrors::default();
    let mut taken: BTreeMap<std::path::PathBuf, &str> = BTreeMap::new();
    // Each section's own errors are reported when its pipeline is built.
    let sections: BTreeMap<&str, DeadLetterQueueConfig> =
        config.pipelines.iter().map(|p| (p.name.as_str(), DeadLetterQueueConfig::of_or_assumed(p))).collect();
    for p in config.pipelines.iter().filter(|p| sections[p.name.as_str()].enabled) {
        let dir = sections[p.name.as_str()].dir(&config.data_dir, &p.name);
        if let Some(first) = taken.get(&dir) {
            let section = p.dead_letter_queue.as_ref();
            let mark = section.and_then(|n| n.get("path")).or(section).map(|n| n.mark.clone());
            errors.push(ConfigError::at(
                format!("dead letter queue {} is already used by pipeline `{first}`", dir.display()),
                &format!("pipelines.{}.dead_letter_queue.path", p.name),
                mark.unwrap_or_else(|| p.node.mark.clone()),
            ));
        } else {
            taken.insert(dir, &p.name);
        }
    }
    // A `dead_letter_queue` input that names a pipeline of this config whose queue is elsewhere
    // than `<data_dir>/dlq/<pipeline>` would read an empty directory.
    for p in &config.pipelines {
        for c in &p.inputs {
            for link in sluice_inputs::links(c) {
                let Link::ReadsDeadLetterQueueOf { pipeline: name, key } = link else { continue };
                let Some(section) = sections.get(name.as_str()) else { continue };
                let dir = section.dir(&config.data_dir, &name);
                if section.path.is_some() && dir != sluice_dlq::default_dir(&config.data_dir, &name) {
                    errors.push(c.key_error(
                        key,
                        format!(
                            "pipeline `{name}` keeps its dead letter queue at {}: give `path: {}` instead",
                            dir.display(),
                            dir.display()
                        ),
                    ));
                }
            }
        }
    }
    errors.into_result(())
}

/// The process has one stdin: a second `stdin` input (in the same pipeline or another) would
/// get nothing, so it is refused, naming the first.
pub fn check_stdin_inputs(config: &RootConfig) -> Result<(), ConfigErrors> {
    let mut errors = ConfigErrors::default();
    let mut first: Option<&ComponentSpec> = None;
    let takes_stdin = |c: &&ComponentSpec| sluice_inputs::links(c).contains(&Link::TakesStdin);
    for c in config.pipelines.iter().flat_map(|p| &p.inputs).filter(takes_stdin) {
        match first {
            Some(f) => errors.push(
                c.error(format!("only one `stdin` input may run in a process, and {} already reads stdin", f.path)),
            ),
            None => first = Some(c),
        }
    }
    errors.into_result(())
}

/// What `sluice validate` warns about without failing: settings that build but are risky (a
/// `file` output whose events choose the directory).
pub fn warnings(config: &RootConfig) -> Vec<ConfigError> {
    let outputs = config.pipelines.iter().flat_map(|p| p.outputs.iter()).flat_map(sluice_outputs::warnings);
    let inputs = config.pipelines.iter().flat_map(|p| p.inputs.iter()).flat_map(sluice_tls::server_warnings);
    inputs.chain(outputs).collect()
}

/// Builds every pipeline of a config, or lists every error.
pub fn build_all(config: &RootConfig, bus: &Arc<PipelineBus>) -> Result<Vec<BuiltPipeline>, ConfigErrors> {
    let mut errors = ConfigErrors::default();
    if let Err(e) = check_links(config) {
        errors.0.extend(e.0);
    }
    if let Err(e) = check_dead_letter_queue_paths(config) {
        errors.0.extend(e.0);
    }
    if let Err(e) = check_stdin_inputs(config) {
        errors.0.extend(e.0);
    }
    let built: Vec<BuiltPipeline> =
        config.pipelines.iter().filter_map(|p| build_pipeline(p, bus, &config.data_dir, &mut errors)).collect();
    errors.into_result(built)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feeds(pairs: &[(&str, &str)]) -> BTreeMap<String, BTreeSet<String>> {
        let mut m: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in pairs {
            m.entry(a.to_string()).or_default().insert(b.to_string());
            m.entry(b.to_string()).or_default();
        }
        m
    }

    #[test]
    fn order_puts_upstream_first() {
        let order = upstream_first(&feeds(&[("c", "a"), ("a", "b"), ("d", "b")]));
        let pos = |n: &str| order.iter().position(|x| x == n).unwrap();
        assert!(pos("c") < pos("a") && pos("a") < pos("b") && pos("d") < pos("b"));
    }

    #[test]
    fn cycles_are_found() {
        assert!(find_cycle(&feeds(&[("a", "b"), ("b", "c")])).is_none());
        assert_eq!(find_cycle(&feeds(&[("a", "b"), ("b", "a")])).unwrap(), ["a", "b", "a"]);
    }
}
