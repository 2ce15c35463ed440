//! `Condition::eval` must not allocate: counted with a global allocator that tallies the
//! allocations of the current thread only.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use sluice_core::{Event, Map, Value};
use sluice_expr::{Condition, Template};

struct Counting;

thread_local! {
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: every method hands its arguments to `System` unchanged and returns what it returns,
// so `System`'s guarantees are this allocator's. The tally is a const-initialised thread local
// that never allocates (and `try_with` skips it once the thread's locals are gone).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's promise about `layout` is passed on as it was made.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, which is `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: as in `dealloc`; `new_size` is the caller's, checked by the caller.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations(f: impl FnOnce()) -> usize {
    let before = ALLOCS.with(Cell::get);
    f();
    ALLOCS.with(Cell::get) - before
}

fn event() -> Event {
    let mut m = Map::new();
    m.insert("status", Value::Int(503));
    m.insert("level", Value::from("error"));
    m.insert("path", Value::from("/api/v1/users"));
    m.insert("tags", Value::Array(vec![Value::from("web"), Value::from("x")]));
    m.insert("user", Value::Object([("id".into(), Value::Int(7))].into_iter().collect()));
    let mut e = Event::new(m);
    e.set_timestamp_nanos(1_700_000_000_000_000_000);
    e
}

#[test]
fn eval_does_not_allocate() {
    let e = event();
    for src in [
        r#"/status >= 500 and /level == "error""#,
        "exists(/user/id) && !exists(/nope)",
        r#"/path =~ "^/api/v\d" or /path !~ "x""#,
        r#"/level in ["warn", "error"] and "x" in /tags and /level not in ["debug"]"#,
        "(/status == 503.0 or /missing > 1) and /@timestamp > '2020-01-01T00:00:00Z'",
        "'api' in /path and /user/id != 8 and /user",
    ] {
        let c = Condition::parse(src).unwrap();
        assert!(c.eval(&e), "{src}");
        // Warm up: the regex engine sets up a per-thread search cache on first use.
        let n = allocations(|| {
            for _ in 0..100 {
                assert!(c.eval(&e));
            }
        });
        assert_eq!(n, 0, "{src} allocated");
    }
}

#[test]
fn render_into_a_reserved_buffer_does_not_allocate() {
    let e = event();
    let t = Template::parse("%{/level}-%{/status}-%{+%Y.%m.%d}-%{+YYYY}").unwrap();
    let mut out = String::with_capacity(256);
    t.render(&e, &mut out);
    assert_eq!(out, "error-503-2023.11.14-2023");
    let n = allocations(|| {
        for _ in 0..100 {
            out.clear();
            t.render(&e, &mut out);
        }
    });
    assert_eq!(n, 0);
}
