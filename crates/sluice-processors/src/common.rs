//! Pieces the processors share: order-keeping config maps, "one or many" lists, failure tags,
//! capture names turned into field paths, and the text-to-number conversions.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::Verdict;
use sluice_config::Link;
use sluice_config::model::ComponentSpec;
use sluice_core::{Event, FieldPath, Str, Value};

/// A config mapping read in the order it was written (a `HashMap` would lose it).
#[derive(Debug, Clone)]
pub(crate) struct OrderedMap<K, V>(pub Vec<(K, V)>);

impl<K, V> Default for OrderedMap<K, V> {
    fn default() -> Self {
        OrderedMap(Vec::new())
    }
}

impl<'de, K: Deserialize<'de>, V: Deserialize<'de>> Deserialize<'de> for OrderedMap<K, V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct MapVisitor<K, V>(PhantomData<(K, V)>);
        impl<'de, K: Deserialize<'de>, V: Deserialize<'de>> Visitor<'de> for MapVisitor<K, V> {
            type Value = OrderedMap<K, V>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a mapping")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = access.next_entry()? {
                    out.push((k, v));
                }
                Ok(OrderedMap(out))
            }
        }
        d.deserialize_map(MapVisitor(PhantomData))
    }
}

/// A string or a list of strings (`match: {message: "..."}` or `match: {message: [..]}`).
#[derive(Debug, Clone, Default)]
pub(crate) struct OneOrMany(pub Vec<String>);

impl<'de> Deserialize<'de> for OneOrMany {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = OneOrMany;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("text or a list of text")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<OneOrMany, E> {
                Ok(OneOrMany(vec![v.to_string()]))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<OneOrMany, E> {
                Ok(OneOrMany(vec![v.to_string()]))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<OneOrMany, E> {
                Ok(OneOrMany(vec![v.to_string()]))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<OneOrMany, E> {
                Ok(OneOrMany(vec![v.to_string()]))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<OneOrMany, E> {
                Ok(OneOrMany(vec![v.to_string()]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<OneOrMany, A::Error> {
                let mut out = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    out.push(s);
                }
                Ok(OneOrMany(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// What a parsing processor does with an event it failed on (after tagging it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum OnFailure {
    /// Keep it in the batch, counted as failed.
    #[default]
    Tag,
    /// Take it out of the batch into the pipeline's dead letter queue.
    Dlq,
}

/// The links of a processor that takes `on_failure`: with `dlq`, its pipeline's dead letter
/// queue. Read apart from the processor's other keys, so that a mistake there (reported when it
/// is built) does not hide this link.
pub(crate) fn on_failure_links(spec: &ComponentSpec) -> Vec<Link> {
    #[derive(serde::Deserialize)]
    struct Keys {
        #[serde(default)]
        on_failure: OnFailure,
    }
    match sluice_config::from_node::<Keys>(&spec.settings.only_keys(&["on_failure"]), &spec.path) {
        Ok(Keys { on_failure: OnFailure::Dlq }) => vec![Link::WritesDeadLetterQueue { key: "on_failure" }],
        _ => Vec::new(),
    }
}

impl OnFailure {
    /// The verdict for a failure; the reason is only worked out when it is needed.
    pub(crate) fn verdict(self, reason: impl FnOnce() -> String) -> Verdict {
        match self {
            OnFailure::Tag => Verdict::Failed,
            OnFailure::Dlq => Verdict::DeadLetter(reason()),
        }
    }
}

/// Adds every tag in `tags` (each once).
pub(crate) fn add_tags(event: &mut Event, tags: &[String]) {
    for t in tags {
        event.add_tag(t);
    }
}

/// The field a grok or dissect capture name writes to.
///
/// - `/a/b`: a JSON pointer, as everywhere else in Sluice;
/// - `[a][b]`: Logstash's nested-field syntax;
/// - `a.b`: dotted (ECS-style) names are nested too;
/// - anything else is one top-level field.
pub(crate) fn capture_target(name: &str) -> Result<FieldPath, String> {
    let segments: Vec<&str> = if name.starts_with('/') {
        return FieldPath::parse(name).map_err(|e| e.to_string());
    } else if let Some(body) = name.strip_prefix('[') {
        let Some(body) = body.strip_suffix(']') else {
            return Err(format!("field name `{name}` starts with `[` but does not end with `]`"));
        };
        body.split("][").collect()
    } else {
        name.split('.').collect()
    };
    if segments.iter().any(|s| s.is_empty() || s.contains(['[', ']'])) {
        return Err(format!("field name `{name}` has an empty or malformed part (write `a.b`, `[a][b]` or `/a/b`)"));
    }
    let mut pointer = String::with_capacity(name.len() + 1);
    for s in segments {
        pointer.push('/');
        pointer.push_str(&s.replace('~', "~0").replace('/', "~1"));
    }
    FieldPath::parse(&pointer).map_err(|e| e.to_string())
}

/// The numeric type a captured string is converted to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NumType {
    Int,
    Float,
}

impl NumType {
    pub(crate) fn from_name(name: &str) -> Option<NumType> {
        match name {
            "int" | "integer" => Some(NumType::Int),
            "float" => Some(NumType::Float),
            _ => None,
        }
    }

    /// Converts text; `None` when it is not a number of that kind.
    pub(crate) fn convert(self, s: &str) -> Option<Value> {
        match self {
            NumType::Int => text_to_int(s).map(Value::Int),
            NumType::Float => text_to_float(s).map(Value::Float),
        }
    }
}

/// Text to an integer: a whole number, or a decimal number truncated toward zero.
pub(crate) fn text_to_int(s: &str) -> Option<i64> {
    let t = s.trim();
    if let Ok(i) = t.parse::<i64>() {
        return Some(i);
    }
    text_to_float(t).and_then(float_to_int)
}

/// A finite float truncated to an integer when it fits.
pub(crate) fn float_to_int(f: f64) -> Option<i64> {
    // i64::MAX as f64 rounds up to 2^63, which does not fit, hence the open end. NaN and the
    // infinities are outside the range.
    (-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&f).then(|| f.trunc() as i64)
}

/// Text to a finite float (`inf` and `NaN` are refused: JSON cannot carry them).
pub(crate) fn text_to_float(s: &str) -> Option<f64> {
    let t = s.trim();
    // Rust's parser accepts words like "inf" and "nan"; a number must start like one.
    let first = t.strip_prefix(['+', '-']).unwrap_or(t).bytes().next()?;
    if !(first.is_ascii_digit() || first == b'.') {
        return None;
    }
    t.parse::<f64>().ok().filter(|f| f.is_finite())
}

/// A string value from a slice; short strings stay inline.
pub(crate) fn str_value(s: &str) -> Value {
    Value::String(Str::new(s))
}

/// Reads one of the loghub samples kept in the repository (`tests/data/loghub`); panics with a
/// clear message when it is missing (the tests depend on real log lines and must not pass
/// silently without them).
#[cfg(test)]
pub(crate) fn loghub(name: &str) -> String {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/loghub");
    let path = format!("{dir}/{name}");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read test data {path}: {e}; the loghub samples are in tests/data/loghub"))
}

/// A processor built from a YAML snippet, for tests.
#[cfg(test)]
pub(crate) fn build_yaml(yaml: &str) -> std::sync::Arc<dyn crate::Processor> {
    let spec = crate::spec_from_yaml(yaml).unwrap_or_else(|e| panic!("bad test config: {e}"));
    crate::build(&spec).unwrap_or_else(|e| panic!("build failed: {e}"))
}

/// The error text of a config that must not build.
#[cfg(test)]
pub(crate) fn build_err(yaml: &str) -> String {
    let spec = match crate::spec_from_yaml(yaml) {
        Ok(s) => s,
        Err(e) => return e.to_string(),
    };
    match crate::build(&spec) {
        Ok(_) => panic!("config should not build:\n{yaml}"),
        Err(e) => e.to_string(),
    }
}

/// The value at a pointer, for tests.
#[cfg(test)]
pub(crate) fn get<'a>(event: &'a Event, path: &str) -> Option<&'a Value> {
    event.get(&FieldPath::parse(path).unwrap())
}

#[cfg(test)]
pub(crate) fn tags(event: &Event) -> Vec<String> {
    match event.fields.get(sluice_core::event::TAGS) {
        Some(Value::Array(a)) => a.iter().map(|v| v.to_text()).collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_targets() {
        assert_eq!(capture_target("ip").unwrap().as_str(), "/ip");
        assert_eq!(capture_target("[client][ip]").unwrap().as_str(), "/client/ip");
        assert_eq!(capture_target("client.ip").unwrap().as_str(), "/client/ip");
        assert_eq!(capture_target("/client/ip").unwrap().as_str(), "/client/ip");
        assert_eq!(capture_target("[a/b]").unwrap().segments()[0].as_str(), "a/b");
        assert!(capture_target("[a][b").is_err());
        assert!(capture_target("a..b").is_err());
        assert!(capture_target("[]").is_err());
        assert!(capture_target("/").is_err());
    }

    #[test]
    fn number_conversions() {
        assert_eq!(text_to_int(" 42 "), Some(42));
        assert_eq!(text_to_int("-3.9"), Some(-3));
        assert_eq!(text_to_int("1e3"), Some(1000));
        assert_eq!(text_to_int("abc"), None);
        assert_eq!(text_to_int("1e30"), None);
        assert_eq!(text_to_float("2.5"), Some(2.5));
        assert_eq!(text_to_float(".5"), Some(0.5));
        assert_eq!(text_to_float("inf"), None);
        assert_eq!(text_to_float("NaN"), None);
        assert_eq!(text_to_float(""), None);
        assert_eq!(NumType::Int.convert("7"), Some(Value::Int(7)));
        assert_eq!(NumType::Float.convert("7"), Some(Value::Float(7.0)));
    }
}
