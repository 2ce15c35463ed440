//! Reading a `_bulk` answer: what became of each document.
//!
//! The answer lists one result per action line, in order. A result is
//! - delivered: 2xx; a `delete` of a document that is not there (404 `not_found`, no error);
//!   a 409 on `create` when `create_conflict: delivered` (a resend of a document already in);
//! - refused for good, when the document itself is at fault: 400 (mapping and parsing errors),
//!   404 (a missing index with auto-creation off), 409 (a version conflict) and 413 (the
//!   document too large), with the engine's error type and reason;
//! - to send again, with backoff, whatever the environment causes and may lift later: 429 (the
//!   engine's queues are full), 5xx, 401 and 403 (credentials, privileges, and the index write
//!   blocks an operator, a shrink, a snapshot restore or a full disk put on), any other status,
//!   and a `cluster_block_exception` whatever its status. This is the rule Logstash follows:
//!   only what sending the same document again can never change is refused.
//!
//! When the answer says `"errors": false` the items are not read at all.

use serde::Deserialize;

use super::bulk::Action;

/// What became of one document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Delivered,
    Retry { status: u16, error_type: String, reason: String },
    Refused { status: u16, error_type: String, reason: String },
}

#[derive(Deserialize)]
struct ErrorsOnly {
    #[serde(default)]
    errors: bool,
}

#[derive(Deserialize)]
struct Full {
    #[serde(default)]
    items: Vec<std::collections::HashMap<String, ItemResult>>,
}

#[derive(Deserialize)]
struct ItemResult {
    status: u16,
    #[serde(default)]
    error: Option<serde_json::Value>,
    #[serde(default)]
    result: Option<String>,
}

/// The outcome of each of `count` documents from the answer `body`; `Err` when the body is not
/// a bulk answer for that many documents.
pub fn outcomes(body: &[u8], count: usize, action: Action, conflict_delivered: bool) -> Result<Vec<Outcome>, String> {
    let head: ErrorsOnly = serde_json::from_slice(body).map_err(|e| format!("the bulk answer is not JSON: {e}"))?;
    if !head.errors {
        return Ok(vec![Outcome::Delivered; count]);
    }
    let full: Full = serde_json::from_slice(body).map_err(|e| format!("the bulk answer cannot be read: {e}"))?;
    if full.items.len() != count {
        return Err(format!("the bulk answer has {} results for {count} documents", full.items.len()));
    }
    Ok(full
        .items
        .into_iter()
        .map(|item| match item.into_values().next() {
            Some(result) => classify(result, action, conflict_delivered),
            None => Outcome::Retry { status: 0, error_type: String::new(), reason: "an empty result".into() },
        })
        .collect())
}

fn classify(result: ItemResult, action: Action, conflict_delivered: bool) -> Outcome {
    let status = result.status;
    if (200..300).contains(&status) {
        return Outcome::Delivered;
    }
    if action == Action::Delete && status == 404 && result.error.is_none() {
        debug_assert!(result.result.as_deref().is_none_or(|r| r == "not_found"));
        return Outcome::Delivered;
    }
    if action == Action::Create && status == 409 && conflict_delivered {
        return Outcome::Delivered;
    }
    let (error_type, reason) = describe(result.error.as_ref());
    if document_at_fault(status, &error_type) {
        Outcome::Refused { status, error_type, reason }
    } else {
        Outcome::Retry { status, error_type, reason }
    }
}

/// Whether a document answered `status` with `error_type` can never be accepted as it is (so it
/// is refused, to the dead letter queue), rather than refused for a while by the environment.
/// Sending a document again that was at fault costs one more request; refusing one that was
/// not loses an event the engine would have taken minutes later, so only the statuses that
/// name the document's own fault refuse it.
pub fn document_at_fault(status: u16, error_type: &str) -> bool {
    // A block is lifted by whoever set it (FORBIDDEN/8 write, TOO_MANY_REQUESTS/12 read-only
    // after a full disk, SERVICE_UNAVAILABLE/2 no master), whatever status carries it.
    if error_type == "cluster_block_exception" {
        return false;
    }
    matches!(status, 400 | 404 | 409 | 413)
}

/// The error's type and its reason, with the reasons of its causes (`caused_by`) after it.
fn describe(error: Option<&serde_json::Value>) -> (String, String) {
    let Some(error) = error else { return (String::new(), "no error given".into()) };
    if let Some(text) = error.as_str() {
        return (String::new(), text.to_string());
    }
    let error_type = error.get("type").and_then(|t| t.as_str()).unwrap_or_default().to_string();
    let mut reason = error.get("reason").and_then(|r| r.as_str()).unwrap_or_default().to_string();
    let mut cause = error.get("caused_by");
    let mut depth = 0;
    while let Some(c) = cause
        && depth < 3
    {
        let t = c.get("type").and_then(|t| t.as_str()).unwrap_or_default();
        let r = c.get("reason").and_then(|r| r.as_str()).unwrap_or_default();
        reason.push_str(&format!("; caused by {t}: {r}"));
        cause = c.get("caused_by");
        depth += 1;
    }
    (error_type, reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIXED: &str = r#"{"took":3,"errors":true,"items":[
        {"index":{"_index":"logs","_id":"1","status":201,"result":"created"}},
        {"index":{"_index":"logs","_id":"2","status":400,"error":{"type":"mapper_parsing_exception",
            "reason":"failed to parse field [n] of type [long] in document with id '2'",
            "caused_by":{"type":"illegal_argument_exception","reason":"For input string: \"x\""}}}},
        {"index":{"_index":"logs","_id":"3","status":429,"error":{"type":"es_rejected_execution_exception","reason":"rejected execution"}}},
        {"index":{"_index":"logs","_id":"4","status":503,"error":{"type":"unavailable_shards_exception","reason":"primary shard is not active"}}},
        {"index":{"_index":"logs","_id":"5","status":409,"error":{"type":"version_conflict_engine_exception","reason":"[5]: version conflict"}}}
    ]}"#;

    #[test]
    fn each_document_is_delivered_retried_or_refused() {
        let o = outcomes(MIXED.as_bytes(), 5, Action::Index, false).unwrap();
        assert_eq!(o[0], Outcome::Delivered);
        match &o[1] {
            Outcome::Refused { status: 400, error_type, reason } => {
                assert_eq!(error_type, "mapper_parsing_exception");
                assert!(reason.starts_with("failed to parse field [n]"), "{reason}");
                assert!(reason.ends_with("caused by illegal_argument_exception: For input string: \"x\""), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(&o[2], Outcome::Retry { status: 429, error_type, .. } if error_type == "es_rejected_execution_exception")
        );
        assert!(matches!(&o[3], Outcome::Retry { status: 503, .. }));
        assert!(matches!(&o[4], Outcome::Refused { status: 409, .. }), "a conflict on index is refused");
    }

    /// Which per-document answers are the document's fault (dead letter queue) and which the
    /// environment's (sent again), as the engines give them.
    #[test]
    fn only_what_the_document_causes_is_refused_and_blocks_are_sent_again() {
        let cases: &[(u16, &str, bool)] = &[
            (400, "mapper_parsing_exception", true),
            (400, "strict_dynamic_mapping_exception", true),
            (400, "document_parsing_exception", true),
            (400, "illegal_argument_exception", true),
            (404, "index_not_found_exception", true),
            (409, "version_conflict_engine_exception", true),
            (413, "", true),
            // `index.blocks.write: true`: the document is fine, the index refuses writes for now.
            (403, "cluster_block_exception", false),
            // The flood-stage watermark's read-only block, and no master elected.
            (429, "cluster_block_exception", false),
            (503, "cluster_block_exception", false),
            (400, "cluster_block_exception", false),
            (403, "security_exception", false),
            (401, "security_exception", false),
            (408, "", false),
            (429, "es_rejected_execution_exception", false),
            (429, "circuit_breaking_exception", false),
            (500, "", false),
            (502, "", false),
            (503, "unavailable_shards_exception", false),
            (504, "", false),
            (0, "", false),
        ];
        for &(status, error_type, refused) in cases {
            assert_eq!(document_at_fault(status, error_type), refused, "status {status} {error_type}");
            let body = format!(
                r#"{{"errors":true,"items":[{{"index":{{"status":{status},"error":{{"type":"{error_type}","reason":"r"}}}}}}]}}"#
            );
            let outcome = &outcomes(body.as_bytes(), 1, Action::Index, false).unwrap()[0];
            if refused {
                assert!(matches!(outcome, Outcome::Refused { status: s, .. } if *s == status), "{outcome:?}");
            } else {
                assert!(matches!(outcome, Outcome::Retry { status: s, .. } if *s == status), "{outcome:?}");
            }
        }
        // The answer OpenSearch gives each document of an index with `index.blocks.write: true`.
        let blocked = r#"{"took":0,"errors":true,"items":[{"index":{"_index":"held","_id":"e-1","status":403,
            "error":{"type":"cluster_block_exception","reason":"index [held] blocked by: [FORBIDDEN/8/index write (api)];"}}}]}"#;
        assert!(matches!(
            &outcomes(blocked.as_bytes(), 1, Action::Index, false).unwrap()[0],
            Outcome::Retry { status: 403, error_type, reason }
                if error_type == "cluster_block_exception" && reason.contains("index write")
        ));
    }

    #[test]
    fn conflicts_on_create_count_as_delivered_when_asked() {
        let body = r#"{"errors":true,"items":[{"create":{"_index":"l","_id":"1","status":409,"error":{"type":"version_conflict_engine_exception","reason":"document already exists"}}}]}"#;
        assert!(matches!(
            outcomes(body.as_bytes(), 1, Action::Create, false).unwrap()[0],
            Outcome::Refused { status: 409, .. }
        ));
        assert_eq!(outcomes(body.as_bytes(), 1, Action::Create, true).unwrap()[0], Outcome::Delivered);
    }

    #[test]
    fn deleting_what_is_not_there_is_done() {
        let body = r#"{"errors":true,"items":[{"delete":{"_index":"l","_id":"1","status":404,"result":"not_found"}},
            {"delete":{"_index":"nope","_id":"1","status":404,"error":{"type":"index_not_found_exception","reason":"no such index [nope]"}}}]}"#;
        let o = outcomes(body.as_bytes(), 2, Action::Delete, false).unwrap();
        assert_eq!(o[0], Outcome::Delivered);
        assert!(matches!(&o[1], Outcome::Refused { status: 404, .. }));
    }

    #[test]
    fn no_errors_reads_no_items_and_a_bad_answer_is_an_error() {
        assert_eq!(outcomes(br#"{"took":1,"errors":false,"items":[]}"#, 3, Action::Index, false).unwrap().len(), 3);
        assert!(outcomes(b"<html>", 1, Action::Index, false).unwrap_err().contains("not JSON"));
        let short = r#"{"errors":true,"items":[{"index":{"status":201}}]}"#;
        assert!(outcomes(short.as_bytes(), 2, Action::Index, false).unwrap_err().contains("1 results for 2"));
    }
}
