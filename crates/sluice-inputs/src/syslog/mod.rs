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
//! - Every setting is checked when the input is built ([`config`]), the `tls:` files included (so
//!   `sluice validate` reports them); a key that belongs to the other `mode` is an error.
//! - Every message read becomes one event; one that parses as neither RFC is kept whole,
//!   tagged `_syslogparsefailure` and counted as failed.
//! - Bounded: messages are at most `max_message_bytes`; TCP connections are at most
//!   `max_connections`; every batch takes room in the node's memory budget before it is
//!   decoded; a full queue stops the reads (TCP: flow control reaches the sender; UDP: the
//!   kernel drops datagrams, and the drops are counted — see [`udp`]).
//! - There are no acknowledgements: syslog senders cannot be told what was delivered.

mod cisco;
mod config;
mod frame;
mod parse;
mod tcp;
#[cfg(test)]
mod tests;
mod udp;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::{Event, FieldPath, Map, Str, Value};
use sluice_tls::ServerTls;

use crate::{Input, InputContext, InputError};
use config::Mode;

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
    let (mode, settings, tls) = config::read(spec)?;
    Ok(Box::new(Syslog { mode, settings, tls }))
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
