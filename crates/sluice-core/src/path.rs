//! Field paths: JSON pointers (RFC 6901) parsed once at config load.
//!
//! `/user/name` walks objects by key and arrays by index; `~1` escapes `/` and `~0` escapes `~`.
//! A path without the leading slash (`message`, `user/name`) is read as if it had one, because
//! that is how people write field names in configs. The empty path and `/` alone are rejected:
//! no component may replace the whole event by accident.

use std::fmt;

use crate::value::{Map, Str, Value};

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FieldPath {
    segments: Vec<Str>,
    text: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid field path `{path}`: {reason}")]
pub struct PathError {
    pub path: String,
    pub reason: String,
}

impl FieldPath {
    pub fn parse(text: &str) -> Result<FieldPath, PathError> {
        let err = |reason: &str| PathError { path: text.to_string(), reason: reason.to_string() };
        let body = text.strip_prefix('/').unwrap_or(text);
        if body.is_empty() {
            return Err(err("a path names at least one field, like /message"));
        }
        let mut segments = Vec::new();
        for raw in body.split('/') {
            if raw.is_empty() {
                return Err(err("empty segment (two slashes in a row, or a trailing slash)"));
            }
            let mut seg = String::with_capacity(raw.len());
            let mut chars = raw.chars();
            while let Some(c) = chars.next() {
                if c == '~' {
                    match chars.next() {
                        Some('0') => seg.push('~'),
                        Some('1') => seg.push('/'),
                        _ => return Err(err("`~` must be followed by 0 or 1 (~0 is `~`, ~1 is `/`)")),
                    }
                } else {
                    seg.push(c);
                }
            }
            segments.push(Str::from(seg));
        }
        let mut canonical = String::with_capacity(text.len() + 1);
        for s in &segments {
            canonical.push('/');
            canonical.push_str(&s.replace('~', "~0").replace('/', "~1"));
        }
        Ok(FieldPath { segments, text: canonical })
    }

    /// A path of one top-level field, taken literally (no pointer parsing).
    pub fn field(name: &str) -> FieldPath {
        FieldPath { segments: vec![Str::new(name)], text: format!("/{}", name.replace('~', "~0").replace('/', "~1")) }
    }

    pub fn segments(&self) -> &[Str] {
        &self.segments
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub fn last(&self) -> &str {
        self.segments.last().map(|s| s.as_str()).unwrap_or("")
    }

    pub fn get<'a>(&self, root: &'a Map) -> Option<&'a Value> {
        let (first, rest) = self.segments.split_first()?;
        let mut cur = root.get(first)?;
        for seg in rest {
            cur = step(cur, seg)?;
        }
        Some(cur)
    }

    pub fn get_mut<'a>(&self, root: &'a mut Map) -> Option<&'a mut Value> {
        let (first, rest) = self.segments.split_first()?;
        let mut cur = root.get_mut(first)?;
        for seg in rest {
            cur = step_mut(cur, seg)?;
        }
        Some(cur)
    }

    /// Sets the value, creating intermediate objects as needed. Fails (returning the value)
    /// when an intermediate exists and is neither an object nor an indexable array.
    pub fn insert(&self, root: &mut Map, value: Value) -> Result<Option<Value>, Value> {
        let (last, parents) = self.segments.split_last().expect("paths are never empty");
        let mut map = root;
        let mut iter = parents.iter();
        // Walk objects; an array on the way is indexed, and a scalar is in the way.
        while let Some(seg) = iter.next() {
            let next = map.entry_or_insert_with(seg, || Value::Object(Map::new()));
            let mut slot = next;
            loop {
                match slot {
                    Value::Object(m) => {
                        map = m;
                        break;
                    }
                    Value::Array(a) => {
                        let Some(idx_seg) = iter.next() else {
                            return Err(value);
                        };
                        let Some(item) = idx_seg.parse::<usize>().ok().and_then(|i| a.get_mut(i)) else {
                            return Err(value);
                        };
                        slot = item;
                    }
                    _ => return Err(value),
                }
            }
        }
        Ok(map.insert(last.clone(), value))
    }

    pub fn remove(&self, root: &mut Map) -> Option<Value> {
        let (last, parents) = self.segments.split_last()?;
        if parents.is_empty() {
            return root.remove(last);
        }
        let (first, mid) = parents.split_first()?;
        let mut cur = root.get_mut(first)?;
        for seg in mid {
            cur = step_mut(cur, seg)?;
        }
        match cur {
            Value::Object(m) => m.remove(last),
            Value::Array(a) => {
                let i = last.parse::<usize>().ok()?;
                (i < a.len()).then(|| a.remove(i))
            }
            _ => None,
        }
    }
}

fn step<'a>(v: &'a Value, seg: &str) -> Option<&'a Value> {
    match v {
        Value::Object(m) => m.get(seg),
        Value::Array(a) => a.get(seg.parse::<usize>().ok()?),
        _ => None,
    }
}

fn step_mut<'a>(v: &'a mut Value, seg: &str) -> Option<&'a mut Value> {
    match v {
        Value::Object(m) => m.get_mut(seg),
        Value::Array(a) => a.get_mut(seg.parse::<usize>().ok()?),
        _ => None,
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl<'de> serde::Deserialize<'de> for FieldPath {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        FieldPath::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> Map {
        match Value::from_json_slice(br#"{"a":{"b":[10,{"c":"x"}]},"k/e~y":1}"#).unwrap() {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    #[test]
    fn get_walks_objects_and_arrays() {
        let d = doc();
        assert_eq!(FieldPath::parse("/a/b/0").unwrap().get(&d), Some(&Value::Int(10)));
        assert_eq!(FieldPath::parse("/a/b/1/c").unwrap().get(&d), Some(&Value::from("x")));
        assert_eq!(FieldPath::parse("/k~1e~0y").unwrap().get(&d), Some(&Value::Int(1)));
        assert_eq!(FieldPath::parse("a/b/0").unwrap().get(&d), Some(&Value::Int(10)));
        assert_eq!(FieldPath::parse("/a/zz").unwrap().get(&d), None);
        assert_eq!(FieldPath::parse("/a/b/9").unwrap().get(&d), None);
    }

    #[test]
    fn insert_creates_parents_and_refuses_scalars() {
        let mut d = doc();
        FieldPath::parse("/x/y/z").unwrap().insert(&mut d, Value::Int(1)).unwrap();
        assert_eq!(FieldPath::parse("/x/y/z").unwrap().get(&d), Some(&Value::Int(1)));
        FieldPath::parse("/a/b/1/d").unwrap().insert(&mut d, Value::Int(2)).unwrap();
        assert_eq!(FieldPath::parse("/a/b/1/d").unwrap().get(&d), Some(&Value::Int(2)));
        assert!(FieldPath::parse("/k~1e~0y/sub").unwrap().insert(&mut d, Value::Null).is_err());
    }

    #[test]
    fn remove_nested() {
        let mut d = doc();
        assert_eq!(FieldPath::parse("/a/b/1/c").unwrap().remove(&mut d), Some(Value::from("x")));
        assert_eq!(FieldPath::parse("/a/b/0").unwrap().remove(&mut d), Some(Value::Int(10)));
        assert_eq!(FieldPath::parse("/nope/x").unwrap().remove(&mut d), None);
    }

    #[test]
    fn bad_paths() {
        assert!(FieldPath::parse("").is_err());
        assert!(FieldPath::parse("/").is_err());
        assert!(FieldPath::parse("/a//b").is_err());
        assert!(FieldPath::parse("/a~2").is_err());
    }
}
