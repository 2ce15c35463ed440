// The allocator the `sluice` binary uses.
sluice_alloc::install!();
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_core::{Event, Map, Value};
use sluice_expr::{Condition, Template};

fn event() -> Event {
    let mut m = Map::new();
    m.insert("message", Value::from("GET /api/v1/users HTTP/1.1"));
    m.insert("@timestamp", Value::Timestamp(1_700_000_000_123_000_000));
    m.insert("host", Value::from("web-1"));
    m.insert("service", Value::from("api"));
    m.insert("method", Value::from("GET"));
    m.insert("path", Value::from("/api/v1/users"));
    m.insert("bytes", Value::Int(5120));
    m.insert("duration_ms", Value::Float(12.5));
    m.insert("user_agent", Value::from("curl/8.5.0"));
    m.insert("client", Value::from("10.0.0.7"));
    m.insert("status", Value::Int(503));
    m.insert("level", Value::from("error"));
    Event::new(m)
}

fn bench(c: &mut Criterion) {
    let ev = event();
    let cond = Condition::parse(r#"/status >= 500 and /level == "error""#).unwrap();
    c.bench_function("condition_eval", |b| b.iter(|| black_box(&cond).eval(black_box(&ev))));

    let tpl = Template::parse("%{/host}-%{/service}-%{+%Y.%m.%d}").unwrap();
    let mut out = String::with_capacity(64);
    c.bench_function("template_render", |b| {
        b.iter(|| {
            out.clear();
            black_box(&tpl).render(black_box(&ev), &mut out);
            black_box(out.len())
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
