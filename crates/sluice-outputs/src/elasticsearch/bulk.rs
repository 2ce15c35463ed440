//! The `_bulk` request body: for each event an action line (`{"index":{"_index":...}}`) and,
//! except for `delete`, its source line, as NDJSON.
//!
//! Each event's lines are encoded once, into one shared buffer, and remembered as a byte range,
//! so that a retry of some documents (429s) or a request split by size re-sends the same bytes
//! without encoding the event again. An event whose `index`, `document_id` or `routing` template names a field the
//! event lacks is not sent: it is refused with a reason naming the field, since a document
//! indexed under an index or id with a hole in it is a silent loss that the user never asked
//! for.

use sluice_core::Event;
use sluice_expr::Template;

/// The bulk action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Adds the document, or replaces the one with its `_id`.
    #[default]
    Index,
    /// Adds the document; one with its `_id` already there is a conflict (409). Data streams
    /// take only this.
    Create,
    /// Merges the event's fields into the document with its `_id`, creating it if absent
    /// (`doc_as_upsert`).
    Update,
    /// Deletes the document with its `_id`; the event's other fields are not sent.
    Delete,
}

impl Action {
    pub fn name(self) -> &'static str {
        match self {
            Action::Index => "index",
            Action::Create => "create",
            Action::Update => "update",
            Action::Delete => "delete",
        }
    }
}

/// How each event's action line is made.
pub struct Targets {
    pub action: Action,
    pub index: Template,
    pub id: Option<Template>,
    pub routing: Option<Template>,
    pub pipeline: Option<Template>,
}

/// One event's lines in a [`Encoded`] buffer, and where they go.
#[derive(Debug, Clone)]
pub struct Item {
    /// Index into the events given to `send`.
    pub event: usize,
    /// The byte range of its lines in [`Encoded::bytes`].
    pub start: usize,
    pub end: usize,
    /// The index it was addressed to, for messages: a place in [`Encoded::indices`].
    pub index: usize,
}

impl Item {
    pub fn len(&self) -> usize {
        self.end - self.start
    }
}

/// The encoded lines of a batch: items that can be sent, and events refused before sending.
pub struct Encoded {
    pub bytes: Vec<u8>,
    pub items: Vec<Item>,
    /// (event index, reason)
    pub refused: Vec<(usize, String)>,
    /// The index names the items were addressed to, each once in a row (a batch mostly goes to
    /// one or two indices, so this is not a string per event).
    pub indices: Vec<String>,
}

impl Encoded {
    /// The index `item` was addressed to.
    pub fn index_of(&self, item: &Item) -> &str {
        &self.indices[item.index]
    }
}

/// Encodes every event's action and source lines.
pub fn encode(targets: &Targets, events: &[&Event]) -> Encoded {
    let mut bytes = Vec::with_capacity(events.len() * 320);
    let mut items = Vec::with_capacity(events.len());
    let mut refused = Vec::new();
    let mut indices: Vec<String> = Vec::new();
    let mut index = String::with_capacity(64);
    let mut scratch = String::with_capacity(64);
    for (i, event) in events.iter().enumerate() {
        if let Some(reason) = missing_field(targets, event) {
            refused.push((i, reason));
            continue;
        }
        index.clear();
        targets.index.render(event, &mut index);
        let start = bytes.len();
        bytes.extend_from_slice(b"{\"");
        bytes.extend_from_slice(targets.action.name().as_bytes());
        bytes.extend_from_slice(b"\":{\"_index\":");
        write_json_string(&mut bytes, &index);
        for (key, template) in [("_id", &targets.id), ("routing", &targets.routing), ("pipeline", &targets.pipeline)] {
            let Some(template) = template else { continue };
            scratch.clear();
            template.render(event, &mut scratch);
            if scratch.is_empty() && key != "_id" {
                continue;
            }
            bytes.extend_from_slice(b",\"");
            bytes.extend_from_slice(key.as_bytes());
            bytes.extend_from_slice(b"\":");
            write_json_string(&mut bytes, &scratch);
        }
        bytes.extend_from_slice(b"}}\n");
        match targets.action {
            Action::Delete => {}
            Action::Update => {
                bytes.extend_from_slice(b"{\"doc\":");
                event.write_json(&mut bytes);
                bytes.extend_from_slice(b",\"doc_as_upsert\":true}\n");
            }
            Action::Index | Action::Create => {
                event.write_json(&mut bytes);
                bytes.push(b'\n');
            }
        }
        if indices.last() != Some(&index) {
            indices.push(index.clone());
        }
        items.push(Item { event: i, start, end: bytes.len(), index: indices.len() - 1 });
    }
    Encoded { bytes, items, refused, indices }
}

/// Why `event` cannot be addressed: a field its index, id or routing template names is missing,
/// or its id renders empty.
fn missing_field(targets: &Targets, event: &Event) -> Option<String> {
    let named =
        [("index", Some(&targets.index)), ("document_id", targets.id.as_ref()), ("routing", targets.routing.as_ref())];
    for (key, template) in named {
        let Some(template) = template else { continue };
        if let Some(field) = template.missing_field(event) {
            return Some(format!(
                "the event has no {field}, which `{key}: {}` needs; it was not sent",
                template.source()
            ));
        }
    }
    if let Some(id) = &targets.id
        && id.render_string(event).is_empty()
    {
        return Some(format!("`document_id: {}` renders empty for this event; it was not sent", id.source()));
    }
    None
}

/// `s` as a JSON string.
pub fn write_json_string(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    let mut from = 0;
    for (i, b) in s.bytes().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&s.as_bytes()[from..i]);
        if escape.is_empty() {
            out.extend_from_slice(format!("\\u{b:04x}").as_bytes());
        } else {
            out.extend_from_slice(escape);
        }
        from = i + 1;
    }
    out.extend_from_slice(&s.as_bytes()[from..]);
    out.push(b'"');
}

/// Splits `items` into requests of at most `max_events` items and, past the first item of a
/// request, at most `max_bytes` bytes (an item larger than `max_bytes` goes alone).
pub fn requests(
    items: &[usize],
    sizes: impl Fn(usize) -> usize,
    max_events: usize,
    max_bytes: usize,
) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut current: Vec<usize> = Vec::new();
    let mut bytes = 0;
    for &item in items {
        let size = sizes(item);
        if !current.is_empty() && (current.len() >= max_events || bytes + size > max_bytes) {
            out.push(std::mem::take(&mut current));
            bytes = 0;
        }
        bytes += size;
        current.push(item);
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::Value;

    fn event(json: &str) -> Event {
        let Value::Object(fields) = Value::from_json_slice(json.as_bytes()).unwrap() else { panic!("not an object") };
        Event::from_object_at(fields, 1_764_115_200_000_000_000) // 2025-11-26T00:00:00Z
    }

    fn targets(action: Action, id: Option<&str>) -> Targets {
        Targets {
            action,
            index: Template::parse("logs-%{/service}-%{+%Y.%m.%d}").unwrap(),
            id: id.map(|t| Template::parse(t).unwrap()),
            routing: None,
            pipeline: Some(Template::parse("%{/pipe}").unwrap()),
        }
    }

    fn lines(e: &Encoded, item: usize) -> Vec<serde_json::Value> {
        let it = &e.items[item];
        std::str::from_utf8(&e.bytes[it.start..it.end])
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn index_create_update_and_delete_lines() {
        let events = [event(r#"{"service":"web","event_id":"a\"1","pipe":"geo","n":1}"#)];
        let refs: Vec<&Event> = events.iter().collect();
        let e = encode(&targets(Action::Index, Some("%{/event_id}")), &refs);
        let l = lines(&e, 0);
        assert_eq!(
            l[0],
            serde_json::json!({"index": {"_index": "logs-web-2025.11.26", "_id": "a\"1", "pipeline": "geo"}})
        );
        assert_eq!(l[1]["n"], 1);
        assert_eq!(l[1]["service"], "web");
        assert!(l[1]["@timestamp"].is_string());
        assert_eq!(e.index_of(&e.items[0]), "logs-web-2025.11.26");

        let e = encode(&targets(Action::Update, Some("%{/event_id}")), &refs);
        let l = lines(&e, 0);
        assert!(l[0]["update"].is_object());
        assert_eq!(l[1]["doc_as_upsert"], true);
        assert_eq!(l[1]["doc"]["n"], 1);

        let e = encode(&targets(Action::Delete, Some("%{/event_id}")), &refs);
        assert_eq!(lines(&e, 0).len(), 1, "a delete has no source line");

        let e = encode(&targets(Action::Create, None), &refs);
        assert_eq!(
            lines(&e, 0)[0],
            serde_json::json!({"create": {"_index": "logs-web-2025.11.26", "pipeline": "geo"}})
        );
    }

    #[test]
    fn an_event_missing_a_named_field_is_refused_with_the_field() {
        let events =
            [event(r#"{"service":"web","event_id":"1"}"#), event(r#"{"event_id":"2"}"#), event(r#"{"service":"db"}"#)];
        let refs: Vec<&Event> = events.iter().collect();
        let e = encode(&targets(Action::Index, Some("%{/event_id}")), &refs);
        assert_eq!(e.items.iter().map(|i| i.event).collect::<Vec<_>>(), [0]);
        assert_eq!(e.refused.len(), 2);
        assert_eq!(e.refused[0].0, 1);
        assert!(
            e.refused[0].1.contains("/service") && e.refused[0].1.contains("`index: logs-%{/service}"),
            "{}",
            e.refused[0].1
        );
        assert!(e.refused[1].1.contains("/event_id") && e.refused[1].1.contains("`document_id:"), "{}", e.refused[1].1);
        // The pipeline template's field is optional: absent, no pipeline is named.
        assert!(lines(&e, 0)[0]["index"].get("pipeline").is_none());
    }

    #[test]
    fn each_item_names_its_own_index_and_runs_share_one_name() {
        let events = [event(r#"{"service":"web"}"#), event(r#"{"service":"web"}"#), event(r#"{"service":"db"}"#)];
        let refs: Vec<&Event> = events.iter().collect();
        let e = encode(&targets(Action::Index, None), &refs);
        let names: Vec<&str> = e.items.iter().map(|it| e.index_of(it)).collect();
        assert_eq!(names, ["logs-web-2025.11.26", "logs-web-2025.11.26", "logs-db-2025.11.26"]);
        assert_eq!(e.indices.len(), 2, "one name per run of items, not one per event");
    }

    #[test]
    fn json_strings_are_escaped() {
        let mut out = Vec::new();
        write_json_string(&mut out, "a\"b\\c\nd\u{1}é");
        assert_eq!(std::str::from_utf8(&out).unwrap(), r#""a\"b\\c\nd\u0001é""#);
        let back: String = serde_json::from_slice(&out).unwrap();
        assert_eq!(back, "a\"b\\c\nd\u{1}é");
    }

    #[test]
    fn requests_are_bounded_by_events_and_bytes() {
        let sizes = [10, 10, 10, 50, 10, 200, 10];
        let all: Vec<usize> = (0..sizes.len()).collect();
        let r = requests(&all, |i| sizes[i], 3, 60);
        assert_eq!(r, vec![vec![0, 1, 2], vec![3, 4], vec![5], vec![6]]);
        let r = requests(&all, |i| sizes[i], 100, 1000);
        assert_eq!(r, vec![all.clone()]);
        assert!(requests(&[], |_| 1, 1, 1).is_empty());
    }
}
