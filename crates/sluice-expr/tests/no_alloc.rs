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

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
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
