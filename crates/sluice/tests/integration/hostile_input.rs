//! Clients that are careless or malicious, against the real binary: bodies of tiny values that
//! would amplify into gigabytes, many at once; clients that send half a request and then
//! nothing. Every client must be answered, the node's memory budget must hold, and a normal
//! client must still get through.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Sluice, free_port, http, metric, try_http};

fn config(port: u16, extra: &str) -> String {
    format!(
        "data_dir: {{dir}}/data\napi: {{address: 127.0.0.1:0}}\nmemory: {{budget: 64MiB}}\npipelines:\n  p:\n    workers: 1\n    inputs: [{{type: http, address: '127.0.0.1:{port}'{extra}}}]\n    outputs: [{{type: blackhole}}]\n"
    )
}

/// The resident memory of a process, from /proc.
fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[test]
fn bodies_of_tiny_values_are_refused_and_every_client_is_answered() {
    let port = free_port();
    let mut s = Sluice::start(&config(port, ""));
    s.wait_port(port);
    let api = s.api();
    let address = format!("127.0.0.1:{port}");
    // 10 MiB of `1 ` is 5 million events: well over a gigabyte as events, 16 times the budget.
    let spaces = b"1 ".repeat(5 << 20);
    let array = format!("[{}1]", "1,".repeat((5 << 20) - 2)).into_bytes();
    let clients: Vec<_> = (0..4)
        .map(|i| {
            let (address, body) = (address.clone(), if i % 2 == 0 { spaces.clone() } else { array.clone() });
            std::thread::spawn(move || try_http(&address, "POST", "/", &[], &body))
        })
        .collect();
    // Each is refused as too large (413), or — when the requests already waiting for the
    // budget hold their share of it with their bodies — told to send again later (429); the
    // oldest waiter is always served, so at least one gets as far as the limit.
    let mut too_large = 0;
    for c in clients {
        let (status, body) = c.join().unwrap().expect("the client was not answered");
        match status {
            413 => {
                too_large += 1;
                assert!(body.contains("max_events_per_request") || body.contains("memory budget"), "{body}");
            }
            429 => assert!(body.contains("memory budget"), "{body}"),
            _ => panic!("answered {status}: {body}"),
        }
    }
    assert!(too_large >= 1, "no request was refused as too large");
    // A normal client is served, and nothing of the refused requests is still held.
    let (status, body) = http(&address, "POST", "/", &[], b"{\"msg\":\"fine\"}\n{\"msg\":\"also\"}");
    assert_eq!((status, body.as_str()), (200, "{\"accepted\":2}"));
    let metrics = common::http(&api, "GET", "/metrics", &[], b"").1;
    assert_eq!(metric(&metrics, "sluice_memory_used_bytes"), 0.0, "{metrics}");
    assert_eq!(metric(&metrics, "sluice_memory_budget_bytes"), (64 << 20) as f64);
    assert!(
        metric(
            &metrics,
            "sluice_component_refused_total{pipeline=\"p\",component=\"http_0\",kind=\"input\",type=\"http\"}"
        ) >= 4.0
    );
    let peak = rss_bytes(s.child.id());
    // Four 10 MiB bodies and their decoding stay far below what the events would have cost
    // (the measured figure is in bench/; this only guards against the gigabytes).
    assert!(peak < 600 << 20, "peak RSS {} MiB", peak >> 20);
    s.stop();
}

#[test]
fn a_request_larger_than_half_the_budget_is_413_and_the_budget_holds_many_clients() {
    let port = free_port();
    // Events per request are not what stops these: memory is.
    let mut s = Sluice::start(&config(port, ", max_events_per_request: 10000000"));
    s.wait_port(port);
    let address = format!("127.0.0.1:{port}");
    let tiny = b"1 ".repeat(5 << 20);
    // Normal-sized events: 200 requests of 1,000 events each, 8 clients at once.
    let normal: Vec<u8> =
        (0..1000).flat_map(|i| format!("{{\"n\":{i},\"text\":\"{}\"}}\n", "x".repeat(200)).into_bytes()).collect();
    let mut clients = Vec::new();
    for i in 0..8 {
        let (address, tiny, normal) = (address.clone(), tiny.clone(), normal.clone());
        clients.push(std::thread::spawn(move || {
            let mut statuses = Vec::new();
            for _ in 0..25 {
                let body = if i == 0 { &tiny } else { &normal };
                let (status, body) = try_http(&address, "POST", "/", &[], body).expect("not answered");
                statuses.push((status, body));
            }
            statuses
        }));
    }
    for (i, c) in clients.into_iter().enumerate() {
        for (status, body) in c.join().unwrap() {
            if i == 0 {
                assert_eq!(status, 413, "{body}");
                assert!(body.contains("half the node's memory budget"), "{body}");
            } else {
                assert!(status == 200 || status == 429, "{status}: {body}");
            }
        }
    }
    s.stop();
}

#[test]
fn slow_clients_are_closed_and_a_normal_client_gets_through() {
    let port = free_port();
    let mut s =
        Sluice::start(&config(port, ", header_timeout: 1s, body_timeout: 1s, idle_timeout: 2s, max_connections: 300"));
    s.wait_port(port);
    let address = format!("127.0.0.1:{port}");
    // 200 clients send half a head, 50 a head and part of a body, 40 nothing at all.
    let mut slow = Vec::new();
    for i in 0..290 {
        let mut c = TcpStream::connect(&address).unwrap();
        match i % 29 {
            0..=19 => c.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Le").unwrap(),
            20..=24 => c.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n[1,").unwrap(),
            _ => {}
        }
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        slow.push(c);
    }
    let started = Instant::now();
    // Meanwhile a normal client is served at once.
    let (status, _) = http(&address, "POST", "/", &[], b"{}");
    assert_eq!(status, 200);
    assert!(started.elapsed() < Duration::from_secs(5));
    // Every slow client is closed by a timeout (408 for the slow bodies), none is left open.
    for (i, mut c) in slow.into_iter().enumerate() {
        let mut got = Vec::new();
        let r = c.read_to_end(&mut got);
        assert!(r.is_ok(), "client {i} was not closed: {r:?}");
        if (20..=24).contains(&(i % 29)) {
            assert!(got.starts_with(b"HTTP/1.1 408"), "client {i}: {}", String::from_utf8_lossy(&got));
        }
    }
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
    // With every place held by a stalled connection, a new client still gets in: the longest
    // stalled one makes room.
    let held: Vec<_> = (0..300).map(|_| TcpStream::connect(&address).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    let (status, _) = http(&address, "POST", "/", &[], b"{}");
    assert_eq!(status, 200);
    assert!(started.elapsed() < Duration::from_secs(5));
    drop(held);
    s.stop();
}

/// Many short-lived senders against `max_connections: 8` on the `tcp` and `syslog` inputs,
/// which have no acknowledgements: each connects, writes half its lines, pauses (so it is the
/// idle one a newcomer evicts), writes the rest and closes; the house starts full of
/// connections that send nothing. A connection is evicted only once it has been read and has
/// nothing unread, and an evicted one reads until its client closes: every line arrives, once.
/// The evictions are counted at `/metrics`, and their log line is rate-limited.
#[test]
fn evicted_connections_of_short_lived_senders_lose_no_line() {
    let (tcp_port, syslog_port) = (free_port(), free_port());
    let mut s = Sluice::start(&format!(
        "api: {{address: '127.0.0.1:0'}}
pipelines:
  p:
    inputs:
      - {{type: tcp, address: '127.0.0.1:{tcp_port}', max_connections: 8}}
      - {{type: syslog, mode: tcp, address: '127.0.0.1:{syslog_port}', max_connections: 8}}
    outputs: [{{type: file, path: '{{dir}}/out.log'}}]
"
    ));
    s.wait_port(tcp_port);
    s.wait_port(syslog_port);
    let api = s.api();
    let started = Instant::now();
    let silent: Vec<_> = [tcp_port, syslog_port]
        .iter()
        .flat_map(|&port| (0..8).map(move |_| TcpStream::connect(("127.0.0.1", port)).unwrap()))
        .collect();
    let (threads, connections, half) = (24, 20, 5);
    let senders: Vec<_> = [tcp_port, syslog_port]
        .into_iter()
        .flat_map(|port| (0..threads).map(move |t| (port, t)))
        .map(|(port, t)| {
            std::thread::spawn(move || {
                for c in 0..connections {
                    let line =
                        |l: usize| format!("<13>Nov 26 07:16:16 host app: evict port={port} t={t} c={c} l={l}\n");
                    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
                    let first: String = (0..half).map(line).collect();
                    stream.write_all(first.as_bytes()).unwrap();
                    std::thread::sleep(Duration::from_millis(20));
                    let rest: String = (half..2 * half).map(line).collect();
                    // A write into a connection the input closed fails or resets: the line is lost.
                    stream
                        .write_all(rest.as_bytes())
                        .expect("the input closed a connection it had not read to its end");
                }
            })
        })
        .collect();
    for sender in senders {
        sender.join().unwrap();
    }
    let per_port = threads * connections * 2 * half;
    let out = s.path("out.log");
    let keys = || {
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        let mut seen = std::collections::HashMap::<String, u32>::new();
        for line in text.lines() {
            if let Some(at) = line.find("evict port=") {
                *seen.entry(line[at..].split('"').next().unwrap().to_string()).or_default() += 1;
            }
        }
        seen
    };
    let all = common::eventually(Duration::from_secs(30), || keys().len() >= 2 * per_port);
    let seen = keys();
    for port in [tcp_port, syslog_port] {
        let got = seen.keys().filter(|k| k.starts_with(&format!("evict port={port} "))).count();
        assert_eq!(got, per_port, "port {port}: {got} of {per_port} lines arrived:\n{}", s.log());
    }
    assert!(all);
    assert!(seen.values().all(|&n| n == 1), "a line arrived twice");
    drop(silent);

    let metrics = common::http(&api, "GET", "/metrics", &[], b"").1;
    for kind in ["tcp", "syslog"] {
        let evicted = metrics
            .lines()
            .find(|l| {
                l.starts_with("sluice_component_connections_evicted_total{") && l.contains(&format!("type=\"{kind}\""))
            })
            .unwrap_or_else(|| panic!("no eviction count for {kind} at /metrics:\n{metrics}"));
        let evicted: f64 = evicted.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(evicted >= 8.0, "{kind}: {evicted} evictions, and the 8 silent connections had to make room");
        assert!(
            metrics.lines().any(|l| l.starts_with("sluice_component_evicted_bytes_discarded_total{")
                && l.contains(&format!("type=\"{kind}\""))
                && l.ends_with(" 0")),
            "{kind}: bytes discarded at eviction:\n{metrics}"
        );
    }
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    // Once per 10 s per input at most, however many evictions.
    let allowed = 1 + started.elapsed().as_secs() as usize / 10;
    for kind in ["tcp", "syslog"] {
        let lines = log.lines().filter(|l| l.contains(&format!("{kind} input is closing a connection"))).count();
        assert!((1..=allowed).contains(&lines), "{lines} eviction lines for {kind}, at most {allowed} allowed:\n{log}");
    }
    assert!(!log.contains("refused a connection"), "{log}");
}
