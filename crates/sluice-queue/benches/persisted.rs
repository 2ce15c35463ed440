//! The persisted queue alone, no engine: group-committed writes with `sync: commit`, reads back
//! from disk with every frame's CRC checked and every event decoded, the Beats
//! `BenchmarkSync1k` workload, and start-up time with a large backlog.
//!
//! Events are realistic log records of seven kinds (Apache access, CloudTrail JSON, Cloudflare
//! JSON, VPC flow log, Cisco ASA, Suricata EVE JSON, IIS), 81 to ~2,300 bytes, mean ≈ 740,
//! picked with a fixed seed.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_config::{ByteSize, HumanDuration};
use sluice_core::{AckSet, Acker, Batch, Event, Queue};
use sluice_queue::persisted::{PersistedQueue, PersistedQueueConfig, SyncPolicy};
use sluice_testkit::Rng;

// The allocator the `sluice` binary uses.
sluice_alloc::install!();

const APACHE: &str =
    r#"203.0.113.42 - frank [21/Nov/2026:07:00:01 +0000] "GET /apache_pb.gif HTTP/1.1" 200 2326 "-" "Mozilla/4.08""#;
const VPC: &str = "2 123456789010 eni-1235b8ca123456789 172.31.16.139 172.31.16.21 20641 22 6 20 4249 1418530010 1418530070 ACCEPT OK";
const ASA: &str = "%ASA-6-302013: Built inbound TCP connection 123456 for outside:198.51.100.7/51123 (198.51.100.7/51123) to inside:10.0.0.12/443 (10.0.0.12/443)";
const IIS: &str = "2026-11-21 07:00:01 W3SVC1 WEB01 192.0.2.10 GET /default.htm - 80 - 203.0.113.5 HTTP/1.1 Mozilla/5.0+(Windows+NT+10.0;+Win64;+x64) - - www.example.com 200 0 0 2326 421 15";

fn cloudtrail(i: u64) -> String {
    format!(
        r#"{{"eventVersion":"1.08","userIdentity":{{"type":"IAMUser","principalId":"AIDA{i:016X}","arn":"arn:aws:iam::123456789012:user/alice","accountId":"123456789012","accessKeyId":"AKIA{i:016X}","userName":"alice","sessionContext":{{"attributes":{{"creationDate":"2026-11-21T06:59:00Z","mfaAuthenticated":"true"}}}}}},"eventTime":"2026-11-21T07:00:01Z","eventSource":"s3.amazonaws.com","eventName":"GetObject","awsRegion":"eu-west-1","sourceIPAddress":"203.0.113.{}","userAgent":"aws-cli/2.15.0 Python/3.11.6 Linux/6.1 exe/x86_64","requestParameters":{{"bucketName":"logs-archive","key":"2026/11/21/app-{i}.log.gz","Host":"logs-archive.s3.eu-west-1.amazonaws.com"}},"responseElements":null,"additionalEventData":{{"SignatureVersion":"SigV4","CipherSuite":"ECDHE-RSA-AES128-GCM-SHA256","bytesTransferredIn":0,"AuthenticationMethod":"AuthHeader","x-amz-id-2":"{i:032x}","bytesTransferredOut":52311}},"requestID":"{i:016X}","eventID":"{i:08x}-1111-2222-3333-444455556666","readOnly":true,"resources":[{{"type":"AWS::S3::Object","ARN":"arn:aws:s3:::logs-archive/2026/11/21/app-{i}.log.gz"}},{{"accountId":"123456789012","type":"AWS::S3::Bucket","ARN":"arn:aws:s3:::logs-archive"}}],"eventType":"AwsApiCall","managementEvent":false,"recipientAccountId":"123456789012","sharedEventID":"{i:08x}-aaaa-bbbb-cccc-ddddeeeeffff","vpcEndpointId":"vpce-0a1b2c3d4e5f60718","vpcEndpointAccountId":"123456789012","eventCategory":"Data","tlsDetails":{{"tlsVersion":"TLSv1.2","cipherSuite":"ECDHE-RSA-AES128-GCM-SHA256","clientProvidedHostHeader":"logs-archive.s3.eu-west-1.amazonaws.com"}},"sessionCredentialFromConsole":"false","edgeDeviceDetails":null,"insightDetails":null,"annotation":"nightly archive job {i}, retention class glacier-ir, replication to us-east-1 pending, object lock governance mode until 2027-11-21","serviceEventDetails":{{"replicationRule":"archive-to-dr","destinationBucket":"arn:aws:s3:::logs-archive-dr-us-east-1","storageClass":"GLACIER_IR","kmsKeyArn":"arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab","checksumAlgorithm":"CRC32C","objectSize":52311,"versionId":"3HL4kqtJlcpXroDTDmJ+rmSpXd3dIbrHY+MTRCxf3vjVBH40Nr8X8gdRQBpUMLUo"}}}}"#,
        i % 250
    )
}

fn cloudflare(i: u64) -> String {
    format!(
        r#"{{"ClientIP":"198.51.100.{}","ClientRequestHost":"www.example.com","ClientRequestMethod":"GET","ClientRequestURI":"/api/v1/items/{i}?page=2","EdgeEndTimestamp":"2026-11-21T07:00:01Z","EdgeResponseBytes":{},"EdgeResponseStatus":200,"EdgeStartTimestamp":"2026-11-21T07:00:00Z","RayID":"{i:016x}","CacheCacheStatus":"hit","ClientCountry":"de","ClientDeviceType":"desktop","ClientRequestUserAgent":"Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36","OriginResponseStatus":0,"SecurityLevel":"med","WAFAction":"unknown","ClientSSLProtocol":"TLSv1.3","ClientSSLCipher":"AEAD-AES128-GCM-SHA256","ClientRequestReferer":"https://www.example.com/catalog/search?q=widgets&page=1","ClientASN":3320,"EdgeColoCode":"FRA","EdgeServerIP":"104.16.0.{}","OriginIP":"192.0.2.10","OriginResponseTime":41000000,"WorkerSubrequest":false,"ZoneName":"example.com","BotScore":87,"BotScoreSrc":"Machine Learning","JA3Hash":"{i:032x}","ClientRequestPath":"/api/v1/items/{i}","ClientRequestProtocol":"HTTP/2","CacheResponseBytes":{},"EdgeRequestHost":"www.example.com","ParentRayID":"00"}}"#,
        i % 250,
        1000 + i % 9000,
        i % 250,
        900 + i % 9000
    )
}

fn suricata(i: u64) -> String {
    format!(
        r#"{{"timestamp":"2026-11-21T07:00:01.{:06}+0000","flow_id":{i},"in_iface":"eth0","event_type":"alert","src_ip":"10.0.0.{}","src_port":{},"dest_ip":"192.0.2.1","dest_port":443,"proto":"TCP","alert":{{"action":"allowed","gid":1,"signature_id":2013028,"rev":7,"signature":"ET POLICY curl User-Agent Outbound","category":"Attempted Information Leak","severity":2}},"http":{{"hostname":"example.com","url":"/download/tool-{i}.tar.gz","http_user_agent":"curl/8.4.0","http_content_type":"application/gzip","http_method":"GET","protocol":"HTTP/1.1","status":200,"length":{}}},"app_proto":"http","flow":{{"pkts_toserver":7,"pkts_toclient":12,"bytes_toserver":612,"bytes_toclient":14823,"start":"2026-11-21T07:00:00.000000+0000"}},"community_id":"1:{i:016x}=","host":"sensor-eu-1","payload_printable":"GET /download/tool-{i}.tar.gz HTTP/1.1\r\nHost: example.com\r\nUser-Agent: curl/8.4.0\r\nAccept: */*\r\n\r\n","stream":0,"packet_info":{{"linktype":1}},"fileinfo":{{"filename":"/download/tool-{i}.tar.gz","gaps":false,"state":"CLOSED","stored":false,"size":{},"tx_id":0,"sha256":"{i:064x}"}},"metadata":{{"flowbits":["http.dottedquadhost","ET.curl.ua"],"flowints":{{"http.anomaly.count":1}}}},"tx_id":0}}"#,
        i % 1_000_000,
        i % 250,
        1024 + i % 60000,
        10_000 + i % 50_000,
        10_000 + i % 50_000
    )
}

/// The message of event `i`: one of seven kinds, picked by a fixed-seed generator.
fn sample(i: u64, rng: &mut Rng) -> String {
    match rng.below(7) {
        0 => APACHE.to_string(),
        1 => cloudtrail(i),
        2 => cloudflare(i),
        3 => VPC.to_string(),
        4 => ASA.to_string(),
        5 => suricata(i),
        _ => IIS.to_string(),
    }
}

fn events(n: usize, rng: &mut Rng) -> (Vec<Event>, usize) {
    let mut bytes = 0;
    let events = (0..n as u64)
        .map(|i| {
            let m = sample(i, rng);
            bytes += m.len();
            Event::from_message_at(m, 1_700_000_000_000_000_000 + i as i64)
        })
        .collect();
    (events, bytes)
}

fn config(shards: usize, memory_bytes: u64) -> PersistedQueueConfig {
    PersistedQueueConfig {
        shards: Some(shards),
        max_bytes: ByteSize(8 << 30),
        segment_bytes: ByteSize(64 << 20),
        sync: SyncPolicy::Commit,
        checkpoint_interval: HumanDuration(Duration::from_millis(200)),
        memory_bytes: ByteSize(memory_bytes),
        // To compare with direct I/O: SLUICE_BENCH_DIRECT_IO=true.
        direct_io: std::env::var("SLUICE_BENCH_DIRECT_IO").is_ok_and(|v| v == "true"),
        ..PersistedQueueConfig::default()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

async fn open(dir: &Path, c: &PersistedQueueConfig) -> Arc<PersistedQueue> {
    let q = Arc::new(PersistedQueue::from_config(c, dir, "bench").unwrap());
    q.start().await.unwrap();
    q
}

/// Pushes every batch and waits until all are durable.
async fn push_all(q: &PersistedQueue, batches: Vec<Vec<Event>>) {
    let mut waits = Vec::with_capacity(batches.len());
    for b in batches {
        let n = b.len();
        let bytes = b.iter().map(|e| e.message().map_or(0, str::len)).sum();
        let (acker, done) = Acker::with_notify(n);
        q.push(Batch::new(b, AckSet::single(acker, n), bytes)).await.unwrap();
        waits.push(done);
    }
    for w in waits {
        w.await.unwrap();
    }
}

/// Pops and completes until `n` events came out.
async fn drain(q: &PersistedQueue, n: usize, batch: usize) {
    let mut got = 0;
    while got < n {
        let b = q.pop(batch, Duration::ZERO).await.expect("the queue holds what was pushed");
        got += b.len();
        b.complete();
    }
}

/// The exact bytes these events take as frames on disk.
fn frame_bytes(events: &[Event]) -> u64 {
    let mut body = Vec::new();
    events
        .iter()
        .map(|e| {
            body.clear();
            sluice_segment::encode_event(e, &mut body).unwrap();
            sluice_segment::frame_size(body.len()) as u64
        })
        .sum()
}

/// Two consumers at once, as two workers would take from the queue.
async fn drain_two(q: &Arc<PersistedQueue>, n: usize, batch: usize) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let taken = Arc::new(AtomicUsize::new(0));
    let finished = Arc::new(tokio::sync::Notify::new());
    let consumers: Vec<_> = (0..2)
        .map(|_| {
            let (q, taken, finished) = (q.clone(), taken.clone(), finished.clone());
            tokio::spawn(async move {
                loop {
                    // Registered before the count is read: the other consumer's last take, and
                    // its notification, may come at any point after that read.
                    let done = finished.notified();
                    tokio::pin!(done);
                    done.as_mut().enable();
                    if taken.load(Ordering::Relaxed) >= n {
                        break;
                    }
                    tokio::select! {
                        b = tokio::time::timeout(Duration::from_secs(30), q.pop(batch, Duration::ZERO)) => {
                            let Ok(b) = b else {
                                panic!("no event for 30 s with {} of {n} taken: {:?}",
                                    taken.load(Ordering::Relaxed), q.stats());
                            };
                            let b = b.expect("the queue holds what was pushed");
                            if taken.fetch_add(b.len(), Ordering::Relaxed) + b.len() >= n {
                                finished.notify_waiters();
                            }
                            b.complete();
                        }
                        _ = done => break,
                    }
                }
            })
        })
        .collect();
    for c in consumers {
        c.await.unwrap();
    }
}

fn write_and_read(c: &mut Criterion) {
    let rt = runtime();
    let mut rng = Rng::with_seed(0x9E37_79B9_7F4A_7C15);
    // 64 batches of 1,000 events: ~47 MB of frames per iteration.
    let template: Vec<Vec<Event>> = (0..64).map(|_| events(1000, &mut rng).0).collect();
    let bytes: u64 = template.iter().map(|b| frame_bytes(b)).sum();

    let mut g = c.benchmark_group("persisted");
    g.sample_size(10).measurement_time(Duration::from_secs(8)).warm_up_time(Duration::from_secs(2));
    g.throughput(Throughput::Bytes(bytes));

    let dir = tempfile::tempdir().unwrap();
    let q = rt.block_on(open(dir.path(), &config(2, 0)));
    g.bench_function("write_commit_2_shards", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let batches = template.clone();
                let started = Instant::now();
                rt.block_on(push_all(&q, batches));
                total += started.elapsed();
                rt.block_on(drain(&q, 64_000, 1000));
            }
            total
        })
    });

    g.bench_function("read_verify_from_disk_2_consumers", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                rt.block_on(push_all(&q, template.clone()));
                let started = Instant::now();
                rt.block_on(drain_two(&q, 64_000, 1000));
                total += started.elapsed();
            }
            total
        })
    });
    rt.block_on(q.shutdown());
    g.finish();
}

/// Beats' BenchmarkSync1k: 1,000 events published one by one, then read back 10 at a time and
/// acked; queue creation not timed; `sync: commit`.
///
/// - `sync_1k` is Beats' shape: the producer has no acknowledgement listener (Beats' benchmark
///   makes its producer with an empty `ProducerConfig`), so a push returns once the queue took
///   the event. The reads wait for the writer but not for the fdatasync: with `sync: commit` the
///   workers get a group once it is written, and only the inputs' acknowledgements wait. (Beats'
///   reader waits for its writer's fsync; `sync_1k_acked` includes the fdatasync.)
/// - `sync_1k_acked` is stricter: every push has its own acknowledgement, and all 1,000 are
///   awaited (every event durable) before the first read.
fn sync_1k(c: &mut Criterion) {
    let rt = runtime();
    if std::env::var("SLUICE_BENCH_PHASES").is_ok_and(|v| v == "1") {
        sync_1k_phases(&rt, false);
        sync_1k_phases(&rt, true);
        return;
    }
    let mut rng = Rng::with_seed(0x1234_5678_9ABC_DEF1);
    let (template, _) = events(1000, &mut rng);
    let mut g = c.benchmark_group("persisted");
    g.sample_size(20);
    for acked in [false, true] {
        let name = if acked { "sync_1k_acked" } else { "sync_1k" };
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let dir = tempfile::tempdir().unwrap();
                    let q = rt.block_on(open(dir.path(), &config(1, 16 << 20)));
                    let single: Vec<Vec<Event>> = template.iter().map(|e| vec![e.clone()]).collect();
                    let started = Instant::now();
                    rt.block_on(async {
                        publish(&q, single, acked).await;
                        drain(&q, 1000, 10).await;
                    });
                    total += started.elapsed();
                    rt.block_on(q.shutdown());
                }
                total
            })
        });
    }
    g.finish();
}

/// Pushes each batch; with `acked`, each with its own acknowledgement, all awaited at the end.
async fn publish(q: &PersistedQueue, batches: Vec<Vec<Event>>, acked: bool) {
    let mut waits = Vec::with_capacity(if acked { batches.len() } else { 0 });
    for b in batches {
        let n = b.len();
        let bytes = b.iter().map(|e| e.message().map_or(0, str::len)).sum();
        let acks = if acked {
            let (acker, done) = Acker::with_notify(n);
            waits.push(done);
            AckSet::single(acker, n)
        } else {
            AckSet::none()
        };
        q.push(Batch::new(b, acks, bytes)).await.unwrap();
    }
    for w in waits {
        w.await.unwrap();
    }
}

/// Where a `sync_1k` op spends its time (SLUICE_BENCH_PHASES=1): over 40 ops, the 10th, 50th
/// and 90th percentiles of when the last push returned, when the producer's acknowledgements
/// had all come (with `acked`), when the first read returned, when the drain ended, and of the
/// fdatasyncs per op.
fn sync_1k_phases(rt: &tokio::runtime::Runtime, acked: bool) {
    let mut rng = Rng::with_seed(0x1234_5678_9ABC_DEF1);
    let (template, _) = events(1000, &mut rng);
    let (mut pushed, mut durable, mut first, mut drained, mut fsyncs) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..40 {
        let dir = tempfile::tempdir().unwrap();
        let q = rt.block_on(open(dir.path(), &config(1, 16 << 20)));
        let count_fsyncs = || q.metrics().fsyncs.load(std::sync::atomic::Ordering::Relaxed);
        let before = count_fsyncs();
        let single: Vec<Vec<Event>> = template.iter().map(|e| vec![e.clone()]).collect();
        let started = Instant::now();
        rt.block_on(async {
            let mut waits = Vec::with_capacity(single.len());
            for batch in single {
                let acks = if acked {
                    let (acker, done) = Acker::with_notify(1);
                    waits.push(done);
                    AckSet::single(acker, 1)
                } else {
                    AckSet::none()
                };
                let bytes = batch[0].message().map_or(0, str::len);
                q.push(Batch::new(batch, acks, bytes)).await.unwrap();
            }
            pushed.push(started.elapsed());
            for w in waits {
                w.await.unwrap();
            }
            durable.push(started.elapsed());
            let b = q.pop(10, Duration::ZERO).await.expect("the queue holds what was pushed");
            first.push(started.elapsed());
            let got = b.len();
            b.complete();
            drain(&q, 1000 - got, 10).await;
        });
        drained.push(started.elapsed());
        fsyncs.push(count_fsyncs() - before);
        rt.block_on(q.shutdown());
    }
    let pct = |v: &mut Vec<Duration>| {
        v.sort();
        format!("{:?} / {:?} / {:?}", v[v.len() / 10], v[v.len() / 2], v[v.len() * 9 / 10])
    };
    fsyncs.sort();
    eprintln!("{} (p10 / p50 / p90 of 40 ops):", if acked { "sync_1k_acked" } else { "sync_1k" });
    eprintln!("  pushed   {}", pct(&mut pushed));
    if acked {
        eprintln!("  acked    {}", pct(&mut durable));
    }
    eprintln!("  first    {}", pct(&mut first));
    eprintln!("  drained  {}", pct(&mut drained));
    eprintln!("  fdatasyncs {} / {} / {}", fsyncs[4], fsyncs[20], fsyncs[36]);
}

/// Start-up with 1 GiB unacknowledged: time from opening the queue to the first event popped.
fn startup_1gib(c: &mut Criterion) {
    let rt = runtime();
    let mut rng = Rng::with_seed(0xDEAD_BEEF_CAFE_F00D);
    let dir = tempfile::tempdir().unwrap();
    let cfg = PersistedQueueConfig { max_bytes: ByteSize(2 << 30), ..config(2, 16 << 20) };
    // Fill once (not timed): about 1 GiB of frames, never acknowledged.
    rt.block_on(async {
        let q = open(dir.path(), &cfg).await;
        let mut written = 0u64;
        while written < 1 << 30 {
            let (batch, _) = events(1000, &mut rng);
            written += frame_bytes(&batch);
            push_all(&q, vec![batch]).await;
        }
        q.shutdown().await;
    });
    let mut g = c.benchmark_group("persisted");
    g.sample_size(10);
    g.bench_function("startup_1gib_to_first_event", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let started = Instant::now();
                let q = rt.block_on(open(dir.path(), &cfg));
                let first = rt.block_on(q.pop(1000, Duration::ZERO)).expect("the backlog");
                total += started.elapsed();
                // Not acknowledged: the backlog stays for the next sample.
                drop(first);
                rt.block_on(q.shutdown());
            }
            total
        })
    });
    g.finish();
}

fn sample_sizes(_: &mut Criterion) {
    let mut rng = Rng::with_seed(0x1234_5678_9ABC_DEF1);
    let (evs, bytes) = events(1000, &mut rng);
    let min = evs.iter().map(|e| e.message().map_or(0, str::len)).min().unwrap_or(0);
    let max = evs.iter().map(|e| e.message().map_or(0, str::len)).max().unwrap_or(0);
    eprintln!("sample messages: mean {} bytes, {min} to {max}", bytes / 1000);
}

criterion_group!(benches, sample_sizes, write_and_read, sync_1k, startup_1gib);
criterion_main!(benches);
