//! Network and file components end to end: tcp and http in, file out, with every event and
//! byte accounted for; over-long lines and malformed JSON; an output that always fails; a slow
//! output whose backpressure reaches the input without unbounded memory; the acknowledgement
//! latency of what an input waits for.

use crate::common;

use std::collections::BTreeSet;
use std::io::Write;
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::*;

fn lines_of(path: &std::path::Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

#[test]
fn tcp_in_file_out_every_line_arrives() {
    let port = free_port();
    let mut s = Sluice::start(&format!(
        "api: {{address: '127.0.0.1:0'}}
pipelines:
  t:
    workers: 2
    inputs: [{{type: tcp, address: '127.0.0.1:{port}', codec: json_lines, max_line_bytes: 200}}]
    outputs: [{{type: file, path: '{{dir}}/out/%{{/client}}.log'}}]
"
    ));
    let api = s.api();
    let clients: Vec<_> = (0..3)
        .map(|c| {
            std::thread::spawn(move || {
                let mut conn = TcpStream::connect(("127.0.0.1", port)).unwrap();
                let mut buf = String::new();
                for i in 0..5000 {
                    buf.push_str(&format!("{{\"client\":\"c{c}\",\"n\":{i}}}\n"));
                }
                buf.push_str("{not json\n");
                buf.push_str(&format!("{{\"client\":\"c{c}\",\"pad\":\"{}\"}}\n", "x".repeat(500)));
                buf.push_str(&format!("{{\"client\":\"c{c}\",\"n\":\"after\"}}\n"));
                conn.write_all(buf.as_bytes()).unwrap();
                buf.len() as u64
            })
        })
        .collect();
    let sent: u64 = clients.into_iter().map(|c| c.join().unwrap()).sum();
    wait_until("all lines", Duration::from_secs(30), || {
        get_json(&api, "/stats")["pipelines"]["t"]["events"]["out"].as_u64() == Some(3 * 5003)
    });
    // Bytes in: every byte the clients sent, once, however it was framed (over-long and broken
    // lines included). Bytes out: what the files hold; the rejected events wrote nothing.
    let written: u64 = std::fs::read_dir(s.path("out")).unwrap().map(|f| f.unwrap().metadata().unwrap().len()).sum();
    let stats = get_json(&api, "/stats");
    let components = stats["pipelines"]["t"]["components"].as_array().unwrap();
    let (input, output) = (&components[0], &components[1]);
    assert_eq!((input["kind"].as_str(), output["kind"].as_str()), (Some("input"), Some("output")), "{stats}");
    assert_eq!(input["bytes_in"].as_u64(), Some(sent), "{input}");
    assert_eq!(output["bytes_out"].as_u64(), Some(written), "{output}");
    let text = http(&api, "GET", "/metrics", &[], b"").1;
    let labels =
        |id: &str, kind: &str, t: &str| format!("{{pipeline=\"t\",component=\"{id}\",kind=\"{kind}\",type=\"{t}\"}}");
    let (input_id, output_id) = (input["id"].as_str().unwrap(), output["id"].as_str().unwrap());
    assert!(text.contains("\n# TYPE sluice_component_received_bytes counter\n"), "{text}");
    assert!(text.contains("\n# TYPE sluice_component_sent_bytes counter\n"), "{text}");
    let received = format!("sluice_component_received_bytes_total{}", labels(input_id, "input", "tcp"));
    let delivered = format!("sluice_component_sent_bytes_total{}", labels(output_id, "output", "file"));
    assert_eq!(metric(&text, &received), sent as f64);
    assert_eq!(metric(&text, &delivered), written as f64);
    assert!(!text.contains(&format!("sluice_component_received_bytes_total{}", labels(output_id, "output", "file"))));
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    for c in 0..3 {
        let events = lines_of(&s.path(&format!("out/c{c}.log")));
        let ns: BTreeSet<i64> = events.iter().filter_map(|e| e["n"].as_i64()).collect();
        assert_eq!(ns, (0..5000).collect(), "client {c}: every numbered line once");
        assert!(events.iter().any(|e| e["n"] == "after"), "the line after an over-long one is intact");
    }
    // Lines without a client field (unparsable, some also truncated) would make the file name `.log`:
    // the file output rejects them, naming the missing field.
    assert!(!s.path("out/.log").exists());
    assert_eq!(summary(&log, "t")["failed"], 3 + 3, "{log}");
    assert!(log.contains("the event has no field `/client`"), "{log}");
}

#[test]
fn http_in_answers_after_delivery_and_refuses_bad_bodies() {
    let port = free_port();
    let mut s = Sluice::start(&format!(
        "api: {{enabled: false}}
pipelines:
  h:
    inputs: [{{type: http, address: '127.0.0.1:{port}', auth_token: sekrit, max_body_bytes: 4KiB}}]
    outputs: [{{type: file, path: '{{dir}}/http.log'}}]
"
    ));
    let addr = format!("127.0.0.1:{port}");
    wait_until("http input", Duration::from_secs(20), || TcpStream::connect(&addr).is_ok());
    let auth = [("Authorization", "Bearer sekrit")];
    let (code, body) = http(&addr, "POST", "/", &auth, br#"[{"n":1},{"n":2}]"#);
    assert_eq!((code, body.contains("\"accepted\":2")), (200, true), "{body}");
    // The 200 came after delivery: the events are in the file already.
    assert_eq!(lines_of(&s.path("http.log")).len(), 2);
    let (code, _) = http(&addr, "POST", "/", &auth, b"{\"n\":3}\n{\"n\":4}\n");
    assert_eq!(code, 200);
    let (code, body) = http(&addr, "POST", "/", &auth, b"{\"n\":5}\n{oops\n");
    assert_eq!(code, 400, "{body}");
    let (code, _) = http(&addr, "POST", "/", &[], b"{\"n\":6}");
    assert_eq!(code, 401);
    let (code, _) = http(&addr, "POST", "/", &auth, "x".repeat(5000).as_bytes());
    assert_eq!(code, 413);
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    let ns: Vec<i64> = lines_of(&s.path("http.log")).iter().map(|e| e["n"].as_i64().unwrap()).collect();
    assert_eq!(ns, [1, 2, 3, 4], "nothing from refused requests");
}

/// Each request the http input answers 200 is one acknowledged batch in
/// `sluice_pipeline_ack_latency_seconds`, timed from its arrival to its delivery: behind an
/// output that takes 60 ms a request, every one lands above 50 ms, and /stats gives p50/p99.
#[test]
fn ack_latency_is_measured_once_per_acknowledged_request() {
    let (out, served) = http_server(200, Duration::from_millis(60));
    let port = free_port();
    let mut s = Sluice::start(&format!(
        "api: {{address: '127.0.0.1:0'}}
pipelines:
  h:
    inputs: [{{type: http, address: '127.0.0.1:{port}'}}]
    outputs: [{{type: http, url: 'http://{out}/'}}]
"
    ));
    let api = s.api();
    s.wait_port(port);
    let addr = format!("127.0.0.1:{port}");
    for n in 0..3 {
        let body = format!("{{\"n\":{n}}}\n{{\"m\":{n}}}\n");
        let (code, body) = http(&addr, "POST", "/", &[], body.as_bytes());
        assert_eq!(code, 200, "{body}");
    }
    assert_eq!(served.load(Ordering::SeqCst), 3, "one output request per input request");
    let (_, text) = http(&api, "GET", "/metrics", &[], b"");
    assert_eq!(metric(&text, "sluice_pipeline_ack_latency_seconds_count{pipeline=\"h\"}"), 3.0, "{text}");
    assert_eq!(metric(&text, "sluice_pipeline_ack_latency_seconds_bucket{le=\"0.05\",pipeline=\"h\"}"), 0.0);
    assert_eq!(metric(&text, "sluice_pipeline_ack_latency_seconds_bucket{le=\"+Inf\",pipeline=\"h\"}"), 3.0);
    assert!(metric(&text, "sluice_pipeline_ack_latency_seconds_sum{pipeline=\"h\"}") >= 0.18, "{text}");
    let ack = &get_json(&api, "/stats")["pipelines"]["h"]["ack_latency"];
    assert_eq!(ack["count"], 3, "{ack}");
    let (p50, p99) = (ack["p50_seconds"].as_f64().unwrap(), ack["p99_seconds"].as_f64().unwrap());
    assert!(0.05 < p50 && p50 <= p99, "{ack}");
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
}

/// An http client waits for its answer before it sends more, so its request is not held for a
/// fuller batch: with `batch.delay: 20s` a lone small request is answered at once, not after
/// the delay (its acknowledgement well under the 2.5 s bucket).
#[test]
fn an_http_request_is_not_held_for_batch_delay() {
    let port = free_port();
    let mut s = Sluice::start(&format!(
        "api: {{address: '127.0.0.1:0'}}
pipelines:
  h:
    batch: {{size: 1000, delay: 20s}}
    inputs: [{{type: http, address: '127.0.0.1:{port}'}}]
    outputs: [{{type: blackhole}}]
"
    ));
    let api = s.api();
    s.wait_port(port);
    let addr = format!("127.0.0.1:{port}");
    for n in 0..2 {
        let (code, body) = http(&addr, "POST", "/", &[], format!("{{\"n\":{n}}}\n").as_bytes());
        assert_eq!(code, 200, "{body}");
    }
    let ack = &get_json(&api, "/stats")["pipelines"]["h"]["ack_latency"];
    assert_eq!(ack["count"], 2, "{ack}");
    assert!(ack["p99_seconds"].as_f64().unwrap() < 2.5, "held for batch.delay: {ack}");
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
}

/// A tiny HTTP server: answers every request with `status` after `delay`, counting requests.
fn http_server(status: u16, delay: Duration) -> (String, Arc<AtomicUsize>) {
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    let addr = serve_http(move |_| {
        seen.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(delay);
        format!("HTTP/1.1 {status} X\r\nContent-Length: 2\r\n\r\nno")
    });
    (addr, count)
}

/// A 503 with `Retry-After: 1` makes the next attempt wait a second, not the 10 ms backoff;
/// the attempt after a give-up is not announced as a retry.
#[test]
fn retry_after_is_honoured() {
    let times = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = times.clone();
    let addr = serve_http(move |_| {
        let mut t = seen.lock().unwrap();
        t.push(std::time::Instant::now());
        if t.len() == 1 {
            "HTTP/1.1 503 Busy\r\nRetry-After: 1\r\nContent-Length: 4\r\n\r\nbusy".to_string()
        } else {
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_string()
        }
    });
    let mut s = Sluice::start(&format!(
        "api: {{enabled: false}}
pipelines:
  f:
    workers: 1
    inputs: [{{type: generator, count: 1}}]
    outputs:
      - type: http
        url: http://{addr}/bulk
        retry: {{initial_backoff: 10ms, max_backoff: 20ms}}
"
    ));
    let (status, log) = s.wait(Duration::from_secs(60));
    assert!(status.success(), "{log}");
    let t = times.lock().unwrap();
    assert_eq!(t.len(), 2, "{log}");
    assert!(t[1] - t[0] >= Duration::from_millis(950), "retried after {:?}, not after Retry-After: 1", t[1] - t[0]);
}

/// The http output's sent bytes are the bodies of the requests answered 2xx: a body answered
/// 503 and sent again counts once.
#[test]
fn http_output_counts_the_body_of_an_accepted_request_once() {
    let bodies = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = bodies.clone();
    let addr = serve_http(move |body| {
        let mut b = seen.lock().unwrap();
        b.push(body.len());
        if b.len() == 1 {
            "HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy".to_string()
        } else {
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_string()
        }
    });
    // stdin stays open, so the process keeps running after the generator is done.
    let mut s = Sluice::start_with(
        &format!(
            "api: {{address: '127.0.0.1:0'}}
pipelines:
  f:
    workers: 1
    inputs: [{{type: generator, count: 5, batch_size: 5}}, {{type: stdin}}]
    outputs:
      - {{type: http, id: out, url: 'http://{addr}/bulk', retry: {{initial_backoff: 10ms, max_backoff: 20ms}}}}
"
        ),
        std::process::Stdio::piped(),
    );
    let api = s.api();
    wait_until("the events delivered", Duration::from_secs(30), || {
        get_json(&api, "/stats")["pipelines"]["f"]["events"]["out"].as_u64() == Some(5)
    });
    let stats = get_json(&api, "/stats");
    let out = common::component(&stats, "f", "id", "out");
    assert!(!out.is_null(), "no output in {stats}");
    let b = bodies.lock().unwrap().clone();
    assert_eq!(b.len(), 2, "one refused attempt, one accepted: {b:?}");
    assert_eq!(b[0], b[1], "the same body sent again");
    assert_eq!(out["bytes_out"], b[1] as u64, "{out}");
    assert_eq!(out["retries"], 1, "{out}");
    drop(s.child.stdin.take());
    let (status, log) = s.wait(Duration::from_secs(30));
    assert!(status.success(), "{log}");
}

#[test]
fn an_output_that_always_fails_gives_up_after_its_retries() {
    let (addr, requests) = http_server(503, Duration::ZERO);
    let mut s = Sluice::start(&format!(
        "api: {{enabled: false}}
pipelines:
  f:
    workers: 1
    inputs: [{{type: generator, count: 10}}]
    outputs:
      - type: http
        url: http://{addr}/bulk
        retry: {{max_retries: 2, initial_backoff: 10ms, max_backoff: 20ms}}
"
    ));
    let (status, log) = s.wait(Duration::from_secs(60));
    // Over a finite input, events given up on with no dead letter queue make the run fail.
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("kept in no dead letter queue"), "{log}");
    let sum = summary(&log, "f");
    assert_eq!((sum["in"], sum["failed"]), (10, 10), "{log}");
    assert_eq!(requests.load(Ordering::SeqCst), 3, "one try and two retries");
    assert!(log.contains("503"), "the error names the status: {log}");
    assert_eq!(
        log.matches("retrying (the pipeline waits)").count(),
        1,
        "only the first failure is logged as retried (rate limit), never the last: {log}"
    );
}

#[test]
fn a_slow_output_pushes_back_on_the_input_without_growing_memory() {
    let (addr, _requests) = http_server(200, Duration::from_millis(100));
    let mut s = Sluice::start(&format!(
        "api: {{address: '127.0.0.1:0'}}
pipelines:
  slow:
    workers: 1
    batch: {{size: 100, delay: 1ms}}
    queue: {{max_events: 1000}}
    inputs: [{{type: generator}}]
    outputs: [{{type: http, url: 'http://{addr}/'}}]
"
    ));
    let api = s.api();
    std::thread::sleep(Duration::from_millis(1500));
    let q = get_json(&api, "/stats")["pipelines"]["slow"]["queue"].clone();
    assert!(q["events"].as_u64().unwrap() <= 1000 + 1000, "queue stays bounded: {q}");
    assert!(q["blocked_nanos"].as_u64().unwrap() > 0, "the generator was made to wait: {q}");
    let out = get_json(&api, "/stats")["pipelines"]["slow"]["events"]["out"].as_u64().unwrap();
    assert!(out <= 100 * 20, "about 10 batches per second get through, not more: {out}");
    let rss_kib: u64 = std::fs::read_to_string(format!("/proc/{}/status", s.child.id()))
        .unwrap()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap();
    assert!(rss_kib < 200 * 1024, "memory stays bounded: {rss_kib} KiB");
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
}
