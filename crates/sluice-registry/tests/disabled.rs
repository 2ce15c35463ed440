//! The benchmarking switch `SLUICE_REGISTRY_DISABLED=1` turns commits into no-ops. It is read
//! at open, so this test runs in a process of its own (an integration test binary).

use std::time::Duration;

use sluice_registry::{DISABLED_ENV, Registry, RegistryOptions};

#[test]
fn commits_are_ignored_when_disabled() {
    // SAFETY: the only test in this binary; no other thread reads the environment meanwhile.
    unsafe { std::env::set_var(DISABLED_ENV, "1") };
    let dir = tempfile::tempdir().unwrap();
    let opts = RegistryOptions { flush_interval: Duration::from_millis(1), ..RegistryOptions::default() };
    let r = Registry::open(dir.path(), opts.clone()).unwrap();
    let c = r.cursor("k");
    for i in 0..1000 {
        c.commit(i);
    }
    r.flush().unwrap();
    assert!(r.get("k").is_none());
    assert_eq!(r.stats().records_written, 0);
    r.close().unwrap();
    drop(r);

    // SAFETY: as above; the registry closed and dropped above has no thread left to read it.
    unsafe { std::env::remove_var(DISABLED_ENV) };
    let r = Registry::open(dir.path(), opts).unwrap();
    assert!(r.entries().is_empty());
    r.cursor("k").commit(5);
    r.flush().unwrap();
    assert_eq!(r.stats().records_written, 1);
}
