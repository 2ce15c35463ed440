//! The acknowledgement path: `Cursor::commit` over 10,000 keys while the background writer runs
//! with the default flush interval. Target: ≤ 50 ns per commit, ≤ 1 fsync per flush interval.

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_registry::{Registry, RegistryOptions};

const KEYS: usize = 10_000;
const COMMITS: u64 = 1_000_000;

fn ack(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let registry = Registry::open(dir.path(), RegistryOptions::default()).expect("open the registry");
    let cursors: Vec<_> = (0..KEYS).map(|i| registry.cursor(&format!("/var/log/app/file-{i:05}.log"))).collect();
    // A fixed pseudo-random key order, precomputed so the bench measures commits.
    let mut rng = sluice_testkit::Rng::with_seed(0x9e37_79b9_7f4a_7c15);
    let random: Vec<u32> = (0..COMMITS).map(|_| rng.below(KEYS as u64) as u32).collect();

    let mut group = c.benchmark_group("registry_ack");
    group.throughput(Throughput::Elements(COMMITS));
    group.sample_size(20);
    let mut offset = 0u64;
    group.bench_function("commit_1M_round_robin_10k_keys", |b| {
        b.iter(|| {
            for i in 0..COMMITS as usize {
                offset += 1;
                cursors[i % KEYS].commit(offset);
            }
        })
    });
    group.bench_function("commit_1M_random_10k_keys", |b| {
        b.iter(|| {
            for &k in &random {
                offset += 1;
                cursors[k as usize].commit(offset);
            }
        })
    });
    // Two threads (the machine's cores), each on its own half of the keys, as ack handlers on
    // two runtime workers would be.
    group.bench_function("commit_1M_two_threads_10k_keys", |b| {
        b.iter(|| {
            std::thread::scope(|s| {
                for half in cursors.chunks(KEYS / 2) {
                    s.spawn(move || {
                        for i in 0..COMMITS / 2 {
                            half[i as usize % half.len()].commit(i);
                        }
                    });
                }
            })
        })
    });
    group.finish();

    // fsyncs per flush interval under a sustained commit load.
    let before = registry.stats();
    let started = Instant::now();
    let run = Duration::from_secs(5);
    let mut commits = 0u64;
    while started.elapsed() < run {
        for &k in &random[..100_000] {
            offset += 1;
            cursors[k as usize].commit(offset);
        }
        commits += 100_000;
    }
    let elapsed = started.elapsed();
    let after = registry.stats();
    let intervals = elapsed.as_secs_f64() / RegistryOptions::default().flush_interval.as_secs_f64();
    println!(
        "sustained load: {commits} commits in {:.2}s over {KEYS} keys; {} fsyncs, {} flushes, {} records in {:.1} flush intervals = {:.2} fsyncs per interval",
        elapsed.as_secs_f64(),
        after.fsyncs - before.fsyncs,
        after.flushes - before.flushes,
        after.records_written - before.records_written,
        intervals,
        (after.fsyncs - before.fsyncs) as f64 / intervals,
    );
    registry.close().expect("close the registry");
}

criterion_group!(benches, ack);
criterion_main!(benches);
