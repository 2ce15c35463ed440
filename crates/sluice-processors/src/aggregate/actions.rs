//! The actions of `aggregate`: how they are configured, what a group of each keeps, how an event
//! is folded into it and what a concluded group emits.
//!
//! Four actions consume their events and emit one event per group when it concludes (`count`,
//! `sum`, `histogram`, `put_all`); three pass events through and only decide which stay in the
//! batch (`remove_duplicates`, `rate_limiter`, `percent_sampler`); their groups emit nothing.

use std::fmt;
use std::time::Instant;

use serde::Deserialize;
use serde::de::{self, MapAccess, Visitor};
use sluice_core::event::TIMESTAMP;
use sluice_core::{Event, FieldPath, Map, Value};

/// The action names, for messages.
pub(crate) const ACTIONS: &[&str] =
    &["count", "histogram", "percent_sampler", "put_all", "rate_limiter", "remove_duplicates", "sum"];

/// Where `count`, `sum` and `histogram` write what they report.
#[derive(Debug, Clone)]
pub(crate) struct Outputs {
    pub count_key: FieldPath,
    pub start_time_key: FieldPath,
    pub end_time_key: FieldPath,
}

impl Outputs {
    fn new(count: Option<FieldPath>, start: Option<FieldPath>, end: Option<FieldPath>) -> Outputs {
        Outputs {
            count_key: count.unwrap_or_else(|| FieldPath::field("count")),
            start_time_key: start.unwrap_or_else(|| FieldPath::field("start_time")),
            end_time_key: end.unwrap_or_else(|| FieldPath::field("end_time")),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CountOptions {
    #[serde(default)]
    count_key: Option<FieldPath>,
    #[serde(default)]
    start_time_key: Option<FieldPath>,
    #[serde(default)]
    end_time_key: Option<FieldPath>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SumOptions {
    key: FieldPath,
    #[serde(default)]
    sum_key: Option<FieldPath>,
    #[serde(default)]
    count_key: Option<FieldPath>,
    #[serde(default)]
    start_time_key: Option<FieldPath>,
    #[serde(default)]
    end_time_key: Option<FieldPath>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HistogramOptions {
    key: FieldPath,
    buckets: Vec<f64>,
    #[serde(default)]
    start_time_key: Option<FieldPath>,
    #[serde(default)]
    end_time_key: Option<FieldPath>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RateOptions {
    events_per_second: f64,
    #[serde(default)]
    when_exceeds: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PercentOptions {
    percent: f64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NoOptions {}

/// `action:` as written: a bare name, or a one-key mapping from the name to its options.
#[derive(Debug)]
pub(crate) enum ActionConfig {
    Count(CountOptions),
    Sum(SumOptions),
    PutAll(NoOptions),
    Histogram(HistogramOptions),
    RemoveDuplicates(NoOptions),
    RateLimiter(RateOptions),
    PercentSampler(PercentOptions),
}

fn unknown_action<E: de::Error>(name: &str) -> E {
    E::custom(format!(
        "unknown action `{name}`, expected one of {}",
        ACTIONS.iter().map(|a| format!("`{a}`")).collect::<Vec<_>>().join(", ")
    ))
}

impl<'de> Deserialize<'de> for ActionConfig {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ActionConfig;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an action name (like `count`) or a one-key mapping (like `{sum: {key: /bytes}}`)")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<ActionConfig, E> {
                match name {
                    "count" => Ok(ActionConfig::Count(CountOptions::default())),
                    "put_all" => Ok(ActionConfig::PutAll(NoOptions {})),
                    "remove_duplicates" => Ok(ActionConfig::RemoveDuplicates(NoOptions {})),
                    "sum" => Err(E::custom("`sum` needs options: `{sum: {key: /bytes}}`")),
                    "histogram" => {
                        Err(E::custom("`histogram` needs options: `{histogram: {key: /latency, buckets: [0.1, 1]}}`"))
                    }
                    "rate_limiter" => {
                        Err(E::custom("`rate_limiter` needs options: `{rate_limiter: {events_per_second: 10}}`"))
                    }
                    "percent_sampler" => {
                        Err(E::custom("`percent_sampler` needs options: `{percent_sampler: {percent: 25}}`"))
                    }
                    other => Err(unknown_action(other)),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ActionConfig, A::Error> {
                let Some(name) = map.next_key::<String>()? else {
                    return Err(de::Error::custom(
                        "the action mapping is empty: give one action, like `{sum: {key: /bytes}}`",
                    ));
                };
                let action = match name.as_str() {
                    "count" => ActionConfig::Count(map.next_value()?),
                    "sum" => ActionConfig::Sum(map.next_value()?),
                    "put_all" => ActionConfig::PutAll(map.next_value()?),
                    "histogram" => ActionConfig::Histogram(map.next_value()?),
                    "remove_duplicates" => ActionConfig::RemoveDuplicates(map.next_value()?),
                    "rate_limiter" => ActionConfig::RateLimiter(map.next_value()?),
                    "percent_sampler" => ActionConfig::PercentSampler(map.next_value()?),
                    other => return Err(unknown_action(other)),
                };
                if let Some(more) = map.next_key::<String>()? {
                    return Err(de::Error::custom(format!("give one action, found `{name}` and `{more}`")));
                }
                Ok(action)
            }
        }
        d.deserialize_any(V)
    }
}

/// An action, checked and ready.
#[derive(Debug)]
pub(crate) enum Action {
    Count(Outputs),
    Sum { key: FieldPath, sum_key: FieldPath, out: Outputs },
    PutAll,
    Histogram { key: FieldPath, buckets: Box<[f64]>, out: Outputs },
    RemoveDuplicates,
    RateLimiter { per_second: f64 },
    PercentSampler { percent: f64 },
}

impl Action {
    /// Checks the options; the error is a message about the `action` key.
    pub(crate) fn from_config(c: ActionConfig) -> Result<Action, String> {
        Ok(match c {
            ActionConfig::Count(o) => Action::Count(Outputs::new(o.count_key, o.start_time_key, o.end_time_key)),
            ActionConfig::Sum(o) => Action::Sum {
                key: o.key,
                sum_key: o.sum_key.unwrap_or_else(|| FieldPath::field("sum")),
                out: Outputs::new(o.count_key, o.start_time_key, o.end_time_key),
            },
            ActionConfig::PutAll(_) => Action::PutAll,
            ActionConfig::Histogram(o) => {
                if o.buckets.is_empty() {
                    return Err("histogram: `buckets` needs at least one upper bound".into());
                }
                if let Some(b) = o.buckets.iter().find(|b| !b.is_finite()) {
                    return Err(format!("histogram: bucket bound `{b}` is not a finite number"));
                }
                if let Some(w) = o.buckets.windows(2).find(|w| w[0] >= w[1]) {
                    return Err(format!(
                        "histogram: `buckets` must be strictly ascending, but {} comes before {}",
                        w[0], w[1]
                    ));
                }
                Action::Histogram {
                    key: o.key,
                    buckets: o.buckets.into(),
                    out: Outputs::new(None, o.start_time_key, o.end_time_key),
                }
            }
            ActionConfig::RemoveDuplicates(_) => Action::RemoveDuplicates,
            ActionConfig::RateLimiter(o) => {
                if !(o.events_per_second.is_finite() && o.events_per_second > 0.0) {
                    return Err(format!(
                        "rate_limiter: `events_per_second` must be more than 0, found {}",
                        o.events_per_second
                    ));
                }
                if let Some(w) = o.when_exceeds.as_deref().filter(|w| *w != "drop") {
                    return Err(format!("rate_limiter: `when_exceeds` can only be `drop`, found `{w}`"));
                }
                Action::RateLimiter { per_second: o.events_per_second }
            }
            ActionConfig::PercentSampler(o) => {
                if !(o.percent > 0.0 && o.percent <= 100.0) {
                    return Err(format!(
                        "percent_sampler: `percent` must be more than 0 and at most 100, found {}",
                        o.percent
                    ));
                }
                Action::PercentSampler { percent: o.percent }
            }
        })
    }

    /// True when the emitted event carries the identification keys' values (kept per group).
    pub(crate) fn reports_keys(&self) -> bool {
        matches!(self, Action::Count(_) | Action::Sum { .. } | Action::Histogram { .. })
    }

    /// A new group's state, for a group opened at `now`.
    pub(crate) fn open(&self, now: Instant) -> GroupState {
        match self {
            Action::Count(_) => GroupState::Count { count: 0 },
            Action::Sum { .. } => GroupState::Sum { count: 0, sum: Num::Int(0) },
            Action::PutAll => GroupState::PutAll { fields: Map::new() },
            Action::Histogram { buckets, .. } => GroupState::Histogram(Histogram {
                count: 0,
                sum: 0.0,
                min: f64::INFINITY,
                max: f64::NEG_INFINITY,
                buckets: vec![0; buckets.len()].into(),
            }),
            Action::RemoveDuplicates => GroupState::Seen,
            Action::RateLimiter { per_second } => GroupState::Bucket { tokens: bucket_size(*per_second), last: now },
            Action::PercentSampler { .. } => GroupState::Sampled { seen: 0, kept: 0 },
        }
    }

    /// Folds one event into its group's state. Consuming actions may take the event's fields
    /// (the event leaves the batch).
    pub(crate) fn fold(&self, state: &mut GroupState, event: &mut Event, now: Instant, skipped: &mut u64) -> Fate {
        match (self, state) {
            (Action::Count(_), GroupState::Count { count }) => {
                *count += 1;
                Fate::Consume
            }
            (Action::Sum { key, .. }, GroupState::Sum { count, sum }) => {
                *count += 1;
                match event.get(key) {
                    Some(Value::Int(i)) => sum.add_int(*i),
                    Some(Value::Float(f)) if f.is_finite() => sum.add_float(*f),
                    _ => *skipped += 1,
                }
                Fate::Consume
            }
            (Action::PutAll, GroupState::PutAll { fields }) => {
                let taken = std::mem::take(&mut event.fields);
                if fields.is_empty() {
                    *fields = taken;
                } else {
                    for (k, v) in taken {
                        fields.insert(k, v);
                    }
                }
                Fate::Consume
            }
            (Action::Histogram { key, buckets, .. }, GroupState::Histogram(h)) => {
                match event.get(key).and_then(number) {
                    Some(v) => h.observe(buckets, v),
                    None => *skipped += 1,
                }
                Fate::Consume
            }
            (Action::RemoveDuplicates, GroupState::Seen) => Fate::Drop,
            (Action::RateLimiter { per_second }, GroupState::Bucket { tokens, last }) => {
                let elapsed = now.saturating_duration_since(*last).as_secs_f64();
                *last = (*last).max(now);
                *tokens = (*tokens + elapsed * per_second).min(bucket_size(*per_second));
                if *tokens >= 1.0 {
                    *tokens -= 1.0;
                    Fate::Keep
                } else {
                    Fate::Drop
                }
            }
            (Action::PercentSampler { percent }, GroupState::Sampled { seen, kept }) => {
                // After n events, ceil(n * percent / 100) have been kept: the first always is.
                *seen += 1;
                let due = (*seen as f64 * percent / 100.0).ceil() as u64;
                if *kept < due {
                    *kept += 1;
                    Fate::Keep
                } else {
                    Fate::Drop
                }
            }
            _ => unreachable!("a group's state always matches its processor's action"),
        }
    }

    /// What the first event of a new group does (the group is already opened with `open`).
    pub(crate) fn first(&self, state: &mut GroupState, event: &mut Event, now: Instant, skipped: &mut u64) -> Fate {
        match self {
            Action::RemoveDuplicates => Fate::Keep,
            _ => self.fold(state, event, now, skipped),
        }
    }

    /// The event a concluded group emits, if its action emits one. `keys` are the identification
    /// keys' paths and `values` their values in the group (absent ones are left out).
    pub(crate) fn emit(
        &self,
        keys: &[FieldPath],
        values: &[Option<Value>],
        state: GroupState,
        start_nanos: i64,
        end_nanos: i64,
    ) -> Option<Event> {
        let mut e = Event::new(Map::with_capacity(keys.len() + 8));
        let put = |e: &mut Event, path: &FieldPath, v: Value| {
            // A parent that is not an object (a key path inside another) loses this one value.
            let _ = e.insert(path, v);
        };
        for (path, value) in keys.iter().zip(values) {
            if let Some(v) = value {
                put(&mut e, path, v.clone());
            }
        }
        let times = |e: &mut Event, out: &Outputs| {
            put(e, &out.start_time_key, Value::Timestamp(start_nanos));
            put(e, &out.end_time_key, Value::Timestamp(end_nanos));
        };
        match (self, state) {
            (Action::Count(out), GroupState::Count { count }) => {
                put(&mut e, &out.count_key, Value::Int(count as i64));
                times(&mut e, out);
            }
            (Action::Sum { sum_key, out, .. }, GroupState::Sum { count, sum }) => {
                put(&mut e, &out.count_key, Value::Int(count as i64));
                put(&mut e, sum_key, sum.value());
                times(&mut e, out);
            }
            (Action::Histogram { buckets: bounds, out, .. }, GroupState::Histogram(h)) => {
                put(&mut e, &FieldPath::field("count"), Value::Int(h.count as i64));
                put(&mut e, &FieldPath::field("sum"), Value::Float(h.sum));
                if h.count > 0 {
                    put(&mut e, &FieldPath::field("min"), Value::Float(h.min));
                    put(&mut e, &FieldPath::field("max"), Value::Float(h.max));
                }
                let mut running = 0u64;
                let buckets = bounds
                    .iter()
                    .zip(h.buckets.iter())
                    .map(|(le, n)| {
                        running += n;
                        let mut m = Map::with_capacity(2);
                        m.push_unchecked("le", Value::Float(*le));
                        m.push_unchecked("count", Value::Int(running as i64));
                        Value::Object(m)
                    })
                    .collect();
                put(&mut e, &FieldPath::field("buckets"), Value::Array(buckets));
                times(&mut e, out);
            }
            (Action::PutAll, GroupState::PutAll { fields }) => e = Event::new(fields),
            _ => return None,
        }
        e.fields.insert(TIMESTAMP, Value::Timestamp(end_nanos));
        Some(e)
    }
}

/// The rate limiter's bucket holds one second's worth of events (at least one), refilled by the
/// time elapsed; a new group's bucket starts full.
fn bucket_size(per_second: f64) -> f64 {
    per_second.max(1.0)
}

/// What happens to an event folded into a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Stays in the batch.
    Keep,
    /// Taken into the group; its acknowledgement is held.
    Consume,
    /// Dropped on purpose; its acknowledgement stays with the batch.
    Drop,
}

/// A number's value, when it is one (finite).
fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Int(i) => Some(*i as f64),
        Value::Float(f) if f.is_finite() => Some(*f),
        _ => None,
    }
}

/// A running sum: integers stay integers until a float arrives (or an integer sum overflows).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Num {
    Int(i64),
    Float(f64),
}

impl Num {
    fn add_int(&mut self, i: i64) {
        *self = match *self {
            Num::Int(s) => s.checked_add(i).map(Num::Int).unwrap_or(Num::Float(s as f64 + i as f64)),
            Num::Float(s) => Num::Float(s + i as f64),
        }
    }

    fn add_float(&mut self, f: f64) {
        *self = match *self {
            Num::Int(s) => Num::Float(s as f64 + f),
            Num::Float(s) => Num::Float(s + f),
        }
    }

    fn value(self) -> Value {
        match self {
            Num::Int(i) => Value::Int(i),
            Num::Float(f) => Value::Float(f),
        }
    }
}

#[derive(Debug)]
pub(crate) struct Histogram {
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
    /// Per bound, the values above the previous bound and at most this one (not cumulative).
    buckets: Box<[u64]>,
}

impl Histogram {
    fn observe(&mut self, bounds: &[f64], v: f64) {
        self.count += 1;
        self.sum += v;
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        let i = bounds.partition_point(|b| *b < v);
        if let Some(n) = self.buckets.get_mut(i) {
            *n += 1;
        }
    }
}

/// What a group keeps, per action.
#[derive(Debug)]
pub(crate) enum GroupState {
    Count { count: u64 },
    Sum { count: u64, sum: Num },
    PutAll { fields: Map },
    Histogram(Histogram),
    Seen,
    Bucket { tokens: f64, last: Instant },
    Sampled { seen: u64, kept: u64 },
}
