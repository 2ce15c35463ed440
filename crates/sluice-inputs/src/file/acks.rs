//! Ordered offset commits for one file.
//!
//! Every batch piece read from a file gets a sequence number and the offset just past its last
//! event. Pieces can be acknowledged in any order (several workers, several queue shards), but
//! the file's cursor only ever moves to the end of the longest prefix of pieces that are all
//! acknowledged: a piece that is still in flight holds back every later one. A piece that comes
//! back abandoned (a pipeline stopped before delivering it) stops the cursor for good in this
//! run, so the next start reads again from the last offset that is known safe.
//!
//! The ack path takes one short per-file lock and calls the commit function, which only records
//! the offset in memory (the registry writes it out in the background): no I/O, no allocation.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use sluice_core::Acker;
use sluice_core::ack::AckOutcome;

type Commit = Box<dyn Fn(u64) + Send + Sync>;

pub(crate) struct AckTracker {
    state: Mutex<Pending>,
    commit: Commit,
}

#[derive(Default)]
struct Pending {
    /// Sequence number of `slots[0]`.
    base: u64,
    /// `(end offset, acknowledged)` for every piece not yet committed, in read order.
    slots: VecDeque<(u64, bool)>,
    /// A piece was abandoned: nothing after it may be committed.
    blocked: bool,
}

impl AckTracker {
    pub(crate) fn new(commit: impl Fn(u64) + Send + Sync + 'static) -> Arc<AckTracker> {
        Arc::new(AckTracker { state: Mutex::new(Pending::default()), commit: Box::new(commit) })
    }

    /// An acker for a piece of `count` events ending at `end_offset`.
    pub(crate) fn acker(self: &Arc<Self>, count: usize, end_offset: u64) -> Acker {
        let seq = {
            let mut p = self.state.lock();
            p.slots.push_back((end_offset, false));
            p.base + p.slots.len() as u64 - 1
        };
        let this = self.clone();
        Acker::new(count, move |outcome| this.complete(seq, outcome))
    }

    fn complete(&self, seq: u64, outcome: AckOutcome) {
        let mut p = self.state.lock();
        if outcome == AckOutcome::Abandoned {
            p.blocked = true;
        }
        if p.blocked {
            return;
        }
        let Some(index) = seq.checked_sub(p.base) else { return };
        if let Some(slot) = p.slots.get_mut(index as usize) {
            slot.1 = true;
        }
        let mut last = None;
        while let Some(&(end, true)) = p.slots.front() {
            last = Some(end);
            p.slots.pop_front();
            p.base += 1;
        }
        // Under the lock, so two threads finishing neighbouring pieces cannot commit out of order.
        if let Some(end) = last {
            (self.commit)(end);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn tracker() -> (Arc<AckTracker>, Arc<AtomicU64>) {
        let committed = Arc::new(AtomicU64::new(0));
        let c = committed.clone();
        (AckTracker::new(move |o| c.store(o, Ordering::SeqCst)), committed)
    }

    #[test]
    fn commits_only_the_contiguous_acknowledged_prefix() {
        let (t, committed) = tracker();
        let a = t.acker(2, 10);
        let b = t.acker(3, 25);
        let c = t.acker(1, 40);
        c.ack(1);
        b.ack(3);
        assert_eq!(committed.load(Ordering::SeqCst), 0, "the first piece is still in flight");
        a.ack(1);
        assert_eq!(committed.load(Ordering::SeqCst), 0);
        a.ack(1);
        assert_eq!(committed.load(Ordering::SeqCst), 40);
        assert!(t.state.lock().slots.is_empty());
    }

    #[test]
    fn abandoned_piece_stops_the_cursor() {
        let (t, committed) = tracker();
        let a = t.acker(1, 10);
        let b = t.acker(1, 20);
        let c = t.acker(1, 30);
        a.ack(1);
        assert_eq!(committed.load(Ordering::SeqCst), 10);
        drop(b); // never completed: abandoned
        c.ack(1);
        assert_eq!(committed.load(Ordering::SeqCst), 10);
        t.acker(1, 50).ack(1);
        assert_eq!(committed.load(Ordering::SeqCst), 10);
    }
}
