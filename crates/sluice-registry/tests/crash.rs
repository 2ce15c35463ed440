//! SIGKILL while the registry writes: a child process (this test binary, re-run in a child
//! mode) commits rising offsets to 50 keys with a 1 ms flush interval and a tiny (or, every
//! other cycle, a large) compaction threshold, and reports each offset `flush()` made durable. The parent kills it at varied
//! moments (mid-append, mid-compaction), reopens the registry and checks that every key holds at
//! least the last offset reported durable, then lets the next child carry on from there.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use sluice_registry::{Registry, RegistryOptions};

const CHILD_ENV: &str = "SLUICE_REGISTRY_CRASH_CHILD";
const KEYS: u64 = 50;

const COMPACT_ENV: &str = "SLUICE_REGISTRY_CRASH_COMPACT_AFTER";

fn options(compact_after_bytes: u64) -> RegistryOptions {
    RegistryOptions { flush_interval: Duration::from_millis(1), compact_after_bytes }
}

/// The child's work; does nothing unless run as the child.
#[test]
fn child_writer() {
    let Ok(dir) = std::env::var(CHILD_ENV) else { return };
    let compact_after = std::env::var(COMPACT_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(4096);
    let r = Registry::open(Path::new(&dir), options(compact_after)).expect("the child opens the registry");
    let start = r.entries().iter().map(|e| e.offset).max().unwrap_or(0) + 1;
    let cursors: Vec<_> = (0..KEYS).map(|k| r.cursor(&format!("key-{k:02}"))).collect();
    for round in start.. {
        for (k, c) in cursors.iter().enumerate() {
            c.commit(round);
            if round % 100 == k as u64 {
                c.set_meta(serde_json::json!({"round": round}));
            }
        }
        if round % 10 == 0 {
            r.flush().expect("flush");
            println!("durable {round}");
        }
    }
}

#[test]
fn sigkill_at_any_moment_keeps_every_durable_offset() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut rng = sluice_testkit::Rng::from_env();
    let mut random = move |n: u64| rng.below(n);
    let mut durable = 0u64;
    for cycle in 0..12 {
        let mut child = Command::new(&exe)
            .args(["--exact", "child_writer", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, dir.path())
            // Small: kills often land in compactions; large: recovery replays a long op log.
            .env(COMPACT_ENV, if cycle % 2 == 0 { "4096" } else { "1048576" })
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let wanted = 1 + random(20);
        let mut seen = 0;
        while seen < wanted {
            let line = lines.next().unwrap_or_else(|| panic!("cycle {cycle}: the child ended early")).unwrap();
            if let Some(n) = line.strip_prefix("durable ") {
                durable = n.parse().unwrap();
                seen += 1;
            }
        }
        std::thread::sleep(Duration::from_micros(random(2_000)));
        child.kill().unwrap();
        child.wait().unwrap();

        let r = Registry::open(dir.path(), options(4096))
            .unwrap_or_else(|e| panic!("cycle {cycle}: the registry does not open after SIGKILL: {e}"));
        let entries = r.entries();
        assert_eq!(entries.len() as u64, KEYS, "cycle {cycle}: keys lost");
        for e in &entries {
            assert!(e.offset >= durable, "cycle {cycle}: {} went back to {} (durable: {durable})", e.key, e.offset);
        }
        r.close().unwrap();
    }
    assert!(durable >= 120, "the children made little progress: {durable}");
}
