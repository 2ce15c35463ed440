//! The `kafka` input's settings, checked when it is built, and the librdkafka consumer
//! configuration made from them.
//!
//! Everything is checked before anything connects: the connection keys through
//! [`sluice_kafka::Connection`] (TLS files read, SASL), topic patterns compiled, every
//! librdkafka option handed to librdkafka once (so an unknown option or a bad value is a config
//! error naming it), and the keys the input owns — offsets are committed by the input itself,
//! never automatically — refused in `librdkafka_options`.

use std::time::Duration;

use rdkafka::ClientConfig;
use serde::Deserialize;
use sluice_config::model::ComponentSpec;
use sluice_config::{ConfigError, HumanDuration};
use sluice_core::FieldPath;
use sluice_kafka::Connection;

use crate::codec::Codec;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct KafkaInputConfig {
    /// Topic names; an entry starting with `^` is a regular expression.
    pub topics: Vec<String>,
    pub group_id: String,
    #[serde(default)]
    pub auto_offset_reset: OffsetReset,
    #[serde(default)]
    pub codec: KafkaCodec,
    #[serde(default = "default_commit_interval")]
    pub commit_interval: HumanDuration,
    #[serde(default = "default_revoke_timeout")]
    pub revoke_timeout: HumanDuration,
    #[serde(default = "default_topic_field")]
    pub topic_field: Option<FieldPath>,
    #[serde(default = "default_partition_field")]
    pub partition_field: Option<FieldPath>,
    #[serde(default = "default_offset_field")]
    pub offset_field: Option<FieldPath>,
    #[serde(default = "default_key_field")]
    pub key_field: Option<FieldPath>,
    #[serde(default = "default_timestamp_field")]
    pub timestamp_field: Option<FieldPath>,
    #[serde(default = "default_headers_field")]
    pub headers_field: Option<FieldPath>,
}

/// Where a partition without a committed offset for the group starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub(super) enum OffsetReset {
    #[serde(alias = "smallest", alias = "beginning")]
    Earliest,
    /// Kafka's own default, and Logstash's and Vector's.
    #[default]
    #[serde(alias = "largest", alias = "end")]
    Latest,
}

/// How a record's value becomes an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub(super) enum KafkaCodec {
    /// The value as text in `message`.
    #[default]
    #[serde(alias = "lines", alias = "plain")]
    Text,
    /// The value as a JSON object whose fields become the event's; anything else is kept as
    /// text in `message` and tagged `_jsonparsefailure`.
    #[serde(alias = "json_lines")]
    Json,
}

impl KafkaCodec {
    pub(super) fn codec(self) -> Codec {
        match self {
            KafkaCodec::Text => Codec::Lines,
            KafkaCodec::Json => Codec::JsonLines,
        }
    }
}

fn default_commit_interval() -> HumanDuration {
    HumanDuration(Duration::from_secs(1))
}
fn default_revoke_timeout() -> HumanDuration {
    HumanDuration(Duration::from_secs(10))
}
fn field(path: &str) -> Option<FieldPath> {
    FieldPath::parse(path).ok()
}
fn default_topic_field() -> Option<FieldPath> {
    field("/@metadata/kafka/topic")
}
fn default_partition_field() -> Option<FieldPath> {
    field("/@metadata/kafka/partition")
}
fn default_offset_field() -> Option<FieldPath> {
    field("/@metadata/kafka/offset")
}
fn default_key_field() -> Option<FieldPath> {
    field("/@metadata/kafka/key")
}
fn default_timestamp_field() -> Option<FieldPath> {
    field("/@metadata/kafka/timestamp")
}
fn default_headers_field() -> Option<FieldPath> {
    field("/@metadata/kafka/headers")
}

/// The librdkafka keys the input sets itself.
const OWNED: &[&str] = &[
    "group.id",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.commit.interval.ms",
    "auto.offset.reset",
    "enable.partition.eof",
];

/// The settings checked, and the consumer configuration made from them.
/// How long librdkafka waits before fetching again a partition whose local queue was full.
const FETCH_QUEUE_BACKOFF_MS: &str = "10";

/// Reads the input's connection keys and its own.
pub(super) fn read(spec: &ComponentSpec) -> Result<(Connection, KafkaInputConfig), ConfigError> {
    Connection::read(spec)
}

pub(super) fn consumer_config(
    spec: &ComponentSpec,
    connection: &Connection,
    c: &KafkaInputConfig,
) -> Result<ClientConfig, ConfigError> {
    if c.topics.is_empty() {
        return Err(spec.key_error("topics", "needs at least one topic name (or a `^regex` pattern)"));
    }
    for topic in &c.topics {
        if topic.trim().is_empty() || topic.trim() != topic {
            return Err(spec.key_error("topics", format!("`{topic}` is not a topic name")));
        }
        if topic.starts_with('^')
            && let Err(e) = regex::Regex::new(topic)
        {
            return Err(spec.key_error("topics", format!("`{topic}` is not a valid regular expression: {e}")));
        }
    }
    if c.group_id.trim().is_empty() {
        return Err(spec.key_error("group_id", "must not be empty"));
    }
    if c.commit_interval.0 < Duration::from_millis(10) {
        return Err(spec.key_error("commit_interval", "must be at least 10ms"));
    }
    if c.revoke_timeout.0.is_zero() {
        return Err(spec.key_error("revoke_timeout", "must be more than 0"));
    }
    let mut config = connection.client_config(spec, OWNED)?;
    // A member that does not poll for max.poll.interval.ms leaves the group; a revocation
    // waits inside the poll, so it must end well before.
    let max_poll = config.get("max.poll.interval.ms").and_then(|v| v.parse::<u64>().ok()).unwrap_or(300_000);
    if c.revoke_timeout.0 >= Duration::from_millis(max_poll) {
        return Err(spec.key_error(
            "revoke_timeout",
            format!("must be shorter than max.poll.interval.ms ({max_poll} ms), or the member leaves the group while it waits"),
        ));
    }
    config.set("group.id", &c.group_id);
    config.set("enable.auto.commit", "false");
    config.set("enable.auto.offset.store", "false");
    config.set("enable.partition.eof", "false");
    config.set(
        "auto.offset.reset",
        match c.auto_offset_reset {
            OffsetReset::Earliest => "earliest",
            OffsetReset::Latest => "latest",
        },
    );
    // librdkafka stops fetching a partition whose local queue is past `queued.min.messages` and
    // then waits `fetch.queue.backoff.ms` (1 s by default) before it fetches it again. Whenever
    // the fetcher got ahead of the pipeline, that left the input idle for most of a second
    // (bench/kafka.py: 343,000 records/s with the default, 740,000 with 10 ms). A user's value
    // wins.
    if !connection.librdkafka_options.contains_key("fetch.queue.backoff.ms") {
        config.set("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS);
    }
    connection.check(spec, &config)?;
    Ok(config)
}
