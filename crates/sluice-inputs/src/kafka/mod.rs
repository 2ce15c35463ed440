//! `kafka` input: records of Kafka topics, read as a member of a consumer group, with offsets
//! committed only for events that reached the ack point.
//!
//! A consumer thread ([`consumer`]) polls librdkafka and hands chunks of records to this
//! input's task, which takes room in the node's memory budget, makes events of them
//! ([`decode`]), gives each partition's share of the batch an acknowledgement registered with
//! the offset tracker ([`offsets`]), and pushes the batch into the pipeline's queue.
//!
//! Guarantees:
//! - At-least-once. An offset is committed only past a contiguous run of records whose events
//!   reached the ack point (durable in a persisted queue, or delivered with a memory queue):
//!   never on receipt. Commits are made every `commit_interval`, when partitions are revoked
//!   (after a wait of at most `revoke_timeout` for their events in flight), and at shutdown.
//!   After a crash, records after the last commit are read again: duplicates, never losses.
//! - A revoked partition's events acknowledged late commit nothing: the partition may belong
//!   to another member by then.
//! - A full pipeline pauses the assigned partitions while the consumer keeps polling, so the
//!   member stays in its group; records already polled are kept and sent first.
//! - Nothing read is dropped: a value that is not valid UTF-8 has U+FFFD in place of its bad
//!   bytes, and with `codec: json` a value that is not a JSON object is kept in `message`,
//!   tagged `_jsonparsefailure` and counted as failed.

mod config;
mod consumer;
mod decode;
mod figures;
mod offsets;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::ClientConfig;
use rdkafka::consumer::BaseConsumer;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::value::now_nanos;
use sluice_core::{AckSet, Batch};
use tokio::sync::{mpsc, oneshot};

use crate::admission;
use crate::codec::{Codec, Decoded};
use crate::{Input, InputContext, InputError};
use consumer::{Chunk, Context, Shared};
use decode::Fields;
use figures::Figures;
use offsets::OffsetTracker;

/// Chunks waiting between the consumer thread and the input's task: enough to keep the task
/// busy, few enough that a full pipeline pauses the consumer soon.
const HANDOFF_CHUNKS: usize = 4;

struct KafkaInput {
    client: ClientConfig,
    topics: Vec<String>,
    group_id: String,
    bootstrap: String,
    codec: Codec,
    fields: Fields,
    commit_interval: Duration,
    revoke_timeout: Duration,
}

pub(crate) fn build(spec: &ComponentSpec) -> Result<Box<dyn Input>, ConfigError> {
    let (connection, c) = config::read(spec)?;
    let client = config::consumer_config(spec, &connection, &c)?;
    Ok(Box::new(KafkaInput {
        client,
        topics: c.topics,
        group_id: c.group_id,
        bootstrap: connection.bootstrap_servers,
        codec: c.codec.codec(),
        fields: Fields {
            topic: c.topic_field,
            partition: c.partition_field,
            offset: c.offset_field,
            key: c.key_field,
            timestamp: c.timestamp_field,
            headers: c.headers_field,
        },
        commit_interval: c.commit_interval.0,
        revoke_timeout: c.revoke_timeout.0,
    }))
}

#[async_trait]
impl Input for KafkaInput {
    async fn run(self: Box<Self>, ctx: InputContext) -> Result<(), InputError> {
        let tracker = OffsetTracker::new();
        let figures = Arc::new(Figures::default());
        let _ = ctx.metrics.state.set(figures.clone());
        let shared = Arc::new(Shared::new(
            tracker.clone(),
            figures.clone(),
            self.revoke_timeout,
            &ctx.pipeline,
            &ctx.id,
            sluice_kafka::describe(&self.client),
        ));
        let consumer: BaseConsumer<Context> = self
            .client
            .create_with_context(Context(shared))
            .map_err(|e| InputError(format!("kafka input cannot create its consumer: {e}")))?;
        let (tx, mut rx) = mpsc::channel::<Chunk>(HANDOFF_CHUNKS);
        let (done_tx, done_rx) = oneshot::channel();
        // Stops the consumer at shutdown, and also when this task ends for another reason.
        let stop = ctx.shutdown.child_token();
        let thread_stop = stop.clone();
        let (topics, fields, interval) = (self.topics.clone(), self.fields.clone(), self.commit_interval);
        std::thread::Builder::new()
            .name(format!("sluice-kafka-{}", ctx.id))
            .spawn(move || {
                let r = consumer::run(consumer, &topics, &fields, interval, tx, &thread_stop);
                let _ = done_tx.send(r);
            })
            .map_err(|e| InputError(format!("kafka input cannot start its consumer thread: {e}")))?;
        tracing::info!(pipeline = %ctx.pipeline, input = %ctx.id, brokers = %self.bootstrap, group_id = %self.group_id,
            topics = %self.topics.join(","), "kafka input started");
        send_chunks(&self, &ctx, &tracker, &figures, &mut rx).await;
        stop.cancel();
        drop(rx);
        let result = done_rx.await.unwrap_or_else(|_| Err("the kafka consumer thread ended unexpectedly".into()));
        tracing::info!(pipeline = %ctx.pipeline, input = %ctx.id,
            consumed = figures.consumed.load(std::sync::atomic::Ordering::Relaxed), "kafka input stopped");
        result.map_err(InputError)
    }
}

/// Turns the consumer's chunks into batches and pushes them, until shutdown or the consumer
/// is gone.
async fn send_chunks(
    input: &KafkaInput,
    ctx: &InputContext,
    tracker: &Arc<OffsetTracker>,
    figures: &Figures,
    rx: &mut mpsc::Receiver<Chunk>,
) {
    loop {
        let chunk = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return,
            c = rx.recv() => match c {
                Some(c) => c,
                None => return,
            },
        };
        let Chunk { mut records, bytes } = chunk;
        // The records' values as the broker gave them (after librdkafka decompressed its
        // batches); keys and headers are not counted.
        ctx.metrics.bytes_in.add(bytes as u64);
        let Some(mut charge) = ctx.reserve(input.fields.estimate(input.codec, records.len(), bytes)).await else {
            return;
        };
        // Each partition's records together, in the order polled (the sort is stable), so
        // that each partition's share of the batch is one acknowledgement.
        records.sort_by(|a, b| (&*a.topic, a.partition).cmp(&(&*b.topic, b.partition)));
        let now = now_nanos();
        let mut events = Vec::with_capacity(records.len());
        let mut acks = AckSet::none();
        let (mut failed, mut skipped, mut sent_bytes) = (0u64, 0u64, 0usize);
        for group in records.chunk_by(|a, b| a.topic == b.topic && a.partition == b.partition && a.epoch == b.epoch) {
            let last = &group[group.len() - 1];
            let key = (last.topic.clone(), last.partition);
            let Some(acker) = tracker.register(&key, last.epoch, group.len(), last.offset + 1) else {
                // Revoked since it was polled: the partition's next owner reads these.
                skipped += group.len() as u64;
                continue;
            };
            for record in group {
                let (event, decoded) = input.fields.decode(input.codec, record, now);
                failed += u64::from(decoded == Decoded::Failed);
                sent_bytes += record.value.len();
                events.push(event);
            }
            acks.append(AckSet::single(acker, group.len()));
        }
        drop(records);
        if failed > 0 {
            ctx.metrics.failed.add(failed);
        }
        if skipped > 0 {
            figures.skipped_revoked.fetch_add(skipped, std::sync::atomic::Ordering::Relaxed);
        }
        if events.is_empty() {
            continue;
        }
        charge.true_up(admission::measure_each(&events, 0));
        if ctx.send(Batch::new(events, acks, sent_bytes).with_memory(charge)).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests;
