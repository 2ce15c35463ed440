//! Line splitting and line decoding, the per-byte work of every line-based input.

// The allocator the `sluice` binary uses.
sluice_alloc::install!();

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_inputs::codec::Codec;
use sluice_inputs::framing::LineFramer;

fn sample(lines: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..lines {
        let line = format!(
            r#"{{"ts":"2026-11-21T07:00:00.{:03}Z","level":"info","host":"web-{}","service":"checkout","trace_id":"{:016x}","status":{},"method":"GET","path":"/api/v1/items/{}","latency_ms":{},"msg":"request served"}}"#,
            i % 1000,
            i % 7,
            i * 7919,
            200 + i % 5,
            i,
            i % 300
        );
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
    }
    out
}

fn bench(c: &mut Criterion) {
    let data = sample(10_000);
    let mut g = c.benchmark_group("framing");
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.bench_function("split_lines_64k_chunks", |b| {
        b.iter(|| {
            let mut f = LineFramer::new(1 << 20);
            let mut n = 0usize;
            for chunk in data.chunks(64 * 1024) {
                f.feed(chunk, |l| n += l.bytes.len());
            }
            n
        })
    });
    g.bench_function("split_and_decode_text", |b| {
        b.iter(|| {
            let mut f = LineFramer::new(1 << 20);
            let mut events = Vec::with_capacity(10_000);
            for chunk in data.chunks(64 * 1024) {
                f.feed(chunk, |l| events.push(Codec::Lines.decode(l.bytes, l.truncated, 0).0));
            }
            events.len()
        })
    });
    g.bench_function("split_and_decode_json", |b| {
        b.iter(|| {
            let mut f = LineFramer::new(1 << 20);
            let mut events = Vec::with_capacity(10_000);
            for chunk in data.chunks(64 * 1024) {
                f.feed(chunk, |l| events.push(Codec::JsonLines.decode(l.bytes, l.truncated, 0).0));
            }
            events.len()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
