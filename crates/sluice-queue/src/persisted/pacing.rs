//! Whether a push beyond the memory budget waits for the workers, or goes to disk only.
//!
//! A batch kept in memory (`memory_bytes`) reaches a worker as it is. One beyond the budget is
//! written and dropped, and a worker reads it back later: a read, a CRC check and a decode per
//! event, which cost CPU time. When the CPUs have time to spare that is free, and spilling is
//! what lets the queue absorb a backlog. When they have none, the read-back comes out of the
//! workers' time, and a pipeline whose inputs outrun its workers would get slower by spilling:
//! the inputs run ahead, and every event they get ahead by is read back.
//!
//! So a push beyond the budget waits for room in memory, as a push into the memory queue does,
//! while both of these hold:
//! - the workers are asking for events or taking them (from memory or disk) at least every
//!   [`SPILL_AFTER`]: an output that stalls stops them, and then the backlog goes to disk at
//!   once;
//! - this process is using at least [`BUSY_CPU`] of the CPUs it may use, over the last
//!   [`CPU_SAMPLE`] or so.
//!
//! Otherwise the push does not wait: the batch is written, and read back when the workers get
//! to it. Either way `max_bytes` bounds the queue, and no event is treated differently on disk.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Workers that have not taken anything for this long are stalled (or gone): pushes stop
/// waiting for them. Also how long a push waits before it looks again.
pub(crate) const SPILL_AFTER: Duration = Duration::from_millis(20);

/// Share of its CPUs a process uses when it has none to spare. A CPU-bound pipeline measures
/// 0.90–0.98 here on 2 CPUs; below this some CPU is idle, and reading back is nearly free.
pub(crate) const BUSY_CPU: f64 = 0.85;

/// How often the CPU use is sampled (by the push that finds the last sample older).
pub(crate) const CPU_SAMPLE: Duration = Duration::from_millis(50);

const NEVER: u64 = u64::MAX;

pub(crate) struct Pacing {
    epoch: Instant,
    /// When a worker last asked for or took events, in nanoseconds since `epoch` ([`NEVER`]
    /// before the first).
    last_take: AtomicU64,
    busy: AtomicBool,
    /// When `busy` was last worked out, in nanoseconds since `epoch`.
    sampled_at: AtomicU64,
    /// The process's CPU time and the wall time at the last sample.
    sample: Mutex<(Duration, Instant)>,
    cpus: f64,
    #[cfg(test)]
    forced_busy: Mutex<Option<bool>>,
}

impl Pacing {
    pub fn new() -> Pacing {
        let epoch = Instant::now();
        Pacing {
            epoch,
            last_take: AtomicU64::new(NEVER),
            busy: AtomicBool::new(false),
            sampled_at: AtomicU64::new(0),
            sample: Mutex::new((process_cpu_time().unwrap_or_default(), epoch)),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()) as f64,
            #[cfg(test)]
            forced_busy: Mutex::new(None),
        }
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// A worker asked for events, or took some (from memory or from disk).
    pub fn saw_worker(&self) {
        self.last_take.store(self.now(), Ordering::Relaxed);
    }

    /// Whether a push beyond the memory budget should wait for room rather than spill.
    pub fn should_wait(&self) -> bool {
        let now = self.now();
        let last = self.last_take.load(Ordering::Relaxed);
        let taking = last != NEVER && now.saturating_sub(last) <= SPILL_AFTER.as_nanos() as u64;
        taking && self.cpu_busy(now)
    }

    fn cpu_busy(&self, now: u64) -> bool {
        #[cfg(test)]
        if let Some(busy) = *self.forced_busy.lock() {
            return busy;
        }
        if now.saturating_sub(self.sampled_at.load(Ordering::Relaxed)) >= CPU_SAMPLE.as_nanos() as u64
            && let Some(mut sample) = self.sample.try_lock()
            && let Some(cpu) = process_cpu_time()
        {
            let wall = sample.1.elapsed();
            if wall >= CPU_SAMPLE {
                let used = cpu.saturating_sub(sample.0).as_secs_f64() / (wall.as_secs_f64() * self.cpus);
                self.busy.store(used >= BUSY_CPU, Ordering::Relaxed);
                *sample = (cpu, Instant::now());
                self.sampled_at.store(now, Ordering::Relaxed);
            }
        }
        self.busy.load(Ordering::Relaxed)
    }

    /// Makes the CPU look busy (or not) to this queue, whatever it is.
    #[cfg(test)]
    pub fn force_busy(&self, busy: Option<bool>) {
        *self.forced_busy.lock() = busy;
    }
}

/// User plus system CPU time of the whole process.
fn process_cpu_time() -> Option<Duration> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage fills the struct it is given, and returns 0 when it did.
    let usage = unsafe {
        if libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) != 0 {
            return None;
        }
        usage.assume_init()
    };
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    Some(time(usage.ru_utime) + time(usage.ru_stime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_cpu_time_counts_a_spinning_thread() {
        let before = process_cpu_time().unwrap();
        let until = Instant::now() + CPU_SAMPLE;
        while Instant::now() < until {}
        let spent = process_cpu_time().unwrap() - before;
        // Other tests' threads only add to it; a descheduled spinner can lose some.
        assert!(spent >= CPU_SAMPLE / 2, "{spent:?} of CPU time counted for a {CPU_SAMPLE:?} spin");
    }

    #[test]
    fn workers_that_stop_taking_are_not_waited_for() {
        let pacing = Pacing::new();
        pacing.force_busy(Some(true));
        assert!(!pacing.should_wait(), "waiting for workers that never took anything");
        pacing.saw_worker();
        assert!(pacing.should_wait());
        std::thread::sleep(SPILL_AFTER + Duration::from_millis(5));
        assert!(!pacing.should_wait(), "waiting for workers that took nothing for {SPILL_AFTER:?}");
        pacing.saw_worker();
        assert!(pacing.should_wait());
        pacing.force_busy(Some(false));
        assert!(!pacing.should_wait(), "waiting although the CPUs have time to spare");
    }
}
