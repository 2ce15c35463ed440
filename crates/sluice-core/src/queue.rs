//! The interface between inputs and workers.
//!
//! A queue takes batches from inputs and hands batches of at most `max_events` to workers. The
//! memory queue passes the inputs' acknowledgements through to the workers, so an input hears
//! about its events when they are delivered; the persisted queue acknowledges inputs once the
//! batch is durable and gives workers batches that acknowledge its own read position instead.

use std::time::Duration;

use async_trait::async_trait;

use crate::batch::Batch;
use crate::exposition::{DescriptorEncoder, Labels, counter, gauge, histogram_snapshots};

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the queue is closed")]
pub struct QueueClosed;

/// `memory` or `persisted`. An alias, so that serde's derive does not take the field for one
/// borrowed from the document it reads.
pub type QueueKind = &'static str;

/// A point-in-time view of a queue, for metrics.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct QueueStats {
    /// `memory` or `persisted`.
    #[serde(deserialize_with = "queue_kind")]
    pub kind: QueueKind,
    pub events: u64,
    pub bytes: u64,
    pub max_events: u64,
    pub max_bytes: u64,
    /// Total time producers spent blocked because the queue was full.
    pub blocked_nanos: u64,
    /// Persisted queues: one entry per shard.
    pub shards: Vec<ShardStats>,
    /// Persisted queues: fdatasync calls so far.
    pub fsyncs: u64,
    /// Persisted queues: fdatasync calls that failed (what they covered was not acknowledged).
    pub fsync_failures: u64,
    /// Persisted queues: time from write to durable, per group commit.
    pub commit_latency: Option<HistogramSnapshot>,
    /// Persisted queues: damaged frames found and skipped.
    pub corrupt_frames: u64,
    /// Persisted queues: events accepted but never stored (unencodable, or a full disk at shutdown).
    pub unstored: u64,
    /// Persisted queues: time writers waited on the disk (full, or failing).
    pub stalled_nanos: u64,
    /// Persisted queues: events handed to the workers straight from memory.
    pub events_from_memory: u64,
    /// Persisted queues: events read back from the segments.
    pub events_read_back: u64,
    /// Persisted queues: frame bytes read back from the segments.
    pub bytes_read_back: u64,
    /// Persisted queues: events the workers finished that no durable checkpoint records yet,
    /// i.e. what a restart right now would deliver again (an upper bound).
    pub checkpoint_lag_events: u64,
}

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ShardStats {
    pub shard: u32,
    pub events: u64,
    pub bytes: u64,
    pub segments: u64,
    /// Why the shard's writer is waiting (e.g. "disk full"), if it is.
    pub stalled: Option<String>,
}

/// Cumulative bucket counts (upper bounds in [`crate::metrics::LATENCY_BUCKETS`], then +Inf),
/// sum in seconds, and count.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct HistogramSnapshot {
    pub buckets: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

/// A queue's kind read back from `/stats`: one of the kinds there are, else `unknown`.
fn queue_kind<'de, D: serde::Deserializer<'de>>(d: D) -> Result<&'static str, D::Error> {
    let kind = <std::borrow::Cow<'de, str> as serde::Deserialize>::deserialize(d)?;
    Ok(["memory", "persisted"].into_iter().find(|k| *k == kind).unwrap_or("unknown"))
}

impl QueueStats {
    /// The `sluice_queue_*` families, one series per pipeline (and shard); a persisted queue's
    /// own only when there is one.
    pub fn encode(out: &mut DescriptorEncoder<'_>, queues: &[(Labels, &QueueStats)]) -> std::fmt::Result {
        type PickQ = fn(&QueueStats) -> u64;
        let queue_gauges: [(&str, &str, PickQ); 4] = [
            ("sluice_queue_events", "Events waiting in the queue.", |s| s.events),
            ("sluice_queue_bytes", "Bytes waiting in the queue.", |s| s.bytes),
            ("sluice_queue_max_events", "Queue capacity in events.", |s| s.max_events),
            ("sluice_queue_max_bytes", "Queue capacity in bytes.", |s| s.max_bytes),
        ];
        for (name, help, pick) in queue_gauges {
            gauge(out, name, help, queues.iter().map(|(l, s)| (l.clone(), pick(s))))?;
        }
        counter(
            out,
            "sluice_queue_blocked_seconds_total",
            "Time inputs spent waiting because the queue was full (backpressure), waits in progress included.",
            queues.iter().map(|(l, s)| (l.clone(), s.blocked_nanos as f64 / 1e9)),
        )?;
        let persisted: Vec<&(Labels, &QueueStats)> = queues.iter().filter(|(_, s)| s.kind == "persisted").collect();
        if persisted.is_empty() {
            return Ok(());
        }
        let shards = || {
            persisted.iter().flat_map(|(l, s)| {
                s.shards.iter().map(move |sh| {
                    let mut labels = l.clone();
                    labels.push(("shard", sh.shard.to_string()));
                    (labels, sh)
                })
            })
        };
        gauge(
            out,
            "sluice_queue_shard_bytes",
            "Unacknowledged bytes per shard of a persisted queue.",
            shards().map(|(l, sh)| (l, sh.bytes)),
        )?;
        gauge(
            out,
            "sluice_queue_shard_events",
            "Unacknowledged events per shard of a persisted queue.",
            shards().map(|(l, sh)| (l, sh.events)),
        )?;
        let queue_counters: [(&str, &str, PickQ); 7] = [
            ("sluice_queue_fsyncs_total", "fdatasync calls of a persisted queue.", |s| s.fsyncs),
            (
                "sluice_queue_fsync_failures_total",
                "fdatasync calls of a persisted queue that failed; with sync: commit, the events they covered were \
                 not acknowledged.",
                |s| s.fsync_failures,
            ),
            ("sluice_queue_corrupt_frames_total", "Damaged frames a persisted queue found and skipped.", |s| {
                s.corrupt_frames
            }),
            (
                "sluice_queue_unstored_events_total",
                "Events a persisted queue accepted but could not store (unencodable, or a full disk at shutdown).",
                |s| s.unstored,
            ),
            (
                "sluice_queue_events_from_memory_total",
                "Events a persisted queue handed to the workers from memory, as they were written.",
                |s| s.events_from_memory,
            ),
            (
                "sluice_queue_events_read_back_total",
                "Events a persisted queue read back from its segments (beyond memory_bytes, or after a restart).",
                |s| s.events_read_back,
            ),
            ("sluice_queue_read_back_bytes_total", "Frame bytes a persisted queue read back from its segments.", |s| {
                s.bytes_read_back
            }),
        ];
        for (name, help, pick) in queue_counters {
            counter(out, name, help, persisted.iter().map(|(l, s)| (l.clone(), pick(s))))?;
        }
        gauge(
            out,
            "sluice_queue_checkpoint_lag_events",
            "Events the workers finished that no durable checkpoint of a persisted queue records yet: what a \
             restart now would deliver again.",
            persisted.iter().map(|(l, s)| (l.clone(), s.checkpoint_lag_events)),
        )?;
        counter(
            out,
            "sluice_queue_stalled_seconds_total",
            "Time a persisted queue's writers waited on the disk (full or failing).",
            persisted.iter().map(|(l, s)| (l.clone(), s.stalled_nanos as f64 / 1e9)),
        )?;
        histogram_snapshots(
            out,
            "sluice_queue_commit_duration_seconds",
            "Time from a group's write to its fdatasync returning.",
            persisted.iter().filter_map(|(l, s)| Some((l.clone(), s.commit_latency.clone()?))),
        )
    }
}

#[async_trait]
pub trait Queue: Send + Sync {
    /// Opens what the queue needs (files, recovery) before anything is pushed or popped.
    async fn start(&self) -> Result<(), String> {
        Ok(())
    }

    /// Adds a batch, waiting while the queue is full. Fails only once the queue is closed.
    async fn push(&self, batch: Batch) -> Result<(), QueueClosed>;

    /// Takes up to `max_events`, waiting up to `delay` for the batch to fill once at least one
    /// event is there. Returns `None` when the queue is closed and empty.
    async fn pop(&self, max_events: usize, delay: Duration) -> Option<Batch>;

    /// Every input has stopped: no push will come, so a pop no longer waits for its batch to
    /// fill (a drain would otherwise wait `delay` for the last, partial batch).
    fn inputs_ended(&self) {}

    /// Refuses further pushes. A memory queue's pops drain what is left, then return `None`;
    /// a persistent queue's pops return `None` at once (what is left stays for the next start).
    fn close(&self);

    /// After the workers have stopped: flushes and releases the queue (a persistent queue
    /// writes what is pending and its checkpoints here).
    async fn shutdown(&self) {
        self.close();
    }

    /// True when events left in the queue at shutdown survive a restart.
    fn persistent(&self) -> bool {
        false
    }

    fn stats(&self) -> QueueStats;
}
