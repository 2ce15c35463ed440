//! `syslog` input: RFC 5424, RFC 3164 and Cisco IOS messages over TCP (optionally TLS) or UDP,
//! parsed into fields ([`parse`]).
//!
//! ```yaml
//! inputs:
//!   - {type: syslog, mode: tcp, address: 0.0.0.0:5514}    # framing detected per connection
//!   - {type: syslog, mode: udp, address: 0.0.0.0:5514}
//! ```
//!
//! What it guarantees:
//! - Every setting is checked when the input is built, the `tls:` files included (so
//!   `sluice validate` reports them); a key that belongs to the other `mode` is an error.
//! - Every message read becomes one event; one that parses as neither RFC is kept whole,
//!   tagged `_syslogparsefailure` and counted as failed.
//! - Bounded: messages are at most `max_message_bytes`; TCP connections are at most
//!   `max_connections`; every batch takes room in the node's memory budget before it is
//!   decoded; a full queue stops the reads (TCP: flow control reaches the sender; UDP: the
//!   kernel drops datagrams, and the drops are counted — see [`udp`]).
//! - There are no acknowledgements: syslog senders cannot be told what was delivered.

mod cisco;
mod frame;
mod parse;
mod tcp;
#[cfg(test)]
mod tests;
mod udp;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use sluice_config::model::ComponentSpec;
use sluice_config::{ByteSize, ConfigError, HumanDuration};
use sluice_core::{Event, FieldPath, Map, Str, Value};
use sluice_tls::{ServerTls, TlsConfig};

use crate::tcp::check_address;
use crate::{Input, InputContext, InputError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Mode {
    Tcp,
    Udp,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct SyslogConfig {
    /// `tcp` or `udp`.
    mode: Mode,
    /// `host:port` to listen on.
    address: String,
    /// The longest message taken whole; see the module comment.
    #[serde(default = "default_max_message")]
    max_message_bytes: ByteSize,
    /// Where to put the sender's `ip:port`; absent means nowhere.
    peer_field: Option<FieldPath>,
    /// The IANA zone of times written without an offset (BSD timestamps).
    #[serde(default = "default_timezone")]
    timezone: String,
    // TCP only.
    max_connections: Option<usize>,
    idle_timeout: Option<HumanDuration>,
    tls: Option<TlsConfig>,
    // UDP only.
    receive_buffer_bytes: Option<ByteSize>,
}

fn default_max_message() -> ByteSize {
    ByteSize(64 << 10)
}
fn default_timezone() -> String {
    "UTC".into()
}

const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// The largest `max_message_bytes` accepted.
const MAX_MESSAGE_LIMIT: u64 = 16 << 20;
/// The largest `receive_buffer_bytes` accepted (the kernel caps it lower unless allowed more).
const MAX_RECEIVE_BUFFER: u64 = 1 << 30;

/// What the running input needs, checked.
#[derive(Debug, Clone)]
pub(super) struct Settings {
    address: String,
    max_message_bytes: usize,
    peer_field: Option<FieldPath>,
    parser: parse::Parser,
    max_connections: usize,
    idle_timeout: Duration,
    receive_buffer_bytes: Option<usize>,
}

struct Syslog {
    mode: Mode,
    settings: Settings,
    tls: Option<Arc<ServerTls>>,
}

pub(crate) fn build(spec: &ComponentSpec) -> Result<Box<dyn Input>, ConfigError> {
    let (mode, settings, tls) = settings(spec)?;
    Ok(Box::new(Syslog { mode, settings, tls }))
}

fn settings(spec: &ComponentSpec) -> Result<(Mode, Settings, Option<Arc<ServerTls>>), ConfigError> {
    let config: SyslogConfig = spec.settings()?;
    check_address(&config.address).map_err(|m| spec.key_error("address", m))?;
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
            if config.max_connections == Some(0) {
                return Err(spec.key_error("max_connections", "must be at least 1"));
            }
            tls = ServerTls::for_component(spec, config.tls.as_ref())?;
        }
        Mode::Udp => {
            for (key, set) in
                [("max_connections", config.max_connections.is_some()), ("idle_timeout", config.idle_timeout.is_some())]
            {
                if set {
                    return Err(other_mode(key, "tcp"));
                }
            }
            if config.tls.is_some() {
                return Err(spec.key_error(
                    "tls",
                    "TLS needs `mode: tcp`: syslog over UDP has no TLS (RFC 5425 is TCP only); remove `tls:` or \
                     set `mode: tcp`",
                ));
            }
            if let Some(b) = config.receive_buffer_bytes
                && (b.0 == 0 || b.0 > MAX_RECEIVE_BUFFER)
            {
                return Err(spec.key_error("receive_buffer_bytes", "must be between 1 byte and 1GiB"));
            }
        }
    }
    let settings = Settings {
        address: config.address,
        max_message_bytes: config.max_message_bytes.as_usize(),
        peer_field: config.peer_field,
        parser: parse::Parser::new(zone),
        max_connections: config.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS),
        idle_timeout: config.idle_timeout.map_or(Duration::ZERO, |d| d.0),
        receive_buffer_bytes: config.receive_buffer_bytes.map(|b| b.as_usize()),
    };
    Ok((config.mode, settings, tls))
}

#[async_trait]
impl Input for Syslog {
    async fn run(self: Box<Self>, ctx: InputContext) -> Result<(), InputError> {
        match self.mode {
            Mode::Tcp => {
                let listener = ctx.listen_tcp(&self.settings.address).await?;
                tcp::serve(self.settings, self.tls, listener, ctx).await
            }
            Mode::Udp => {
                let socket = udp::bind(&self.settings, &ctx).await?;
                ctx.metrics.health.running();
                udp::serve(self.settings, socket, ctx).await
            }
        }
    }

    fn listens(&self) -> bool {
        true
    }
}

/// Who sent a read's messages, as the events record it.
#[derive(Debug, Default)]
pub(super) struct Sender {
    /// `ip:port`, when `peer_field` is set.
    peer: Option<Str>,
    /// The subject of the client's TLS certificate, when it sent one.
    tls_subject: Option<Str>,
}

impl Settings {
    /// The event of one message, appended to `events`; true when it failed to parse.
    fn decode(&self, bytes: &[u8], truncated: bool, sender: &Sender, received: i64, events: &mut Vec<Event>) -> bool {
        let (mut event, parsed) = self.parser.parse(bytes, truncated, received);
        if let (Some(path), Some(peer)) = (&self.peer_field, &sender.peer) {
            let _ = event.insert(path, Value::String(peer.clone()));
        }
        if let Some(subject) = &sender.tls_subject {
            let mut tls = Map::with_capacity(1);
            tls.insert("subject", Value::String(subject.clone()));
            event.metadata_mut().insert("tls_peer", Value::Object(tls));
        }
        events.push(event);
        parsed == parse::Parsed::Failed
    }

    /// The memory to reserve before decoding `bytes` bytes holding about `messages` messages:
    /// the text is copied into the events' fields, with the events' own cost.
    fn estimate(bytes: usize, messages: usize) -> usize {
        2 * bytes + messages * parse::typical_event_bytes()
    }
}
