//! The interface between inputs and workers.
//!
//! A queue takes batches from inputs and hands batches of at most `max_events` to workers. The
//! memory queue passes the inputs' acknowledgements through to the workers, so an input hears
//! about its events when they are delivered; the persisted queue acknowledges inputs once the
//! batch is durable and gives workers batches that acknowledge its own read position instead.

use std::time::Duration;

use async_trait::async_trait;

use crate::batch::Batch;

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the queue is closed")]
pub struct QueueClosed;

/// A point-in-time view of a queue, for metrics.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct QueueStats {
    pub kind: &'static str,
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

#[derive(Debug, Clone, Default, serde::Serialize)]
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
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct HistogramSnapshot {
    pub buckets: Vec<u64>,
    pub sum: f64,
    pub count: u64,
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
