//! Sluice's configuration loader.
//!
//! The YAML text becomes a [`Node`] tree in which every value keeps its line and column, with
//! `${VAR}`, `${VAR:-default}` and `${VAR-default}` substituted in scalars. Typed settings are
//! read from nodes with serde through [`from_node`], whose errors name the key path and the
//! line, e.g. `sluice.yml:12:9: pipelines.web.outputs[1].hosts: unknown field `hosts``. The
//! layout of the top level (pipelines and their components) is walked by hand in [`model`], so
//! that each component's `type`, `id` and `if` are read uniformly and its remaining keys are
//! handed to the component that owns them.
//!
//! ```
//! use sluice_config::{from_node, parse_yaml, ByteSize};
//! #[derive(serde::Deserialize)]
//! #[serde(deny_unknown_fields)]
//! struct Q { max_bytes: ByteSize }
//! let root = parse_yaml("max_bytes: 64MiB\n", "q.yml").unwrap();
//! let q: Q = from_node(&root, "queue").unwrap();
//! assert_eq!(q.max_bytes.0, 64 << 20);
//! let bad = parse_yaml("max_bytes: 64MiB\nmax_bites: 1\n", "q.yml").unwrap();
//! let err = from_node::<Q>(&bad, "queue").err().unwrap();
//! assert!(err.to_string().starts_with("q.yml:2:1: queue.max_bites: unknown field `max_bites`"), "{err}");
//! ```

mod de;
mod env;
mod error;
pub mod link;
pub mod model;
mod node;
mod units;

pub use de::{from_node, struct_fields};
pub use error::{ConfigError, ConfigErrors};
pub use link::{Link, no_links};
pub use node::{Mark, Node, NodeKind, parse_yaml, parse_yaml_with_env};
pub use units::{ByteSize, HumanDuration};
