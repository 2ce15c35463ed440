//! Time spent waiting, waits in progress included: a stall shows in the figures while it
//! lasts, not only once it ends.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// The total time of many waits (finished and in progress) and how many are in progress.
/// Starting or ending a wait is three atomic operations; reading is lock-free.
#[derive(Debug)]
pub struct WaitTime {
    origin: Instant,
    /// Finished waits.
    waited_nanos: AtomicU64,
    /// Waits in progress, and the sum of their start times (since `origin`).
    waiting: AtomicU64,
    started_sum: AtomicU64,
}

impl Default for WaitTime {
    fn default() -> Self {
        WaitTime {
            origin: Instant::now(),
            waited_nanos: AtomicU64::new(0),
            waiting: AtomicU64::new(0),
            started_sum: AtomicU64::new(0),
        }
    }
}

impl WaitTime {
    fn now_nanos(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    /// Starts a wait; it ends (and its time is added) when the guard is dropped, however the
    /// wait ends.
    pub fn start(&self) -> WaitGuard<'_> {
        let started = self.now_nanos();
        self.started_sum.fetch_add(started, Ordering::AcqRel);
        self.waiting.fetch_add(1, Ordering::AcqRel);
        WaitGuard { time: self, started }
    }

    /// Total nanoseconds waited, waits in progress included.
    pub fn total_nanos(&self) -> u64 {
        let now = self.now_nanos();
        let waiting = self.waiting.load(Ordering::Acquire);
        let started = self.started_sum.load(Ordering::Acquire);
        let ongoing = waiting.saturating_mul(now).saturating_sub(started);
        self.waited_nanos.load(Ordering::Relaxed) + ongoing
    }

    /// Waits in progress now.
    pub fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::Acquire)
    }

    /// How long the waits in progress have lasted, on average (zero when none): the longest
    /// has lasted at least this long.
    pub fn ongoing_mean(&self) -> std::time::Duration {
        let now = self.now_nanos();
        let waiting = self.waiting.load(Ordering::Acquire);
        let started = self.started_sum.load(Ordering::Acquire);
        if waiting == 0 {
            return std::time::Duration::ZERO;
        }
        std::time::Duration::from_nanos(waiting.saturating_mul(now).saturating_sub(started) / waiting)
    }
}

/// One wait in progress.
#[derive(Debug)]
pub struct WaitGuard<'a> {
    time: &'a WaitTime,
    started: u64,
}

impl Drop for WaitGuard<'_> {
    fn drop(&mut self) {
        let t = self.time;
        let waited = t.now_nanos().saturating_sub(self.started);
        // Add the finished wait before removing it from the ongoing ones, so that a reader in
        // between sees it at most twice, never not at all.
        t.waited_nanos.fetch_add(waited, Ordering::AcqRel);
        t.waiting.fetch_sub(1, Ordering::AcqRel);
        t.started_sum.fetch_sub(self.started, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_wait_in_progress_counts_before_it_ends() {
        let w = WaitTime::default();
        let guard = w.start();
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(w.waiting(), 1);
        let during = w.total_nanos();
        assert!(during >= 30_000_000, "{during}");
        drop(guard);
        assert_eq!(w.waiting(), 0);
        assert!(w.total_nanos() >= during);
    }

    #[test]
    fn the_mean_of_ongoing_waits_grows_while_they_last_and_is_zero_without_any() {
        let w = WaitTime::default();
        assert_eq!(w.ongoing_mean(), Duration::ZERO);
        let old = w.start();
        std::thread::sleep(Duration::from_millis(40));
        let young = w.start();
        let mean = w.ongoing_mean();
        assert!(mean >= Duration::from_millis(20) && mean < Duration::from_secs(5), "{mean:?}");
        drop(old);
        assert!(w.ongoing_mean() < mean, "the young wait alone is younger than the mean of both");
        drop(young);
        assert_eq!(w.ongoing_mean(), Duration::ZERO);
    }
}
