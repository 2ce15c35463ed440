//! A full disk under the persisted queue, through the real binary: the queue lives on a small
//! tmpfs the test mounts (8 MiB, less than the queue's `max_bytes`), the `http` output points at
//! a test server that answers 503 (so nothing is delivered and the disk fills), and a client
//! posts numbered events to the `http` input until requests stop being answered. Then: the log
//! says the queue cannot write because the disk is full, the process is alive, and once the
//! server answers 200 the queue drains, space returns, the held-back requests complete, new
//! ones are taken, and every event answered 200 reaches the server.
//!
//! A 1 MiB ballast file shares the tmpfs. If the queue does not free its own acknowledged
//! segments after the drain, the test deletes the ballast to check the rest (writing resumes
//! when space returns, nothing answered 200 is lost), then fails with what it saw.
//!
//! Needs root and permission to mount a tmpfs; without them the test fails saying why (unless
//! `SLUICE_SKIP_ROOT_TESTS=1` skips it, see `sluice_testkit::root`).

use crate::common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use sluice_testkit::SmallTmpfs;

/// Events per request, and the padding that makes each one about 2 KiB.
const PER_REQUEST: u64 = 20;
const PAD: usize = 2000;

const REFUSE: u8 = 0;
const ACCEPT: u8 = 1;

/// The output's server: answers 503 while refusing, 200 while accepting (recording the ids).
struct Server {
    port: u16,
    mode: Arc<AtomicU8>,
    received: Arc<Mutex<Vec<u64>>>,
    refused: Arc<Mutex<u64>>,
    stop: Arc<AtomicBool>,
}

impl Server {
    fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = Server {
            port,
            mode: Arc::new(AtomicU8::new(REFUSE)),
            received: Arc::default(),
            refused: Arc::default(),
            stop: Arc::default(),
        };
        let (mode, received, refused, stop) =
            (server.mode.clone(), server.received.clone(), server.refused.clone(), server.stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let (mode, received, refused) = (mode.clone(), received.clone(), refused.clone());
                        std::thread::spawn(move || serve(conn, &mode, &received, &refused));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        server
    }

    fn received(&self) -> BTreeSet<u64> {
        self.received.lock().unwrap().iter().copied().collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Serves requests on one connection (keep-alive) until the client closes it.
fn serve(mut conn: TcpStream, mode: &AtomicU8, received: &Mutex<Vec<u64>>, refused: &Mutex<u64>) {
    conn.set_nonblocking(false).unwrap();
    let _ = conn.set_read_timeout(Some(Duration::from_secs(60)));
    let mut buf = Vec::new();
    loop {
        let Some(head_end) = read_until(&mut conn, &mut buf, |b| find(b, b"\r\n\r\n").map(|i| i + 4)) else { return };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let body = if head.contains("transfer-encoding: chunked") {
            let Some(end) =
                read_until(&mut conn, &mut buf, |b| find(&b[head_end..], b"\r\n0\r\n\r\n").map(|i| head_end + i + 7))
            else {
                return;
            };
            let body = String::from_utf8_lossy(&buf[head_end..end]).into_owned();
            buf.drain(..end);
            body
        } else {
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            let Some(end) = read_until(&mut conn, &mut buf, |b| (b.len() >= head_end + len).then_some(head_end + len))
            else {
                return;
            };
            let body = String::from_utf8_lossy(&buf[head_end..end]).into_owned();
            buf.drain(..end);
            body
        };
        let answer = if mode.load(Ordering::SeqCst) == ACCEPT {
            received.lock().unwrap().extend(ids(&body));
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"
        } else {
            *refused.lock().unwrap() += 1;
            "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\n{}"
        };
        if conn.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}

/// Reads into `buf` until `done` finds what it needs; `None` when the connection ends first.
fn read_until(conn: &mut TcpStream, buf: &mut Vec<u8>, done: impl Fn(&[u8]) -> Option<usize>) -> Option<usize> {
    let mut chunk = [0u8; 64 << 10];
    loop {
        if let Some(at) = done(buf) {
            return Some(at);
        }
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Every `"n":<id>` in a text.
fn ids(text: &str) -> Vec<u64> {
    text.split("\"n\":")
        .skip(1)
        .filter_map(|p| p.chars().take_while(char::is_ascii_digit).collect::<String>().parse().ok())
        .collect()
}

fn body(first: u64) -> String {
    let pad = "x".repeat(PAD);
    (first..first + PER_REQUEST)
        .map(|n| format!("{{\"n\":{n},\"message\":\"disk full test event {n} {pad}\"}}\n"))
        .collect()
}

/// A request posted in the background: its first id and its outcome once it has one.
struct Pending {
    first: u64,
    rx: mpsc::Receiver<std::io::Result<(u16, String)>>,
}

fn post(port: u16, first: u64) -> Pending {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let addr = format!("127.0.0.1:{port}");
        let _ = tx.send(post_now(&addr, body(first).as_bytes(), Duration::from_secs(50)));
    });
    Pending { first, rx }
}

/// One POST with a read timeout (a request held back by a full queue may wait a long time).
fn post_now(addr: &str, body: &[u8], timeout: Duration) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(timeout))?;
    let head = format!(
        "POST / HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/x-ndjson\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)?;
    let text = String::from_utf8_lossy(&resp).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((status, text))
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

fn df(path: &Path) -> String {
    Command::new("df")
        .arg("-k")
        .arg(path)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().last().unwrap_or_default().to_string())
        .unwrap_or_default()
}

#[test]
fn a_full_disk_holds_inputs_back_and_the_queue_recovers_when_space_returns() {
    full_disk(false);
}

/// The same with `direct_io`: a failed direct write is cut back to the live frames like a
/// buffered one, and the block it rewrites holds them again when writing resumes.
#[test]
fn a_full_disk_under_direct_io_recovers_the_same_way() {
    full_disk(true);
}

fn full_disk(direct_io: bool) {
    let Some(mount) = SmallTmpfs::mount("8m") else { return };
    let started = Instant::now();
    let queue: PathBuf = mount.path().join("q");
    // Space the test can give back from outside, to tell "the queue frees its own space" from
    // "writing resumes when space returns".
    let ballast = mount.path().join("ballast");
    std::fs::write(&ballast, vec![1u8; 1 << 20]).unwrap();
    let server = Server::start();
    let port = free_port();
    let config = format!(
        "data_dir: '{{dir}}/data'
api: {{address: '127.0.0.1:0'}}
shutdown_timeout: 10s
pipelines:
  p:
    workers: 1
    batch: {{size: 100, delay: 5ms}}
    queue: {{type: persisted, path: '{}', shards: 1, segment_bytes: 1MiB, max_bytes: 64MiB, checkpoint_interval: 50ms, direct_io: {direct_io}}}
    inputs: [{{type: http, address: '127.0.0.1:{port}'}}]
    outputs:
      - {{type: http, url: 'http://127.0.0.1:{}/', timeout: 5s, retry: {{initial_backoff: 50ms, max_backoff: 500ms}}}}
",
        queue.display(),
        server.port
    );
    // Declared after the mount, so it is dropped (killed) before the unmount.
    let mut s = Sluice::start(&config);
    let api = s.api();
    s.wait_port(port);

    // Fill the disk: post until a request is not answered within a few seconds.
    let mut acked: BTreeSet<u64> = BTreeSet::new();
    let mut held: Vec<Pending> = Vec::new();
    let mut next = 0u64;
    while held.len() < 3 {
        assert!(started.elapsed() < Duration::from_secs(25), "the disk never filled; {}", df(mount.path()));
        let p = post(port, next);
        next += PER_REQUEST;
        match p.rx.recv_timeout(if held.is_empty() { Duration::from_secs(3) } else { Duration::from_millis(300) }) {
            Ok(Ok((200, _))) => acked.extend(p.first..p.first + PER_REQUEST),
            Ok(other) => panic!("request {} answered {other:?} while the disk filled:\n{}", p.first, tail(&s.log())),
            Err(_) => held.push(p),
        }
    }
    let log = s.log();
    assert!(
        log.contains("persisted queue cannot write") && log.contains("disk full"),
        "no `cannot write (disk full)` line in the log ({}):\n{}",
        df(mount.path()),
        tail(&log)
    );
    assert!(s.child.try_wait().unwrap().is_none(), "sluice died on a full disk:\n{}", tail(&log));
    let stats = get_json(&api, "/stats");
    let q = &stats["pipelines"]["p"]["queue"];
    assert_eq!(q["shards"][0]["stalled"], "disk full", "the stall shows in /stats: {q}");
    assert!(q["stalled_nanos"].as_u64().unwrap_or(0) > 0, "stall time counts while the stall lasts: {q}");
    eprintln!(
        "disk full after {} events acknowledged ({:?}); {}; server refused {} requests",
        acked.len(),
        started.elapsed(),
        df(mount.path()),
        server.refused.lock().unwrap()
    );

    // Space returns once the output delivers (the queue deletes what was acknowledged): the
    // held requests complete.
    server.mode.store(ACCEPT, Ordering::SeqCst);
    let mut stuck: Option<String> = None;
    let mut still_held = Vec::new();
    for p in held {
        match p.rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok((200, _))) => acked.extend(p.first..p.first + PER_REQUEST),
            Err(mpsc::RecvTimeoutError::Timeout) => still_held.push(p),
            other => panic!("a request held back by the full disk failed: {other:?}\n{}", tail(&s.log())),
        }
    }
    if !still_held.is_empty() {
        // The queue did not free its own acknowledged segments. Note it, then give space back
        // from outside (the ballast) to check the rest: writing resumes when space returns.
        stuck = Some(format!(
            "the output took every event, but the queue never freed its acknowledged segments and the \
             {} held requests never completed: {} {} received by the server; files: {}; queue: {}",
            still_held.len(),
            df(mount.path()),
            server.received().len(),
            listing(&queue.join("shard-0")),
            get_json(&api, "/stats")["pipelines"]["p"]["queue"]
        ));
        eprintln!("FAILURE (checked at the end): {}", stuck.as_ref().unwrap());
        std::fs::remove_file(&ballast).unwrap();
        for p in still_held {
            match p.rx.recv_timeout(Duration::from_secs(20)) {
                Ok(Ok((200, _))) => acked.extend(p.first..p.first + PER_REQUEST),
                other => panic!(
                    "a request held back by the full disk did not complete even once space returned: {other:?}\n\
                     {}; queue: {}\n{}",
                    df(mount.path()),
                    get_json(&api, "/stats")["pipelines"]["p"]["queue"],
                    tail(&s.log())
                ),
            }
        }
    }
    // And the queue takes new events.
    for _ in 0..20 {
        let p = post(port, next);
        next += PER_REQUEST;
        match p.rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok((200, _))) => acked.extend(p.first..p.first + PER_REQUEST),
            other => panic!("request {} after recovery: {other:?}\n{}", p.first, tail(&s.log())),
        }
    }
    wait_until("the server to receive every acknowledged event", Duration::from_secs(20), || {
        acked.is_subset(&server.received())
    });
    let received = server.received();
    let unknown: Vec<u64> = received.iter().copied().filter(|n| *n >= next).collect();
    assert!(unknown.is_empty(), "events nobody sent: {unknown:?}");
    let (status, log) = s.stop();
    assert!(status.success(), "{}", tail(&log));
    eprintln!(
        "recovered: {} events acknowledged, {} received, {:?} in all",
        acked.len(),
        received.len(),
        started.elapsed()
    );
    drop(s);
    drop(mount);
    if let Some(why) = stuck {
        panic!("{why}");
    }
}

fn listing(dir: &Path) -> String {
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| format!("{} {}", e.file_name().to_string_lossy(), e.metadata().map_or(0, |m| m.len())))
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files.join(", ")
}

/// The restart after a full disk: events are delivered while the disk is full, then
/// Sluice is stopped with the disk still full. Every delivered event must be recorded by the
/// queue's checkpoints (they need no new space), so the queue on disk holds nothing to deliver
/// again: `sluice queue stats` counts 0 unacknowledged events, and a restart sends nothing.
#[test]
fn events_delivered_on_a_full_disk_are_not_delivered_again_after_a_restart() {
    let Some(mount) = SmallTmpfs::mount("8m") else { return };
    let queue: PathBuf = mount.path().join("q");
    let server = Server::start();
    let port = free_port();
    let config = format!(
        "data_dir: '{{dir}}/data'
api: {{address: '127.0.0.1:0'}}
shutdown_timeout: 5s
pipelines:
  p:
    workers: 1
    batch: {{size: 100, delay: 5ms}}
    queue: {{type: persisted, path: '{}', shards: 1, segment_bytes: 1MiB, max_bytes: 64MiB, checkpoint_interval: 50ms}}
    inputs: [{{type: http, address: '127.0.0.1:{port}'}}]
    outputs:
      - {{type: http, url: 'http://127.0.0.1:{}/', timeout: 5s, retry: {{initial_backoff: 50ms, max_backoff: 200ms}}}}
",
        queue.display(),
        server.port
    );
    let mut s = Sluice::start(&config);
    let api = s.api();
    s.wait_port(port);
    // Stored, not delivered (the server refuses): about 2 MB in the queue.
    let requests = 50u64;
    for r in 0..requests {
        let p = post(port, r * PER_REQUEST);
        match p.rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok((200, _))) => {}
            other => panic!("request {r}: {other:?}\n{}", tail(&s.log())),
        }
    }
    // Now the disk is full, and the output delivers everything.
    let ballast = mount.path().join("ballast");
    {
        let mut f = std::fs::File::create(&ballast).unwrap();
        let chunk = vec![0xa5u8; 4096];
        while f.write(&chunk).is_ok_and(|n| n > 0) {}
    }
    server.mode.store(ACCEPT, Ordering::SeqCst);
    let all: BTreeSet<u64> = (0..requests * PER_REQUEST).collect();
    wait_until("the server to receive every event", Duration::from_secs(30), || server.received() == all);
    wait_until("the checkpoint to record every delivered event", Duration::from_secs(10), || {
        let (_, text) = http(&api, "GET", "/metrics", &[], b"");
        text.contains("sluice_queue_checkpoint_lag_events{pipeline=\"p\"} 0\n")
    });
    let (status, log) = s.stop();
    assert!(status.success(), "{}", tail(&log));
    assert!(!log.contains("cannot write the last queue checkpoint"), "{}", tail(&log));

    let out = Command::new(BIN).args(["queue", "stats", "--json"]).arg(&queue).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["totals"]["unacked_events"], 0, "a restart would deliver these again: {report:#}");
    drop(s);
    drop(mount);
}
