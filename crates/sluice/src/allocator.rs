//! The process's allocator: mimalloc, called the way the C library would be.
//!
//! glibc's allocator hands each freed batch back to the kernel and faults it in again on the
//! next read (measured: the tcp input at 1.5M lines/s with it, 2.7M/s without the trimming), so
//! the process uses mimalloc. Events are made of many small allocations (a map, its strings,
//! nested metadata maps): requests whose alignment mimalloc's plain `mi_malloc` already
//! guarantees (up to 16 bytes, and not more than the size, as for C's `malloc`) go to it
//! directly. The stock Rust binding routes every request through the aligned entry points,
//! whose extra checks showed up as a tenth of the file input's allocation time.

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys::{
    mi_free, mi_malloc, mi_malloc_aligned, mi_option_set, mi_option_t, mi_realloc, mi_realloc_aligned, mi_zalloc,
    mi_zalloc_aligned,
};

/// The largest alignment `mi_malloc` guarantees for every block at least that large.
const PLAIN_ALIGN: usize = 16;

pub struct Mimalloc;

fn plain(align: usize, size: usize) -> bool {
    align <= PLAIN_ALIGN && align <= size
}

// SAFETY: every pointer comes from and goes back to mimalloc; the plain entry points are used
// only where their alignment guarantee covers the layout's.
unsafe impl GlobalAlloc for Mimalloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: mimalloc accepts any size; alignment is handled as described above.
        unsafe {
            if plain(layout.align(), layout.size()) {
                mi_malloc(layout.size()).cast()
            } else {
                mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        unsafe {
            if plain(layout.align(), layout.size()) {
                mi_zalloc(layout.size()).cast()
            } else {
                mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` was returned by one of mimalloc's allocation functions.
        unsafe { mi_free(ptr.cast::<c_void>()) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` is mimalloc's; the new block keeps the layout's alignment.
        unsafe {
            if plain(layout.align(), new_size) {
                mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

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
extern "C" fn tune() {
    // Its position in mimalloc's `mi_option_e` (the same in v2 and v3); the binding does not
    // name it.
    const ARENA_EAGER_COMMIT: mi_option_t = 4;
    // SAFETY: sets a plain integer option; mimalloc needs no initialisation for this (an
    // option set before its own start-up keeps the value set).
    unsafe { mi_option_set(ARENA_EAGER_COMMIT, 0) };
}

#[used]
#[unsafe(link_section = ".init_array")]
static TUNE_AT_START: extern "C" fn() = tune;
