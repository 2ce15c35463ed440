//! `kafka` output: each event a record of a topic (a template), with a key and headers from its
//! fields, through librdkafka's idempotent producer.
//!
//! Guarantees:
//! - An event counts as delivered only once the broker acknowledged its record (`acks: all`
//!   by default: every in-sync replica has it). The idempotent producer (on by default) keeps
//!   a partition's records in order and free of duplicates across its own retries.
//! - A record the broker refuses for good (larger than the broker or `message_max_bytes`
//!   allows, an unknown topic with auto-creation off, an invalid record or topic name) is
//!   rejected with the broker's reason: to the dead letter queue when the pipeline has one.
//!   The broker's size limit applies to the batch librdkafka made, so records refused as too
//!   large are sent again one at a time first: only one refused on its own is rejected.
//!   An event whose `topic` template names a field it lacks is rejected before it is sent.
//! - Everything else (a broker down, leaders moving, the local queue full) is retried: the
//!   send waits, which holds the pipeline back, and a broker that is down loses nothing.
//!   Brokers that refuse the credentials or the TLS handshake are retried the same way (the
//!   fix is in the configuration or on the broker), with an error line saying which.
//!   `delivery_timeout` (default: none) bounds it; past it, the events are given up (counted
//!   failed, not dead-lettered).
//!
//! librdkafka batches and compresses records per partition (`linger`, `batch_max_bytes`,
//! `compression`); one `send` hands every event of a worker batch to it at once and waits for
//! all their acknowledgements together. A worker may have `batches_in_flight` batches in
//! `send` at once (in a pipeline that does not keep order), so that enough records are queued
//! to fill librdkafka's batches instead of each batch waiting out `linger` and a round trip on
//! its own. Each batch is still acknowledged only once every one of its records is. Batches of
//! one worker are handed over in the order they were taken, but a retried record may then
//! follow records of a later batch, as it may already follow another worker's.
//!
//! The output's `bytes_out` counts the payloads of the records the broker acknowledged (before
//! librdkafka's compression; keys and headers not counted), as `record_bytes_produced_total`.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::Event;
use sluice_core::figures::{Figure, Publish, Spec, Unit};
use sluice_expr::Template;
use sluice_kafka::LogAs;

use crate::retry::{Backoff, RetryConfig, StallLog};
use crate::{Aborted, Delivery, Output, OutputContext, Rejected};

mod config;
#[cfg(test)]
mod tests;

use config::Codec;

pub(crate) struct KafkaOutput {
    producer: FutureProducer<ProducerLog>,
    topic: Template,
    key: Option<Template>,
    headers: Vec<(String, Template)>,
    codec: Codec,
    retry: RetryConfig,
    stall: StallLog,
    refused_log: StallLog,
    figures: Arc<Figures>,
    bootstrap: String,
    batches_in_flight: usize,
    /// Shared with the producer's [`ProducerLog`].
    sending: Arc<AtomicUsize>,
    ctx: OutputContext,
}

pub(crate) fn build(spec: &ComponentSpec, ctx: OutputContext) -> Result<Arc<dyn Output>, ConfigError> {
    Ok(Arc::new(build_output(spec, ctx)?))
}

pub(crate) fn build_output(spec: &ComponentSpec, ctx: OutputContext) -> Result<KafkaOutput, ConfigError> {
    let (connection, c) = config::read(spec)?;
    let template = |key: &str, src: &str| {
        Template::parse(src).map_err(|e| spec.key_error(key, format!("`{src}` is not a valid template: {e}")))
    };
    if c.topic.is_empty() {
        return Err(spec.key_error("topic", "must not be empty"));
    }
    let topic = template("topic", &c.topic)?;
    let key = c.key.as_deref().map(|k| template("key", k)).transpose()?;
    let mut headers = Vec::with_capacity(c.headers.len());
    for (name, value) in &c.headers {
        headers.push((name.clone(), template("headers", value)?));
    }
    let client = config::producer_config(spec, &connection, &c)?;
    let sending = Arc::new(AtomicUsize::new(0));
    let log = ProducerLog {
        pipeline: ctx.pipeline.clone(),
        id: ctx.id.clone(),
        connection: sluice_kafka::describe(&client),
        logs: StallLog::default(),
        refusals: StallLog::default(),
        errors: StallLog::default(),
        metrics: ctx.metrics.clone(),
        sending: sending.clone(),
    };
    let producer: FutureProducer<ProducerLog> =
        client.create_with_context(log).map_err(|e| spec.error(format!("cannot create the Kafka producer: {e}")))?;
    let figures = Arc::new(Figures::default());
    let _ = ctx.metrics.state.set(figures.clone());
    Ok(KafkaOutput {
        producer,
        topic,
        key,
        headers,
        codec: c.codec,
        retry: c.retry,
        stall: StallLog::for_output(&ctx.metrics),
        refused_log: StallLog::default(),
        figures,
        bootstrap: connection.bootstrap_servers.clone(),
        batches_in_flight: c.batches_in_flight,
        sending,
        ctx,
    })
}

/// librdkafka's logs and errors in the output's name, each kind at most once per 10 s: they
/// repeat at every reconnection, and a refusal (credentials, TLS) gets a line that says what
/// it means, not held back by librdkafka's own lines on it.
pub(crate) struct ProducerLog {
    pipeline: String,
    id: String,
    connection: String,
    logs: StallLog,
    refusals: StallLog,
    errors: StallLog,
    /// The output's metrics, for its state: librdkafka retries inside, so its error reports
    /// are the only sign of a broker down while a batch waits.
    metrics: Arc<sluice_core::metrics::ComponentMetrics>,
    /// Batches in `send`: an error then holds records back (`retrying`); with none, it is only
    /// noted as the last error.
    sending: Arc<AtomicUsize>,
}

/// Counts a batch in `send` for as long as it is there (a cancelled send included).
struct Sending<'a>(&'a AtomicUsize);

impl<'a> Sending<'a> {
    fn new(count: &'a AtomicUsize) -> Sending<'a> {
        count.fetch_add(1, Ordering::Relaxed);
        Sending(count)
    }
}

impl Drop for Sending<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ClientContext for ProducerLog {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        match LogAs::of(level) {
            LogAs::Warning => {
                if let Some(held) = self.logs.failed() {
                    tracing::warn!(pipeline = %self.pipeline, output = %self.id, facility = fac, held_back = held,
                        "librdkafka: {message} (logged at most once per 10 s)");
                }
            }
            LogAs::Info => {
                tracing::info!(pipeline = %self.pipeline, output = %self.id, facility = fac, "librdkafka: {message}")
            }
            LogAs::Debug => {
                tracing::debug!(pipeline = %self.pipeline, output = %self.id, facility = fac, "librdkafka: {message}")
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let message = format!("{error}: {reason}");
        if self.sending.load(Ordering::Relaxed) > 0 {
            self.metrics.output.retrying(&message);
        } else {
            self.metrics.output.note_error(&message);
        }
        if let Some(refusal) = sluice_kafka::refusal(&error, reason) {
            if let Some(held) = self.refusals.failed() {
                tracing::error!(pipeline = %self.pipeline, output = %self.id, error = %error, held_back = held,
                    "kafka output cannot deliver: {refusal} ({}): {reason}; the records wait and are sent again \
                     (librdkafka retries; logged at most once per 10 s)", self.connection);
            }
        } else if let Some(held) = self.errors.failed() {
            tracing::warn!(pipeline = %self.pipeline, output = %self.id, error = %error, held_back = held,
                "kafka output: {reason} (librdkafka retries; logged at most once per 10 s)");
        }
    }
}

/// Whether a record's failure is the record's fault (it would fail again as is).
fn refused_for_good(e: &KafkaError) -> bool {
    let code = match e {
        KafkaError::MessageProduction(code) => *code,
        _ => return false,
    };
    matches!(
        code,
        RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::MessageBatchTooLarge
            | RDKafkaErrorCode::InvalidRecord
            | RDKafkaErrorCode::InvalidTopic
            | RDKafkaErrorCode::UnknownTopic
            | RDKafkaErrorCode::UnknownTopicOrPartition
            | RDKafkaErrorCode::UnknownPartition
            | RDKafkaErrorCode::InvalidMessage
            | RDKafkaErrorCode::InvalidMessageSize
            | RDKafkaErrorCode::BadMessage
    )
}

/// One event's record, encoded.
struct Record<'o> {
    event: usize,
    /// Borrowed from the config when `topic` is constant: no String per record then.
    topic: Cow<'o, str>,
    key: Option<String>,
    payload: Vec<u8>,
    headers: Option<OwnedHeaders>,
    attempts: u32,
    /// Sent on its own after the broker refused its batch as too large.
    alone: bool,
}

impl KafkaOutput {
    fn encode(&self, index: usize, event: &Event) -> Result<Record<'_>, String> {
        if let Some(field) = self.topic.missing_field(event) {
            return Err(format!(
                "the event has no {field}, which `topic: {}` needs; it was not sent",
                self.topic.source()
            ));
        }
        let topic = if self.topic.is_constant() {
            Cow::Borrowed(self.topic.literal_prefix())
        } else {
            Cow::Owned(self.topic.render_string(event))
        };
        // A key whose field is missing is no key: the partitioner spreads such records.
        let key = self.key.as_ref().filter(|k| k.missing_field(event).is_none()).map(|k| k.render_string(event));
        let mut headers: Option<OwnedHeaders> = None;
        for (name, template) in &self.headers {
            if template.missing_field(event).is_some() {
                continue;
            }
            let value = template.render_string(event);
            let h = headers.take().unwrap_or_else(|| OwnedHeaders::new_with_capacity(self.headers.len()));
            headers = Some(h.insert(Header { key: name, value: Some(value.as_bytes()) }));
        }
        let mut payload = Vec::with_capacity(256);
        match self.codec {
            Codec::Json => event.write_json(&mut payload),
            Codec::Text => match event.message() {
                Some(m) => payload.extend_from_slice(m.as_bytes()),
                None => event.write_json(&mut payload),
            },
        }
        Ok(Record { event: index, topic, key, payload, headers, attempts: 0, alone: false })
    }

    /// Hands `record` to librdkafka, waiting while its queue is full. `Err` with a reason when
    /// it is refused at once (too large for `message_max_bytes`, a bad topic name).
    async fn enqueue(
        &self,
        record: &Record<'_>,
    ) -> Result<rdkafka::producer::DeliveryFuture, Result<KafkaError, Aborted>> {
        loop {
            let mut r = FutureRecord::<String, Vec<u8>>::to(record.topic.as_ref()).payload(&record.payload);
            if let Some(key) = &record.key {
                r = r.key(key);
            }
            if let Some(headers) = &record.headers {
                r = r.headers(headers.clone());
            }
            match self.producer.send_result(r) {
                Ok(future) => return Ok(future),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    // librdkafka's own queue is full: the broker is slow or away. Wait a little.
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(5)) => {}
                        _ = self.ctx.abort.cancelled() => return Err(Err(Aborted)),
                    }
                }
                Err((e, _)) => return Err(Ok(e)),
            }
        }
    }
}

#[async_trait]
impl Output for KafkaOutput {
    async fn send(&self, events: &[&Event]) -> Result<Delivery, Aborted> {
        let _sending = Sending::new(&self.sending);
        // Added to `bytes_out` once, however the send ends: records the broker acknowledged
        // were delivered even when shutdown cuts the rest short.
        let mut produced = Tally { counter: &self.ctx.metrics.bytes_out, bytes: 0 };
        let mut rejected = Vec::new();
        let mut pending: Vec<Record<'_>> = Vec::with_capacity(events.len());
        for (i, e) in events.iter().enumerate() {
            match self.encode(i, e) {
                Ok(r) => pending.push(r),
                Err(reason) => {
                    self.figures.refused("missing_field");
                    self.log_refused(&reason);
                    rejected.push(Rejected::refused(i, reason, 1));
                }
            }
        }
        let mut backoff = Backoff::new(self.retry);
        while !pending.is_empty() {
            // Everything is handed over first, then every acknowledgement awaited together.
            let mut in_flight = Vec::with_capacity(pending.len());
            let mut again = Vec::new();
            let mut last_error = String::new();
            for mut record in pending.drain(..) {
                record.attempts += 1;
                match self.enqueue(&record).await {
                    Ok(future) => in_flight.push((record, future)),
                    Err(Err(Aborted)) => return Err(Aborted),
                    Err(Ok(e)) if refused_for_good(&e) => self.refuse(&record, &e, &mut rejected),
                    Err(Ok(e)) => {
                        last_error = e.to_string();
                        again.push(record);
                    }
                }
            }
            let mut alone = Vec::new();
            for (record, future) in in_flight {
                let outcome = tokio::select! {
                    o = future => o,
                    _ = self.ctx.abort.cancelled() => return Err(Aborted),
                };
                match outcome {
                    Ok(Ok(_)) => produced.bytes += self.produced(&record),
                    // The broker's size limit is on the whole batch librdkafka made: a record
                    // refused as too large may only have shared a batch with one that is. Each
                    // is sent again alone to tell which.
                    Ok(Err((e, _))) if too_large(&e) && !record.alone => alone.push(record),
                    Ok(Err((e, _))) if refused_for_good(&e) => self.refuse(&record, &e, &mut rejected),
                    Ok(Err((e, _))) => {
                        last_error = e.to_string();
                        again.push(record);
                    }
                    Err(_canceled) => {
                        last_error = "the producer dropped the record".into();
                        again.push(record);
                    }
                }
            }
            for mut record in alone {
                record.alone = true;
                match self.send_alone(&record).await? {
                    Ok(()) => produced.bytes += self.produced(&record),
                    Err(e) if refused_for_good(&e) => self.refuse(&record, &e, &mut rejected),
                    Err(e) => {
                        last_error = e.to_string();
                        again.push(record);
                    }
                }
            }
            if again.is_empty() {
                if let Some(failures) = self.stall.succeeded() {
                    tracing::info!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, failed_attempts = failures,
                        "kafka output delivers again");
                }
                break;
            }
            let last = backoff.exhausted_after_this();
            if !last {
                self.ctx.metrics.retries.add(1);
                self.figures.retried.fetch_add(again.len() as u64, Ordering::Relaxed);
            }
            if let Some(held_back) = self.stall.retrying(&last_error)
                && !last
            {
                tracing::warn!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, brokers = %self.bootstrap,
                    records = again.len(), error = %last_error, also_failed_since_last_log = held_back,
                    "kafka records not acknowledged; sending them again (the pipeline waits)");
            }
            if !backoff.retry(&self.ctx.abort).await? {
                self.stall.gave_up(&last_error);
                tracing::error!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, records = again.len(),
                    error = %last_error, "kafka output gave up after retry.max_retries; the events are rejected");
                rejected.extend(again.iter().map(|r| Rejected::gave_up(r.event, &last_error, r.attempts)));
                break;
            }
            pending = again;
        }
        rejected.sort_by_key(|r| r.index);
        Ok(Delivery { rejected })
    }

    fn batches_in_flight(&self) -> usize {
        self.batches_in_flight
    }

    async fn close(&self) {
        let producer = self.producer.clone();
        // Records still queued were not acknowledged to anyone: flushing only spares resends.
        let _ = tokio::task::spawn_blocking(move || producer.flush(Duration::from_secs(5))).await;
    }
}

/// The broker found the record's batch too large.
fn too_large(e: &KafkaError) -> bool {
    matches!(
        e,
        KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge | RDKafkaErrorCode::MessageBatchTooLarge)
    )
}

impl KafkaOutput {
    /// Sends one record and waits for its acknowledgement before anything else is handed over,
    /// so that librdkafka puts it in a batch of its own.
    async fn send_alone(&self, record: &Record<'_>) -> Result<Result<(), KafkaError>, Aborted> {
        let future = match self.enqueue(record).await {
            Ok(f) => f,
            Err(Err(Aborted)) => return Err(Aborted),
            Err(Ok(e)) => return Ok(Err(e)),
        };
        let outcome = tokio::select! {
            o = future => o,
            _ = self.ctx.abort.cancelled() => return Err(Aborted),
        };
        Ok(match outcome {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((e, _))) => Err(e),
            Err(_) => Err(KafkaError::Canceled),
        })
    }

    /// Counts an acknowledged record; its payload's bytes.
    fn produced(&self, record: &Record<'_>) -> u64 {
        self.figures.produced.fetch_add(1, Ordering::Relaxed);
        self.figures.bytes.fetch_add(record.payload.len() as u64, Ordering::Relaxed);
        record.payload.len() as u64
    }

    fn refuse(&self, record: &Record<'_>, e: &KafkaError, rejected: &mut Vec<Rejected>) {
        let code = match e {
            KafkaError::MessageProduction(code) => format!("{code:?}"),
            other => format!("{other:?}"),
        };
        self.figures.refused(&code);
        let reason =
            format!("the broker refused the record for topic {} ({} bytes): {e}", record.topic, record.payload.len());
        self.log_refused(&reason);
        rejected.push(Rejected::refused(record.event, reason, record.attempts));
    }

    fn log_refused(&self, reason: &str) {
        if let Some(held_back) = self.refused_log.failed() {
            tracing::warn!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, refused_since_last_log = held_back,
                "{reason} (to the dead letter queue if the pipeline has one; logged at most once per 10 s)");
        }
    }
}

/// Bytes a send delivered, added to the counter when the send ends, however it ends.
struct Tally<'a> {
    counter: &'a sluice_core::metrics::Counter,
    bytes: u64,
}

impl Drop for Tally<'_> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.counter.add(self.bytes);
        }
    }
}

/// The output's own figures.
#[derive(Default)]
pub(crate) struct Figures {
    produced: AtomicU64,
    bytes: AtomicU64,
    retried: AtomicU64,
    refused: parking_lot::Mutex<std::collections::BTreeMap<String, u64>>,
}

impl Figures {
    fn refused(&self, code: &str) {
        *self.refused.lock().entry(code.to_string()).or_default() += 1;
    }
}

impl Publish for Figures {
    fn figures(&self) -> Vec<Figure> {
        const PRODUCED: Spec = Spec::counter("records_produced_total", "Records the broker acknowledged.");
        const BYTES: Spec = Spec::counter(
            "record_bytes_produced_total",
            "Payload bytes of the records the broker acknowledged (before compression).",
        )
        .in_unit(Unit::Bytes);
        const RETRIED: Spec =
            Spec::counter("records_retried_total", "Records sent again after a failure that was not theirs.");
        const REFUSED: Spec = Spec::counter(
            "records_refused_total",
            "Records refused for good, by error (MessageSizeTooLarge, UnknownTopic, ...; missing_field: not sent).",
        );
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut out =
            vec![PRODUCED.value(get(&self.produced)), BYTES.value(get(&self.bytes)), RETRIED.value(get(&self.retried))];
        out.extend(self.refused.lock().iter().map(|(code, n)| REFUSED.labelled(vec![("error", code.clone())], *n)));
        out
    }
}
