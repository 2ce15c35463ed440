//! Routing in cluster mode: for every event of a batch, the hash of its identification keys, the
//! ring member owning it, and the event's index pushed onto that member's list. Target: ≤ 30 ns
//! per event on one core, all of it.
//!
//! The events are what the `json` processor makes of lines like
//! `{"@timestamp":"…","host":"web-3","level":"info","user":"user-04217","message":"…",…}`:
//! a `user` from 10,000 distinct names among half a dozen other fields. The keys are `[/user]`;
//! the ring has three members at the default points per member.

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_cluster::ring::{DEFAULT_VIRTUAL_NODES, Ring};
use sluice_core::{Event, FieldPath, KeySpec, Value};

const BATCH: usize = 1000;
const USERS: u64 = 10_000;

fn events() -> Vec<Event> {
    let mut rng = sluice_testkit::Rng::with_seed(0x9e37_79b9_7f4a_7c15);
    let mut next = move || rng.next_u64();
    (0..BATCH)
        .map(|i| {
            let r = next();
            let user = r % USERS;
            let line = format!(
                r#"{{"@timestamp":"2025-03-14T09:26:{:02}.{:03}Z","host":"web-{}","level":"{}","user":"user-{user:05}","message":"GET /api/v1/orders/{} HTTP/1.1 200","status":{},"latency_ms":{}.{}}}"#,
                i % 60,
                i % 1000,
                r % 8,
                ["info", "warn", "error"][(r >> 20) as usize % 3],
                r >> 40,
                [200, 201, 404, 500][(r >> 8) as usize % 4],
                r % 500,
                r % 10,
            );
            match Value::from_json_slice(line.as_bytes()).expect("valid JSON") {
                Value::Object(map) => Event::from_object_at(map, 0),
                _ => unreachable!("an object"),
            }
        })
        .collect()
}

fn routing(c: &mut Criterion) {
    let events = events();
    let spec = KeySpec::new(vec![FieldPath::parse("/user").unwrap()]);
    let ring = Ring::new(&["10.0.0.1:7100", "10.0.0.2:7100", "10.0.0.3:7100"], DEFAULT_VIRTUAL_NODES);
    let mut scratch = Vec::with_capacity(64);
    let mut groups: Vec<Vec<u32>> = (0..ring.len()).map(|_| Vec::with_capacity(BATCH)).collect();
    let hashes: Vec<u64> = events.iter().map(|e| spec.hash(e, &mut scratch).hash).collect();

    let mut group = c.benchmark_group("routing");
    group.throughput(Throughput::Elements(BATCH as u64));

    group.bench_function("route_batch_1000", |b| {
        b.iter(|| {
            for g in groups.iter_mut() {
                g.clear();
            }
            for (i, event) in events.iter().enumerate() {
                let h = spec.hash(event, &mut scratch).hash;
                groups[ring.owner(h)].push(i as u32);
            }
            black_box(&groups);
        })
    });

    group.bench_function("hash_only_1000", |b| {
        b.iter(|| {
            let mut acc = 0u64;
            for event in &events {
                acc ^= spec.hash(event, &mut scratch).hash;
            }
            black_box(acc)
        })
    });

    group.bench_function("owner_only_1000", |b| {
        b.iter(|| {
            let mut acc = 0usize;
            for &h in &hashes {
                acc += ring.owner(h);
            }
            black_box(acc)
        })
    });

    group.bench_function("owner_and_group_1000", |b| {
        b.iter(|| {
            for g in groups.iter_mut() {
                g.clear();
            }
            for (i, &h) in hashes.iter().enumerate() {
                groups[ring.owner(h)].push(i as u32);
            }
            black_box(&groups);
        })
    });

    // Lookups at other ring sizes: the direct index keeps them flat.
    for (members, vn) in [(3, 64), (3, 1024), (16, 256)] {
        let names: Vec<String> = (0..members).map(|i| format!("10.0.0.{i}:7100")).collect();
        let ring = Ring::new(&names, vn);
        group.bench_function(format!("owner_only_1000_{members}x{vn}"), |b| {
            b.iter(|| {
                let mut acc = 0usize;
                for &h in &hashes {
                    acc += ring.owner(h);
                }
                black_box(acc)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, routing);
criterion_main!(benches);
