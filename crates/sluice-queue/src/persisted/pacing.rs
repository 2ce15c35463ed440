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
//! - the CPUs are busy, over the last [`CPU_SAMPLE`] or so: this process used at least
//!   [`BUSY_CPU`] of the CPUs it may use, or the machine's CPUs were idle less than
//!   `1 - BUSY_CPU` of the time. Both, because a container's CPU quota makes the first the
//!   one that counts, while on a virtual machine whose host is busy the process gets less CPU
//!   time than it could use (steal time) and only the second sees that nothing is idle.
//!   Until a sample has been taken (when the queue opens, or when memory was last full more
//!   than two samples ago) the CPUs count as busy: waiting for the workers a moment too long
//!   costs an input a few milliseconds, spilling a moment too early costs the workers a read
//!   back of everything spilled.
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

pub(crate) struct Pacing {
    epoch: Instant,
    /// When a worker last asked for or took events, in nanoseconds since `epoch`. It starts at
    /// 0: the workers of a pipeline that just started get `SPILL_AFTER` to ask for the first.
    last_take: AtomicU64,
    /// The verdict of the last sample. While none is fresh (at the start, or when memory was
    /// last full long ago) the CPUs count as busy: a pipeline starting with a backlog (a
    /// generator, a replay) would otherwise spill what its inputs make while the first sample
    /// is taken, and its workers would then read that back when they are the bottleneck.
    busy: AtomicBool,
    /// When the current sample began, in nanoseconds since `epoch`; 0 before the first.
    sampled_at: AtomicU64,
    /// Where the current sample began: the process's CPU time, the wall time and the
    /// machine's CPU times.
    sample: Mutex<Option<CpuSample>>,
    cpus: f64,
    #[cfg(test)]
    forced_busy: Mutex<Option<bool>>,
}

impl Pacing {
    pub fn new() -> Pacing {
        let epoch = Instant::now();
        Pacing {
            epoch,
            last_take: AtomicU64::new(0),
            busy: AtomicBool::new(true),
            sampled_at: AtomicU64::new(0),
            sample: Mutex::new(None),
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
        let taking = now.saturating_sub(self.last_take.load(Ordering::Relaxed)) <= SPILL_AFTER.as_nanos() as u64;
        taking && self.cpu_busy(now)
    }

    fn cpu_busy(&self, now: u64) -> bool {
        #[cfg(test)]
        if let Some(busy) = *self.forced_busy.lock() {
            return busy;
        }
        let since = now.saturating_sub(self.sampled_at.load(Ordering::Relaxed));
        if (since >= CPU_SAMPLE.as_nanos() as u64 || self.sampled_at.load(Ordering::Relaxed) == 0)
            && let Some(mut sample) = self.sample.try_lock()
            && let Some(current) = CpuSample::take()
        {
            let verdict = match sample.as_ref() {
                Some(last) if since <= 2 * CPU_SAMPLE.as_nanos() as u64 => current.busy_since(last, self.cpus),
                // None yet, or one begun before a quiet stretch, which says nothing about now:
                // measure from here on, and count the CPUs as busy meanwhile.
                _ => Some(true),
            };
            if let Some(busy) = verdict {
                self.busy.store(busy, Ordering::Relaxed);
                *sample = Some(current);
                self.sampled_at.store(now.max(1), Ordering::Relaxed);
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

/// Where a CPU sample began.
struct CpuSample {
    cpu: Duration,
    at: Instant,
    machine: Option<MachineCpu>,
}

impl CpuSample {
    fn take() -> Option<CpuSample> {
        Some(CpuSample { cpu: process_cpu_time()?, at: Instant::now(), machine: MachineCpu::read() })
    }

    /// Whether the CPUs were busy between `last` and this sample (see the module comment);
    /// `None` if less than [`CPU_SAMPLE`] lies between them.
    fn busy_since(&self, last: &CpuSample, cpus: f64) -> Option<bool> {
        let wall = self.at.duration_since(last.at);
        if wall < CPU_SAMPLE {
            return None;
        }
        let used = self.cpu.saturating_sub(last.cpu).as_secs_f64() / (wall.as_secs_f64() * cpus);
        let machine_busy = match (&last.machine, &self.machine) {
            (Some(before), Some(after)) => after.idle_since(before).is_some_and(|idle| idle < 1.0 - BUSY_CPU),
            _ => false,
        };
        Some(used >= BUSY_CPU || machine_busy)
    }
}

/// The machine's CPU time counters (all CPUs), from the first line of `/proc/stat`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct MachineCpu {
    /// Idle and waiting for I/O.
    idle: u64,
    total: u64,
}

impl MachineCpu {
    /// `None` where there is no `/proc/stat` (not Linux) or it reads strangely.
    fn read() -> Option<MachineCpu> {
        use std::io::Read;
        // The first line is short; the file goes on with a long line of interrupt counts.
        let mut head = [0u8; 256];
        let n = std::fs::File::open("/proc/stat").ok()?.read(&mut head).ok()?;
        MachineCpu::parse(std::str::from_utf8(&head[..n]).ok()?.lines().next()?)
    }

    /// `cpu  user nice system idle iowait irq softirq steal ...`, in clock ticks.
    fn parse(line: &str) -> Option<MachineCpu> {
        let mut fields = line.split_ascii_whitespace();
        if fields.next()? != "cpu" {
            return None;
        }
        let ticks: Vec<u64> = fields.take(8).map(|f| f.parse().ok()).collect::<Option<_>>()?;
        if ticks.len() < 5 {
            return None;
        }
        Some(MachineCpu { idle: ticks[3] + ticks[4], total: ticks.iter().sum() })
    }

    /// The share of CPU time that was idle since `before`; `None` if no tick passed.
    fn idle_since(&self, before: &MachineCpu) -> Option<f64> {
        let total = self.total.checked_sub(before.total).filter(|&t| t > 0)?;
        Some(self.idle.saturating_sub(before.idle) as f64 / total as f64)
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
    fn machine_cpu_times_are_read_from_the_first_line_of_proc_stat() {
        let before = MachineCpu::parse("cpu  100 5 50 800 40 3 2 0 0 0").unwrap();
        assert_eq!(before, MachineCpu { idle: 840, total: 1000 });
        // 100 ticks later, 10 of them idle, 30 stolen by the host.
        let after = MachineCpu::parse("cpu  150 5 60 808 42 3 2 30 0 0").unwrap();
        assert_eq!(after.idle_since(&before), Some(0.1));
        assert_eq!(after.idle_since(&after), None, "no time passed");
        assert_eq!(MachineCpu::parse("cpu0 1 2 3 4 5"), None, "a single CPU's line");
        assert_eq!(MachineCpu::parse("cpu  1 2 x 4 5"), None);
        assert_eq!(MachineCpu::parse("cpu  1 2 3"), None);
        if cfg!(target_os = "linux") {
            assert!(MachineCpu::read().is_some(), "/proc/stat unreadable");
        }
    }

    #[test]
    fn until_a_fresh_sample_says_otherwise_the_cpus_count_as_busy() {
        let pacing = Pacing::new();
        pacing.saw_worker();
        // At the start nothing is measured yet: wait for the workers rather than spill.
        assert!(pacing.should_wait(), "a queue that just opened spills before it has measured anything");
        // A sample is taken over the next CPU_SAMPLE; whatever it says (other tests share the
        // CPUs), one that is long out of date is not trusted: measuring starts again, and
        // meanwhile the CPUs count as busy.
        std::thread::sleep(CPU_SAMPLE + Duration::from_millis(10));
        pacing.saw_worker();
        let _ = pacing.should_wait();
        std::thread::sleep(4 * CPU_SAMPLE);
        pacing.saw_worker();
        assert!(pacing.should_wait(), "a sample taken long ago decided");
    }

    #[test]
    fn workers_that_stop_taking_are_not_waited_for() {
        let pacing = Pacing::new();
        pacing.force_busy(Some(true));
        // Workers just started get SPILL_AFTER to show up...
        assert!(pacing.should_wait());
        std::thread::sleep(SPILL_AFTER + Duration::from_millis(5));
        assert!(!pacing.should_wait(), "waiting for workers that never asked for anything");
        // ...and then as long from each time they ask or take.
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
