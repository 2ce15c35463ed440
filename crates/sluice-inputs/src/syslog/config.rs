//! The `syslog` input's settings: the shared listener keys ([`Listener`]) and its own, with their
//! defaults and checks; a key that belongs to the other `mode` is an error, and the `tls:` files
//! are read here (so `sluice validate` reports them).

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use sluice_config::model::ComponentSpec;
use sluice_config::{ByteSize, ConfigError};
use sluice_core::FieldPath;
use sluice_tls::ServerTls;

use super::{Settings, parse};
use crate::listener::Listener;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Mode {
    Tcp,
    Udp,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct SyslogConfig {
    /// `tcp` or `udp`.
    mode: Mode,
    /// The longest message taken whole; see the module comment.
    #[serde(default = "default_max_message")]
    max_message_bytes: ByteSize,
    /// Where to put the sender's `ip:port`; absent means nowhere.
    peer_field: Option<FieldPath>,
    /// The IANA zone of times written without an offset (BSD timestamps).
    #[serde(default = "default_timezone")]
    timezone: String,
    // UDP only.
    receive_buffer_bytes: Option<ByteSize>,
}

fn default_max_message() -> ByteSize {
    ByteSize(64 << 10)
}
fn default_timezone() -> String {
    "UTC".into()
}

/// Syslog senders keep connections open without sending for long spans: never closed for it.
const DEFAULT_IDLE_TIMEOUT: Duration = Duration::ZERO;
/// The largest `max_message_bytes` accepted.
const MAX_MESSAGE_LIMIT: u64 = 16 << 20;
/// The largest `receive_buffer_bytes` accepted (the kernel caps it lower unless allowed more).
const MAX_RECEIVE_BUFFER: u64 = 1 << 30;

/// Reads and checks the input's settings.
pub(super) fn read(spec: &ComponentSpec) -> Result<(Mode, Settings, Option<Arc<ServerTls>>), ConfigError> {
    let (listener, config): (Listener, SyslogConfig) = Listener::read(spec, DEFAULT_IDLE_TIMEOUT)?;
    if config.max_message_bytes.0 == 0 || config.max_message_bytes.0 > MAX_MESSAGE_LIMIT {
        return Err(spec.key_error("max_message_bytes", "must be between 1 byte and 16MiB"));
    }
    let zone = parse::zone(&config.timezone).map_err(|m| spec.key_error("timezone", m))?;
    let other_mode = |key: &str, mode: &str| {
        spec.key_error(
            key,
            format!(
                "`{key}` applies to `mode: {mode}` only; this input has `mode: {}`",
                match config.mode {
                    Mode::Tcp => "tcp",
                    Mode::Udp => "udp",
                }
            ),
        )
    };
    let mut tls = None;
    match config.mode {
        Mode::Tcp => {
            if config.receive_buffer_bytes.is_some() {
                return Err(other_mode("receive_buffer_bytes", "udp"));
            }
            tls = listener.server_tls(spec)?;
        }
        Mode::Udp => {
            match listener.connection_keys_written().first() {
                Some(&"tls") => {
                    return Err(spec.key_error(
                        "tls",
                        "TLS needs `mode: tcp`: syslog over UDP has no TLS (RFC 5425 is TCP only); remove `tls:` \
                         or set `mode: tcp`",
                    ));
                }
                Some(key) => return Err(other_mode(key, "tcp")),
                None => {}
            }
            if let Some(b) = config.receive_buffer_bytes
                && (b.0 == 0 || b.0 > MAX_RECEIVE_BUFFER)
            {
                return Err(spec.key_error("receive_buffer_bytes", "must be between 1 byte and 1GiB"));
            }
        }
    }
    let settings = Settings {
        address: listener.address,
        max_message_bytes: config.max_message_bytes.as_usize(),
        peer_field: config.peer_field,
        parser: parse::Parser::new(zone),
        max_connections: listener.max_connections,
        idle_timeout: listener.idle_timeout,
        receive_buffer_bytes: config.receive_buffer_bytes.map(|b| b.as_usize()),
    };
    Ok((config.mode, settings, tls))
}
