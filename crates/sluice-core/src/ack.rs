//! End-to-end acknowledgements, paid per input batch rather than per event.
//!
//! An input that wants to know when its events are handled makes one [`Acker`] per batch it
//! pushes, with the number of events in it. The batch carries an [`AckSet`]: a short list of
//! `(acker, count)` pairs in event order. When the queue splits a batch the pieces share the
//! acker (one reference-count increment per piece, none per event); when a worker has handled a
//! batch — delivered by every output, dropped on purpose, or rejected for good — it calls
//! [`AckSet::complete`], one atomic subtraction per pair. The acker's callback runs exactly once,
//! when its count reaches zero, on whichever thread finished last. If every piece is dropped
//! without completing (a pipeline stopped before it could deliver), the callback runs with
//! [`AckOutcome::Abandoned`], so a waiting client hears "not accepted" instead of nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use smallvec::SmallVec;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckOutcome {
    /// Every event reached the ack point.
    Handled,
    /// The events were dropped before reaching the ack point (shutdown, abort).
    Abandoned,
}

type Callback = Box<dyn FnOnce(AckOutcome) + Send>;

struct AckInner {
    pending: AtomicUsize,
    callback: Mutex<Option<Callback>>,
}

impl Drop for AckInner {
    fn drop(&mut self) {
        if let Some(cb) = self.callback.get_mut().take() {
            cb(AckOutcome::Abandoned);
        }
    }
}

/// One input batch's acknowledgement. Cloning is cheap and does not change the count.
#[derive(Clone)]
pub struct Acker(Arc<AckInner>);

impl std::fmt::Debug for Acker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Acker(pending={})", self.0.pending.load(Ordering::Relaxed))
    }
}

impl Acker {
    /// An acker for `count` events that runs `callback` once when all are handled.
    pub fn new(count: usize, callback: impl FnOnce(AckOutcome) + Send + 'static) -> Acker {
        let inner = AckInner { pending: AtomicUsize::new(count), callback: Mutex::new(Some(Box::new(callback))) };
        let acker = Acker(Arc::new(inner));
        if count == 0 {
            acker.fire(AckOutcome::Handled);
        }
        acker
    }

    /// An acker whose completion is announced on a oneshot channel.
    pub fn with_notify(count: usize) -> (Acker, tokio::sync::oneshot::Receiver<AckOutcome>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let acker = Acker::new(count, move |outcome| {
            let _ = tx.send(outcome);
        });
        (acker, rx)
    }

    /// Marks `count` events handled.
    pub fn ack(&self, count: usize) {
        if count == 0 {
            return;
        }
        let before = self.0.pending.fetch_sub(count, Ordering::AcqRel);
        debug_assert!(before >= count, "acked more events than the acker was made for");
        if before == count {
            self.fire(AckOutcome::Handled);
        }
    }

    fn fire(&self, outcome: AckOutcome) {
        if let Some(cb) = self.0.callback.lock().take() {
            cb(outcome);
        }
    }

    pub fn pending(&self) -> usize {
        self.0.pending.load(Ordering::Acquire)
    }
}

/// The acknowledgements a batch carries, in event order. Empty for untracked inputs.
#[derive(Clone, Debug, Default)]
pub struct AckSet {
    groups: SmallVec<[(Acker, usize); 2]>,
}

impl AckSet {
    pub fn none() -> AckSet {
        AckSet::default()
    }

    pub fn single(acker: Acker, count: usize) -> AckSet {
        let mut groups = SmallVec::new();
        groups.push((acker, count));
        AckSet { groups }
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// How many events the set covers.
    pub fn covered(&self) -> usize {
        self.groups.iter().map(|(_, n)| n).sum()
    }

    /// Appends another batch's set (its events follow ours). Where our last acker is the
    /// other's first, the two counts are merged, so that a set built from many pieces of one
    /// input batch (a stateful processor holding what it consumed) stays one pair long.
    pub fn append(&mut self, other: AckSet) {
        for (acker, n) in other.groups {
            match self.groups.last_mut() {
                Some((last, count)) if Arc::ptr_eq(&last.0, &acker.0) => *count += n,
                _ => self.groups.push((acker, n)),
            }
        }
    }

    /// A set covering `count` events of one acker.
    pub fn of(acker: &Acker, count: usize) -> AckSet {
        AckSet::single(acker.clone(), count)
    }

    /// Splits off the part covering the first `n` events; `self` keeps the rest.
    pub fn split_front(&mut self, mut n: usize) -> AckSet {
        let mut front = AckSet::default();
        while n > 0 && !self.groups.is_empty() {
            let (acker, count) = &mut self.groups[0];
            if *count <= n {
                n -= *count;
                front.groups.push(self.groups.remove(0));
            } else {
                *count -= n;
                front.groups.push((acker.clone(), n));
                n = 0;
            }
        }
        front
    }

    /// Marks every covered event handled.
    pub fn complete(self) {
        for (acker, count) in self.groups {
            acker.ack(count);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn fires_once_when_all_pieces_complete() {
        let fired = Arc::new(AtomicUsize::new(0));
        let f = fired.clone();
        let acker = Acker::new(10, move |o| {
            assert_eq!(o, AckOutcome::Handled);
            f.fetch_add(1, Ordering::SeqCst);
        });
        let mut set = AckSet::single(acker, 10);
        let a = set.split_front(3);
        let b = set.split_front(3);
        assert_eq!((a.covered(), b.covered(), set.covered()), (3, 3, 4));
        a.complete();
        set.complete();
        assert_eq!(fired.load(Ordering::SeqCst), 0);
        b.complete();
        assert_eq!(fired.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn split_across_groups_keeps_order() {
        let (a1, _r1) = Acker::with_notify(2);
        let (a2, _r2) = Acker::with_notify(5);
        let mut set = AckSet::single(a1, 2);
        set.append(AckSet::single(a2.clone(), 5));
        let front = set.split_front(4);
        assert_eq!(front.covered(), 4);
        assert_eq!(set.covered(), 3);
        front.complete();
        assert_eq!(a2.pending(), 3);
    }

    #[test]
    fn appending_pieces_of_one_acker_merges_them() {
        let (a, _r) = Acker::with_notify(6);
        let (b, _r2) = Acker::with_notify(1);
        let mut set = AckSet::none();
        set.append(AckSet::of(&a, 2));
        set.append(AckSet::of(&a, 3));
        assert_eq!(set.groups.len(), 1);
        set.append(AckSet::of(&b, 1));
        set.append(AckSet::of(&a, 1));
        assert_eq!((set.groups.len(), set.covered()), (3, 7));
    }

    #[test]
    fn dropped_without_completion_is_abandoned() {
        let (acker, mut rx) = Acker::with_notify(3);
        let set = AckSet::single(acker, 3);
        drop(set);
        assert_eq!(rx.try_recv().unwrap(), AckOutcome::Abandoned);
    }

    #[test]
    fn zero_count_fires_immediately() {
        let (_acker, mut rx) = Acker::with_notify(0);
        assert_eq!(rx.try_recv().unwrap(), AckOutcome::Handled);
    }
}
