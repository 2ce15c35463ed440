//! The network inputs alone, over loopback: one client sends as fast as the input takes it, and
//! a queue that completes every batch at once (counting its events) stands for the pipeline.
//! Each sample is one connection; elements are events.
//!
//! - `listeners/tcp_lines_250B`: chunks of 4096 lines of 250 bytes. `READ_BUFFER=64KiB` tries
//!   another `read_buffer` (256KiB by default).
//! - `listeners/syslog_tcp/{rfc5424_octet_counted,rfc3164_newlines}`: chunks of 1000 messages.
//! - `listeners/beats/{plain,compressed}`: Filebeat-sized events (about 400 bytes of JSON) in
//!   windows of 2048, sent without waiting, each window's ACK read back.
//!
//! `cargo bench -p sluice-inputs --bench listeners`

// The allocator the `sluice` binary uses.
sluice_alloc::install!();

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_core::bus::PipelineBus;
use sluice_core::metrics::{ComponentKind, ComponentMetrics};
use sluice_core::{Batch, MemoryBudget, Queue, QueueClosed, QueueStats};
use sluice_inputs::InputContext;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::runtime::Runtime;
use tokio_util::sync::CancellationToken;

/// Completes every batch at once, counting events: the input's own cost, ACKs included.
struct CompletingQueue(AtomicU64);

#[async_trait]
impl Queue for CompletingQueue {
    async fn push(&self, batch: Batch) -> Result<(), QueueClosed> {
        self.0.fetch_add(batch.len() as u64, Ordering::Relaxed);
        batch.complete();
        Ok(())
    }
    async fn pop(&self, _max_events: usize, _delay: Duration) -> Option<Batch> {
        None
    }
    fn close(&self) {}
    fn stats(&self) -> QueueStats {
        QueueStats::default()
    }
}

/// One input running on a free loopback port until dropped.
struct Listening {
    address: String,
    events: Arc<CompletingQueue>,
    shutdown: CancellationToken,
}

impl Listening {
    /// Builds the input from `yaml` (a flow mapping; `{address}` is replaced by the port's
    /// address), runs it on `rt` and waits until it accepts connections.
    fn start(rt: &Runtime, yaml: &str) -> Listening {
        let address = format!("127.0.0.1:{}", sluice_testkit::free_port());
        let text = format!(
            "pipelines:\n  p:\n    inputs:\n      - {}\n    outputs: [{{type: stdout}}]\n",
            yaml.replace("{address}", &address)
        );
        let mut root = sluice_config::model::load_str(&text, "bench.yml").expect("a valid input config");
        let spec = root.pipelines.remove(0).inputs.remove(0);
        let input = sluice_inputs::build(&spec).expect("the input builds");
        let events = Arc::new(CompletingQueue(AtomicU64::new(0)));
        let shutdown = CancellationToken::new();
        let ctx = InputContext {
            pipeline: "p".into(),
            id: "in".into(),
            queue: events.clone(),
            metrics: Arc::new(ComponentMetrics::new("in", ComponentKind::Input, &spec.type_name)),
            shutdown: shutdown.clone(),
            bus: Arc::new(PipelineBus::default()),
            data_dir: PathBuf::from("."),
            registry: sluice_registry::Registry::in_memory(),
            memory: MemoryBudget::new(256 << 20),
        };
        rt.spawn(async move { input.run(ctx).await.expect("the input runs") });
        let up = sluice_testkit::eventually(Duration::from_secs(10), || std::net::TcpStream::connect(&address).is_ok());
        assert!(up, "the {} input did not listen on {address}", spec.type_name);
        Listening { address, events, shutdown }
    }

    /// Writes `chunk` (`per_chunk` events) `iters` times on a new connection and waits until
    /// the input has pushed all of them; the time from the connect to the last push.
    async fn stream(&self, chunk: &[u8], per_chunk: u64, iters: u64) -> Duration {
        let until = self.events.0.load(Ordering::Relaxed) + per_chunk * iters;
        let started = Instant::now();
        let mut s = TcpStream::connect(&self.address).await.unwrap();
        for _ in 0..iters {
            s.write_all(chunk).await.unwrap();
        }
        s.shutdown().await.unwrap();
        while self.events.0.load(Ordering::Relaxed) < until {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        started.elapsed()
    }

    /// Sends `iters` copies of a Beats window of `window` events on a new connection while
    /// reading ACKs, until every window is acknowledged whole.
    async fn windows(&self, one: &[u8], window: u32, iters: u64) -> Duration {
        let started = Instant::now();
        let (mut rd, mut wr) = TcpStream::connect(&self.address).await.unwrap().into_split();
        let one = one.to_vec();
        let sender = tokio::spawn(async move {
            for _ in 0..iters {
                wr.write_all(&one).await.unwrap();
            }
            wr
        });
        let mut acked = 0;
        let mut frame = [0u8; 6];
        while acked < iters {
            rd.read_exact(&mut frame).await.unwrap();
            if u32::from_be_bytes([frame[2], frame[3], frame[4], frame[5]]) == window {
                acked += 1;
            }
        }
        let elapsed = started.elapsed();
        drop(sender.await.unwrap());
        elapsed
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn tcp(c: &mut Criterion) {
    let rt = runtime();
    let read_buffer = std::env::var("READ_BUFFER").unwrap_or_else(|_| "256KiB".into());
    let node = Listening::start(&rt, &format!("{{type: tcp, address: '{{address}}', read_buffer: {read_buffer}}}"));
    let chunk = format!("{}\n", "a".repeat(249)).repeat(4096);
    let mut g = c.benchmark_group("listeners");
    g.sample_size(10);
    g.throughput(Throughput::Elements(4096));
    g.bench_function("tcp_lines_250B", |b| {
        b.iter_custom(|iters| rt.block_on(node.stream(chunk.as_bytes(), 4096, iters)))
    });
    g.finish();
}

fn syslog(c: &mut Criterion) {
    let rt = runtime();
    let node = Listening::start(&rt, "{type: syslog, mode: tcp, address: '{address}'}");
    let rfc5424 = "<165>1 2026-11-26T07:16:16.003Z web-1.example.com nginx 8710 ACCESS \
        [req@32473 id=\"42\" path=\"/index.html\"] GET /index.html 200 1532 0.004";
    let rfc3164 = "<13>Nov 26 07:16:16 web-1 nginx[8710]: GET /index.html 200 1532 0.004 from 10.0.0.7";
    let mut g = c.benchmark_group("listeners/syslog_tcp");
    g.sample_size(10);
    g.throughput(Throughput::Elements(1000));
    for (name, one) in [
        ("rfc5424_octet_counted", format!("{} {rfc5424}", rfc5424.len())),
        ("rfc3164_newlines", format!("{rfc3164}\n")),
    ] {
        let chunk = one.repeat(1000);
        g.bench_function(name, |b| b.iter_custom(|iters| rt.block_on(node.stream(chunk.as_bytes(), 1000, iters))));
    }
    g.finish();
}

/// A lumberjack v2 frame header and body (`2J`, `2W`, `2C`), as go-lumber writes them.
fn frame(kind: u8, parts: &[&[u8]]) -> Vec<u8> {
    let mut v = vec![b'2', kind];
    for p in parts {
        v.extend_from_slice(p);
    }
    v
}

fn beats(c: &mut Criterion) {
    let rt = runtime();
    let node = Listening::start(&rt, "{type: beats, address: '{address}'}");
    let window = 2048u32;
    let mut data = Vec::new();
    for seq in 1..=window {
        let doc = format!(
            r#"{{"@timestamp":"2026-11-26T07:16:16.123Z","@metadata":{{"beat":"filebeat","type":"_doc","version":"8.15.0"}},"host":{{"name":"web-1"}},"agent":{{"type":"filebeat","version":"8.15.0"}},"log":{{"file":{{"path":"/var/log/app.log"}},"offset":{seq}}},"input":{{"type":"filestream"}},"message":"GET /api/v1/items/{seq} HTTP/1.1 200 512 0.004 {}"}}"#,
            "x".repeat(100)
        );
        data.extend(frame(b'J', &[&seq.to_be_bytes(), &(doc.len() as u32).to_be_bytes(), doc.as_bytes()]));
    }
    let mut g = c.benchmark_group("listeners/beats");
    g.sample_size(10);
    g.throughput(Throughput::Elements(u64::from(window)));
    for compressed in [false, true] {
        let mut one = frame(b'W', &[&window.to_be_bytes()]);
        if compressed {
            let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            z.write_all(&data).unwrap();
            let body = z.finish().unwrap();
            one.extend(frame(b'C', &[&(body.len() as u32).to_be_bytes(), &body]));
        } else {
            one.extend_from_slice(&data);
        }
        let name = if compressed { "compressed" } else { "plain" };
        g.bench_function(name, |b| b.iter_custom(|iters| rt.block_on(node.windows(&one, window, iters))));
    }
    g.finish();
}

criterion_group!(benches, tcp, syslog, beats);
criterion_main!(benches);
