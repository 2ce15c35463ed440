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
//!
//! An acker can also time its batch ([`Acker::time_into`]): the input stamps it when it first
//! pushes the batch, and the completion that fires the callback with [`AckOutcome::Handled`]
//! observes the time since into the pipeline's histogram. The stamp lives in the acker, not in
//! the batch, so however the queue splits the batch and whichever worker finishes last, each
//! acknowledged input batch is measured exactly once; abandoned ones are not measured.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use crate::metrics::Histogram;

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
    /// Where to observe the time from the stamp to completion, and the stamp.
    timing: OnceLock<(Arc<Histogram>, Instant)>,
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
        let inner = AckInner {
            pending: AtomicUsize::new(count),
            callback: Mutex::new(Some(Box::new(callback))),
            timing: OnceLock::new(),
        };
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

    /// Times this acker's batch from `since` to its completion, into `histogram`. Only the
    /// first stamp counts: an input batch sent in several pushes is timed from the first.
    /// Call it before the batch is pushed, so that no worker can complete it unstamped.
    pub fn time_into(&self, histogram: &Arc<Histogram>, since: Instant) {
        if self.0.timing.get().is_none() {
            let _ = self.0.timing.set((histogram.clone(), since));
        }
    }

    fn fire(&self, outcome: AckOutcome) {
        let callback = self.0.callback.lock().take();
        if let Some(cb) = callback {
            if outcome == AckOutcome::Handled
                && let Some((histogram, since)) = self.0.timing.get()
            {
                histogram.observe(since.elapsed());
            }
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

    /// Stamps every acker in the set (see [`Acker::time_into`]): one atomic load per acker
    /// once stamped, nothing per event.
    pub fn time_into(&self, histogram: &Arc<Histogram>, since: Instant) {
        for (acker, _) in &self.groups {
            acker.time_into(histogram, since);
        }
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

    /// The bucket index (into the cumulative counts) holding exactly one observation.
    fn only_bucket(h: &Histogram) -> usize {
        let (b, _, n) = h.snapshot();
        assert_eq!(n, 1, "observed once");
        b.iter().position(|&c| c == 1).unwrap()
    }

    #[test]
    fn completion_after_a_known_delay_lands_in_its_bucket() {
        let h = Arc::new(Histogram::default());
        let (acker, _rx) = Acker::with_notify(4);
        // Stamped 30 ms ago, completed now.
        let since = Instant::now() - std::time::Duration::from_millis(30);
        let set = AckSet::single(acker, 4);
        set.time_into(&h, since);
        set.complete();
        let (_, sum, _) = h.snapshot();
        assert!(sum >= 0.030, "{sum}");
        // However long this thread was held up, the one observation is in the bucket of its value.
        let bounds = crate::metrics::LATENCY_BUCKETS;
        let expected = bounds.iter().position(|&b| sum <= b).unwrap_or(bounds.len());
        assert_eq!(only_bucket(&h), expected, "{sum}");
        assert!(expected >= bounds.iter().position(|&b| b >= 0.030).unwrap());
    }

    #[test]
    fn a_split_batch_is_measured_once_at_its_last_piece() {
        let h = Arc::new(Histogram::default());
        let fired = Arc::new(AtomicUsize::new(0));
        let f = fired.clone();
        let acker = Acker::new(9, move |_| {
            f.fetch_add(1, Ordering::SeqCst);
        });
        let mut set = AckSet::single(acker.clone(), 9);
        set.time_into(&h, Instant::now() - std::time::Duration::from_secs(1));
        // A second push of the same acker (a window over two reads) keeps the first stamp.
        acker.time_into(&h, Instant::now());
        let a = set.split_front(3);
        let b = set.split_front(3);
        a.complete();
        b.complete();
        assert_eq!(h.snapshot().2, 0, "not measured before the last piece");
        set.complete();
        assert_eq!(fired.load(Ordering::SeqCst), 1);
        let (_, sum, n) = h.snapshot();
        assert_eq!(n, 1);
        assert!((1.0..2.5).contains(&sum), "timed from the first stamp: {sum}");
    }

    #[test]
    fn a_batch_over_several_ackers_measures_each_once() {
        let h = Arc::new(Histogram::default());
        let (a1, _r1) = Acker::with_notify(2);
        let (a2, _r2) = Acker::with_notify(3);
        let mut set = AckSet::single(a1, 2);
        set.append(AckSet::single(a2, 3));
        set.time_into(&h, Instant::now());
        let front = set.split_front(4);
        front.complete();
        assert_eq!(h.snapshot().2, 1, "the first acker is complete, the second is not");
        set.complete();
        assert_eq!(h.snapshot().2, 2);
    }

    #[test]
    fn abandoned_and_unstamped_batches_are_not_measured() {
        let h = Arc::new(Histogram::default());
        let (acker, mut rx) = Acker::with_notify(3);
        AckSet::single(acker, 3).time_into(&h, Instant::now());
        assert_eq!(rx.try_recv().unwrap(), AckOutcome::Abandoned);
        let (plain, _r) = Acker::with_notify(1);
        AckSet::single(plain, 1).complete();
        assert_eq!(h.snapshot().2, 0);
    }

    #[test]
    fn zero_count_fires_immediately() {
        let (_acker, mut rx) = Acker::with_notify(0);
        assert_eq!(rx.try_recv().unwrap(), AckOutcome::Handled);
    }
}
