//! Crash safety of the `file` input, through the real binary: a writer appends numbered lines
//! to several files and rotates them (rename, then a new file) while the harness kills `sluice`
//! (file input → persisted queue → file output) with SIGKILL at random moments and starts it
//! again. Afterwards every written line must be in the output at least once. Duplicates are
//! counted and reported, and must stay under what the crash windows can explain: per kill, the
//! lines written during one registry flush interval plus one queue checkpoint interval (with
//! slack for an fsync). `SLUICE_CRASH_CYCLES` sets the number of kills (default 30). Every
//! line of the output must be whole: a line a kill cut short is cut off at the next start.

use crate::common;

use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::*;

const FILES: u64 = 3;
/// Lines per second the writer aims at, over all files.
const RATE: u64 = 5_000;
const ROTATE_EVERY: u64 = 3_000;
const FLUSH_INTERVAL_MS: u64 = 100;
const CHECKPOINT_INTERVAL_MS: u64 = 50;

fn config() -> String {
    format!(
        "data_dir: '{{dir}}/data'
registry: {{flush_interval: {FLUSH_INTERVAL_MS}ms}}
api: {{address: '127.0.0.1:0'}}
pipelines:
  p:
    workers: 2
    batch: {{size: 200, delay: 5ms}}
    queue: {{type: persisted, shards: 2, sync: commit, segment_bytes: 256KiB, max_bytes: 64MiB, checkpoint_interval: {CHECKPOINT_INTERVAL_MS}ms}}
    inputs: [{{type: file, include: ['{{dir}}/logs/*.log*'], scan_interval: 200ms, host_field: null}}]
    outputs: [{{type: file, path: '{{dir}}/out.log'}}]
"
    )
}

/// Appends `n <number>` lines round-robin to `app<k>.log`, rotating each file by rename every
/// `ROTATE_EVERY` lines; runs until told to stop and returns how many lines it wrote.
fn writer(logs: &Path, stop: Arc<AtomicBool>, written: Arc<AtomicU64>) -> u64 {
    let mut files: Vec<std::fs::File> = (0..FILES).map(|k| open(&logs.join(format!("app{k}.log")))).collect();
    let mut lines_in = vec![0u64; FILES as usize];
    let mut generation = vec![0u64; FILES as usize];
    let started = Instant::now();
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        // Keep to RATE lines per second, in small bursts.
        let due = started.elapsed().as_micros() as u64 * RATE / 1_000_000;
        if n >= due {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        let k = (n % FILES) as usize;
        files[k].write_all(format!("crash line n={n}\n").as_bytes()).unwrap();
        n += 1;
        written.store(n, Ordering::SeqCst);
        lines_in[k] += 1;
        if lines_in[k] == ROTATE_EVERY {
            let path = logs.join(format!("app{k}.log"));
            generation[k] += 1;
            std::fs::rename(&path, logs.join(format!("app{k}.log.{}", generation[k]))).unwrap();
            files[k] = open(&path);
            lines_in[k] = 0;
        }
    }
    n
}

fn open(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap()
}

#[test]
fn sigkill_while_files_rotate_loses_no_line() {
    let cycles = crash_cycles();
    let mut rng = Rng::from_env();
    let seed = rng.seed();
    let cfg = config();
    let mut dir = tempfile::tempdir().unwrap();
    let logs = dir.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let w = {
        let (logs, stop, written) = (logs.clone(), stop.clone(), written.clone());
        std::thread::spawn(move || writer(&logs, stop, written))
    };
    for _ in 0..cycles {
        let mut s = Sluice::start_in(dir, &cfg, Stdio::null());
        s.wait_log("file input watching", Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(100 + rng.next_u64() % 500));
        dir = s.kill_into_dir();
    }
    stop.store(true, Ordering::SeqCst);
    let total = w.join().unwrap();
    // A last run delivers everything that is left, then stops cleanly.
    let mut s = Sluice::start_in(dir, &cfg, Stdio::null());
    let out = s.path("out.log");
    // Not asserted here: the assertions below name what is missing.
    eventually(Duration::from_secs(60), || numbers_after(&out, "crash line n=").len() >= total as usize);
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    let seen = numbers_after(&out, "crash line n=");
    let missing: Vec<u64> = (0..total).filter(|n| !seen.contains_key(n)).collect();
    let duplicates: u64 = seen.values().map(|&c| u64::from(c) - 1).sum();
    // Per kill: what one registry flush interval and one queue checkpoint interval can hold
    // back, plus 200 ms for the fsyncs themselves, at the writer's rate.
    let window_ms = FLUSH_INTERVAL_MS + CHECKPOINT_INTERVAL_MS + 200;
    let bound = cycles as u64 * RATE * window_ms / 1000;
    eprintln!(
        "file crash test (seed {seed}): {cycles} kills, {total} lines written, {} delivered, {duplicates} duplicates \
         (bound {bound}), {} missing",
        seen.len(),
        missing.len()
    );
    assert!(total > 10_000, "the writer wrote ({total} lines)");
    assert!(
        missing.is_empty(),
        "lines missing from the output (seed {seed}): {} of them, first {:?}",
        missing.len(),
        &missing[..missing.len().min(20)]
    );
    assert!(seen.keys().all(|&n| n < total), "lines nobody wrote");
    let text = std::fs::read_to_string(&out).unwrap();
    let broken: Vec<&str> = text.lines().filter(|l| serde_json::from_str::<serde_json::Value>(l).is_err()).collect();
    assert!(broken.is_empty(), "broken lines in the output (seed {seed}): {broken:?}");
    assert!(duplicates <= bound, "{duplicates} duplicates is more than {cycles} crash windows explain ({bound})");
}

/// A file the `file` output was appending to when the process died ends in a partial line. The
/// next start cuts it back to its last complete line (its events come again from the queue)
/// and says how many bytes it cut, so the new lines follow whole ones.
#[test]
fn a_line_cut_by_a_crash_is_cut_off_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.log");
    let whole = "{\"message\":\"before the crash\"}\n";
    let torn = "{\"message\":\"cut sh";
    std::fs::write(&out, format!("{whole}{torn}")).unwrap();
    let input = dir.path().join("input.txt");
    std::fs::write(&input, "after 1\nafter 2\n").unwrap();
    let cfg = "data_dir: '{dir}/data'
api: {enabled: false}
pipelines:
  p:
    inputs: [{type: stdin}]
    outputs: [{type: file, path: '{dir}/out.log'}]
";
    let mut s = Sluice::start_in(dir, cfg, Stdio::from(std::fs::File::open(&input).unwrap()));
    let (status, log) = s.wait(Duration::from_secs(60));
    assert!(status.success(), "{log}");
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.starts_with(whole), "the complete line stays:\n{text}");
    assert!(!text.contains("cut sh"), "the torn bytes are gone:\n{text}");
    let messages: Vec<String> = text
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("a broken line `{l}`: {e}"));
            v["message"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(messages, ["before the crash", "after 1", "after 2"]);
    assert!(
        log.contains(&format!("bytes_cut={}", torn.len())) && log.contains("cut back to its last complete line"),
        "{log}"
    );

    // A file that ends whole is not touched at the next start.
    let dir = s.into_dir();
    std::fs::write(dir.path().join("input.txt"), "after 3\n").unwrap();
    let input = std::fs::File::open(dir.path().join("input.txt")).unwrap();
    let mut s = Sluice::start_in(dir, cfg, Stdio::from(input));
    let (status, log) = s.wait(Duration::from_secs(60));
    assert!(status.success(), "{log}");
    assert!(!log.contains("bytes_cut"), "{log}");
    let text = std::fs::read_to_string(s.path("out.log")).unwrap();
    assert_eq!(text.lines().count(), 4, "{text}");
    assert!(text.starts_with(whole) && text.lines().last().unwrap().contains("\"after 3\""), "{text}");
}
