//! Shared by the output tests: building an output from a YAML snippet, and making events.

#![allow(dead_code)]

use std::sync::Arc;

use sluice_core::bus::PipelineBus;
use sluice_core::metrics::{ComponentKind, ComponentMetrics};
use sluice_core::{Event, Map, Value};
use sluice_outputs::{Output, OutputContext};
use tokio_util::sync::CancellationToken;

/// The spec of an output written as a YAML flow mapping.
pub fn spec(yaml: &str) -> sluice_config::model::ComponentSpec {
    let text = format!("pipelines:\n  p:\n    inputs: [{{type: stdin}}]\n    outputs:\n      - {yaml}\n");
    let root = sluice_config::model::load_str(&text, "test.yml").unwrap_or_else(|e| panic!("{e}"));
    root.pipelines.into_iter().next().unwrap().outputs.remove(0)
}

pub fn context() -> OutputContext {
    OutputContext {
        pipeline: "test".into(),
        id: "out".into(),
        metrics: Arc::new(ComponentMetrics::new("out", ComponentKind::Output, "test")),
        bus: Arc::new(PipelineBus::default()),
        abort: CancellationToken::new(),
    }
}

pub fn build(yaml: &str) -> Arc<dyn Output> {
    build_with(yaml, context())
}

pub fn build_with(yaml: &str, ctx: OutputContext) -> Arc<dyn Output> {
    sluice_outputs::build(&spec(yaml), ctx).unwrap_or_else(|e| panic!("{e}"))
}

pub fn build_err(yaml: &str) -> String {
    match sluice_outputs::build(&spec(yaml), context()) {
        Ok(_) => panic!("built: {yaml}"),
        Err(e) => e.to_string(),
    }
}

/// Events `{"message": "event <i>", "n": i}`, all stamped 2023-11-14T22:13:20Z.
pub fn numbered(count: usize) -> Vec<Event> {
    (0..count)
        .map(|i| {
            let mut e = Event::from_message_at(format!("event {i}"), 1_700_000_000_000_000_000);
            e.fields.insert("n", Value::Int(i as i64));
            e
        })
        .collect()
}

pub fn event(fields: serde_json::Value) -> Event {
    let map: Map = serde_json::from_value(fields).unwrap();
    Event::from_object_at(map, 1_700_000_000_000_000_000)
}

pub fn refs(events: &[Event]) -> Vec<&Event> {
    events.iter().collect()
}
