//! The node's memory budget for events in flight.
//!
//! One budget per process, counted in what events really cost in memory (their maps, values
//! and strings, as [`crate::Event::memory_size`] counts them) and not in the bytes they were
//! decoded from: the two bytes `1 ` of a JSON body become an event of about 200 bytes. An
//! input takes a [`MemoryCharge`] before it decodes more; the charge travels with the batch
//! ([`crate::Batch::memory`]) through the queue and the workers, and is given back when the
//! batch is dropped: after delivery with a memory queue, once written with a persisted one.
//!
//! Guarantees:
//! - Waiters are served in arrival order, so a large charge is not starved by small ones.
//! - A charge larger than the whole budget can never be granted and is refused at once
//!   ([`ChargeError::NeverFits`]), so that a caller can answer "too large" instead of waiting.
//! - [`MemoryBudget::force`] takes a charge without waiting, going over the budget if need be.
//!   It is for events that are already in memory and were charged upstream (a `pipeline`
//!   output feeding another pipeline), where waiting could deadlock the two pipelines. The
//!   overdraft is repaid first when charges are given back.
//! - A charge may wait for more while keeping what it holds ([`MemoryCharge::grow_keeping`]),
//!   for a caller that keeps the memory it has (a request body read so far), so that the
//!   budget counts it while it waits. Such waiting charges together keep at most half the
//!   budget, and a caller may need at most half of it in all (its cap; more is refused as
//!   too large, [`ChargeError::NeverFits`]): the other half, given back by the rest of the
//!   node, always covers what the oldest waiter still lacks, so no set of waiters can wedge
//!   the budget.
//! - Time spent waiting is counted while the wait lasts ([`MemoryBudget::wait_nanos`]), not
//!   only when it ends, so a stall shows in the metrics while it goes on.
//!
//! - When a budget's use crosses three quarters of its limit, the process's pressure hook
//!   ([`on_pressure`]) is told, and told again when it falls back under half: the binary's
//!   allocator then gives freed memory back to the kernel at once rather than after a delay,
//!   so that what the process holds stays near what the budget counts.
//!
//! Internally the budget is a fair semaphore whose permits are granules of 64 bytes, so that
//! one permit count covers budgets far beyond 4 GiB.

use crate::wait::WaitTime;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::Semaphore;

/// Bytes per semaphore permit.
const GRANULE: usize = 64;

fn granules(bytes: usize) -> usize {
    bytes.div_ceil(GRANULE)
}

/// The process's memory pressure hook (see [`on_pressure`]).
static PRESSURE_HOOK: OnceLock<fn(bool)> = OnceLock::new();

/// Installs `hook`, called with `true` when a budget's use crosses three quarters of its
/// limit and with `false` when it falls back under half. One per process; false when one is
/// installed already.
pub fn on_pressure(hook: fn(bool)) -> bool {
    PRESSURE_HOOK.set(hook).is_ok()
}

/// Why a charge was not granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChargeError {
    #[error("needs {needed} bytes of memory, more than the whole budget of {limit} bytes")]
    NeverFits { needed: usize, limit: usize },
    #[error("no room in the memory budget before the deadline")]
    TimedOut,
    /// The charges waiting while they keep what they hold already keep their share of the
    /// budget: this one may not wait holding memory.
    #[error("no room in the memory budget, and the share of it that waiting requests may keep is taken")]
    NoShareToWait,
}

/// The budget. Share it as `Arc<MemoryBudget>`.
#[derive(Debug)]
pub struct MemoryBudget {
    limit_granules: usize,
    permits: Semaphore,
    /// Granules granted by `force` beyond what the semaphore had.
    overdraft: AtomicUsize,
    /// Granules kept by charges waiting in [`MemoryCharge::grow_keeping`].
    kept_waiting: AtomicUsize,
    /// Time charges waited, waits in progress included.
    wait: WaitTime,
    waits: AtomicU64,
    refused: AtomicU64,
    /// Use crossed three quarters of the limit and has not yet fallen under half.
    pressed: AtomicBool,
}

impl MemoryBudget {
    /// The default budget: 256 MiB.
    pub const DEFAULT_BYTES: usize = 256 << 20;

    pub fn new(limit_bytes: usize) -> Arc<MemoryBudget> {
        let limit_granules = granules(limit_bytes).clamp(1, Semaphore::MAX_PERMITS);
        Arc::new(MemoryBudget {
            limit_granules,
            permits: Semaphore::new(limit_granules),
            overdraft: AtomicUsize::new(0),
            kept_waiting: AtomicUsize::new(0),
            wait: WaitTime::default(),
            waits: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            pressed: AtomicBool::new(false),
        })
    }

    pub fn limit(&self) -> usize {
        self.limit_granules.saturating_mul(GRANULE)
    }

    /// Bytes charged now (over the limit when some charges were forced).
    pub fn used(&self) -> usize {
        let granted = self.limit_granules - self.permits.available_permits().min(self.limit_granules);
        (granted + self.overdraft.load(Ordering::Relaxed)).saturating_mul(GRANULE)
    }

    /// Charges that are waiting now.
    pub fn waiting(&self) -> u64 {
        self.wait.waiting()
    }

    /// How long the charges waiting now have waited, on average: a budget that nothing gives
    /// back to (a wedged node) shows here as a figure that only grows.
    pub fn ongoing_wait_mean(&self) -> std::time::Duration {
        self.wait.ongoing_mean()
    }

    /// Total time charges have waited, the waits still in progress included.
    pub fn wait_nanos(&self) -> u64 {
        self.wait.total_nanos()
    }

    /// Charges that had to wait (finished or not).
    pub fn waits(&self) -> u64 {
        self.waits.load(Ordering::Relaxed)
    }

    /// Charges refused: larger than the budget, or not granted before their deadline.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The budget's figures now, for `/metrics` and `/stats`.
    pub fn snapshot(&self) -> MemorySnapshot {
        MemorySnapshot {
            budget_bytes: self.limit() as u64,
            used_bytes: self.used() as u64,
            waiting: self.waiting(),
            wait_seconds: self.wait_nanos() as f64 / 1e9,
            waits: self.waits(),
            refused: self.refused(),
        }
    }

    /// A charge that holds nothing, tied to this budget so that it can grow.
    pub fn empty(self: &Arc<Self>) -> MemoryCharge {
        MemoryCharge { budget: Some(self.clone()), granules: 0 }
    }

    /// Takes `bytes` now if they are free and nobody waits before us.
    pub fn try_charge(self: &Arc<Self>, bytes: usize) -> Option<MemoryCharge> {
        let n = granules(bytes);
        if n == 0 {
            return Some(self.empty());
        }
        let n32 = u32::try_from(n).ok()?;
        let permit = self.permits.try_acquire_many(n32).ok()?;
        permit.forget();
        self.note_level();
        Some(MemoryCharge { budget: Some(self.clone()), granules: n })
    }

    /// Takes `bytes`, waiting (in arrival order) until they are free or `deadline` passes
    /// (`None`: no deadline).
    pub async fn charge(
        self: &Arc<Self>,
        bytes: usize,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<MemoryCharge, ChargeError> {
        let n = granules(bytes);
        if n > self.limit_granules || u32::try_from(n).is_err() {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(ChargeError::NeverFits { needed: bytes, limit: self.limit() });
        }
        if let Some(c) = self.try_charge(bytes) {
            return Ok(c);
        }
        self.waits.fetch_add(1, Ordering::Relaxed);
        let _wait = self.wait.start();
        let acquire = self.permits.acquire_many(n as u32);
        let permit = match deadline {
            None => acquire.await,
            Some(d) => match tokio::time::timeout_at(d, acquire).await {
                Ok(p) => p,
                Err(_) => {
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    return Err(ChargeError::TimedOut);
                }
            },
        };
        // The semaphore is never closed.
        permit.expect("the memory budget's semaphore is never closed").forget();
        self.note_level();
        Ok(MemoryCharge { budget: Some(self.clone()), granules: n })
    }

    /// Takes `bytes` without waiting, over the budget if need be (see the module comment).
    pub fn force(self: &Arc<Self>, bytes: usize) -> MemoryCharge {
        let n = granules(bytes);
        let mut taken = 0;
        while taken < n {
            let free = self.permits.available_permits().min(n - taken).min(u32::MAX as usize);
            if free == 0 {
                break;
            }
            if let Ok(p) = self.permits.try_acquire_many(free as u32) {
                p.forget();
                taken += free;
            } else {
                // Someone waits in line, or took the permits first: the rest is overdraft.
                break;
            }
        }
        if taken < n {
            self.overdraft.fetch_add(n - taken, Ordering::Relaxed);
        }
        self.note_level();
        MemoryCharge { budget: Some(self.clone()), granules: n }
    }

    /// Enters `n` granules into the share waiting charges may keep; false when it is taken.
    fn keep_waiting(&self, n: usize) -> bool {
        let share = self.limit_granules / 2;
        self.kept_waiting
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |kept| (kept + n <= share).then_some(kept + n))
            .is_ok()
    }

    /// Granules waiting charges keep now.
    pub fn kept_waiting_bytes(&self) -> usize {
        self.kept_waiting.load(Ordering::Relaxed) * GRANULE
    }

    fn release(&self, mut n: usize) {
        let mut owed = self.overdraft.load(Ordering::Relaxed);
        while owed > 0 && n > 0 {
            let repay = owed.min(n);
            match self.overdraft.compare_exchange_weak(owed, owed - repay, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    n -= repay;
                    break;
                }
                Err(now) => owed = now,
            }
        }
        if n > 0 {
            self.permits.add_permits(n);
        }
        self.note_level();
    }

    /// Notes when use crosses three quarters of the limit upwards or half of it downwards,
    /// and tells the pressure hook (three loads when nothing changes).
    fn note_level(&self) {
        let used = self.used() / GRANULE;
        let pressed = self.pressed.load(Ordering::Relaxed);
        let now = if pressed { used * 2 >= self.limit_granules } else { used * 4 >= self.limit_granules * 3 };
        if now != pressed
            && self.pressed.compare_exchange(pressed, now, Ordering::Relaxed, Ordering::Relaxed).is_ok()
            && let Some(hook) = PRESSURE_HOOK.get()
        {
            hook(now);
        }
    }

    /// Whether use crossed three quarters of the limit and has not yet fallen under half.
    pub fn pressed(&self) -> bool {
        self.pressed.load(Ordering::Relaxed)
    }
}

/// Memory taken from the budget; given back when dropped. A default charge holds nothing.
#[derive(Default)]
pub struct MemoryCharge {
    budget: Option<Arc<MemoryBudget>>,
    granules: usize,
}

impl std::fmt::Debug for MemoryCharge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MemoryCharge({} bytes)", self.bytes())
    }
}

impl MemoryCharge {
    pub fn none() -> MemoryCharge {
        MemoryCharge::default()
    }

    /// The bytes held (rounded up to the budget's granule).
    pub fn bytes(&self) -> usize {
        self.granules * GRANULE
    }

    /// Adds another charge's bytes to this one.
    pub fn merge(&mut self, mut other: MemoryCharge) {
        if other.granules == 0 {
            return;
        }
        if self.budget.is_none() {
            self.budget = other.budget.take();
            self.granules = std::mem::take(&mut other.granules);
            return;
        }
        debug_assert!(other.budget.as_ref().is_none_or(|b| Arc::ptr_eq(b, self.budget.as_ref().unwrap())));
        self.granules += std::mem::take(&mut other.granules);
    }

    /// Splits off the share of `part` in `whole` (events of a batch, say); `self` keeps the rest.
    pub fn split_share(&mut self, part: usize, whole: usize) -> MemoryCharge {
        if self.granules == 0 || whole == 0 {
            return MemoryCharge::none();
        }
        let n =
            if part >= whole { self.granules } else { (self.granules as u128 * part as u128 / whole as u128) as usize };
        self.granules -= n;
        MemoryCharge { budget: self.budget.clone(), granules: n }
    }

    /// Splits off `bytes` (rounded up to the granule, at most what is held) into a charge of
    /// its own; `self` keeps the rest. For handing a batch its share of what an input holds.
    pub fn split_off(&mut self, bytes: usize) -> MemoryCharge {
        let n = granules(bytes).min(self.granules);
        self.granules -= n;
        MemoryCharge { budget: self.budget.clone(), granules: n }
    }

    /// Gives back what is held beyond `bytes`.
    pub fn shrink_to(&mut self, bytes: usize) {
        let keep = granules(bytes);
        if keep < self.granules {
            if let Some(b) = &self.budget {
                b.release(self.granules - keep);
            }
            self.granules = keep;
        }
    }

    /// Makes the charge exactly `bytes` now: gives back the excess, or forces the shortfall
    /// (for truing up an estimate after the events are decoded).
    pub fn true_up(&mut self, bytes: usize) {
        let want = granules(bytes);
        if want <= self.granules {
            self.shrink_to(bytes);
        } else if let Some(b) = self.budget.clone() {
            self.merge(b.force((want - self.granules) * GRANULE));
        }
    }

    /// Adds `bytes` if they are free now (and nobody waits before us); false otherwise.
    pub fn try_grow(&mut self, bytes: usize) -> bool {
        let Some(budget) = self.budget.clone() else {
            return true;
        };
        match budget.try_charge(bytes) {
            Some(more) => {
                self.merge(more);
                true
            }
            None => false,
        }
    }

    /// Adds `bytes` without waiting, over the budget if need be ([`MemoryBudget::force`]).
    pub fn force_grow(&mut self, bytes: usize) {
        if let Some(budget) = self.budget.clone() {
            self.merge(budget.force(bytes));
        }
    }

    /// `bytes` more keep this charge within `cap`; refused (and counted) otherwise.
    fn within_cap(&self, budget: &MemoryBudget, bytes: usize, cap: usize) -> Result<(), ChargeError> {
        let total = self.bytes() + bytes;
        if total > cap {
            budget.refused.fetch_add(1, Ordering::Relaxed);
            return Err(ChargeError::NeverFits { needed: total, limit: cap });
        }
        Ok(())
    }

    /// Adds `bytes`, waiting for them as [`MemoryBudget::charge`] does; `cap` bounds the total
    /// this charge may reach (the caller's "can never fit" limit).
    pub async fn grow(
        &mut self,
        bytes: usize,
        cap: usize,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<(), ChargeError> {
        let Some(budget) = self.budget.clone() else {
            return Ok(());
        };
        self.within_cap(&budget, bytes, cap)?;
        let more = budget.charge(bytes, deadline).await?;
        self.merge(more);
        Ok(())
    }

    /// Adds `bytes` as [`MemoryCharge::grow`] does, keeping what the charge holds while it
    /// waits: for a caller that keeps the memory it was charged for meanwhile. What it keeps
    /// counts in the share of the budget waiting charges may keep (half); when that share
    /// is taken the charge does not wait ([`ChargeError::NoShareToWait`]) and the caller is to
    /// give up what it holds. Callers must bound `cap` to half the budget at most (see the
    /// module comment).
    pub async fn grow_keeping(
        &mut self,
        bytes: usize,
        cap: usize,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<(), ChargeError> {
        let Some(budget) = self.budget.clone() else {
            return Ok(());
        };
        self.within_cap(&budget, bytes, cap)?;
        if let Some(more) = budget.try_charge(bytes) {
            self.merge(more);
            return Ok(());
        }
        let kept = self.granules;
        if kept > 0 && !budget.keep_waiting(kept) {
            budget.refused.fetch_add(1, Ordering::Relaxed);
            return Err(ChargeError::NoShareToWait);
        }
        // Left when the wait ends, however it ends (the caller's future may be dropped).
        struct Leave<'a>(&'a MemoryBudget, usize);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                self.0.kept_waiting.fetch_sub(self.1, Ordering::Relaxed);
            }
        }
        let _leave = Leave(&budget, kept);
        let more = budget.charge(bytes, deadline).await?;
        self.merge(more);
        Ok(())
    }
}

impl Drop for MemoryCharge {
    fn drop(&mut self) {
        if self.granules > 0
            && let Some(b) = &self.budget
        {
            b.release(self.granules);
        }
    }
}

/// The memory budget's figures at one moment (`/stats`' `memory`, `sluice_memory_*`).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct MemorySnapshot {
    pub budget_bytes: u64,
    /// Charged now (over the budget when some charges were forced).
    pub used_bytes: u64,
    /// Charges waiting now.
    pub waiting: u64,
    /// Time charges waited, waits in progress included.
    pub wait_seconds: f64,
    /// Charges that had to wait.
    pub waits: u64,
    pub refused: u64,
}

impl MemorySnapshot {
    pub fn encode(&self, out: &mut crate::exposition::DescriptorEncoder<'_>) -> std::fmt::Result {
        use crate::exposition::{Labels, counter, gauge};
        let gauges: [(&str, &str, u64); 3] = [
            ("sluice_memory_budget_bytes", "The node's memory budget for events in flight.", self.budget_bytes),
            (
                "sluice_memory_used_bytes",
                "Memory the events in flight hold now, as charged to the budget.",
                self.used_bytes,
            ),
            ("sluice_memory_waiting", "Inputs waiting now for room in the memory budget.", self.waiting),
        ];
        for (name, help, v) in gauges {
            gauge(out, name, help, [(Labels::new(), v)])?;
        }
        counter(
            out,
            "sluice_memory_wait_seconds_total",
            "Time inputs waited for room in the memory budget, waits in progress included.",
            [(Labels::new(), self.wait_seconds)],
        )?;
        counter(
            out,
            "sluice_memory_refused_total",
            "Charges refused: larger than the budget allows, or not granted in time.",
            [(Labels::new(), self.refused)],
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn charges_wait_for_room_and_are_given_back_on_drop() {
        let budget = MemoryBudget::new(1024);
        let a = budget.charge(600, None).await.unwrap();
        assert_eq!(budget.used(), 640);
        assert!(budget.try_charge(600).is_none());
        let b2 = budget.clone();
        let waiter = tokio::spawn(async move { b2.charge(600, None).await.map(|c| c.bytes()) });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "granted while the budget was full");
        assert_eq!(budget.waiting(), 1);
        assert!(budget.wait_nanos() > 0, "a wait in progress is counted");
        drop(a);
        assert_eq!(waiter.await.unwrap(), Ok(640));
        assert_eq!(budget.used(), 0);
        assert_eq!((budget.waiting(), budget.waits()), (0, 1));
    }

    #[tokio::test]
    async fn too_large_is_refused_at_once_and_deadlines_hold() {
        let budget = MemoryBudget::new(1024);
        assert_eq!(budget.charge(4096, None).await.unwrap_err(), ChargeError::NeverFits { needed: 4096, limit: 1024 });
        let _held = budget.charge(1024, None).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(30);
        assert_eq!(budget.charge(64, Some(deadline)).await.unwrap_err(), ChargeError::TimedOut);
        assert_eq!(budget.refused(), 2);
        assert_eq!(budget.waiting(), 0, "a timed-out wait is not left counted");
    }

    #[tokio::test]
    async fn waiting_charges_keep_what_they_hold_within_half_the_budget() {
        let budget = MemoryBudget::new(4096);
        let full = budget.charge(4096 - 512, None).await.unwrap();
        // 512 bytes free; a request holding 512 waits for 512 more, keeping what it holds.
        let mut a = budget.charge(512, None).await.unwrap();
        let waiting = tokio::spawn(async move {
            a.grow_keeping(512, 2048, None).await.unwrap();
            a
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!waiting.is_finished());
        assert_eq!((budget.used(), budget.kept_waiting_bytes()), (4096, 512));
        // Another one holding memory finds the rest of the share (2048 - 512 bytes) too small
        // for it: refused, it gives up what it holds rather than keeping it uncounted.
        let mut b = budget.force(1600);
        assert_eq!(b.grow_keeping(64, 2048, None).await.unwrap_err(), ChargeError::NoShareToWait);
        drop(b);
        // One holding nothing may always wait.
        let mut c = budget.empty();
        let deadline = tokio::time::Instant::now() + Duration::from_millis(20);
        assert_eq!(c.grow_keeping(64, 2048, Some(deadline)).await.unwrap_err(), ChargeError::TimedOut);
        drop(full);
        let a = waiting.await.unwrap();
        assert_eq!((a.bytes(), budget.kept_waiting_bytes()), (1024, 0));
        // Past its cap it is too large, never a wait.
        let mut d = budget.empty();
        assert!(matches!(d.grow_keeping(4096, 2048, None).await, Err(ChargeError::NeverFits { .. })));
    }

    #[tokio::test]
    async fn waiters_are_served_in_order() {
        let budget = MemoryBudget::new(1024);
        let a = budget.charge(512, None).await.unwrap();
        let b = budget.charge(512, None).await.unwrap();
        let b2 = budget.clone();
        let big = tokio::spawn(async move { b2.charge(960, None).await.unwrap() });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(a);
        // Half the budget is free, but it is the big waiter's: a small charge arriving after it
        // does not jump the line.
        assert!(budget.try_charge(64).is_none());
        assert!(!big.is_finished());
        drop(b);
        assert_eq!(big.await.unwrap().bytes(), 960);
        assert!(budget.try_charge(64).is_some());
    }

    #[test]
    fn pressure_starts_at_three_quarters_and_ends_under_half() {
        let budget = MemoryBudget::new(1 << 20);
        let half = budget.try_charge(512 << 10).unwrap();
        assert!(!budget.pressed(), "half the budget is no pressure");
        let quarter = budget.try_charge(256 << 10).unwrap();
        assert!(budget.pressed(), "three quarters is");
        let mut rest = budget.force(64 << 10);
        rest.shrink_to(0);
        assert!(budget.pressed(), "still over half");
        drop(quarter);
        assert!(budget.pressed(), "at half exactly it goes on");
        drop(half);
        assert!(!budget.pressed(), "under half it ends");
        let over = budget.force(2 << 20);
        assert!(budget.pressed(), "an overdraft is pressure too");
        drop(over);
        assert!(!budget.pressed());
    }

    #[test]
    fn forced_overdraft_is_repaid_before_the_budget_refills() {
        let budget = MemoryBudget::new(1024);
        let a = budget.force(1024);
        let b = budget.force(512);
        assert_eq!(budget.used(), 1536);
        drop(b);
        assert_eq!(budget.used(), 1024);
        assert!(budget.try_charge(64).is_none(), "the overdraft was repaid, nothing freed yet");
        drop(a);
        assert_eq!(budget.used(), 0);
        assert!(budget.try_charge(1024).is_some());
    }

    #[test]
    fn splitting_merging_and_truing_up() {
        let budget = MemoryBudget::new(1 << 20);
        let mut c = budget.try_charge(6400).unwrap();
        let front = c.split_share(1, 4);
        assert_eq!((front.bytes(), c.bytes()), (1600, 4800));
        c.merge(front);
        assert_eq!(c.bytes(), 6400);
        c.true_up(100);
        assert_eq!((c.bytes(), budget.used()), (128, 128));
        c.true_up(10_000);
        assert_eq!(budget.used(), c.bytes());
        let mut off = c.split_off(100);
        assert_eq!((off.bytes(), c.bytes(), budget.used()), (128, 9920, 10_048));
        off.true_up(1000);
        assert_eq!(c.split_off(1 << 20).bytes(), 9920, "at most what is held");
        drop(off);
        c.true_up(10_000);
        let mut none = MemoryCharge::none();
        none.merge(c);
        assert_eq!(budget.used(), none.bytes());
        drop(none);
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn grow_respects_the_cap() {
        let budget = MemoryBudget::new(1 << 20);
        let mut c = budget.empty();
        c.grow(1000, 2000, None).await.unwrap();
        assert!(matches!(c.grow(1500, 2000, None).await, Err(ChargeError::NeverFits { .. })));
        assert_eq!(budget.used(), c.bytes());
    }
}
