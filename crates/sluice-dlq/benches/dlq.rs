//! The dead letter queue's index and writer: oldest/newest segment look-ups and the size-policy
//! decision with 100 to 20,000 segments on disk (these must not grow with the count: the index
//! replaces the directory scans Logstash did), the start-up index build, and write throughput
//! of 500-byte events with `sync: interval(1s)`.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use sluice_core::{Event, Value};
use sluice_dlq::{DeadLetter, DeadLetterQueue, DlqOptions, DlqSync, Room, StoragePolicy, encode_entry};

const COUNTS: [usize; 4] = [100, 1_000, 10_000, 20_000];

/// A dead letter whose encoded entry is about 500 bytes.
fn letter(i: u64) -> DeadLetter {
    let message = format!(
        "203.0.113.{} - - [21/Nov/2026:07:00:01 +0000] \"POST /api/v1/orders/{i} HTTP/1.1\" 400 187 \
         \"https://shop.example.com/checkout?step=3\" \"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 \
         (KHTML, like Gecko) Chrome/120.0 Safari/537.36\" request_id={i:016x} upstream=10.0.3.17:8080 \
         rt=0.041 uct=0.001 uht=0.040 urt=0.040 cache=MISS tls=TLSv1.3",
        i % 250
    );
    let mut event = Event::from_message_at(message, 1_763_708_401_000_000_000 + i as i64);
    event.fields.insert("host", Value::from("web-eu-3"));
    DeadLetter {
        event,
        reason: "400 Bad Request: mapper_parsing_exception: failed to parse field [status]".into(),
        plugin_id: "search-out".into(),
        plugin_type: "http".into(),
        pipeline: "main".into(),
        time: 1_763_708_401_000_000_000 + i as i64,
        attempts: 1,
    }
}

fn entry_bytes() -> usize {
    let mut body = Vec::new();
    encode_entry(&letter(123_456), &mut body).unwrap();
    body.len()
}

/// A directory holding `n` sealed segments of one entry each, written through the writer.
fn directory_with(n: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let opts = DlqOptions { segment_bytes: 1024, max_bytes: u64::MAX, sync: DlqSync::None, ..Default::default() };
    let q = DeadLetterQueue::open(dir.path(), opts).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(async {
        for i in 0..n as u64 {
            q.write(vec![letter(i)]).await.unwrap();
        }
    });
    q.close().unwrap();
    assert_eq!(sluice_dlq::inspect::segments(dir.path()).unwrap().len(), n);
    dir
}

/// Opens `dir` with `max_bytes` = what it stores: exactly full, drop_older, so the size
/// decision has to find the segment to evict.
fn open_full(dir: &Path, stored: u64) -> Arc<DeadLetterQueue> {
    let opts = DlqOptions {
        segment_bytes: 1024,
        max_bytes: stored,
        storage_policy: StoragePolicy::DropOlder,
        sync: DlqSync::Interval(Duration::from_secs(1)),
        ..Default::default()
    };
    DeadLetterQueue::open(dir, opts).unwrap()
}

fn index(c: &mut Criterion) {
    let mut g = c.benchmark_group("index");
    g.sample_size(30).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    for n in COUNTS {
        let dir = directory_with(n);
        let stored = sluice_dlq::inspect::stats(dir.path()).unwrap().bytes;
        let q = open_full(dir.path(), stored);
        assert_eq!(q.stats().segments, n as u64);
        assert_eq!(q.room_for(600), Room::EvictOldest(1));
        g.bench_with_input(BenchmarkId::new("oldest_segment", n), &n, |b, _| {
            b.iter(|| std::hint::black_box(q.oldest_segment()))
        });
        g.bench_with_input(BenchmarkId::new("newest_segment", n), &n, |b, _| {
            b.iter(|| std::hint::black_box(q.newest_segment()))
        });
        g.bench_with_input(BenchmarkId::new("size_policy_decision", n), &n, |b, _| {
            b.iter(|| std::hint::black_box(q.room_for(std::hint::black_box(600))))
        });
        q.close().unwrap();
        drop(q);
        // Start-up: one directory read builds the index of `n` sealed segments.
        g.bench_with_input(BenchmarkId::new("startup_open", n), &n, |b, _| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    let q = open_full(dir.path(), stored);
                    total += start.elapsed();
                    assert_eq!(q.stats().segments, n as u64);
                    q.close().unwrap();
                }
                total
            })
        });
    }
    g.finish();
}

fn write(c: &mut Criterion) {
    let bytes = entry_bytes();
    eprintln!("entry body: {bytes} bytes, frame: {} bytes", sluice_segment::frame_size(bytes));
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let opts = DlqOptions {
        sync: DlqSync::Interval(Duration::from_secs(1)),
        storage_policy: StoragePolicy::DropOlder,
        ..Default::default()
    };
    let q = DeadLetterQueue::open(dir.path(), opts).unwrap();
    let mut g = c.benchmark_group("write");
    g.sample_size(20).measurement_time(Duration::from_secs(5));
    for batch in [1usize, 100] {
        g.throughput(Throughput::Elements(batch as u64));
        let template: Vec<DeadLetter> = (0..batch as u64).map(letter).collect();
        g.bench_with_input(BenchmarkId::new("500B_sync_interval_1s", batch), &batch, |b, _| {
            b.iter_custom(|iters| {
                let batches: Vec<Vec<DeadLetter>> = (0..iters).map(|_| template.clone()).collect();
                rt.block_on(async {
                    let start = Instant::now();
                    for entries in batches {
                        let outcome = q.write(entries).await.unwrap();
                        assert_eq!(outcome.written, batch);
                    }
                    start.elapsed()
                })
            })
        });
    }
    // Eight tasks writing one entry each at a time: the writer groups them.
    g.throughput(Throughput::Elements(8));
    g.bench_function("500B_sync_interval_1s/8_tasks_x_1", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                let tasks: Vec<_> = (0..8)
                    .map(|_| {
                        let q = q.clone();
                        tokio::spawn(async move {
                            for i in 0..iters {
                                q.write(vec![letter(i)]).await.unwrap();
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.unwrap();
                }
                start.elapsed()
            })
        })
    });
    g.finish();
    q.close().unwrap();

    // For reference: fdatasync before every write returns, batches of 100.
    let dir = tempfile::tempdir().unwrap();
    let opts = DlqOptions { sync: DlqSync::Commit, storage_policy: StoragePolicy::DropOlder, ..Default::default() };
    let q = DeadLetterQueue::open(dir.path(), opts).unwrap();
    let mut g = c.benchmark_group("write");
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    g.throughput(Throughput::Elements(100));
    let template: Vec<DeadLetter> = (0..100).map(letter).collect();
    g.bench_function("500B_sync_commit/100", |b| {
        b.iter_custom(|iters| {
            let batches: Vec<Vec<DeadLetter>> = (0..iters).map(|_| template.clone()).collect();
            rt.block_on(async {
                let start = Instant::now();
                for entries in batches {
                    q.write(entries).await.unwrap();
                }
                start.elapsed()
            })
        })
    });
    g.finish();
    q.close().unwrap();
}

/// Reading back: every frame's CRC checked and every entry decoded.
fn read(c: &mut Criterion) {
    const N: u64 = 100_000;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let opts = DlqOptions { sync: DlqSync::None, ..Default::default() };
    let q = DeadLetterQueue::open(dir.path(), opts).unwrap();
    rt.block_on(async {
        for b in 0..N / 1000 {
            q.write((b * 1000..(b + 1) * 1000).map(letter).collect()).await.unwrap();
        }
    });
    q.close().unwrap();
    let mut g = c.benchmark_group("read");
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    g.throughput(Throughput::Elements(N));
    g.bench_function("500B_100k_entries", |b| {
        b.iter(|| {
            rt.block_on(async {
                let mut r = sluice_dlq::DlqReader::open(dir.path(), sluice_dlq::ReadFrom::Beginning).unwrap();
                let mut n = 0;
                loop {
                    let batch = r.next_batch(1000, false).await.unwrap();
                    if batch.is_empty() {
                        break;
                    }
                    n += batch.len() as u64;
                }
                assert_eq!(n, N);
            })
        })
    });
    g.finish();
}

criterion_group!(benches, index, write, read);
criterion_main!(benches);
