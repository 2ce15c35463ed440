//! Segment format throughput.
//!
//! - `frame/*`: 1,000 realistic log lines (Apache, CloudTrail JSON, VPC flow, Cisco ASA, IIS;
//!   about 740 bytes on average) framed with CRC32C, then scanned and verified. Bytes are the
//!   lines' bytes.
//! - `event_frames/*`: the same lines as events (message, timestamp, host, source), each
//!   encoded with the codec into its own frame, then scanned and decoded.
//! - `codec/*`: one 12-field event, encoded and decoded.

// The allocator the `sluice` binary uses.
sluice_alloc::install!();

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sluice_core::{Event, Map, Value};
use sluice_segment::{
    EventDecoder, FrameCursor, FrameResult, append_frame, decode_event_body, encode_event, try_append_frame,
};
use sluice_testkit::Rng;

/// Log-line pieces drawn from the shared generator.
trait Draw {
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str;
    fn ip(&mut self) -> String;
    fn hex(&mut self, n: usize) -> String;
}

impl Draw for Rng {
    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.index(items.len())]
    }
    fn ip(&mut self) -> String {
        format!("{}.{}.{}.{}", 1 + self.below(223), self.below(256), self.below(256), 1 + self.below(254))
    }
    fn hex(&mut self, n: usize) -> String {
        (0..n).map(|_| char::from(b"0123456789abcdef"[self.index(16)])).collect()
    }
}

const AGENTS: &[&str] = &[
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/124.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_4_1) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.4.1 Safari/605.1.15",
    "curl/8.5.0",
    "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)",
];
const PATHS: &[&str] = &[
    "/",
    "/index.html",
    "/api/v2/orders/8812734/items?expand=product,shipping&currency=EUR",
    "/static/js/app.4f9c1b2e.min.js",
    "/wp-login.php",
    "/search?q=rust+log+pipeline+persisted+queue&page=3",
];
const EVENTS: &[&str] = &["GetObject", "PutObject", "AssumeRole", "DescribeInstances", "ConsoleLogin", "CreateTags"];

fn apache(r: &mut Rng) -> String {
    format!(
        "{} - - [10/Oct/2025:13:{:02}:{:02} +0000] \"{} {} HTTP/1.1\" {} {} \"https://www.example.com{}\" \"{}\"",
        r.ip(),
        r.below(60),
        r.below(60),
        r.pick(&["GET", "GET", "POST", "HEAD"]),
        r.pick(PATHS),
        r.pick(&["200", "200", "304", "404", "500"]),
        r.below(100_000),
        r.pick(PATHS),
        r.pick(AGENTS)
    )
}

fn cloudtrail(r: &mut Rng) -> String {
    let event = r.pick(EVENTS);
    let tags: Vec<String> =
        (0..23 + r.below(54)).map(|i| format!("{{\"key\":\"team-{i}\",\"value\":\"{}\"}}", r.hex(12))).collect();
    format!(
        concat!(
            "{{\"eventVersion\":\"1.09\",\"userIdentity\":{{\"type\":\"AssumedRole\",\"principalId\":\"AROA{}:session-{}\",",
            "\"arn\":\"arn:aws:sts::123456789012:assumed-role/deploy/session-{}\",\"accountId\":\"123456789012\",",
            "\"accessKeyId\":\"ASIA{}\",\"sessionContext\":{{\"attributes\":{{\"creationDate\":\"2025-10-10T13:00:00Z\",",
            "\"mfaAuthenticated\":\"false\"}}}}}},\"eventTime\":\"2025-10-10T13:{:02}:{:02}Z\",",
            "\"eventSource\":\"ec2.amazonaws.com\",\"eventName\":\"{}\",\"awsRegion\":\"eu-west-1\",",
            "\"sourceIPAddress\":\"{}\",\"userAgent\":\"aws-cli/2.15.30 Python/3.11.8 Linux/6.1 exe/x86_64\",",
            "\"requestParameters\":{{\"resourcesSet\":{{\"items\":[{{\"resourceId\":\"i-{}\"}}]}},\"tagSet\":{{\"items\":[{}]}}}},",
            "\"responseElements\":null,\"requestID\":\"{}-{}-{}\",\"eventID\":\"{}-{}\",\"readOnly\":false,",
            "\"eventType\":\"AwsApiCall\",\"managementEvent\":true,\"recipientAccountId\":\"123456789012\",",
            "\"eventCategory\":\"Management\",\"tlsDetails\":{{\"tlsVersion\":\"TLSv1.3\",",
            "\"cipherSuite\":\"TLS_AES_128_GCM_SHA256\",\"clientProvidedHostHeader\":\"ec2.eu-west-1.amazonaws.com\"}}}}"
        ),
        r.hex(17).to_uppercase(),
        r.below(10_000),
        r.below(10_000),
        r.hex(16).to_uppercase(),
        r.below(60),
        r.below(60),
        event,
        r.ip(),
        r.hex(17),
        tags.join(","),
        r.hex(8),
        r.hex(4),
        r.hex(12),
        r.hex(8),
        r.hex(12),
    )
}

fn vpc_flow(r: &mut Rng) -> String {
    let start = 1_760_000_000 + r.below(100_000);
    format!(
        "2 123456789012 eni-{} {} {} {} {} {} {} {} {} {} {} OK",
        r.hex(17),
        r.ip(),
        r.ip(),
        r.below(65_536),
        r.pick(&["443", "22", "53", "3306", "8080"]),
        r.pick(&["6", "17"]),
        r.below(500),
        r.below(1_000_000),
        start,
        start + 60,
        r.pick(&["ACCEPT", "ACCEPT", "REJECT"])
    )
}

fn cisco_asa(r: &mut Rng) -> String {
    let (src, dst) = (r.ip(), r.ip());
    format!(
        "<166>Oct 10 2025 13:{:02}:{:02} fw-edge-01 : %ASA-6-302013: Built outbound TCP connection {} for outside:{}/{} ({}/{}) to inside:{}/{} ({}/{})",
        r.below(60),
        r.below(60),
        r.below(100_000_000),
        dst,
        443,
        dst,
        443,
        src,
        r.below(65_536),
        src,
        r.below(65_536)
    )
}

fn iis(r: &mut Rng) -> String {
    format!(
        "2025-10-10 13:{:02}:{:02} W3SVC1 WEB{:02} 10.0.0.5 {} {} - 443 - {} HTTP/1.1 {} - https://www.example.com/ www.example.com {} 0 0 {} {} {}",
        r.below(60),
        r.below(60),
        r.below(8),
        r.pick(&["GET", "POST"]),
        r.pick(PATHS),
        r.ip(),
        r.pick(AGENTS).replace(' ', "+"),
        r.pick(&["200", "200", "302", "404"]),
        r.below(100_000),
        r.below(2_000),
        r.below(500)
    )
}

fn messages(n: usize) -> Vec<String> {
    let mut r = Rng::with_seed(0x5EED_1234_ABCD_0001);
    let mut sizes = [(0usize, 0usize); 5];
    let msgs = (0..n)
        .map(|_| {
            let kind = r.below(5) as usize;
            let m = match kind {
                0 => apache(&mut r),
                1 => cloudtrail(&mut r),
                2 => vpc_flow(&mut r),
                3 => cisco_asa(&mut r),
                _ => iis(&mut r),
            };
            sizes[kind].0 += 1;
            sizes[kind].1 += m.len();
            m
        })
        .collect();
    let means: Vec<usize> = sizes.iter().map(|(n, b)| b / (*n).max(1)).collect();
    eprintln!("mean bytes per kind (apache, cloudtrail, vpc, asa, iis): {means:?}");
    msgs
}

fn log_event(message: &str, i: usize) -> Event {
    let mut e = Event::from_message_at(message, 1_760_000_000_000_000_000 + i as i64 * 1_000);
    e.fields.push_unchecked("host", Value::from("ip-10-0-3-17.eu-west-1.compute.internal"));
    e.fields.push_unchecked("source", Value::from("/var/log/app/access.log"));
    e
}

fn twelve_fields() -> Event {
    let mut m = Map::with_capacity(12);
    m.push_unchecked("ts", Value::Timestamp(1_760_000_000_123_456_789));
    m.push_unchecked("level", Value::from("info"));
    m.push_unchecked("host", Value::from("web-07.prod.example.net"));
    m.push_unchecked("service", Value::from("checkout-api"));
    m.push_unchecked("trace_id", Value::from("4bf92f3577b34da6a3ce929d0e0e4736"));
    m.push_unchecked("span_id", Value::from("00f067aa0ba902b7"));
    m.push_unchecked("user_id", Value::Int(88_123_456));
    m.push_unchecked("latency_ms", Value::Float(12.75));
    m.push_unchecked("status", Value::Int(200));
    m.push_unchecked("method", Value::from("POST"));
    m.push_unchecked("path", Value::from("/api/v2/orders/8812734/items"));
    m.push_unchecked("msg", Value::from("order items updated after inventory reservation succeeded"));
    Event::new(m)
}

fn encode_frames(out: &mut Vec<u8>, msgs: &[String]) {
    out.clear();
    for (i, m) in msgs.iter().enumerate() {
        append_frame(out, i as u64, |b| b.extend_from_slice(m.as_bytes())).unwrap();
    }
}

/// Appends one frame per event, numbered from 0, as the persisted queue's writer does.
fn encode_event_frames(out: &mut Vec<u8>, events: &[Event]) {
    for (i, e) in events.iter().enumerate() {
        try_append_frame(out, i as u64, |b| encode_event(e, b).map_err(sluice_segment::Error::from)).unwrap();
    }
}

fn decode_frames(buf: &[u8]) -> usize {
    let mut cursor = FrameCursor::new(buf, 0);
    let mut bytes = 0;
    loop {
        match cursor.next_frame() {
            FrameResult::Frame { body, .. } => bytes += body.len(),
            FrameResult::End => return bytes,
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn bench_frames(c: &mut Criterion) {
    let msgs = messages(1_000);
    let total: usize = msgs.iter().map(String::len).sum();
    eprintln!("frame bench: {} messages, {} bytes, mean {} bytes", msgs.len(), total, total / msgs.len());
    let mut buf = Vec::with_capacity(total + msgs.len() * 32);
    encode_frames(&mut buf, &msgs);
    assert_eq!(decode_frames(&buf), total);

    let mut g = c.benchmark_group("frame");
    g.throughput(Throughput::Bytes(total as u64));
    let mut out = Vec::with_capacity(buf.len());
    g.bench_function("encode_crc", |b| {
        b.iter(|| {
            encode_frames(&mut out, black_box(&msgs));
            black_box(out.len())
        })
    });
    g.bench_function("decode_verify", |b| b.iter(|| decode_frames(black_box(&buf))));
    g.bench_function("encode_decode", |b| {
        b.iter(|| {
            encode_frames(&mut out, black_box(&msgs));
            decode_frames(black_box(&out))
        })
    });
    g.finish();

    let events: Vec<Event> = msgs.iter().enumerate().map(|(i, m)| log_event(m, i)).collect();
    let mut frames = Vec::new();
    encode_event_frames(&mut frames, &events);
    let mut g = c.benchmark_group("event_frames");
    g.throughput(Throughput::Bytes(total as u64));
    g.bench_function("encode", |b| {
        b.iter(|| {
            out.clear();
            encode_event_frames(&mut out, black_box(&events));
            black_box(out.len())
        })
    });
    g.bench_function("decode", |b| {
        b.iter(|| {
            let mut cursor = FrameCursor::new(black_box(&frames), 0);
            let mut n = 0;
            while let FrameResult::Frame { body, .. } = cursor.next_frame() {
                n += decode_event_body(body).unwrap().fields.len();
            }
            n
        })
    });
    let mut decoder = EventDecoder::new();
    g.bench_function("decode_reused_decoder", |b| {
        b.iter(|| {
            let mut cursor = FrameCursor::new(black_box(&frames), 0);
            let mut n = 0;
            while let FrameResult::Frame { body, .. } = cursor.next_frame() {
                n += decoder.decode_event_body(body).unwrap().fields.len();
            }
            n
        })
    });
    // As the persisted queue reads back through the page cache: long strings point into the
    // window read rather than being copied, and each event is pushed onto the batch being built.
    let window = sluice_core::SharedText::new(frames.clone());
    let mut events = Vec::with_capacity(4096);
    g.bench_function("decode_in_shared_buffer", |b| {
        b.iter(|| {
            events.clear();
            let mut cursor = FrameCursor::new(black_box(window.as_bytes()), 0);
            while let FrameResult::Frame { body, .. } = cursor.next_frame() {
                decoder.decode_event_body_into(body, Some(&window), &mut events).unwrap();
            }
            events.len()
        })
    });
    g.finish();
}

fn bench_codec(c: &mut Criterion) {
    let event = twelve_fields();
    let mut body = Vec::new();
    encode_event(&event, &mut body).unwrap();
    let mut g = c.benchmark_group("codec");
    g.throughput(Throughput::Elements(1));
    let mut out = Vec::with_capacity(body.len());
    g.bench_function("encode_12_fields", |b| {
        b.iter(|| {
            out.clear();
            encode_event(black_box(&event), &mut out).unwrap();
            black_box(out.len())
        })
    });
    // The end-to-end benchmark's events: a generator line of 250 bytes and its timestamp.
    let line = format!("{{\"ts\":\"2026-11-21T07:00:00.000Z\",\"level\":\"info\",\"msg\":\"{}\"}}", "x".repeat(200));
    let lines: Vec<Event> =
        (0..1000).map(|i| Event::from_message_at(line.as_str(), 1_760_000_000_000_000_000 + i)).collect();
    let mut frames = Vec::with_capacity(1 << 20);
    g.throughput(Throughput::Elements(1000));
    g.bench_function("encode_frames_1000_lines", |b| {
        b.iter(|| {
            frames.clear();
            encode_event_frames(&mut frames, black_box(&lines));
            black_box(frames.len())
        })
    });
    g.throughput(Throughput::Elements(1));
    g.bench_function("decode_12_fields", |b| b.iter(|| decode_event_body(black_box(&body)).unwrap()));
    let mut decoder = EventDecoder::new();
    g.bench_function("decode_12_fields_reused_decoder", |b| {
        b.iter(|| decoder.decode_event_body(black_box(&body)).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench_frames, bench_codec);
criterion_main!(benches);
