//! The process's allocator: mimalloc, with blocks of a MiB and more mapped on their own. The
//! `sluice` binary and every criterion bench install it with [`install!`], so that what is
//! measured is what ships.
//!
//! glibc's allocator hands each freed batch back to the kernel and faults it in again on the
//! next read (measured: the tcp input at 1.5M lines/s with it, 2.7M/s without the trimming), so
//! the process uses mimalloc, through the stock `mimalloc` crate. (A hand-written binding that
//! sent small requests to `mi_malloc` instead of the aligned entry points was measured against
//! it on the allocation shapes of decoded events and was no faster beyond this machine's noise,
//! so it went.)

use std::alloc::{GlobalAlloc, Layout};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};

use std::ffi::c_long;

use libmimalloc_sys::{mi_collect, mi_option_set, mi_option_t};
use mimalloc::MiMalloc;

/// Blocks of this size and more are mapped from the kernel on their own and unmapped when
/// freed, bypassing mimalloc.
///
/// What the memory budget lets through under a flood of large requests (10 MiB http bodies,
/// their inflated copies, beats windows) is a few dozen such blocks, allocated on one thread
/// and freed on another. mimalloc keeps a freed block's pages until the allocating thread
/// next collects and the purge delay has passed, so at the budget's edge the process held
/// about a third more than it had live (`bench/hostile.py --budget-suite --only http`,
/// 128 MiB budget: 131 MiB live at the peak, 178 MiB resident). A mapping of its own is given
/// back the moment it is freed, and grows in place or by moving page tables (`mremap`)
/// rather than by copying. Below this size blocks are reused hot by mimalloc: events,
/// batches and read buffers never come near it.
pub const DIRECT_MAP_FROM: usize = 1 << 20;

const PAGE: usize = 4096;

/// The process's allocator: blocks of [`DIRECT_MAP_FROM`] bytes and more are mapped on their
/// own, everything else goes to mimalloc. Which of the two owns a block follows from its
/// layout alone, which Rust passes back unchanged to `dealloc` and `realloc`.
pub struct Allocator;

fn mapped(size: usize, align: usize) -> bool {
    size >= DIRECT_MAP_FROM && align <= PAGE
}

fn map(size: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping at an address of the kernel's choosing touches no
    // existing memory; failure is reported as MAP_FAILED and turned into null (the allocator's
    // way of saying out of memory).
    let p = unsafe {
        libc::mmap(
            ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED { ptr::null_mut() } else { p.cast() }
}

// SAFETY: every block handed out is either a fresh anonymous mapping of at least the layout's
// size, page aligned (so aligned for any layout routed there, whose alignment is at most a
// page), or a block from mimalloc, which honours the layout; each is freed or resized by the
// side that made it, chosen by `mapped` on the layout the caller gives back.
unsafe impl GlobalAlloc for Allocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if mapped(layout.size(), layout.align()) {
            return map(layout.size());
        }
        // SAFETY: the caller's contract (a layout of non-zero size) is passed on unchanged.
        unsafe { MiMalloc.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if mapped(layout.size(), layout.align()) {
            // A fresh anonymous mapping reads as zeroes.
            return map(layout.size());
        }
        // SAFETY: as in `alloc`.
        unsafe { MiMalloc.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        if mapped(layout.size(), layout.align()) {
            // SAFETY: the block was mapped by `map` with this size (the layout is the one it
            // was allocated or last resized with) and is not used again by the caller.
            unsafe { libc::munmap(block.cast(), layout.size()) };
            return;
        }
        // SAFETY: the block came from mimalloc with this layout.
        unsafe { MiMalloc.dealloc(block, layout) }
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let was_mapped = mapped(layout.size(), layout.align());
        let will_be_mapped = mapped(new_size, layout.align());
        match (was_mapped, will_be_mapped) {
            // SAFETY: the block came from mimalloc with this layout; the caller guarantees
            // the new size is non-zero and does not overflow when rounded to the alignment.
            (false, false) => unsafe { MiMalloc.realloc(block, layout, new_size) },
            (true, true) => {
                // SAFETY: the block is a mapping of `layout.size()` bytes made by `map`;
                // MREMAP_MAYMOVE lets the kernel move its pages if it cannot grow in place,
                // and the old address is not used again on success.
                let p = unsafe { libc::mremap(block.cast(), layout.size(), new_size, libc::MREMAP_MAYMOVE) };
                if p == libc::MAP_FAILED { ptr::null_mut() } else { p.cast() }
            }
            _ => {
                // Crossing the threshold: a new block on the other side, the contents
                // copied, the old block freed (on failure the old block stays the caller's).
                // SAFETY: the new layout has the old alignment and a size the caller vouched for.
                let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
                // SAFETY: a layout of non-zero size.
                let fresh = unsafe { self.alloc(new_layout) };
                if !fresh.is_null() {
                    // SAFETY: both blocks are at least the smaller size long and distinct;
                    // the old one is freed with the layout it was made with.
                    unsafe {
                        ptr::copy_nonoverlapping(block, fresh, layout.size().min(new_size));
                        self.dealloc(block, layout);
                    }
                }
                fresh
            }
        }
    }
}

// Their positions in mimalloc's `mi_option_e` (the same in v2 and v3); the binding does not
// name them.
const ARENA_EAGER_COMMIT: mi_option_t = 4;
const PURGE_DELAY: mi_option_t = 15;

/// Milliseconds mimalloc waits before giving freed memory back to the kernel, normally.
const PURGE_DELAY_MS: c_long = 1;

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
/// and 1.23 but cost the tcp input 30 %, so it is done only under memory pressure
/// ([`pressure`]). `MIMALLOC_PURGE_DELAY` set in the environment is kept, and then [`pressure`]
/// leaves the delay alone.
pub extern "C" fn tune() {
    // SAFETY: sets plain integer options; mimalloc needs no initialisation for this (an
    // option set before its own start-up keeps the value set).
    unsafe { mi_option_set(ARENA_EAGER_COMMIT, 0) };
    let set_by_operator = std::env::var_os("MIMALLOC_PURGE_DELAY").is_some();
    OPERATOR_SET_PURGE_DELAY.store(set_by_operator, Ordering::Relaxed);
    if !set_by_operator {
        // SAFETY: as above.
        unsafe { mi_option_set(PURGE_DELAY, PURGE_DELAY_MS) };
    }
}

/// `MIMALLOC_PURGE_DELAY` was in the environment at start-up (read once, by [`tune`], so that
/// [`pressure`] reads no environment from inside the memory budget's bookkeeping).
static OPERATOR_SET_PURGE_DELAY: AtomicBool = AtomicBool::new(false);

/// The memory budget's pressure hook (`sluice_core::memory::on_pressure`): while the budget is
/// nearly spent, freed memory goes back to the kernel at once, and what already waits out the
/// delay is given back when pressure starts. Then the resident size follows what the budget
/// counts (`bench/hostile.py --budget-suite --only http`, 128 MiB budget: 1.35 x the budget
/// with the delay, 1.16 x without), at the cost of faulting pages in again while it lasts,
/// which is when the inputs are waiting for memory anyway.
pub fn pressure(pressed: bool) {
    if OPERATOR_SET_PURGE_DELAY.load(Ordering::Relaxed) {
        return;
    }
    let delay = if pressed { 0 } else { PURGE_DELAY_MS };
    // SAFETY: options may be changed while the process runs; mimalloc reads this one each time
    // it schedules a purge.
    unsafe { mi_option_set(PURGE_DELAY, delay) };
    if pressed {
        // SAFETY: collecting is allowed from any thread at any time; forced, it also gives back
        // the freed memory that waits in the process's arenas.
        unsafe { mi_collect(true) };
    }
}

/// Makes [`Allocator`] the global allocator of the crate it is invoked in (a binary, a bench),
/// with [`tune`] run from that executable's initialisation list. Both live in the invoking
/// crate, so that the linker cannot leave the tuning out.
#[macro_export]
macro_rules! install {
    () => {
        #[global_allocator]
        static GLOBAL: $crate::Allocator = $crate::Allocator;

        #[used]
        #[unsafe(link_section = ".init_array")]
        static TUNE_AT_START: extern "C" fn() = $crate::tune;
    };
}
