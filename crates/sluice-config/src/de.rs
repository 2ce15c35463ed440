//! serde over [`Node`]s, keeping track of the key path so every error says where it is.
//!
//! Plain scalars are typed the YAML 1.2 core-schema way (`true`, `12`, `1.5`, `null`) when the
//! target asks for "any"; when the target names a type, the scalar is parsed as that type, so
//! `port: "9600"` and `name: 42` both do what the user meant.

use serde::de::value::StrDeserializer;
use serde::de::{self, DeserializeOwned, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};

use crate::error::ConfigError;
use crate::node::{Node, NodeKind};

/// Reads a typed value from a node. `path` is the dotted place of the node, for messages.
pub fn from_node<T: DeserializeOwned>(node: &Node, path: &str) -> Result<T, ConfigError> {
    T::deserialize(NodeDe { node, path: path.to_string() })
}

/// The keys a struct read with serde takes (its fields, as renamed), in declaration order; empty
/// for a type that is not a struct. Used to name every key a component takes when some of them
/// are read by a block it shares with others.
pub fn struct_fields<T: DeserializeOwned>() -> &'static [&'static str] {
    struct Fields(&'static [&'static str]);
    impl serde::de::Error for Fields {
        fn custom<M: std::fmt::Display>(_: M) -> Self {
            Fields(&[])
        }
    }
    impl std::fmt::Display for Fields {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("fields")
        }
    }
    impl std::fmt::Debug for Fields {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("fields")
        }
    }
    impl std::error::Error for Fields {}
    /// Answers every request with its struct's field names, as an error that stops serde.
    struct Probe;
    impl<'de> de::Deserializer<'de> for Probe {
        type Error = Fields;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Fields> {
            Err(Fields(&[]))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Fields> {
            Err(Fields(fields))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
            unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }
    match T::deserialize(Probe) {
        Err(Fields(fields)) => fields,
        Ok(_) => &[],
    }
}

/// serde's message for a key a struct does not take, listing those it does.
pub(crate) fn unknown_field_message(key: &str, expected: &[&str]) -> String {
    let quoted = |k: &&str| format!("`{k}`");
    match expected {
        [] => format!("unknown field `{key}`, there are no fields"),
        [one] => format!("unknown field `{key}`, expected `{one}`"),
        [a, b] => format!("unknown field `{key}`, expected `{a}` or `{b}`"),
        many => {
            format!("unknown field `{key}`, expected one of {}", many.iter().map(quoted).collect::<Vec<_>>().join(", "))
        }
    }
}

struct NodeDe<'a> {
    node: &'a Node,
    path: String,
}

fn join_key(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_string() } else { format!("{path}.{key}") }
}

impl<'a> NodeDe<'a> {
    fn here(&self, e: ConfigError) -> ConfigError {
        e.or_at(&self.path, self.node.mark.clone())
    }

    fn scalar(&self, what: &str) -> Result<&'a str, ConfigError> {
        match &self.node.kind {
            NodeKind::Scalar { value, .. } => Ok(value),
            _ => Err(self.here(ConfigError::new(format!("expected {what}, found {}", self.node.describe())))),
        }
    }

    fn parse<T: std::str::FromStr>(&self, what: &str) -> Result<T, ConfigError> {
        let s = self.scalar(what)?;
        s.trim().parse().map_err(|_| self.here(ConfigError::new(format!("expected {what}, found `{s}`"))))
    }
}

macro_rules! parse_number {
    ($method:ident, $visit:ident, $ty:ty, $what:expr) => {
        fn $method<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ConfigError> {
            let n: $ty = self.parse($what)?;
            v.$visit(n).map_err(|e| self.here(e))
        }
    };
}

impl<'de> de::Deserializer<'de> for NodeDe<'_> {
    type Error = ConfigError;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ConfigError> {
        let r = match &self.node.kind {
            NodeKind::Scalar { value, plain: true } => {
                if self.node.is_null() {
                    v.visit_unit()
                } else if value == "true" || value == "True" || value == "TRUE" {
                    v.visit_bool(true)
                } else if value == "false" || value == "False" || value == "FALSE" {
                    v.visit_bool(false)
                } else if let Ok(i) = value.parse::<i64>() {
                    v.visit_i64(i)
                } else if let Ok(u) = value.parse::<u64>() {
                    v.visit_u64(u)
                } else if looks_like_float(value) {
                    v.visit_f64(value.parse::<f64>().unwrap_or(f64::NAN))
                } else {
                    v.visit_str(value)
                }
            }
            NodeKind::Scalar { value, plain: false } => v.visit_str(value),
            NodeKind::Seq(items) => v.visit_seq(Seq { items: items.iter(), path: &self.path, index: 0 }),
            NodeKind::Map(entries) => v.visit_map(Map { entries: entries.iter(), path: &self.path, value: None }),
        };
        r.map_err(|e| self.here(e))
    }

    fn deserialize_bool<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ConfigError> {
        let s = self.scalar("true or false")?;
        let b = match s {
            "true" | "True" | "TRUE" => true,
            "false" | "False" | "FALSE" => false,
            _ => return Err(self.here(ConfigError::new(format!("expected true or false, found `{s}`")))),
        };
        v.visit_bool(b).map_err(|e| self.here(e))
    }

    parse_number!(deserialize_i8, visit_i8, i8, "a small integer");
    parse_number!(deserialize_i16, visit_i16, i16, "an integer");
    parse_number!(deserialize_i32, visit_i32, i32, "an integer");
    parse_number!(deserialize_i64, visit_i64, i64, "an integer");
    parse_number!(deserialize_u8, visit_u8, u8, "a whole number from 0 to 255");
    parse_number!(deserialize_u16, visit_u16, u16, "a whole number from 0 to 65535");
    parse_number!(deserialize_u32, visit_u32, u32, "a whole number");
    parse_number!(deserialize_u64, visit_u64, u64, "a whole number");
    parse_number!(deserialize_f32, visit_f32, f32, "a number");
    parse_number!(deserialize_f64, visit_f64, f64, "a number");

    fn deserialize_char<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ConfigError> {
        let s = self.scalar("one character")?;
        let mut chars = s.chars();
        match (chars.next(), chars.next()) {
            (Some(c), None) => v.visit_char(c).map_err(|e| self.here(e)),
            _ => Err(self.here(ConfigError::new(format!("expected one character, found `{s}`")))),
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ConfigError> {
        if self.node.is_null() && self.node.as_str() == Some("") {
            return Err(self.here(ConfigError::new("expected text, found nothing")));
        }
        let s = self.scalar("text")?;
        v.visit_str(s).map_err(|e| self.here(e))
    }

    fn deserialize_string<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ConfigError> {
        self.deserialize_str(v)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ConfigError> {
        self.deserialize_str(v)
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ConfigError> {
        self.deserialize_str(v)
    }

    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ConfigError> {
        if self.node.is_null() {
            v.visit_none().map_err(|e| self.here(e))
        } else {
            let path = self.path.clone();
            let mark = self.node.mark.clone();
            v.visit_some(self).map_err(|e| e.or_at(&path, mark))
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ConfigError> {
        if self.node.is_null() {
            v.visit_unit().map_err(|e| self.here(e))
        } else {
            Err(self.here(ConfigError::new(format!("expected nothing, found {}", self.node.describe()))))
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(self, _name: &'static str, v: V) -> Result<V::Value, ConfigError> {
        self.deserialize_unit(v)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(self, _name: &'static str, v: V) -> Result<V::Value, ConfigError> {
        let path = self.path.clone();
        let mark = self.node.mark.clone();
        v.visit_newtype_struct(self).map_err(|e| e.or_at(&path, mark))
    }

    fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ConfigError> {
        match &self.node.kind {
            NodeKind::Seq(items) => {
                v.visit_seq(Seq { items: items.iter(), path: &self.path, index: 0 }).map_err(|e| self.here(e))
            }
            _ if self.node.is_null() => {
                v.visit_seq(Seq { items: [].iter(), path: &self.path, index: 0 }).map_err(|e| self.here(e))
            }
            _ => Err(self.here(ConfigError::new(format!("expected a list, found {}", self.node.describe())))),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(self, _len: usize, v: V) -> Result<V::Value, ConfigError> {
        self.deserialize_seq(v)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        v: V,
    ) -> Result<V::Value, ConfigError> {
        self.deserialize_seq(v)
    }

    fn deserialize_map<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ConfigError> {
        match &self.node.kind {
            NodeKind::Map(entries) => {
                v.visit_map(Map { entries: entries.iter(), path: &self.path, value: None }).map_err(|e| self.here(e))
            }
            _ if self.node.is_null() => {
                v.visit_map(Map { entries: [].iter(), path: &self.path, value: None }).map_err(|e| self.here(e))
            }
            _ => Err(self.here(ConfigError::new(format!("expected a mapping, found {}", self.node.describe())))),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, ConfigError> {
        self.deserialize_map(v)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, ConfigError> {
        match &self.node.kind {
            NodeKind::Scalar { value, .. } => {
                let d: StrDeserializer<'_, ConfigError> = value.as_str().into_deserializer();
                v.visit_enum(d).map_err(|e| self.here(e))
            }
            _ => Err(self.here(ConfigError::new(format!(
                "expected one of {}, found {}",
                variants.iter().map(|v| format!("`{v}`")).collect::<Vec<_>>().join(", "),
                self.node.describe()
            )))),
        }
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ConfigError> {
        self.deserialize_str(v)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, ConfigError> {
        v.visit_unit()
    }
}

fn looks_like_float(s: &str) -> bool {
    let body = s.strip_prefix(['-', '+']).unwrap_or(s);
    !body.is_empty()
        && body.chars().all(|c| c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '-' | '+'))
        && body.chars().next().is_some_and(|c| c.is_ascii_digit() || c == '.')
        && s.parse::<f64>().is_ok()
}

struct Seq<'a, I> {
    items: I,
    path: &'a str,
    index: usize,
}

impl<'de, 'a, I: Iterator<Item = &'a Node>> SeqAccess<'de> for Seq<'a, I> {
    type Error = ConfigError;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, ConfigError> {
        let Some(node) = self.items.next() else { return Ok(None) };
        let path = format!("{}[{}]", self.path, self.index);
        self.index += 1;
        let mark = node.mark.clone();
        seed.deserialize(NodeDe { node, path: path.clone() }).map(Some).map_err(|e| e.or_at(&path, mark))
    }
}

struct Map<'a, I> {
    entries: I,
    path: &'a str,
    value: Option<(&'a Node, String)>,
}

impl<'de, 'a, I: Iterator<Item = &'a (Node, Node)>> MapAccess<'de> for Map<'a, I> {
    type Error = ConfigError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, ConfigError> {
        let Some((key, value)) = self.entries.next() else { return Ok(None) };
        let key_text = key.as_str().unwrap_or_default();
        let path = join_key(self.path, key_text);
        let d: StrDeserializer<'_, ConfigError> = key_text.into_deserializer();
        let k = seed.deserialize(d).map_err(|e| e.or_at(&path, key.mark.clone()))?;
        self.value = Some((value, path));
        Ok(Some(k))
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, ConfigError> {
        let (node, path) = self.value.take().expect("serde asks for a value after its key");
        let mark = node.mark.clone();
        seed.deserialize(NodeDe { node, path: path.clone() }).map_err(|e| e.or_at(&path, mark))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::parse_yaml_with_env;
    use crate::units::{ByteSize, HumanDuration};
    use serde::Deserialize;
    use std::collections::BTreeMap;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Out {
        hosts: Vec<String>,
        #[serde(default)]
        port: Option<u16>,
        codec: Codec,
        batch: Option<Batch>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "snake_case")]
    enum Codec {
        Json,
        Text,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Batch {
        size: usize,
        delay: HumanDuration,
        max_bytes: Option<ByteSize>,
    }

    fn load<T: DeserializeOwned>(text: &str) -> Result<T, ConfigError> {
        let n = parse_yaml_with_env(text, "c.yml", &|_| None).unwrap();
        from_node(&n, "out")
    }

    #[test]
    fn reads_typed_values() {
        let o: Out = load("hosts: [a, 'b']\nport: '9200'\ncodec: json\nbatch: {size: 10, delay: 5ms}\n").unwrap();
        assert_eq!(o.hosts, ["a", "b"]);
        assert_eq!(o.port, Some(9200));
        assert_eq!(o.codec, Codec::Json);
        assert_eq!(o.batch.unwrap().delay.0, std::time::Duration::from_millis(5));
    }

    #[test]
    fn unknown_field_names_path_and_line() {
        let e = load::<Out>("hosts: [a]\ncodec: json\nbatch:\n  size: 1\n  delay: 1s\n  sise: 3\n").unwrap_err();
        assert_eq!(e.path, "out.batch.sise");
        assert_eq!(e.mark.as_ref().unwrap().line, 6);
        assert!(e.message.starts_with("unknown field `sise`, expected one of"), "{e}");
    }

    #[test]
    fn wrong_types_name_the_value() {
        let e = load::<Out>("hosts: [a]\ncodec: json\nport: http\n").unwrap_err();
        assert_eq!(e.to_string(), "c.yml:3:7: out.port: expected a whole number from 0 to 65535, found `http`");
        let e = load::<Out>("hosts: {a: 1}\ncodec: json\n").unwrap_err();
        assert_eq!(e.to_string(), "c.yml:1:8: out.hosts: expected a list, found a mapping");
        let e = load::<Out>("hosts: [a, [b]]\ncodec: json\n").unwrap_err();
        assert_eq!(e.path, "out.hosts[1]");
        let e = load::<Out>("hosts: [a]\ncodec: xml\n").unwrap_err();
        assert!(e.to_string().contains("out.codec: unknown variant `xml`, expected `json` or `text`"), "{e}");
        let e = load::<Out>("hosts: [a]\ncodec: json\nbatch: {size: 1, delay: 7}\n").unwrap_err();
        assert!(e.to_string().contains("out.batch.delay: `7` has no unit"), "{e}");
    }

    #[test]
    fn struct_fields_are_named_in_order() {
        assert_eq!(struct_fields::<Batch>(), ["size", "delay", "max_bytes"]);
        assert_eq!(struct_fields::<Out>(), ["hosts", "port", "codec", "batch"]);
        assert!(struct_fields::<String>().is_empty());
        // The message serde itself gives.
        let e = load::<Batch>(
            "size: 1
delay: 1s
sise: 3
",
        )
        .unwrap_err();
        assert_eq!(e.message, unknown_field_message("sise", struct_fields::<Batch>()));
    }

    #[test]
    fn missing_field_points_at_the_mapping() {
        let e = load::<Out>("codec: json\n").unwrap_err();
        assert_eq!(e.message, "missing field `hosts`");
        assert_eq!(e.path, "out");
    }

    #[test]
    fn any_values_are_typed() {
        let m: BTreeMap<String, serde_json_like::V> = load("a: 1\nb: 1.5\nc: true\nd: x\ne: '1'\nf:\n").unwrap();
        assert_eq!(m["a"], serde_json_like::V::I(1));
        assert_eq!(m["b"], serde_json_like::V::F(1.5));
        assert_eq!(m["c"], serde_json_like::V::B(true));
        assert_eq!(m["d"], serde_json_like::V::S("x".into()));
        assert_eq!(m["e"], serde_json_like::V::S("1".into()));
        assert_eq!(m["f"], serde_json_like::V::N);
    }

    mod serde_json_like {
        use serde::Deserialize;
        #[derive(Debug, PartialEq, Deserialize)]
        #[serde(untagged)]
        pub enum V {
            N,
            B(bool),
            I(i64),
            F(f64),
            S(String),
        }
    }
}
