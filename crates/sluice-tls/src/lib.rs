//! Sluice's one TLS module: every network input, output and the cluster transport read the same
//! `tls:` section ([`TlsConfig`]) and build their rustls configurations here.
//!
//! What it guarantees:
//! - one config shape, read with `sluice_config::from_node` (unknown keys are refused), with
//!   its combinations checked when a configuration is built, naming the key at fault;
//! - the files are read and checked when the configuration is built, not at the first
//!   connection: a missing file, a file without the PEM block wanted, or a key that is not the
//!   certificate's gives an error naming the file ([`TlsError`]);
//! - rustls with the ring provider, passed explicitly (no process-wide default is needed);
//!   TLS 1.2 and 1.3, or 1.3 only;
//! - a client verifies the server against `server_name` or the host it dialled (DNS names and
//!   IP addresses alike) unless `verify: false`;
//! - certificates are re-read on SIGHUP ([`reload_all`]) by every [`ServerTls`] and
//!   [`ClientTls`] still in use; a reload that fails keeps the files loaded before;
//! - failed handshakes are told in one readable line on both ends
//!   ([`describe_handshake_error`]).
//!
//! ```
//! use sluice_config::{from_node, parse_yaml};
//! let root = parse_yaml("cert: node.crt\nclient_auth: requierd\n", "s.yml").unwrap();
//! let err = from_node::<sluice_tls::TlsConfig>(&root, "tls").unwrap_err();
//! assert_eq!(err.path, "tls.client_auth");
//! ```

mod client;
mod component;
mod config;
mod describe;
mod error;
mod load;
mod reload;
mod server;
mod stream;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

#[cfg(test)]
mod tests;

pub use client::{MIN_VERDICT_WINDOW, TlsConnector, confirm_accepted, verdict_window};
pub use component::server_warnings;
pub use config::{ClientAuth, TlsConfig, TlsVersion};
pub use describe::{describe_handshake_error, peer_certificate_subject};
pub use error::TlsError;
pub use reload::{ClientTls, ReloadSummary, ServerTls, reload_all};
pub use stream::ServerStream;

pub use rustls;
pub use tokio_rustls;
