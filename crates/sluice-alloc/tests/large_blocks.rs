//! Large blocks are mapped on their own: their contents survive every resize across the
//! threshold, they start zeroed when asked, and freeing one gives its memory back at once.

sluice_alloc::install!();

use std::sync::Mutex;

use sluice_alloc::DIRECT_MAP_FROM;

/// The tests share one process's resident size: they run one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn resident_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kb * 1024
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 % 251) as u8).collect()
}

#[test]
fn contents_survive_resizes_across_the_threshold() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let small = DIRECT_MAP_FROM / 4;
    let mut v = pattern(small);
    // Up past the threshold (mimalloc → own mapping), further up (mremap), then back down.
    v.reserve_exact(DIRECT_MAP_FROM * 2);
    assert_eq!(v, pattern(small));
    v.extend(pattern(DIRECT_MAP_FROM * 2));
    v.reserve_exact(DIRECT_MAP_FROM * 8);
    let mut want = pattern(small);
    want.extend(pattern(DIRECT_MAP_FROM * 2));
    assert_eq!(v, want);
    v.truncate(small);
    v.shrink_to_fit();
    assert_eq!(v, pattern(small));
    // Over-aligned large layouts stay with mimalloc and still work.
    let layout = std::alloc::Layout::from_size_align(DIRECT_MAP_FROM * 2, 1 << 16).unwrap();
    // SAFETY: a layout of non-zero size; the block is written within it and freed with it.
    unsafe {
        let p = std::alloc::alloc(layout);
        assert!(!p.is_null() && (p as usize).is_multiple_of(1 << 16));
        p.write_bytes(7, layout.size());
        std::alloc::dealloc(p, layout);
    }
}

#[test]
fn zeroed_blocks_read_as_zeroes() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let v = vec![0u8; DIRECT_MAP_FROM * 3];
    assert!(v.iter().all(|&b| b == 0));
    let w: Vec<u64> = vec![0; DIRECT_MAP_FROM];
    assert!(w.iter().all(|&b| b == 0));
}

#[test]
fn a_freed_large_block_is_given_back_at_once() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    const SIZE: usize = 64 << 20;
    let before = resident_bytes();
    let mut block = vec![1u8; SIZE];
    block[SIZE - 1] = 2;
    let held = resident_bytes();
    assert!(held >= before + SIZE * 3 / 4, "the block is resident: {before} → {held}");
    drop(block);
    let after = resident_bytes();
    assert!(after + SIZE * 3 / 4 <= held, "freed, it is no longer resident: {held} → {after}");
}

#[test]
fn pressure_gives_freed_memory_back_at_once_until_it_ends() {
    const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: reads a plain integer option.
    let delay = || unsafe { libmimalloc_sys::mi_option_get(PURGE_DELAY) };
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        let before = delay();
        sluice_alloc::pressure(true);
        assert_eq!(delay(), before, "a delay the operator set is left alone");
        return;
    }
    assert_eq!(delay(), 1, "1 ms normally");
    sluice_alloc::pressure(true);
    assert_eq!(delay(), 0, "at once under pressure");
    sluice_alloc::pressure(false);
    assert_eq!(delay(), 1, "and back when it ends");
}
