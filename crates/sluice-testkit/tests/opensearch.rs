//! The OpenSearch harness against a real node: documents survive a SIGKILL and a restart, and a
//! node with a write pool of one thread and a queue of one rejects concurrent bulks with 429s.

use sluice_testkit::opensearch::OpenSearch;

const ONE_SHARD: &str = r#"{"settings":{"number_of_shards":1,"number_of_replicas":0}}"#;

fn occurrences(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

#[test]
fn bulk_count_kill_restart() {
    let mut os = OpenSearch::start_or_panic(&[]);
    let (status, body) = os.request("GET", "/", "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"number\" : \"2.19.6\""), "{body}");

    let (status, body) = os.request("PUT", "/logs", ONE_SHARD);
    assert_eq!(status, 200, "create the index: {body}");

    let bulk = concat!(
        "{\"index\":{\"_index\":\"logs\"}}\n",
        "{\"message\":\"one\",\"n\":1}\n",
        "{\"index\":{\"_index\":\"logs\",\"_id\":\"two\"}}\n",
        "{\"message\":\"two\",\"n\":2}\n",
        "{\"create\":{\"_index\":\"logs\"}}\n",
        "{\"message\":\"three\",\"n\":3}\n",
    );
    let (status, body) = os.request("POST", "/_bulk", bulk);
    assert_eq!(status, 200, "bulk: {body}");
    assert!(body.contains("\"errors\":false"), "bulk: {body}");
    assert_eq!(occurrences(&body, "\"status\":201"), 3, "bulk: {body}");

    os.refresh("logs");
    assert_eq!(os.count("logs"), 3);

    let port = os.port();
    os.kill();
    assert!(os.try_request("GET", "/", "").is_err(), "nothing answers after the kill");
    os.restart_or_panic();
    assert_eq!(os.port(), port, "the same port after a restart");
    assert_eq!(os.count("logs"), 3, "acknowledged documents survive a SIGKILL");
    let (status, body) = os.request("GET", "/logs/_doc/two", "");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"message\":\"two\""), "{body}");
}

#[test]
fn tiny_write_pool_rejects_concurrent_bulks_with_429() {
    let os = OpenSearch::start_or_panic(&[("thread_pool.write.size", "1"), ("thread_pool.write.queue_size", "1")]);
    let (status, body) = os.request("PUT", "/busy", ONE_SHARD);
    assert_eq!(status, 200, "create the index: {body}");

    const THREADS: usize = 8;
    const BULKS: usize = 5;
    const DOCS: usize = 100;
    let mut bulk = String::new();
    for i in 0..DOCS {
        bulk.push_str("{\"index\":{\"_index\":\"busy\"}}\n");
        bulk.push_str(&format!(
            "{{\"message\":\"document {i} of a bulk that keeps the write thread busy\",\"n\":{i}}}\n"
        ));
    }

    // Per thread: (bulks answered 429 as a whole, items created, items rejected with 429).
    let together = std::sync::Barrier::new(THREADS);
    let results: Vec<(usize, usize, usize)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    together.wait();
                    let (mut whole, mut created, mut rejected) = (0, 0, 0);
                    for _ in 0..BULKS {
                        let (status, body) = os.request("POST", "/_bulk", &bulk);
                        match status {
                            429 => {
                                assert!(body.contains("rejected_execution_exception"), "429: {body}");
                                whole += 1;
                            }
                            200 => {
                                created += occurrences(&body, "\"status\":201");
                                let items_429 = occurrences(&body, "\"status\":429");
                                // OpenSearch names the error `rejected_execution_exception`;
                                // Elasticsearch names it `es_rejected_execution_exception`.
                                assert_eq!(
                                    items_429,
                                    occurrences(&body, "rejected_execution_exception\""),
                                    "each 429 item is a rejected execution: {body}"
                                );
                                rejected += items_429;
                            }
                            _ => panic!("bulk answered {status}: {body}"),
                        }
                    }
                    (whole, created, rejected)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a bulk thread")).collect()
    });
    let whole: usize = results.iter().map(|r| r.0).sum();
    let created: usize = results.iter().map(|r| r.1).sum();
    let rejected: usize = results.iter().map(|r| r.2).sum();
    eprintln!(
        "{} bulks of {DOCS}: {whole} answered 429, {created} items created, {rejected} items rejected with 429",
        THREADS * BULKS
    );
    assert!(whole + rejected > 0, "a write pool of 1 thread and a queue of 1 rejects concurrent bulks");
    assert_eq!(created + rejected + whole * DOCS, THREADS * BULKS * DOCS, "every item is accounted for");

    os.refresh("busy");
    assert_eq!(os.count("busy"), created as u64, "rejected items are not indexed");
}
