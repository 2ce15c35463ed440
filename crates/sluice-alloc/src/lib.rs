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
pub extern "C" fn tune() {
    // Its position in mimalloc's `mi_option_e` (the same in v2 and v3); the binding does not
    // name it.
    const ARENA_EAGER_COMMIT: mi_option_t = 4;
    // SAFETY: sets a plain integer option; mimalloc needs no initialisation for this (an
    // option set before its own start-up keeps the value set).
    unsafe { mi_option_set(ARENA_EAGER_COMMIT, 0) };
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
