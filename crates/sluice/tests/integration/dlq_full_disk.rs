//! A dead letter queue on a disk that fills: its writes fail for a reason that is not the
//! events', so the batches that carry rejected events wait (backpressure) and are written once
//! space returns — none is lost, and the clients are answered only then.

use crate::common;

use std::time::Duration;

use common::{Sluice, free_port, http, metric, summary, try_http, wait_until};
use sluice_testkit::SmallTmpfs;

/// An http input into a `file` output whose file names come from the events, with a dead
/// letter queue (`sync: commit`) in `data`; `extra` goes at the top of the config.
fn start(data: &std::path::Path, port: u16, extra: &str) -> (Sluice, String) {
    let mut s = Sluice::start(&format!(
        "data_dir: '{}'
api: {{address: '127.0.0.1:0'}}
{extra}pipelines:
  web:
    inputs: [{{type: http, address: '127.0.0.1:{port}'}}]
    outputs: [{{type: file, id: by_name, path: '{{dir}}/out/%{{/name}}.log'}}]
    dead_letter_queue: {{enabled: true, sync: commit}}
",
        data.display()
    ));
    s.wait_port(port);
    let api = s.api();
    (s, api)
}

#[test]
fn rejected_events_wait_for_a_full_dead_letter_queue_and_none_is_lost() {
    let Some(mount) = SmallTmpfs::mount("4m") else { return };
    let port = free_port();
    let data = mount.path().join("data");
    let (mut s, api) = start(&data, port, "");
    // Each request holds one event the file output refuses for good (its name is too long for
    // a file name): it goes to the dead letter queue, which the full disk refuses.
    let ballast = mount.fill();
    const REQUESTS: usize = 6;
    let clients: Vec<_> = (0..REQUESTS)
        .map(|r| {
            let address = format!("127.0.0.1:{port}");
            std::thread::spawn(move || {
                let long = format!("{r}-{}", "n".repeat(300));
                let body = format!("{{\"name\":\"{long}\",\"message\":\"rejected {r}\"}}\n{{\"name\":\"ok\",\"message\":\"fine {r}\"}}\n");
                try_http(&address, "POST", "/", &[], body.as_bytes())
            })
        })
        .collect();
    let retries = |api: &str| {
        metric(&http(api, "GET", "/metrics", &[], b"").1, "sluice_dlq_write_retries_total{pipeline=\"web\"}")
    };
    wait_until("the dead letter queue retried on the full disk", Duration::from_secs(30), || retries(&api) >= 2.0);
    std::thread::sleep(Duration::from_millis(300));
    assert!(clients.iter().all(|c| !c.is_finished()), "a client was answered while its rejected event was not stored");
    s.wait_log("the dead letter queue cannot write", Duration::from_secs(10));
    std::fs::remove_file(&ballast).unwrap();
    for c in clients {
        let (status, body) = c.join().unwrap().expect("answered");
        assert_eq!(status, 200, "{body}");
    }
    let metrics = http(&api, "GET", "/metrics", &[], b"").1;
    assert_eq!(metric(&metrics, "sluice_dlq_lost_total{pipeline=\"web\"}"), 0.0, "{metrics}");
    let (status, log) = s.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("the dead letter queue writes again"), "{log}");
    let mut rejected: Vec<String> =
        common::dlq_show(&data, "web").iter().map(|e| e["event"]["message"].as_str().unwrap().to_string()).collect();
    rejected.sort();
    rejected.dedup();
    assert_eq!(
        rejected,
        (0..REQUESTS).map(|r| format!("rejected {r}")).collect::<Vec<_>>(),
        "every rejected event stored"
    );
}

#[test]
fn a_drain_timeout_while_the_dead_letter_queue_is_full_leaves_the_batch_unacknowledged() {
    let Some(mount) = SmallTmpfs::mount("4m") else { return };
    let port = free_port();
    let data = mount.path().join("data");
    let (mut s, api) = start(&data, port, "shutdown_timeout: 1s\n");
    let _ballast = mount.fill();
    let address = format!("127.0.0.1:{port}");
    let client = std::thread::spawn(move || {
        let body = format!("{{\"name\":\"{}\",\"message\":\"rejected\"}}\n", "n".repeat(300));
        try_http(&address, "POST", "/", &[], body.as_bytes())
    });
    let retries = |api: &str| {
        metric(&http(api, "GET", "/metrics", &[], b"").1, "sluice_dlq_write_retries_total{pipeline=\"web\"}")
    };
    wait_until("the dead letter queue retried on the full disk", Duration::from_secs(30), || retries(&api) >= 1.0);
    s.signal("TERM");
    let (status, log) = s.wait(Duration::from_secs(30));
    // Not acknowledged: the client is not told its events were handled, and the drain says so.
    let (code, _) = client.join().unwrap().expect("answered");
    assert_eq!(code, 503);
    assert!(!status.success(), "events were left unfinished: {log}");
    let sum = summary(&log, "web");
    assert_eq!((sum["unfinished"], sum["dead_lettered"]), (1, 0), "{log}");
    assert!(!log.contains("they are lost"), "{log}");
}
