//! The YAML document as a tree of nodes that remember where they were written.
//!
//! Aliases copy their anchor's value, at most `MAX_ALIAS_VALUES` values per file in all, so a
//! small file cannot expand into a tree that exhausts memory; past that the file is refused
//! with an error at the alias.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

use crate::env;
use crate::error::ConfigError;

/// A place in a config file: 1-based line and column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mark {
    pub file: Arc<str>,
    pub line: usize,
    pub column: usize,
}

impl fmt::Display for Mark {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum NodeKind {
    /// A scalar; `plain` is false for quoted and block scalars, which are always strings.
    Scalar {
        value: String,
        plain: bool,
    },
    Seq(Vec<Node>),
    /// Keys are scalars; their order is kept and duplicates are refused at parse time.
    Map(Vec<(Node, Node)>),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub kind: NodeKind,
    pub mark: Mark,
}

impl Node {
    /// True for `~`, `null`, an empty plain value, or nothing at all after `key:`.
    pub fn is_null(&self) -> bool {
        matches!(&self.kind, NodeKind::Scalar { value, plain: true } if matches!(value.as_str(), "" | "~" | "null" | "Null" | "NULL"))
    }

    pub fn as_str(&self) -> Option<&str> {
        match &self.kind {
            NodeKind::Scalar { value, .. } => Some(value),
            _ => None,
        }
    }

    pub fn as_map(&self) -> Option<&[(Node, Node)]> {
        match &self.kind {
            NodeKind::Map(m) => Some(m),
            _ => None,
        }
    }

    pub fn as_seq(&self) -> Option<&[Node]> {
        match &self.kind {
            NodeKind::Seq(s) => Some(s),
            _ => None,
        }
    }

    /// The value under a key of a mapping.
    pub fn get(&self, key: &str) -> Option<&Node> {
        self.as_map()?.iter().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v)
    }

    /// A short name for error messages: "a mapping", "a list", "`abc`".
    pub fn describe(&self) -> String {
        match &self.kind {
            NodeKind::Scalar { value, .. } if self.is_null() && value.is_empty() => "nothing".to_string(),
            NodeKind::Scalar { value, .. } => format!("`{value}`"),
            NodeKind::Seq(_) => "a list".to_string(),
            NodeKind::Map(_) => "a mapping".to_string(),
        }
    }

    /// A mapping node without the given keys (used to hand a component the keys it owns).
    pub fn without_keys(&self, keys: &[&str]) -> Node {
        match &self.kind {
            NodeKind::Map(m) => Node {
                kind: NodeKind::Map(
                    m.iter().filter(|(k, _)| !k.as_str().is_some_and(|k| keys.contains(&k))).cloned().collect(),
                ),
                mark: self.mark.clone(),
            },
            _ => self.clone(),
        }
    }

    /// A mapping node with only the given keys (used to read a block of keys several components
    /// share, written among each one's own).
    pub fn only_keys(&self, keys: &[&str]) -> Node {
        match &self.kind {
            NodeKind::Map(m) => Node {
                kind: NodeKind::Map(
                    m.iter().filter(|(k, _)| k.as_str().is_some_and(|k| keys.contains(&k))).cloned().collect(),
                ),
                mark: self.mark.clone(),
            },
            _ => self.clone(),
        }
    }

    /// An empty mapping at the given place, for optional sections that were left out.
    pub fn empty_map(mark: Mark) -> Node {
        Node { kind: NodeKind::Map(Vec::new()), mark }
    }
}

/// Parses one YAML document, substituting environment variables in scalars.
pub fn parse_yaml(text: &str, file: &str) -> Result<Node, ConfigError> {
    parse_yaml_with_env(text, file, &|name| std::env::var(name).ok())
}

/// As [`parse_yaml`], with `lookup` answering `${VAR}` instead of the process environment
/// (for tests and fuzzing, which need a fixed one).
pub fn parse_yaml_with_env(
    text: &str,
    file: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Node, ConfigError> {
    let file: Arc<str> = Arc::from(file);
    let mut builder = Builder {
        file: file.clone(),
        stack: Vec::new(),
        anchors: HashMap::new(),
        alias_values: 0,
        root: None,
        error: None,
        lookup,
    };
    let mut parser = Parser::new_from_str(text);
    if let Err(e) = parser.load(&mut builder, false) {
        let mark = Mark { file, line: e.marker().line(), column: e.marker().col() + 1 };
        return Err(ConfigError {
            message: format!("invalid YAML: {}", e.info()),
            path: String::new(),
            mark: Some(mark),
        });
    }
    if let Some(e) = builder.error {
        return Err(e);
    }
    Ok(builder
        .root
        .unwrap_or(Node { kind: NodeKind::Map(Vec::new()), mark: Mark { file: builder.file, line: 1, column: 1 } }))
}

/// The most values that aliases may copy into one document. An alias copies its anchor's
/// value, so nested aliases multiply: 250 bytes of YAML can name hundreds of millions of
/// values (the "billion laughs"). Real configs copy a few dozen.
const MAX_ALIAS_VALUES: usize = 100_000;

/// A collection being read; `size` counts the values in it so far, itself included.
enum Open {
    Seq { items: Vec<Node>, mark: Mark, anchor: usize, size: usize },
    Map { entries: Vec<(Node, Node)>, pending_key: Option<Node>, mark: Mark, anchor: usize, size: usize },
}

struct Builder<'a> {
    file: Arc<str>,
    stack: Vec<Open>,
    /// Each anchor's value and how many values it holds.
    anchors: HashMap<usize, (Node, usize)>,
    /// Values copied by aliases so far.
    alias_values: usize,
    root: Option<Node>,
    error: Option<ConfigError>,
    lookup: &'a dyn Fn(&str) -> Option<String>,
}

impl Builder<'_> {
    fn mark(&self, m: Marker) -> Mark {
        Mark { file: self.file.clone(), line: m.line(), column: m.col() + 1 }
    }

    fn fail(&mut self, e: ConfigError) {
        if self.error.is_none() {
            self.error = Some(e);
        }
    }

    /// Adds a finished value of `size` values to the collection being read.
    fn finish(&mut self, node: Node, anchor: usize, size: usize) {
        if anchor != 0 {
            self.anchors.insert(anchor, (node.clone(), size));
        }
        if let Some(Open::Seq { size: total, .. } | Open::Map { size: total, .. }) = self.stack.last_mut() {
            *total += size;
        }
        match self.stack.last_mut() {
            None => {
                if self.root.is_none() {
                    self.root = Some(node);
                }
            }
            Some(Open::Seq { items, .. }) => items.push(node),
            Some(Open::Map { entries, pending_key, .. }) => match pending_key.take() {
                None => {
                    if !matches!(node.kind, NodeKind::Scalar { .. }) {
                        let e = ConfigError::at("mapping keys must be plain text", "", node.mark.clone());
                        self.fail(e);
                        return;
                    }
                    if let Some((first, _)) = entries.iter().find(|(k, _)| k.as_str() == node.as_str()) {
                        let msg = format!(
                            "duplicate key `{}` (first written at line {})",
                            node.as_str().unwrap_or_default(),
                            first.mark.line
                        );
                        let e = ConfigError::at(msg, "", node.mark.clone());
                        self.fail(e);
                        return;
                    }
                    *pending_key = Some(node);
                }
                Some(key) => entries.push((key, node)),
            },
        }
    }
}

impl MarkedEventReceiver for Builder<'_> {
    fn on_event(&mut self, ev: Event, marker: Marker) {
        if self.error.is_some() {
            return;
        }
        let mark = self.mark(marker);
        match ev {
            Event::Scalar(value, style, anchor, _tag) => {
                let value = match env::substitute(&value, self.lookup) {
                    Ok(v) => v,
                    Err(msg) => {
                        self.fail(ConfigError::at(msg, "", mark));
                        return;
                    }
                };
                let plain = style == TScalarStyle::Plain;
                self.finish(Node { kind: NodeKind::Scalar { value, plain }, mark }, anchor, 1);
            }
            Event::SequenceStart(anchor, _) => self.stack.push(Open::Seq { items: Vec::new(), mark, anchor, size: 1 }),
            Event::MappingStart(anchor, _) => {
                self.stack.push(Open::Map { entries: Vec::new(), pending_key: None, mark, anchor, size: 1 })
            }
            Event::SequenceEnd | Event::MappingEnd => match self.stack.pop() {
                Some(Open::Seq { items, mark, anchor, size }) => {
                    self.finish(Node { kind: NodeKind::Seq(items), mark }, anchor, size)
                }
                Some(Open::Map { entries, mark, anchor, size, .. }) => {
                    self.finish(Node { kind: NodeKind::Map(entries), mark }, anchor, size)
                }
                None => {}
            },
            Event::Alias(id) => {
                let Some(&(_, size)) = self.anchors.get(&id) else {
                    self.fail(ConfigError::at("alias to an unknown anchor", "", mark));
                    return;
                };
                // Counted before the copy is made, so a bomb is refused without building it.
                self.alias_values = self.alias_values.saturating_add(size);
                if self.alias_values > MAX_ALIAS_VALUES {
                    let msg = format!(
                        "aliases copy more than {MAX_ALIAS_VALUES} values into this file (nested aliases multiply); \
                         write the repeated parts out or use fewer levels of aliases"
                    );
                    self.fail(ConfigError::at(msg, "", mark));
                    return;
                }
                let node = self.anchors[&id].0.clone();
                self.finish(node, 0, size);
            }
            Event::Nothing | Event::StreamStart | Event::StreamEnd | Event::DocumentStart | Event::DocumentEnd => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "PORT").then(|| "8080".to_string())
    }

    #[test]
    fn marks_and_structure() {
        let n = parse_yaml_with_env("a: 1\nb:\n  - x\n  - {c: 'q'}\n", "f.yml", &env).unwrap();
        let b = n.get("b").unwrap();
        assert_eq!(b.as_seq().unwrap().len(), 2);
        let c = b.as_seq().unwrap()[1].get("c").unwrap();
        assert_eq!(c.kind, NodeKind::Scalar { value: "q".into(), plain: false });
        assert_eq!((c.mark.line, c.mark.column), (4, 9));
        assert_eq!(n.get("a").unwrap().mark.line, 1);
    }

    #[test]
    fn env_substitution_and_errors() {
        let n = parse_yaml_with_env("port: ${PORT}\n", "f.yml", &env).unwrap();
        assert_eq!(n.get("port").unwrap().as_str(), Some("8080"));
        let e = parse_yaml_with_env("a: 1\nhost: ${NOPE}\n", "f.yml", &env).unwrap_err();
        assert_eq!(e.mark.as_ref().unwrap().line, 2);
        assert!(e.message.contains("`NOPE` is not set"));
    }

    #[test]
    fn duplicate_keys_are_errors() {
        let e = parse_yaml_with_env("a: 1\nb: 2\na: 3\n", "f.yml", &env).unwrap_err();
        assert!(e.to_string().contains("f.yml:3:1: duplicate key `a` (first written at line 1)"), "{e}");
    }

    #[test]
    fn syntax_errors_have_a_place() {
        let e = parse_yaml_with_env("a: [1, 2\nb: 3\n", "f.yml", &env).unwrap_err();
        assert!(e.to_string().starts_with("f.yml:"), "{e}");
        assert!(e.message.starts_with("invalid YAML"));
    }

    #[test]
    fn aliases_that_expand_without_bound_are_refused() {
        // Nine levels of nine aliases each: 9^9 (387 million) scalars from 250 bytes of text.
        let mut text = String::from("l0: &l0 [x, x, x, x, x, x, x, x, x]\n");
        for level in 1..=9 {
            let prev = format!("*l{}", level - 1);
            text.push_str(&format!("l{level}: &l{level} [{}]\n", [prev.as_str(); 9].join(", ")));
        }
        let e = parse_yaml_with_env(&text, "f.yml", &env).unwrap_err();
        assert!(e.message.contains("aliases"), "{e}");
        assert!(e.to_string().starts_with("f.yml:"), "{e}");
        // A reasonable reuse of anchors still loads.
        let mut text = String::from("l0: &l0 [x, x, x]\n");
        for level in 1..=4 {
            text.push_str(&format!("l{level}: &l{level} [*l{0}, *l{0}, *l{0}]\n", level - 1));
        }
        let n = parse_yaml_with_env(&text, "f.yml", &env).unwrap();
        assert_eq!(n.get("l4").unwrap().as_seq().unwrap().len(), 3);
    }

    #[test]
    fn deep_nesting_is_an_error_not_a_crash() {
        for (open, close) in [("[", "]"), ("{a: ", "}")] {
            let depth = 200_000;
            let text = format!("{}1{}", open.repeat(depth), close.repeat(depth));
            let e = parse_yaml_with_env(&text, "f.yml", &env).unwrap_err();
            assert!(e.to_string().starts_with("f.yml:"), "{e}");
        }
    }

    #[test]
    fn aliases() {
        let n = parse_yaml_with_env("a: &x {k: 1}\nb: *x\n", "f.yml", &env).unwrap();
        assert_eq!(n.get("b").unwrap().get("k").unwrap().as_str(), Some("1"));
    }
}
