//! Reading a `_bulk` answer: what became of each document.
//!
//! The answer lists one result per action line, in order. A result is
//! - delivered: 2xx; a `delete` of a document that is not there (404 `not_found`, no error);
//!   a 409 on `create` when `create_conflict: delivered` (a resend of a document already in);
//! - to send again: 429 (the engine's queues are full) and 5xx, with backoff;
//! - refused for good: any other status (400 mapping errors, 404 missing index with
//!   auto-creation off, 409 version conflicts), with the engine's error type and reason.
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
    if status == 429 || status >= 500 {
        Outcome::Retry { status, error_type, reason }
    } else {
        Outcome::Refused { status, error_type, reason }
    }
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
