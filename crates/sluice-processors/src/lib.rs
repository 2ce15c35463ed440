//! Processors: what workers do to each batch between the queue and the outputs.
//!
//! Every processor is built once from its config section (patterns compiled, paths and
//! templates parsed) and then applied to events by workers on many threads at once, so a
//! processor is `Send + Sync` and keeps no lock on the per-event path. A processor decides per
//! event through a [`Verdict`]: keep it, drop it on purpose (counted as handled for
//! acknowledgements), or keep it and count a failure (the event is tagged, e.g.
//! `_jsonparsefailure`). The parsing processors (`json`, `date`, `grok`, `dissect`) take
//! `on_failure: tag | dlq`: with `dlq` a failed event is still tagged, and its verdict
//! [`Verdict::DeadLetter`] tells the worker to take it out of the batch and write it to the
//! pipeline's dead letter queue with the reason. The `if:` condition common to all processors is
//! applied by the worker, not here.
//!
//! `aggregate` is different: it keeps groups across batches and emits events on a timer, so the
//! worker hands it whole batches through its [`Stateful`] form (it locks each shard of its group
//! table once per batch, never per event); see [`stateful`].
//!
//! ```
//! use sluice_core::Event;
//! let spec = sluice_processors::spec_from_yaml("type: mutate\nuppercase: [/message]\n").unwrap();
//! let p = sluice_processors::build(&spec).unwrap();
//! let mut e = Event::from_message("hello");
//! assert_eq!(p.process(&mut e), sluice_processors::Verdict::Keep);
//! assert_eq!(e.message(), Some("HELLO"));
//! ```

use std::sync::Arc;

use sluice_config::model::ComponentSpec;
use sluice_config::{ConfigError, Link, no_links};
use sluice_core::Event;

mod aggregate;
mod common;
mod date;
mod dissect;
mod drop;
mod grok;
mod json;
mod mutate;
pub mod stateful;

pub use stateful::{Consumed, Emitted, Stateful, StatefulStats};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Keep,
    /// Dropped on purpose; the event counts as handled.
    Drop,
    /// Kept, but the processor failed on it (and tagged it); counted in `failed`.
    Failed,
    /// The processor failed on it (and tagged it) and was told `on_failure: dlq`: the event
    /// leaves the batch for the dead letter queue, with this reason.
    DeadLetter(String),
}

pub trait Processor: Send + Sync {
    fn process(&self, event: &mut Event) -> Verdict;

    /// The processor's stateful form, if it has one: the worker then calls
    /// [`Stateful::consume`] on whole batches instead of `process` on each event.
    fn stateful(&self) -> Option<&dyn Stateful> {
        None
    }
}

/// One kind of processor: its `type`, how it is built, and what it links to beyond itself.
pub struct ProcessorKind {
    pub name: &'static str,
    /// Builds it from its config section; every setting is checked here.
    pub build: fn(&ComponentSpec) -> Result<Arc<dyn Processor>, ConfigError>,
    /// What its settings link to: its pipeline's dead letter queue with `on_failure: dlq`.
    pub links: fn(&ComponentSpec) -> Vec<Link>,
}

/// Every processor this build knows, by `type`, in the order messages list them. Adding a
/// processor is its module, one line here, and its section in `docs/processors.md` (a test
/// checks it).
pub const KINDS: &[ProcessorKind] = &[
    ProcessorKind { name: "aggregate", build: aggregate::build, links: no_links },
    ProcessorKind { name: "date", build: date::build, links: common::on_failure_links },
    ProcessorKind { name: "dissect", build: dissect::build, links: common::on_failure_links },
    ProcessorKind { name: "drop", build: drop::build, links: no_links },
    ProcessorKind { name: "grok", build: grok::build, links: common::on_failure_links },
    ProcessorKind { name: "json", build: json::build, links: common::on_failure_links },
    ProcessorKind { name: "mutate", build: mutate::build, links: no_links },
];

/// The kind of processor `spec` is; an unknown `type` is an error listing the known ones.
pub fn kind(spec: &ComponentSpec) -> Result<&'static ProcessorKind, ConfigError> {
    KINDS.iter().find(|k| k.name == spec.type_name).ok_or_else(|| {
        spec.error(format!(
            "unknown processor type `{}`, expected one of {}",
            spec.type_name,
            KINDS.iter().map(|k| format!("`{}`", k.name)).collect::<Vec<_>>().join(", ")
        ))
    })
}

/// Builds a processor from its config section; every setting is checked here.
pub fn build(spec: &ComponentSpec) -> Result<Arc<dyn Processor>, ConfigError> {
    (kind(spec)?.build)(spec)
}

/// What a processor's settings link to (none for an unknown `type`, which [`build`] refuses).
pub fn links(spec: &ComponentSpec) -> Vec<Link> {
    kind(spec).map(|k| (k.links)(spec)).unwrap_or_default()
}

/// A component spec from a YAML snippet, for tests and examples.
pub fn spec_from_yaml(yaml: &str) -> Result<ComponentSpec, sluice_config::ConfigErrors> {
    let text = format!(
        "pipelines:\n  p:\n    inputs: [{{type: stdin}}]\n    outputs: [{{type: stdout}}]\n    processors:\n      - {}\n",
        yaml.trim_end().replace('\n', "\n        ")
    );
    let root = sluice_config::model::load_str(&text, "test.yml")?;
    Ok(root.pipelines.into_iter().next().expect("one pipeline").processors.remove(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::Value;

    /// Every processor on thousands of generated awkward strings: no panic, and a failure always
    /// leaves a tag.
    #[test]
    fn never_panics_on_odd_input() {
        const PIECES: &[&str] = &[
            "%{",
            "}",
            "[",
            "]",
            "\"",
            "{",
            ":",
            ",",
            " ",
            "  ",
            "-",
            "+",
            "1",
            "2026-11-21",
            "T",
            "07:00:00",
            "Z",
            "é",
            "字",
            "\\",
            "/",
            "a",
            "Dec 10 06:55:46",
            "null",
            "true",
            "\0",
            "0x",
            ".",
            "\"a\":",
            "[1,",
            "e9",
            "\n",
            "->",
            "%",
            "=",
        ];
        let configs = [
            "type: json",
            "type: json\ntarget: /t\nremove_source: true",
            "type: grok\nmatch: {/message: ['%{SYSLOGBASE} %{GREEDYDATA:msg}', '%{COMBINEDAPACHELOG}', '%{NUMBER:n:int}']}",
            "type: grok\nmatch: {/message: '%{WORD:w}%{DATA:d}:%{INT:i:float}'}\nbreak_on_match: false\nkeep_empty_captures: true",
            "type: dissect\nmapping: {/message: '[%{ts}] [%{level}] %{msg}'}",
            "type: dissect\nmapping: {/message: '%{a->} %{+a/2}:%{?k}=%{&k},%{n}'}\nconvert_datatype: {n: int}",
            "type: date\nsource: /message\nformats: [ISO8601, UNIX, UNIX_MS, 'dd/MMM/yyyy:HH:mm:ss Z', 'MMM dd HH:mm:ss']",
            "type: mutate\nconvert: {/message: int}\nsplit: {/message: ','}\nlowercase: [/message]",
            "type: mutate\nconvert: {/message: bool}\nmerge: {/message: /message}\nadd_tag: ['%{/message}']",
            "type: mutate\nconvert: {/message: float}\nuppercase: [/message]\ncopy: {/message: /message/x}",
            "type: json\non_failure: dlq",
            "type: grok\nmatch: {/message: '%{NUMBER:n:int}'}\non_failure: dlq",
            "type: dissect\nmapping: {/message: '%{a} %{b}'}\non_failure: dlq",
            "type: date\nsource: /message\nformats: [ISO8601]\non_failure: dlq",
        ];
        let processors: Vec<_> = configs.iter().map(|c| build(&spec_from_yaml(c).unwrap()).unwrap()).collect();
        let mut rng = sluice_testkit::Rng::from_env();
        let mut next = move || rng.next_u64();
        for round in 0..3000 {
            let mut text = String::new();
            for _ in 0..next() % 24 {
                text.push_str(PIECES[(next() % PIECES.len() as u64) as usize]);
            }
            let value = match round % 5 {
                0 => Value::Int(next() as i64),
                1 => Value::Float(f64::from_bits(next())),
                _ => Value::from(text.as_str()),
            };
            for p in &processors {
                let mut e = Event::from_message_at("", 0);
                e.fields.insert("message", value.clone());
                if matches!(p.process(&mut e), Verdict::Failed | Verdict::DeadLetter(_)) {
                    assert!(e.fields.get("tags").is_some(), "{value:?}");
                }
            }
        }
    }
}
