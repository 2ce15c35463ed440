//! The process's allocator: mimalloc. The `sluice` binary and every criterion bench install it
//! with [`install!`], so that what is measured is what ships.
//!
//! glibc's allocator hands each freed batch back to the kernel and faults it in again on the
//! next read (measured: the tcp input at 1.5M lines/s with it, 2.7M/s without the trimming), so
//! the process uses mimalloc, through the stock `mimalloc` crate. (A hand-written binding that
//! sent small requests to `mi_malloc` instead of the aligned entry points was measured against
//! it on the allocation shapes of decoded events and was no faster beyond this machine's noise,
//! so it went.)

use libmimalloc_sys::{mi_option_set, mi_option_t};

pub use mimalloc::MiMalloc as Mimalloc;

/// One of mimalloc's defaults is changed: arenas are committed as they are used, not at once.
/// Committing eagerly touched about 2 MiB per thread up front (an idle process held 27 MiB
/// resident instead of 9), which put the file input over its memory budget once it had
/// builder threads.
///
/// (With mimalloc v3 the purge delay had to be raised too, or a persisted-queue run spent a
/// tenth of its CPU clearing pages it had just given back; with v2 and this setting that cost
/// is half a percent at the default delay, which keeps the resident size lower.)
///
/// The option is read when mimalloc reserves its first arena, which happens at the process's
/// first allocation, before `main`. So it is set from the executable's initialisation list,
/// which the loader runs before any Rust code.
///
/// And memory freed is given back to the kernel after 1 ms instead of mimalloc's 10: under a
/// flood of tiny events the freed pages waiting out the delay were most of what the process
/// held beyond its memory budget (`bench/hostile.py --budget-suite`, 128 MiB budget: tcp
/// 1.40 x the budget at 10 ms, 1.26 at 1 ms; http 1.97 and 1.51). Throughput moved by less
/// than this machine's noise (tcp input 1.04 M events/s either way; generator -> persisted
/// queue 0.93 x, file 0.96 x, three runs each). Purging at once (0) held the same runs to 1.05
/// and 1.23 but cost the tcp input 30 %, so it is left to operators: `MIMALLOC_PURGE_DELAY`
/// set in the environment is kept.
pub extern "C" fn tune() {
    // Their positions in mimalloc's `mi_option_e` (the same in v2 and v3); the binding does
    // not name them.
    const ARENA_EAGER_COMMIT: mi_option_t = 4;
    const PURGE_DELAY: mi_option_t = 15;
    // SAFETY: sets plain integer options; mimalloc needs no initialisation for this (an
    // option set before its own start-up keeps the value set).
    unsafe { mi_option_set(ARENA_EAGER_COMMIT, 0) };
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: as above.
        unsafe { mi_option_set(PURGE_DELAY, 1) };
    }
}

/// Makes [`Mimalloc`] the global allocator of the crate it is invoked in (a binary, a bench),
/// with [`tune`] run from that executable's initialisation list. Both live in the invoking
/// crate, so that the linker cannot leave the tuning out.
#[macro_export]
macro_rules! install {
    () => {
        #[global_allocator]
        static GLOBAL: $crate::Mimalloc = $crate::Mimalloc;

        #[used]
        #[unsafe(link_section = ".init_array")]
        static TUNE_AT_START: extern "C" fn() = $crate::tune;
    };
}
