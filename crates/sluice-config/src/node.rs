//! The YAML document as a tree of nodes that remember where they were written.

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
    let mut builder =
        Builder { file: file.clone(), stack: Vec::new(), anchors: HashMap::new(), root: None, error: None, lookup };
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

enum Open {
    Seq { items: Vec<Node>, mark: Mark, anchor: usize },
    Map { entries: Vec<(Node, Node)>, pending_key: Option<Node>, mark: Mark, anchor: usize },
}

struct Builder<'a> {
    file: Arc<str>,
    stack: Vec<Open>,
    anchors: HashMap<usize, Node>,
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

    fn finish(&mut self, node: Node, anchor: usize) {
        if anchor != 0 {
            self.anchors.insert(anchor, node.clone());
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
                self.finish(Node { kind: NodeKind::Scalar { value, plain }, mark }, anchor);
            }
            Event::SequenceStart(anchor, _) => self.stack.push(Open::Seq { items: Vec::new(), mark, anchor }),
            Event::MappingStart(anchor, _) => {
                self.stack.push(Open::Map { entries: Vec::new(), pending_key: None, mark, anchor })
            }
            Event::SequenceEnd | Event::MappingEnd => match self.stack.pop() {
                Some(Open::Seq { items, mark, anchor }) => {
                    self.finish(Node { kind: NodeKind::Seq(items), mark }, anchor)
                }
                Some(Open::Map { entries, mark, anchor, .. }) => {
                    self.finish(Node { kind: NodeKind::Map(entries), mark }, anchor)
                }
                None => {}
            },
            Event::Alias(id) => match self.anchors.get(&id).cloned() {
                Some(node) => self.finish(node, 0),
                None => self.fail(ConfigError::at("alias to an unknown anchor", "", mark)),
            },
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
    fn aliases() {
        let n = parse_yaml_with_env("a: &x {k: 1}\nb: *x\n", "f.yml", &env).unwrap();
        assert_eq!(n.get("b").unwrap().get("k").unwrap().as_str(), Some("1"));
    }
}
