//! The process's own figures, read at scrape time from the kernel: resident memory, CPU time
//! and open file descriptors, so that an operator sizing a container or chasing a leak sees
//! them beside the pipelines' figures. A figure the system does not give is left out, not
//! reported as zero.

/// What the process uses now.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcessFigures {
    pub resident_bytes: Option<u64>,
    pub cpu_seconds: Option<f64>,
    pub open_fds: Option<u64>,
}

impl ProcessFigures {
    pub fn now() -> ProcessFigures {
        ProcessFigures { resident_bytes: resident_bytes(), cpu_seconds: cpu_seconds(), open_fds: open_fds() }
    }
}

/// `VmRSS` of `/proc/self/status`, which the kernel gives in kB.
fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let kb: u64 = line.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

/// User and system CPU time of every thread of the process.
fn cpu_seconds() -> Option<f64> {
    // SAFETY: `rusage` is a C struct of integers, for which all zeroes is a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct it is given and reads nothing else.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return None;
    }
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Some(seconds(usage.ru_utime) + seconds(usage.ru_stime))
}

fn open_fds() -> Option<u64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as u64)
}

impl From<ProcessFigures> for sluice_core::snapshot::ProcessSnapshot {
    fn from(p: ProcessFigures) -> Self {
        sluice_core::snapshot::ProcessSnapshot {
            resident_bytes: p.resident_bytes,
            cpu_seconds: p.cpu_seconds,
            open_fds: p.open_fds,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_figures_follow_what_the_process_does() {
        let before = ProcessFigures::now();
        let (Some(rss), Some(cpu), Some(fds)) = (before.resident_bytes, before.cpu_seconds, before.open_fds) else {
            panic!("this system gives no process figures: {before:?}");
        };
        assert!(rss > 1 << 20, "{before:?}");
        let held: Vec<_> = (0..16).map(|_| std::fs::File::open("/proc/self/status").unwrap()).collect();
        let mut spin = 0u64;
        let started = std::time::Instant::now();
        while started.elapsed() < std::time::Duration::from_millis(50) {
            spin = spin.wrapping_add(std::hint::black_box(1));
        }
        let after = ProcessFigures::now();
        assert!(after.open_fds.unwrap() >= fds + 16, "{before:?} then {after:?}");
        assert!(after.cpu_seconds.unwrap() > cpu, "{before:?} then {after:?} ({spin})");
        drop(held);
    }
}
