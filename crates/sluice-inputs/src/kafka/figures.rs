//! The `kafka` input's own figures at `/metrics` (`sluice_component_<name>`) and `/stats`.
//!
//! Counters are atomics updated by the consumer thread and its callbacks; the per-partition
//! committed offsets and lag (the partition's end offset, as librdkafka last learnt it from a
//! fetch, minus the committed offset) are refreshed at every `commit_interval`, for the
//! partitions this member owns only.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use sluice_core::figures::{Figure, Publish, Spec};

use super::offsets::PartitionKey;

#[derive(Default)]
pub(super) struct Figures {
    pub consumed: AtomicU64,
    pub skipped_revoked: AtomicU64,
    pub commits: AtomicU64,
    pub commit_failures: AtomicU64,
    pub rebalances: AtomicU64,
    pub revoke_timeouts: AtomicU64,
    pub pauses: AtomicU64,
    pub paused: AtomicU64,
    pub assigned: AtomicU64,
    partitions: Mutex<BTreeMap<(String, i32), Offsets>>,
}

/// What is known of one owned partition's offsets.
#[derive(Default)]
struct Offsets {
    committed: Option<i64>,
    /// The partition's end offset, as last fetched.
    high: Option<i64>,
}

impl Figures {
    pub(super) fn set_committed(&self, (topic, partition): &PartitionKey, offset: i64) {
        self.partitions.lock().entry((topic.to_string(), *partition)).or_default().committed = Some(offset);
    }

    /// The end offsets of the partitions owned now.
    pub(super) fn set_high_watermarks(&self, highs: BTreeMap<(String, i32), i64>) {
        let mut p = self.partitions.lock();
        for (key, high) in &highs {
            p.entry(key.clone()).or_default().high = Some(*high);
        }
    }

    pub(super) fn forget(&self, keys: &[PartitionKey]) {
        let mut p = self.partitions.lock();
        for (topic, partition) in keys {
            p.remove(&(topic.to_string(), *partition));
        }
    }
}

impl Publish for Figures {
    fn figures(&self) -> Vec<Figure> {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let counter = |name, help, value| Spec::counter(name, help).value(value);
        let gauge = |name, help, value| Spec::gauge(name, help).value(value);
        let mut out = vec![
            counter("records_consumed_total", "Records polled from Kafka.", get(&self.consumed)),
            counter(
                "records_skipped_revoked_total",
                "Records polled but not sent because their partition was revoked first (its next owner reads them).",
                get(&self.skipped_revoked),
            ),
            counter("offset_commits_total", "Offset commits the group coordinator accepted.", get(&self.commits)),
            counter(
                "offset_commit_failures_total",
                "Offset commits that failed (made again at the next commit_interval).",
                get(&self.commit_failures),
            ),
            counter("rebalances_total", "Partition assignments and revocations.", get(&self.rebalances)),
            counter(
                "revoke_timeouts_total",
                "Revocations (or shutdowns) whose events in flight were not all acknowledged within revoke_timeout.",
                get(&self.revoke_timeouts),
            ),
            counter("pauses_total", "Times consumption was paused because the pipeline was full.", get(&self.pauses)),
            gauge("paused", "1 while consumption is paused because the pipeline is full.", get(&self.paused)),
            gauge("partitions_assigned", "Partitions this member owns.", get(&self.assigned)),
        ];
        const COMMITTED: Spec =
            Spec::gauge("committed_offset", "The offset last committed for the partition (the next record to read).");
        const LAG: Spec =
            Spec::gauge("lag", "Records of the partition after the committed offset (its end offset as last fetched).");
        let p = self.partitions.lock();
        for ((topic, partition), Offsets { committed, high }) in p.iter() {
            let labels = vec![("topic", topic.clone()), ("partition", partition.to_string())];
            if let Some(c) = committed {
                out.push(COMMITTED.labelled(labels.clone(), (*c).max(0) as u64));
            }
            if let (Some(c), Some(h)) = (committed, high) {
                out.push(LAG.labelled(labels, (h - c).max(0) as u64));
            }
        }
        out
    }
}
