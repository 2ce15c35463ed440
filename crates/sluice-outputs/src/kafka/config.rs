//! The `kafka` output's settings (the connection keys, shared with the input, through
//! [`Connection`]) and the librdkafka producer configuration made from them.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::ClientConfig;
use serde::Deserialize;
use sluice_config::model::ComponentSpec;
use sluice_config::{ByteSize, ConfigError, HumanDuration};
use sluice_kafka::Connection;

use crate::retry::RetryConfig;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaOutputConfig {
    /// Topic template: `%{/field}` and date parts.
    pub topic: String,
    /// Record key template; an event without the field gets no key.
    pub key: Option<String>,
    /// Record headers: name → template; a header whose field is missing is left out.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    pub codec: Codec,
    #[serde(default)]
    pub compression: Compression,
    #[serde(default)]
    pub acks: Acks,
    #[serde(default = "yes")]
    pub idempotence: bool,
    #[serde(default = "default_linger")]
    pub linger: HumanDuration,
    #[serde(default = "default_batch_max_bytes")]
    pub batch_max_bytes: ByteSize,
    #[serde(default = "default_message_max_bytes")]
    pub message_max_bytes: ByteSize,
    /// How long librdkafka keeps trying one record; `0` (the default) without limit.
    #[serde(default = "no_timeout")]
    pub delivery_timeout: HumanDuration,
    #[serde(default)]
    pub retry: RetryConfig,
    /// Worker batches each worker may have in the output at once, waiting for acknowledgements.
    #[serde(default = "default_batches_in_flight")]
    pub batches_in_flight: usize,
}

#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Codec {
    /// The event as one JSON object.
    #[default]
    Json,
    /// The `message` field as is (the event as JSON when it has none).
    Text,
}

#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    #[default]
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
pub enum Acks {
    #[default]
    #[serde(rename = "all")]
    All,
    #[serde(rename = "1")]
    Leader,
    #[serde(rename = "0")]
    None,
}

fn yes() -> bool {
    true
}
fn no_timeout() -> HumanDuration {
    HumanDuration(Duration::ZERO)
}
fn default_linger() -> HumanDuration {
    HumanDuration(Duration::from_millis(5))
}
fn default_batch_max_bytes() -> ByteSize {
    ByteSize(1 << 20)
}
/// With one batch per worker in flight, less than one librdkafka batch is ever queued to a
/// partition and every record waits out `linger`; four fill them at the defaults.
pub const DEFAULT_BATCHES_IN_FLIGHT: usize = 4;
/// Beyond this the records held in flight are only memory, not throughput.
pub const MAX_BATCHES_IN_FLIGHT: usize = 64;

fn default_batches_in_flight() -> usize {
    DEFAULT_BATCHES_IN_FLIGHT
}
fn default_message_max_bytes() -> ByteSize {
    ByteSize(1_000_000)
}

/// The librdkafka keys the output's own settings set.
const OWNED: &[&str] = &[
    "acks",
    "request.required.acks",
    "enable.idempotence",
    "compression.type",
    "compression.codec",
    "linger.ms",
    "queue.buffering.max.ms",
    "batch.size",
    "message.max.bytes",
    "message.timeout.ms",
    "delivery.timeout.ms",
];

/// Reads the output's connection keys and its own.
pub fn read(spec: &ComponentSpec) -> Result<(Connection, KafkaOutputConfig), ConfigError> {
    Connection::read(spec)
}

pub fn producer_config(
    spec: &ComponentSpec,
    connection: &Connection,
    c: &KafkaOutputConfig,
) -> Result<ClientConfig, ConfigError> {
    if c.idempotence && c.acks != Acks::All {
        return Err(spec
            .key_error("acks", "the idempotent producer needs `acks: all`; set `idempotence: false` to use another"));
    }
    if c.message_max_bytes.0 < 1000 || c.message_max_bytes.0 > 1_000_000_000 {
        return Err(spec.key_error("message_max_bytes", "must be between 1000 bytes and 1GB"));
    }
    if c.batch_max_bytes.0 < 1 || c.batch_max_bytes.0 > i32::MAX as u64 {
        return Err(spec.key_error("batch_max_bytes", "must be between 1 byte and 2GiB"));
    }
    if c.batches_in_flight < 1 || c.batches_in_flight > MAX_BATCHES_IN_FLIGHT {
        return Err(spec.key_error("batches_in_flight", format!("must be between 1 and {MAX_BATCHES_IN_FLIGHT}")));
    }
    let mut config = connection.client_config(spec, OWNED)?;
    config.set(
        "acks",
        match c.acks {
            Acks::All => "all",
            Acks::Leader => "1",
            Acks::None => "0",
        },
    );
    config.set("enable.idempotence", if c.idempotence { "true" } else { "false" });
    config.set(
        "compression.type",
        match c.compression {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Snappy => "snappy",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        },
    );
    config.set("linger.ms", c.linger.0.as_millis().to_string());
    config.set("batch.size", c.batch_max_bytes.0.to_string());
    config.set("message.max.bytes", c.message_max_bytes.0.to_string());
    config.set("message.timeout.ms", c.delivery_timeout.0.as_millis().to_string());
    connection.check(spec, &config)?;
    Ok(config)
}
