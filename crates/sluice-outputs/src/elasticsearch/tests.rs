//! The output against a scripted engine on loopback: how each document's result, each whole
//! request's failure and each limit is handled. (The real engine is exercised by the tests of
//! the `sluice` crate, against OpenSearch.)

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use sluice_core::figures::{FigureValue, Publish};
use sluice_core::{Event, Value};

use super::*;
use crate::test_support::{context, spec};

/// One document of a bulk request as the engine saw it.
#[derive(Debug, Clone)]
struct Doc {
    action: serde_json::Value,
    source: Option<serde_json::Value>,
}

impl Doc {
    fn n(&self) -> i64 {
        self.source.as_ref().and_then(|s| s["n"].as_i64()).unwrap_or(-1)
    }
}

type Respond = dyn Fn(usize, &[Doc]) -> (u16, String) + Send + Sync;

/// A scripted engine: `respond(request number, documents)` gives each bulk answer.
struct Engine {
    requests: Mutex<Vec<Vec<Doc>>>,
    /// Each bulk request's body as received (compressed or not), and the status it was answered.
    bodies: Mutex<Vec<(usize, u16)>>,
    gzipped: AtomicUsize,
    templates: Mutex<Vec<(Method, String)>>,
    /// PUTs of a template still to be refused (400, as for an invalid mapping).
    template_refusals: AtomicUsize,
    /// Whether a PUT of the template succeeded (what HEAD answers).
    template_in: AtomicBool,
    respond: Box<Respond>,
}

async fn handle(
    State(engine): State<Arc<Engine>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if uri.path().starts_with("/_index_template/") {
        let mut t = engine.templates.lock();
        t.push((method.clone(), String::from_utf8_lossy(&body).into_owned()));
        return match method {
            Method::HEAD if engine.template_in.load(Ordering::Relaxed) => StatusCode::OK.into_response(),
            Method::HEAD => StatusCode::NOT_FOUND.into_response(),
            _ if engine
                .template_refusals
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok() =>
            {
                (StatusCode::BAD_REQUEST, r#"{"error":{"type":"mapper_parsing_exception","reason":"bad mapping"}}"#)
                    .into_response()
            }
            _ => {
                engine.template_in.store(true, Ordering::Relaxed);
                (StatusCode::OK, r#"{"acknowledged":true}"#).into_response()
            }
        };
    }
    assert_eq!(uri.path(), "/_bulk");
    let mut text = Vec::new();
    if headers.get("content-encoding").is_some_and(|v| v == "gzip") {
        engine.gzipped.fetch_add(1, Ordering::Relaxed);
        flate2::read::GzDecoder::new(&body[..]).read_to_end(&mut text).unwrap();
    } else {
        text = body.to_vec();
    }
    let mut lines =
        std::str::from_utf8(&text).unwrap().lines().map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap());
    let mut docs = Vec::new();
    while let Some(action) = lines.next() {
        let source = if action.get("delete").is_some() { None } else { lines.next() };
        docs.push(Doc { action, source });
    }
    let number = {
        let mut r = engine.requests.lock();
        r.push(docs.clone());
        r.len() - 1
    };
    let raw = body.len();
    let (status, body) = (engine.respond)(number, &docs);
    engine.bodies.lock().push((raw, status));
    let mut response = (StatusCode::from_u16(status).unwrap(), body).into_response();
    if status == 429 || status == 503 {
        response.headers_mut().insert("retry-after", "0".parse().unwrap());
    }
    response
}

async fn scripted(respond: impl Fn(usize, &[Doc]) -> (u16, String) + Send + Sync + 'static) -> (String, Arc<Engine>) {
    let engine = Arc::new(Engine {
        requests: Mutex::new(Vec::new()),
        bodies: Mutex::new(Vec::new()),
        gzipped: AtomicUsize::new(0),
        templates: Mutex::new(Vec::new()),
        template_refusals: AtomicUsize::new(0),
        template_in: AtomicBool::new(false),
        respond: Box::new(respond),
    });
    let app = Router::new().fallback(handle).with_state(engine.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, engine)
}

/// A bulk answer with one result per document, `status(doc)` each.
fn answer(docs: &[Doc], status: impl Fn(&Doc) -> u16) -> (u16, String) {
    let mut errors = false;
    let items: Vec<serde_json::Value> = docs
        .iter()
        .map(|d| {
            let s = status(d);
            let action = d.action.as_object().unwrap().keys().next().unwrap().clone();
            let mut result = serde_json::json!({"_index": "logs", "status": s});
            if !(200..300).contains(&s) {
                errors = true;
                let (t, r) = match s {
                    400 => ("mapper_parsing_exception", format!("failed to parse field [n] of type [long]: {}", d.n())),
                    429 => ("es_rejected_execution_exception", "rejected execution of coordinating operation".into()),
                    409 => ("version_conflict_engine_exception", "document already exists".into()),
                    403 => {
                        ("cluster_block_exception", "index [logs] blocked by: [FORBIDDEN/8/index write (api)];".into())
                    }
                    _ => ("unavailable_shards_exception", "primary shard is not active".into()),
                };
                result["error"] = serde_json::json!({"type": t, "reason": r});
            }
            serde_json::json!({ action: result })
        })
        .collect();
    (200, serde_json::json!({"took": 1, "errors": errors, "items": items}).to_string())
}

fn events(n: i64) -> Vec<Event> {
    (0..n)
        .map(|i| {
            let mut e = Event::from_message_at(format!("event {i}"), 1_764_115_200_000_000_000);
            e.fields.insert("n", Value::Int(i));
            e.fields.insert("event_id", Value::from(format!("id-{i}")));
            e
        })
        .collect()
}

fn output(yaml: &str) -> ElasticsearchOutput {
    build_output(&spec(yaml), context("p", "elasticsearch")).unwrap_or_else(|e| panic!("{e}"))
}

const FAST_RETRY: &str = "retry: {initial_backoff: 5ms, max_backoff: 20ms}";

#[tokio::test]
async fn refused_documents_carry_the_engines_reason_and_the_rest_are_delivered() {
    let (url, engine) = scripted(|_, docs| answer(docs, |d| if d.n() % 2 == 1 { 400 } else { 201 })).await;
    let out = output(&format!("{{type: elasticsearch, hosts: ['{url}'], index: 'logs-%{{+%Y.%m.%d}}', {FAST_RETRY}}}"));
    let evs = events(10);
    let refs: Vec<&Event> = evs.iter().collect();
    let delivery = out.send(&refs).await.unwrap();
    assert_eq!(delivery.rejected.iter().map(|r| r.index).collect::<Vec<_>>(), [1, 3, 5, 7, 9]);
    let r = &delivery.rejected[0];
    assert!(r.permanent, "to the dead letter queue");
    assert!(r.reason.contains("status 400") && r.reason.contains("mapper_parsing_exception"), "{}", r.reason);
    assert!(
        r.reason.contains("index logs-2025.11.26") && r.reason.contains("failed to parse field [n]"),
        "{}",
        r.reason
    );
    assert_eq!(engine.requests.lock().len(), 1, "refused documents are not sent again");
    assert_eq!(engine.gzipped.load(Ordering::Relaxed), 1, "gzip by default");
    // The request was taken (2xx), documents refused in its answer or not: its body counts,
    // compressed, as sent.
    let compressed = engine.bodies.lock()[0].0 as u64;
    assert_eq!(out.ctx.metrics.bytes_out.get(), compressed);
    assert!(compressed < out.figures.bytes_encoded.load(Ordering::Relaxed));
    assert_eq!(out.figures.indexed.load(Ordering::Relaxed), 5);
    assert_eq!(out.figures.refused_count(), 5);
    let figures = out.figures.figures();
    let labelled: Vec<_> = figures.iter().filter(|f| !f.labels.is_empty()).collect();
    assert_eq!(labelled.len(), 1);
    assert_eq!(
        labelled[0].labels,
        [("status".into(), "400".to_string()), ("error_type".into(), "mapper_parsing_exception".to_string())]
    );
}

#[tokio::test]
async fn only_the_documents_answered_429_or_503_are_sent_again() {
    let (url, engine) = scripted(|request, docs| {
        answer(docs, |d| match (request, d.n()) {
            (0, 3) => 429,
            (0, 7) => 503,
            (1, 7) => 429,
            _ => 201,
        })
    })
    .await;
    let out = output(&format!("{{type: elasticsearch, hosts: ['{url}'], compression: none, {FAST_RETRY}}}"));
    let evs = events(10);
    let refs: Vec<&Event> = evs.iter().collect();
    let delivery = out.send(&refs).await.unwrap();
    assert!(delivery.rejected.is_empty(), "{:?}", delivery.rejected);
    let requests = engine.requests.lock();
    let ns: Vec<Vec<i64>> = requests.iter().map(|r| r.iter().map(Doc::n).collect()).collect();
    assert_eq!(ns, vec![(0..10).collect::<Vec<_>>(), vec![3, 7], vec![7]]);
    assert_eq!(out.figures.retried_count(), 3);
    assert_eq!(out.figures.indexed.load(Ordering::Relaxed), 10);
    assert_eq!(engine.gzipped.load(Ordering::Relaxed), 0);
}

/// An index write block (`index.blocks.write: true`) answers each document 403
/// `cluster_block_exception` until it is lifted: the documents are the environment's, so they
/// are sent again on their own (not the ones already in) and none is refused.
#[tokio::test]
async fn documents_behind_a_write_block_are_sent_again_alone_until_it_is_lifted() {
    let (url, engine) = scripted(|request, docs| {
        answer(docs, |d| match (request, d.n() % 2) {
            (0..3, 1) => 403,
            _ => 201,
        })
    })
    .await;
    let out = output(&format!("{{type: elasticsearch, hosts: ['{url}'], compression: none, {FAST_RETRY}}}"));
    let evs = events(6);
    let refs: Vec<&Event> = evs.iter().collect();
    let delivery = out.send(&refs).await.unwrap();
    assert!(delivery.rejected.is_empty(), "{:?}", delivery.rejected);
    let ns: Vec<Vec<i64>> = engine.requests.lock().iter().map(|r| r.iter().map(Doc::n).collect()).collect();
    assert_eq!(ns, vec![vec![0, 1, 2, 3, 4, 5], vec![1, 3, 5], vec![1, 3, 5], vec![1, 3, 5]]);
    assert_eq!(out.figures.indexed.load(Ordering::Relaxed), 6);
    assert_eq!(out.figures.refused_count(), 0);
    assert_eq!(out.ctx.metrics.retries.get(), 3);
    let figures = out.figures.figures();
    let labelled: Vec<_> = figures.iter().filter(|f| !f.labels.is_empty()).collect();
    assert_eq!(labelled.len(), 1);
    assert_eq!(labelled[0].name, "documents_retried_total");
    assert_eq!(labelled[0].value, FigureValue::Count(9));
    assert_eq!(
        labelled[0].labels,
        [("status".into(), "403".to_string()), ("error_type".into(), "cluster_block_exception".to_string())]
    );

    // With a retry limit, a block that outlasts it gives the documents up, not as their fault.
    let (url, _) = scripted(|_, docs| answer(docs, |d| if d.n() == 2 { 403 } else { 201 })).await;
    let out = output(&format!(
        "{{type: elasticsearch, hosts: ['{url}'], retry: {{max_retries: 2, initial_backoff: 5ms, max_backoff: 10ms}}}}"
    ));
    let delivery = out.send(&refs).await.unwrap();
    assert_eq!(delivery.rejected.iter().map(|r| (r.index, r.permanent)).collect::<Vec<_>>(), [(2, false)]);
    assert!(delivery.rejected[0].reason.contains("cluster_block_exception"), "{}", delivery.rejected[0].reason);
}

#[tokio::test]
async fn a_request_failing_as_a_whole_is_sent_again_and_max_retries_gives_up_without_dead_lettering() {
    let (url, engine) =
        scripted(|request, docs| if request < 3 { (503, "busy".into()) } else { answer(docs, |_| 201) }).await;
    let out = output(&format!("{{type: elasticsearch, hosts: ['{url}'], {FAST_RETRY}}}"));
    let evs = events(4);
    let refs: Vec<&Event> = evs.iter().collect();
    assert!(out.send(&refs).await.unwrap().rejected.is_empty());
    assert_eq!(engine.requests.lock().len(), 4);
    assert_eq!(out.ctx.metrics.retries.get(), 3);
    // Sent bytes: the request answered 2xx only; the bulk figure counts every attempt.
    let bodies = engine.bodies.lock().clone();
    let accepted: usize = bodies.iter().filter(|(_, status)| *status == 200).map(|(n, _)| n).sum();
    let all: usize = bodies.iter().map(|(n, _)| n).sum();
    assert!(accepted > 0 && all == 4 * accepted, "{bodies:?}");
    assert_eq!(out.ctx.metrics.bytes_out.get(), accepted as u64);
    assert_eq!(out.figures.bytes_sent.load(Ordering::Relaxed), all as u64);

    let (url, _) = scripted(|_, _| (429, r#"{"error":"too many requests"}"#.into())).await;
    let out = output(&format!(
        "{{type: elasticsearch, hosts: ['{url}'], retry: {{max_retries: 2, initial_backoff: 5ms, max_backoff: 10ms}}}}"
    ));
    let delivery = out.send(&refs).await.unwrap();
    assert_eq!(delivery.rejected.len(), 4);
    assert!(delivery.rejected.iter().all(|r| !r.permanent && r.attempts == 3), "{:?}", delivery.rejected);
    assert!(delivery.rejected[0].reason.contains("HTTP 429"), "{}", delivery.rejected[0].reason);
}

#[tokio::test]
async fn a_request_too_large_is_split_down_to_the_document_at_fault() {
    let (url, engine) = scripted(|_, docs| {
        if docs.iter().any(|d| d.n() == 5) { (413, "request entity too large".into()) } else { answer(docs, |_| 201) }
    })
    .await;
    let out = output(&format!("{{type: elasticsearch, hosts: ['{url}'], {FAST_RETRY}}}"));
    let evs = events(8);
    let refs: Vec<&Event> = evs.iter().collect();
    let delivery = out.send(&refs).await.unwrap();
    assert_eq!(delivery.rejected.len(), 1);
    assert_eq!(delivery.rejected[0].index, 5);
    assert!(delivery.rejected[0].permanent);
    assert!(delivery.rejected[0].reason.contains("HTTP 413"), "{}", delivery.rejected[0].reason);
    let delivered: usize = engine.requests.lock().iter().filter(|r| !r.iter().any(|d| d.n() == 5)).map(Vec::len).sum();
    assert_eq!(delivered, 7);
}

#[tokio::test]
async fn requests_are_bounded_by_events_and_bytes_and_ids_routing_and_pipeline_are_sent() {
    let (url, engine) = scripted(|_, docs| answer(docs, |_| 201)).await;
    let out = output(&format!(
        "{{type: elasticsearch, hosts: ['{url}'], batch_max_events: 3, document_id: '%{{/event_id}}', routing: '%{{/n}}', pipeline: ingest, action: create}}"
    ));
    let evs = events(10);
    let refs: Vec<&Event> = evs.iter().collect();
    assert!(out.send(&refs).await.unwrap().rejected.is_empty());
    let mut sizes: Vec<usize> = engine.requests.lock().iter().map(Vec::len).collect();
    sizes.sort();
    assert_eq!(sizes, [1, 3, 3, 3]);
    let first = engine.requests.lock().iter().flatten().find(|d| d.n() == 4).unwrap().clone();
    assert_eq!(
        first.action,
        serde_json::json!({"create": {"_index": "sluice-2025.11.26", "_id": "id-4", "routing": "4", "pipeline": "ingest"}})
    );

    let (url, engine) = scripted(|_, docs| answer(docs, |_| 201)).await;
    let out = output(&format!("{{type: elasticsearch, hosts: ['{url}'], batch_max_bytes: 1KiB}}"));
    assert!(out.send(&refs).await.unwrap().rejected.is_empty());
    let requests = engine.requests.lock();
    assert!(requests.len() > 1, "split by bytes");
    assert_eq!(requests.iter().map(Vec::len).sum::<usize>(), 10);
}

#[tokio::test]
async fn an_event_missing_its_id_field_is_refused_without_being_sent() {
    let (url, engine) = scripted(|_, docs| answer(docs, |_| 201)).await;
    let out = output(&format!("{{type: elasticsearch, hosts: ['{url}'], document_id: '%{{/event_id}}'}}"));
    let mut evs = events(3);
    evs[1].fields.remove("event_id");
    let refs: Vec<&Event> = evs.iter().collect();
    let delivery = out.send(&refs).await.unwrap();
    assert_eq!(delivery.rejected.len(), 1);
    assert_eq!(delivery.rejected[0].index, 1);
    assert!(delivery.rejected[0].reason.contains("/event_id"), "{}", delivery.rejected[0].reason);
    assert_eq!(engine.requests.lock()[0].len(), 2);
}

#[tokio::test]
async fn a_host_that_refuses_connections_is_set_aside() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let (url, engine) = scripted(|_, docs| answer(docs, |_| 201)).await;
    let out = output(&format!("{{type: elasticsearch, hosts: ['http://{dead}', '{url}'], {FAST_RETRY}}}"));
    let evs = events(2);
    let refs: Vec<&Event> = evs.iter().collect();
    for _ in 0..6 {
        assert!(out.send(&refs).await.unwrap().rejected.is_empty());
    }
    assert_eq!(engine.requests.lock().len(), 6, "every batch reached the live host");
    assert_eq!(out.hosts.up(), 1);
    assert!(out.ctx.metrics.retries.get() >= 1);
}

#[tokio::test]
async fn create_conflicts_are_refused_or_counted_delivered() {
    let (url, _) = scripted(|_, docs| answer(docs, |_| 409)).await;
    let evs = events(2);
    let refs: Vec<&Event> = evs.iter().collect();
    let refuse =
        output(&format!("{{type: elasticsearch, hosts: ['{url}'], action: create, document_id: '%{{/event_id}}'}}"));
    assert_eq!(refuse.send(&refs).await.unwrap().rejected.len(), 2);
    let delivered = output(&format!(
        "{{type: elasticsearch, hosts: ['{url}'], action: create, document_id: '%{{/event_id}}', create_conflict: delivered}}"
    ));
    assert!(delivered.send(&refs).await.unwrap().rejected.is_empty());
}

#[tokio::test]
async fn the_index_template_is_installed_once_and_not_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("template.json");
    std::fs::write(&file, r#"{"index_patterns": ["logs-*"], "template": {"settings": {"number_of_shards": 1}}}"#)
        .unwrap();
    let (url, engine) = scripted(|_, docs| answer(docs, |_| 201)).await;
    let yaml = format!("{{type: opensearch, hosts: ['{url}'], template: {{name: logs, file: '{}'}}}}", file.display());
    let evs = events(1);
    let refs: Vec<&Event> = evs.iter().collect();
    let out = output(&yaml);
    out.send(&refs).await.unwrap();
    out.send(&refs).await.unwrap();
    let calls: Vec<Method> = engine.templates.lock().iter().map(|(m, _)| m.clone()).collect();
    assert_eq!(calls, [Method::HEAD, Method::PUT], "checked, then put, once");
    assert!(engine.templates.lock()[1].1.contains("logs-*"));
    // A second output (a restart) finds it there and leaves it.
    output(&yaml).send(&refs).await.unwrap();
    let calls: Vec<Method> = engine.templates.lock().iter().map(|(m, _)| m.clone()).collect();
    assert_eq!(calls, [Method::HEAD, Method::PUT, Method::HEAD]);
}

#[tokio::test]
async fn no_event_is_sent_before_the_index_template_is_in() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("template.json");
    std::fs::write(&file, r#"{"index_patterns": ["logs-*"]}"#).unwrap();
    let (url, engine) = scripted(|_, docs| answer(docs, |_| 201)).await;
    engine.template_refusals.store(2, Ordering::Relaxed);
    let out = output(&format!(
        "{{type: opensearch, hosts: ['{url}'], template: {{name: logs, file: '{}'}},
          retry: {{initial_backoff: 10ms, max_backoff: 20ms}}}}",
        file.display()
    ));
    let evs = events(3);
    let refs: Vec<&Event> = evs.iter().collect();
    assert!(out.send(&refs).await.unwrap().rejected.is_empty());
    let calls: Vec<Method> = engine.templates.lock().iter().map(|(m, _)| m.clone()).collect();
    assert_eq!(calls.iter().filter(|m| **m == Method::PUT).count(), 3, "refused twice, then put: {calls:?}");
    assert_eq!(engine.requests.lock().len(), 1, "one bulk request, after the template was in");

    // Refused for ever: the send waits (holding the pipeline back) until shutdown aborts it,
    // and nothing is sent meanwhile.
    let (url, engine) = scripted(|_, docs| answer(docs, |_| 201)).await;
    engine.template_refusals.store(usize::MAX, Ordering::Relaxed);
    let out = output(&format!(
        "{{type: opensearch, hosts: ['{url}'], template: {{name: logs, file: '{}'}},
          retry: {{initial_backoff: 10ms, max_backoff: 20ms}}}}",
        file.display()
    ));
    let abort = out.ctx.abort.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        abort.cancel();
    });
    assert!(out.send(&refs).await.is_err(), "aborted, not delivered");
    assert!(engine.templates.lock().len() > 2, "tried again meanwhile");
    assert!(engine.requests.lock().is_empty());
}

#[test]
fn settings_are_checked_naming_the_key() {
    let err = |yaml: &str| build_output(&spec(yaml), context("p", "elasticsearch")).err().unwrap().to_string();
    assert!(err("{type: elasticsearch, hosts: []}").contains("hosts"));
    assert!(err("{type: elasticsearch, hosts: ['ftp://x']}").contains("http:// or https://"));
    assert!(err("{type: elasticsearch, hosts: ['http://x:9200'], action: update}").contains("needs `document_id`"));
    assert!(err("{type: elasticsearch, hosts: ['http://x:9200'], action: delete}").contains("needs `document_id`"));
    assert!(err("{type: elasticsearch, hosts: ['http://x:9200'], index: 'a-%{'}").contains("index"));
    assert!(err("{type: elasticsearch, hosts: ['http://x:9200'], auth: {}}").contains("auth"));
    assert!(
        err("{type: elasticsearch, hosts: ['http://x:9200'], auth: {bearer: a, api_key: b}}").contains("not several")
    );
    let e = err("{type: elasticsearch, hosts: ['http://x:9200'], template: {name: t, file: no/such.json}}");
    assert!(e.contains("template.file") && e.contains("no/such.json"), "{e}");
    let e = err("{type: elasticsearch, hosts: ['http://x:9200'], tls: {verify: false}}");
    assert!(e.contains("https://"), "{e}");
    assert!(err("{type: elasticsearch, hosts: ['http://x:9200'], colour: red}").contains("colour"));
}

#[test]
fn authorization_headers() {
    let header = |yaml: &str| {
        let c: ElasticsearchConfig = spec(yaml).settings().unwrap();
        authorization(&spec(yaml), c.auth.as_ref().unwrap()).unwrap().to_str().unwrap().to_string()
    };
    assert_eq!(
        header("{type: elasticsearch, hosts: [], auth: {basic: {user: elastic, password: changeme}}}"),
        "Basic ZWxhc3RpYzpjaGFuZ2VtZQ=="
    );
    assert_eq!(header("{type: elasticsearch, hosts: [], auth: {api_key: 'id1:key1'}}"), "ApiKey aWQxOmtleTE=");
    assert_eq!(header("{type: elasticsearch, hosts: [], auth: {api_key: aWQxOmtleTE=}}"), "ApiKey aWQxOmtleTE=");
    assert_eq!(header("{type: elasticsearch, hosts: [], auth: {bearer: tok}}"), "Bearer tok");
}
