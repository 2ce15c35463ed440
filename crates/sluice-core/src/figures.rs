//! How a component publishes figures of its own: it declares each one (name, kind, help, unit)
//! in its own module as a [`Spec`], and hands their values out through [`Publish`] when the
//! node is read. The monitoring API puts them at `/metrics` as `sluice_component_<name>` with
//! the component's labels, in `/stats` under the component's `state`, and `sluice top` reads
//! them back with the same types: nothing outside the component names them.
//!
//! The values themselves stay where the component updates them (relaxed atomics, a histogram):
//! [`Publish::figures`] is called once per scrape, never on the hot path.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::metrics::Histogram;
use crate::queue::HistogramSnapshot;

/// What a figure is: a counter only grows, a gauge goes up and down, a histogram counts
/// observations by bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FigureKind {
    Counter,
    Gauge,
    Histogram,
}

/// What a figure counts, for a reader that formats it (`sluice top` shows bytes as bytes).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    /// Events, requests, connections: a plain number.
    #[default]
    Count,
    Bytes,
    Seconds,
}

/// A figure as declared: a counter's name ends in `_total`, a histogram's in `_seconds`, as
/// scraped (`sluice_component_` is added in front).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    pub name: &'static str,
    pub kind: FigureKind,
    pub help: &'static str,
    pub unit: Unit,
}

impl Spec {
    pub const fn counter(name: &'static str, help: &'static str) -> Spec {
        Spec { name, kind: FigureKind::Counter, help, unit: Unit::Count }
    }

    pub const fn gauge(name: &'static str, help: &'static str) -> Spec {
        Spec { name, kind: FigureKind::Gauge, help, unit: Unit::Count }
    }

    /// A latency histogram, in seconds over [`crate::metrics::LATENCY_BUCKETS`].
    pub const fn histogram(name: &'static str, help: &'static str) -> Spec {
        Spec { name, kind: FigureKind::Histogram, help, unit: Unit::Seconds }
    }

    pub const fn in_unit(self, unit: Unit) -> Spec {
        Spec { unit, ..self }
    }

    /// The figure's value now.
    pub fn value(&self, value: u64) -> Figure {
        self.labelled(Vec::new(), value)
    }

    /// The value of one series split by labels of the component's own (added after the
    /// component's labels), such as documents refused by status and error type.
    pub fn labelled(&self, labels: Vec<(&'static str, String)>, value: u64) -> Figure {
        Figure {
            name: Cow::Borrowed(self.name),
            kind: self.kind,
            help: Cow::Borrowed(self.help),
            unit: self.unit,
            labels: labels.into_iter().map(|(k, v)| (Cow::Borrowed(k), v)).collect(),
            value: FigureValue::Count(value),
        }
    }

    /// A histogram's observations so far.
    pub fn observed(&self, histogram: &Histogram) -> Figure {
        Figure { value: FigureValue::Histogram(histogram.snapshot_struct()), ..self.value(0) }
    }
}

/// One figure's value at one moment, with what it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    pub name: Cow<'static, str>,
    pub kind: FigureKind,
    pub help: Cow<'static, str>,
    pub unit: Unit,
    /// The component's own labels; empty for most figures.
    pub labels: Vec<(Cow<'static, str>, String)>,
    pub value: FigureValue,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FigureValue {
    Count(u64),
    Histogram(HistogramSnapshot),
}

impl Figure {
    /// The key in the component's `/stats` `state`: the name without `_total` (a counter) or
    /// `_seconds` (a histogram).
    pub fn stats_key(&self) -> &str {
        match self.kind {
            FigureKind::Histogram => self.name.trim_end_matches("_seconds"),
            _ => self.name.trim_end_matches("_total"),
        }
    }

    /// The count, or a histogram's number of observations.
    pub fn count(&self) -> u64 {
        match &self.value {
            FigureValue::Count(n) => *n,
            FigureValue::Histogram(h) => h.count,
        }
    }
}

/// A component that reports figures of its own (a stateful processor's groups, an output's
/// requests in flight, an input's connections). Set once in its
/// [`ComponentMetrics::state`](crate::metrics::ComponentMetrics::state).
pub trait Publish: Send + Sync {
    /// Every figure of the component's own now, from its [`Spec`]s.
    fn figures(&self) -> Vec<Figure>;

    /// More detail for `/stats` only, under the key given in the component's `state` (a list
    /// too varied for metric labels, such as the files furthest behind).
    fn detail(&self) -> Option<(&'static str, serde_json::Value)> {
        None
    }
}

impl std::fmt::Debug for dyn Publish {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Publish")
    }
}

/// A component's own figures at one moment, as `/stats` gives them under `state`: each plain
/// figure by its [`Figure::stats_key`], a labelled one as a list of its series (labels and
/// `value`), a histogram as its `count` and `sum_seconds`, and the detail under its key.
/// Read back from `/stats`, a figure has its key for a name, no help, and a number is a gauge:
/// the document does not carry what `/metrics` does.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OwnFigures {
    pub figures: Vec<Figure>,
    pub detail: Option<(String, serde_json::Value)>,
}

impl OwnFigures {
    /// The figure whose `/stats` key is `key` (the first series of a labelled one).
    pub fn get(&self, key: &str) -> Option<&Figure> {
        self.figures.iter().find(|f| f.stats_key() == key)
    }
}

impl Serialize for OwnFigures {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde_json::{Value, json};
        let mut state = serde_json::Map::new();
        for f in &self.figures {
            let key = f.stats_key().to_string();
            match &f.value {
                FigureValue::Histogram(h) => {
                    state.insert(key, json!({"count": h.count, "sum_seconds": h.sum}));
                }
                FigureValue::Count(n) if f.labels.is_empty() => {
                    state.insert(key, json!(n));
                }
                FigureValue::Count(n) => {
                    let mut row: serde_json::Map<String, Value> =
                        f.labels.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
                    row.insert("value".into(), json!(n));
                    if let Some(rows) = state.entry(key).or_insert_with(|| json!([])).as_array_mut() {
                        rows.push(Value::Object(row));
                    }
                }
            }
        }
        if let Some((key, detail)) = &self.detail {
            state.insert(key.clone(), detail.clone());
        }
        state.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for OwnFigures {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde_json::Value;
        let state = serde_json::Map::<String, Value>::deserialize(deserializer)?;
        let mut own = OwnFigures::default();
        let figure = |name: &str, kind, labels, value| Figure {
            name: Cow::Owned(name.to_string()),
            kind,
            help: Cow::Borrowed(""),
            unit: Unit::Count,
            labels,
            value,
        };
        for (key, v) in state {
            let histogram = v.get("count").and_then(Value::as_u64).zip(v.get("sum_seconds").and_then(Value::as_f64));
            let rows = v.as_array().filter(|rows| rows.iter().all(|r| r.get("value").is_some_and(Value::is_u64)));
            if let Some(n) = v.as_u64() {
                own.figures.push(figure(&key, FigureKind::Gauge, Vec::new(), FigureValue::Count(n)));
            } else if let Some((count, sum)) = histogram {
                let snapshot = HistogramSnapshot { buckets: Vec::new(), sum, count };
                let mut f = figure(&key, FigureKind::Histogram, Vec::new(), FigureValue::Histogram(snapshot));
                f.unit = Unit::Seconds;
                own.figures.push(f);
            } else if let Some(rows) = rows.filter(|rows| !rows.is_empty()) {
                for row in rows {
                    let Some(fields) = row.as_object() else { continue };
                    let labels = fields
                        .iter()
                        .filter(|(k, _)| k.as_str() != "value")
                        .map(|(k, v)| (Cow::Owned(k.clone()), v.as_str().map_or_else(|| v.to_string(), str::to_string)))
                        .collect();
                    let n = fields.get("value").and_then(Value::as_u64).unwrap_or_default();
                    own.figures.push(figure(&key, FigureKind::Gauge, labels, FigureValue::Count(n)));
                }
            } else {
                own.detail = Some((key, v));
            }
        }
        Ok(own)
    }
}
