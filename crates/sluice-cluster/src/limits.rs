//! Limits on what anyone who can reach the cluster port makes this node hold or log.
//!
//! - [`PendingHandshakes`]: at most `max_pending_handshakes` accepted connections that have not
//!   finished their handshake (TLS and the cluster hello) are held at once. When all places are
//!   taken, the connection that has been handshaking the longest is told to close
//!   ([`PendingSlot::evicted`]) to make room, so connections that open and then say nothing
//!   cannot lock a real peer out: a peer's handshake takes milliseconds, a stalled one holds
//!   its place only until newer ones push it out (or its handshake timeout). A finished
//!   handshake gives its place back.
//! - [`LogEvery`]: a warning a peer can trigger once per connection is written at most once
//!   per interval, with the number held back since the last one.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

/// The places of connections still in their handshake.
#[derive(Debug)]
pub(crate) struct PendingHandshakes {
    max: usize,
    /// By arrival: the first is the oldest.
    live: Mutex<BTreeMap<u64, CancellationToken>>,
    next_id: AtomicU64,
}

impl PendingHandshakes {
    pub(crate) fn new(max: usize) -> Arc<PendingHandshakes> {
        Arc::new(PendingHandshakes { max: max.max(1), live: Mutex::new(BTreeMap::new()), next_id: AtomicU64::new(0) })
    }

    /// A place for a new connection; when all were taken, the oldest holder is told to close
    /// (and `true` says one was).
    pub(crate) fn enter(self: &Arc<Self>) -> (PendingSlot, bool) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let token = CancellationToken::new();
        let mut live = self.live.lock();
        let mut evicted = false;
        while live.len() >= self.max {
            let Some((_, oldest)) = live.pop_first() else { break };
            oldest.cancel();
            evicted = true;
        }
        live.insert(id, token.clone());
        (PendingSlot { slots: self.clone(), id, token }, evicted)
    }

    pub(crate) fn len(&self) -> usize {
        self.live.lock().len()
    }
}

/// One handshaking connection's place; given back on drop (the handshake ended either way).
#[derive(Debug)]
pub(crate) struct PendingSlot {
    slots: Arc<PendingHandshakes>,
    id: u64,
    token: CancellationToken,
}

impl PendingSlot {
    /// Resolves when a newer connection took this one's place.
    pub(crate) async fn evicted(&self) {
        self.token.cancelled().await
    }
}

impl Drop for PendingSlot {
    fn drop(&mut self) {
        self.slots.live.lock().remove(&self.id);
    }
}

/// Lets a repeated log line through at most once per `every`.
#[derive(Debug)]
pub(crate) struct LogEvery {
    every: Duration,
    /// When a line was last let through, and how many were held back since.
    state: Mutex<(Option<Instant>, u64)>,
}

impl LogEvery {
    pub(crate) const fn new(every: Duration) -> LogEvery {
        LogEvery { every, state: Mutex::new((None, 0)) }
    }

    /// `Some(held back since the last line)` when a line may be written now.
    pub(crate) fn due(&self) -> Option<u64> {
        self.due_at(Instant::now())
    }

    pub(crate) fn due_at(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock();
        if s.0.is_none_or(|t| now.saturating_duration_since(t) >= self.every) {
            let held = s.1;
            *s = (Some(now), 0);
            Some(held)
        } else {
            s.1 += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_handshake_makes_room_and_a_finished_one_gives_its_place_back() {
        let slots = PendingHandshakes::new(2);
        let (a, evicted_a) = slots.enter();
        let (b, _) = slots.enter();
        assert!(!evicted_a);
        assert_eq!(slots.len(), 2);
        let (c, evicted) = slots.enter();
        assert!(evicted, "a third connection with two places must push one out");
        assert!(a.token.is_cancelled(), "the oldest is the one pushed out");
        assert!(!b.token.is_cancelled() && !c.token.is_cancelled());
        drop(a);
        assert_eq!(slots.len(), 2, "the evicted connection's place was already given to the new one");
        drop(b);
        let (_d, evicted) = slots.enter();
        assert!(!evicted, "a finished handshake gave its place back");
    }

    #[test]
    fn a_line_is_let_through_once_per_interval_with_the_count_held_back() {
        let log = LogEvery::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(log.due_at(t0), Some(0));
        for i in 1..100 {
            assert_eq!(log.due_at(t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(log.due_at(t0 + Duration::from_secs(10)), Some(99));
        assert_eq!(log.due_at(t0 + Duration::from_secs(11)), None);
    }
}
