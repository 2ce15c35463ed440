//! Which offsets the `kafka` input may commit: per partition, the end of the contiguous run of
//! records that reached the ack point.
//!
//! Every piece of a partition sent to the pipeline (one or more records, in offset order) gets
//! a sequence number and the offset just past its last record. Pieces are acknowledged in any
//! order (several workers, queue shards), but a partition's committable offset only moves to the
//! end of the longest prefix of pieces that are all acknowledged: a piece still in flight holds
//! back every later one, and a piece that comes back abandoned (the pipeline stopped before
//! handling it) holds them back for good, so its records are read again by whoever consumes the
//! partition next.
//!
//! Guarantees:
//! - Nothing is committable on receipt: only acknowledged records count.
//! - Ownership is checked: each assignment of a partition gets a new epoch. A piece is accepted
//!   only for the epoch its records were polled in and only while the partition is not being
//!   given up; an acknowledgement for an earlier epoch, or for a partition this member gave up,
//!   changes nothing. So events of a revoked partition acknowledged late never commit an
//!   offset for a partition another member now owns.
//! - Revocation can wait (bounded) until the in-flight pieces of the partitions given up are
//!   settled (acknowledged, or stuck behind an abandoned piece), then take their offsets.
//!
//! The acknowledgement path takes one short lock and records the offset in memory; the commits
//! themselves are made by the consumer thread.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::{Condvar, Mutex};
use sluice_core::Acker;
use sluice_core::ack::AckOutcome;

/// A topic and partition.
pub(crate) type PartitionKey = (Arc<str>, i32);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    Pending,
    Acked,
    Abandoned,
}

struct Partition {
    epoch: u64,
    /// Sequence number of `slots[0]`.
    base: u64,
    /// `(offset after the piece's last record, state)` for every piece not yet passed.
    slots: VecDeque<(i64, Slot)>,
    /// The offset to commit (the next record to read) once the acknowledged prefix moved.
    committable: Option<i64>,
    /// The highest offset a commit was confirmed for (or handed to a synchronous commit).
    confirmed: Option<i64>,
    /// Being given up (revoked, or shutdown): no new pieces.
    closing: bool,
}

impl Partition {
    fn new(epoch: u64) -> Partition {
        Partition { epoch, base: 0, slots: VecDeque::new(), committable: None, confirmed: None, closing: false }
    }

    /// Nothing more can move the committable offset: no piece in flight, or the first one not
    /// passed was abandoned.
    fn settled(&self) -> bool {
        matches!(self.slots.front(), None | Some((_, Slot::Abandoned)))
    }

    fn in_flight(&self) -> usize {
        self.slots.iter().filter(|(_, s)| *s == Slot::Pending).count()
    }

    /// The committable offset if it is ahead of the confirmed one.
    fn ahead(&self) -> Option<i64> {
        self.committable.filter(|c| self.confirmed.is_none_or(|d| *c > d))
    }
}

#[derive(Default)]
struct State {
    partitions: HashMap<PartitionKey, Partition>,
    next_epoch: u64,
}

/// The input's offsets, shared by the consumer thread, the task that sends batches and the
/// acknowledgement callbacks.
pub(crate) struct OffsetTracker {
    state: Mutex<State>,
    settled: Condvar,
    /// Bumped at every change of assignment, so the consumer thread knows to read the epochs
    /// again.
    version: AtomicU64,
}

impl OffsetTracker {
    pub(crate) fn new() -> Arc<OffsetTracker> {
        Arc::new(OffsetTracker {
            state: Mutex::new(State { partitions: HashMap::new(), next_epoch: 1 }),
            settled: Condvar::new(),
            version: AtomicU64::new(0),
        })
    }

    pub(crate) fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Starts tracking newly assigned partitions, each with a new epoch (a partition assigned
    /// again starts afresh: what its earlier assignment left in flight no longer counts).
    pub(crate) fn assign(&self, keys: impl IntoIterator<Item = PartitionKey>) {
        let mut s = self.state.lock();
        for key in keys {
            let epoch = s.next_epoch;
            s.next_epoch += 1;
            s.partitions.insert(key, Partition::new(epoch));
        }
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    /// The epoch of every partition owned now.
    pub(crate) fn epochs(&self) -> HashMap<PartitionKey, u64> {
        let s = self.state.lock();
        s.partitions.iter().filter(|(_, p)| !p.closing).map(|(k, p)| (k.clone(), p.epoch)).collect()
    }

    /// Partitions owned now.
    pub(crate) fn owned(&self) -> Vec<PartitionKey> {
        let s = self.state.lock();
        s.partitions.keys().cloned().collect()
    }

    /// An acker for a piece of `count` events of `key` polled in `epoch`, whose last record is
    /// just before `next_offset`; `None` when the partition is no longer owned in that epoch
    /// (revoked, being revoked, or assigned again since): the records are then not to be sent.
    pub(crate) fn register(
        self: &Arc<Self>,
        key: &PartitionKey,
        epoch: u64,
        count: usize,
        next_offset: i64,
    ) -> Option<Acker> {
        let seq = {
            let mut s = self.state.lock();
            let p = s.partitions.get_mut(key).filter(|p| p.epoch == epoch && !p.closing)?;
            p.slots.push_back((next_offset, Slot::Pending));
            p.base + p.slots.len() as u64 - 1
        };
        let this = self.clone();
        let key = key.clone();
        Some(Acker::new(count, move |outcome| this.complete(&key, epoch, seq, outcome)))
    }

    fn complete(&self, key: &PartitionKey, epoch: u64, seq: u64, outcome: AckOutcome) {
        let mut s = self.state.lock();
        let Some(p) = s.partitions.get_mut(key).filter(|p| p.epoch == epoch) else { return };
        let Some(index) = seq.checked_sub(p.base) else { return };
        if let Some(slot) = p.slots.get_mut(index as usize) {
            slot.1 = if outcome == AckOutcome::Handled { Slot::Acked } else { Slot::Abandoned };
        }
        while let Some(&(end, Slot::Acked)) = p.slots.front() {
            p.committable = Some(end);
            p.slots.pop_front();
            p.base += 1;
        }
        let closing = p.closing && p.settled();
        drop(s);
        if closing {
            self.settled.notify_all();
        }
    }

    /// Offsets to commit now: each owned partition whose acknowledged prefix moved past what was
    /// last confirmed.
    pub(crate) fn to_commit(&self) -> Vec<(PartitionKey, i64)> {
        let s = self.state.lock();
        s.partitions.iter().filter_map(|(k, p)| Some((k.clone(), p.ahead()?))).collect()
    }

    /// A commit of `offset` for `key` succeeded; false when the partition is not owned (any
    /// more).
    pub(crate) fn confirm(&self, key: &PartitionKey, offset: i64) -> bool {
        let mut s = self.state.lock();
        match s.partitions.get_mut(key) {
            Some(p) => {
                p.confirmed = Some(p.confirmed.map_or(offset, |c| c.max(offset)));
                true
            }
            None => false,
        }
    }

    /// Starts giving up `keys`: no new pieces are accepted for them.
    pub(crate) fn close(&self, keys: &[PartitionKey]) {
        let mut s = self.state.lock();
        for k in keys {
            if let Some(p) = s.partitions.get_mut(k) {
                p.closing = true;
            }
        }
        self.version.fetch_add(1, Ordering::AcqRel);
    }

    /// Waits until every partition of `keys` is settled, or `deadline`; the number of batch
    /// parts (runs of one partition's records in one batch) still in flight then (0 when all
    /// settled).
    pub(crate) fn wait_settled(&self, keys: &[PartitionKey], deadline: Instant) -> usize {
        let mut s = self.state.lock();
        loop {
            let unsettled: usize = keys
                .iter()
                .filter_map(|k| s.partitions.get(k))
                .filter(|p| !p.settled())
                .map(Partition::in_flight)
                .sum();
            if unsettled == 0 || self.settled.wait_until(&mut s, deadline).timed_out() {
                return keys.iter().filter_map(|k| s.partitions.get(k)).map(Partition::in_flight).sum();
            }
        }
    }

    /// Stops tracking `keys`; the offsets still to commit for them (to commit synchronously
    /// before they are released).
    pub(crate) fn release(&self, keys: &[PartitionKey]) -> Vec<(PartitionKey, i64)> {
        let mut s = self.state.lock();
        let mut out = Vec::new();
        for k in keys {
            if let Some(p) = s.partitions.remove(k)
                && let Some(offset) = p.ahead()
            {
                out.push((k.clone(), offset));
            }
        }
        self.version.fetch_add(1, Ordering::AcqRel);
        out
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn key(p: i32) -> PartitionKey {
        (Arc::from("logs"), p)
    }

    fn tracker(partitions: &[i32]) -> (Arc<OffsetTracker>, HashMap<PartitionKey, u64>) {
        let t = OffsetTracker::new();
        t.assign(partitions.iter().map(|p| key(*p)));
        let epochs = t.epochs();
        (t, epochs)
    }

    fn committable(t: &OffsetTracker, p: i32) -> Option<i64> {
        t.to_commit().into_iter().find(|(k, _)| *k == key(p)).map(|(_, o)| o)
    }

    #[test]
    fn nothing_is_committable_on_receipt() {
        let (t, e) = tracker(&[0]);
        let _a = t.register(&key(0), e[&key(0)], 10, 10).unwrap();
        assert_eq!(committable(&t, 0), None);
    }

    #[test]
    fn out_of_order_acks_commit_only_the_contiguous_prefix() {
        let (t, e) = tracker(&[0]);
        let ep = e[&key(0)];
        let a = t.register(&key(0), ep, 2, 2).unwrap(); // offsets 0..2
        let b = t.register(&key(0), ep, 3, 5).unwrap(); // 2..5
        let c = t.register(&key(0), ep, 1, 6).unwrap(); // 5
        c.ack(1);
        b.ack(3);
        assert_eq!(committable(&t, 0), None, "the first piece is still in flight");
        a.ack(1);
        assert_eq!(committable(&t, 0), None, "half of the first piece is not a prefix");
        a.ack(1);
        assert_eq!(committable(&t, 0), Some(6));
        t.confirm(&key(0), 6);
        assert_eq!(committable(&t, 0), None, "confirmed: nothing new to commit");
    }

    #[test]
    fn a_gap_in_acks_holds_back_later_pieces_per_partition_only() {
        let (t, e) = tracker(&[0, 1]);
        let a0 = t.register(&key(0), e[&key(0)], 1, 10).unwrap();
        let b0 = t.register(&key(0), e[&key(0)], 1, 20).unwrap();
        let c0 = t.register(&key(0), e[&key(0)], 1, 30).unwrap();
        let a1 = t.register(&key(1), e[&key(1)], 1, 7).unwrap();
        a0.ack(1);
        c0.ack(1);
        a1.ack(1);
        assert_eq!(committable(&t, 0), Some(10), "b0 is a gap: c0 waits behind it");
        assert_eq!(committable(&t, 1), Some(7), "partition 1 does not wait for partition 0");
        b0.ack(1);
        assert_eq!(committable(&t, 0), Some(30));
        // Offsets need not be contiguous (compacted topics, transaction markers): the piece's
        // end is what is committed.
        let d0 = t.register(&key(0), e[&key(0)], 1, 45).unwrap();
        d0.ack(1);
        assert_eq!(committable(&t, 0), Some(45));
    }

    #[test]
    fn an_abandoned_piece_stops_the_partition() {
        let (t, e) = tracker(&[0]);
        let ep = e[&key(0)];
        let a = t.register(&key(0), ep, 1, 10).unwrap();
        let b = t.register(&key(0), ep, 1, 20).unwrap();
        let c = t.register(&key(0), ep, 1, 30).unwrap();
        a.ack(1);
        drop(b); // never completed: abandoned
        c.ack(1);
        assert_eq!(committable(&t, 0), Some(10));
        t.register(&key(0), ep, 1, 40).unwrap().ack(1);
        assert_eq!(committable(&t, 0), Some(10));
        assert_eq!(t.wait_settled(&[key(0)], Instant::now()), 0, "stuck behind an abandoned piece is settled");
    }

    #[test]
    fn revoked_partitions_take_no_new_pieces_and_ignore_late_acks() {
        let (t, e) = tracker(&[0, 1]);
        let old = e[&key(0)];
        let a = t.register(&key(0), old, 1, 10).unwrap();
        let late = t.register(&key(0), old, 1, 20).unwrap();
        a.ack(1);
        t.close(&[key(0)]);
        assert!(t.register(&key(0), old, 1, 30).is_none(), "a partition being revoked takes no new piece");
        assert_eq!(t.wait_settled(&[key(0)], Instant::now()), 1, "one piece is still in flight");
        let released = t.release(&[key(0)]);
        assert_eq!(released, vec![(key(0), 10)]);
        // Acknowledged after the partition was given up: no effect on anything.
        late.ack(1);
        assert_eq!(committable(&t, 0), None);
        // Assigned again (a later generation): a new epoch, and the old one is refused.
        t.assign([key(0)]);
        let new = t.epochs()[&key(0)];
        assert_ne!(new, old);
        assert!(t.register(&key(0), old, 1, 30).is_none());
        let fresh = t.register(&key(0), new, 1, 25).unwrap();
        assert_eq!(committable(&t, 0), None);
        fresh.ack(1);
        assert_eq!(committable(&t, 0), Some(25));
        // Partition 1 was never touched.
        assert!(t.epochs().contains_key(&key(1)));
    }

    #[test]
    fn an_old_epochs_ack_does_not_move_a_reassigned_partition() {
        let (t, e) = tracker(&[0]);
        let old = t.register(&key(0), e[&key(0)], 1, 100).unwrap();
        t.close(&[key(0)]);
        t.release(&[key(0)]);
        t.assign([key(0)]);
        let ep = t.epochs()[&key(0)];
        let new = t.register(&key(0), ep, 1, 5).unwrap();
        old.ack(1); // sequence 0 of the old epoch must not mark sequence 0 of the new one
        assert_eq!(committable(&t, 0), None);
        new.ack(1);
        assert_eq!(committable(&t, 0), Some(5));
    }

    #[test]
    fn waiting_for_a_revocation_ends_when_the_acks_arrive() {
        let (t, e) = tracker(&[0]);
        let a = t.register(&key(0), e[&key(0)], 2, 50).unwrap();
        t.close(&[key(0)]);
        let acker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            a.ack(2);
        });
        let started = Instant::now();
        let left = t.wait_settled(&[key(0)], Instant::now() + Duration::from_secs(10));
        assert_eq!(left, 0);
        assert!(started.elapsed() < Duration::from_secs(5));
        acker.join().unwrap();
        assert_eq!(t.release(&[key(0)]), vec![(key(0), 50)]);
        // A bounded wait gives up.
        t.assign([key(0)]);
        let _held = t.register(&key(0), t.epochs()[&key(0)], 1, 60).unwrap();
        t.close(&[key(0)]);
        assert_eq!(t.wait_settled(&[key(0)], Instant::now() + Duration::from_millis(30)), 1);
    }
}
