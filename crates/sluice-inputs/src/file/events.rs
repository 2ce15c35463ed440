//! How a file's lines become events: the lines of one read and the batch they go to, decoding
//! (the encoding, the codec), the metadata fields (path, offset, host) and joined multiline
//! groups. Events keep the order of their lines.

use std::sync::Arc;

use sluice_core::{Event, FieldPath, Map, SharedText, Str, Value};

use super::acks::AckTracker;
use super::decode::TextEncoding;
use super::framing::*;
use super::multiline::{self, Multiline};
use crate::codec::{Codec, Decoded};

/// Everything needed to turn lines of any file into events.
pub(crate) struct Shape {
    pub framing: Framing,
    pub codec: Codec,
    pub encoding: TextEncoding,
    pub multiline: Option<Multiline>,
    pub path_field: Option<FieldPath>,
    pub offset_field: Option<FieldPath>,
    pub host_field: Option<FieldPath>,
    pub host: Str,
    /// A metadata field is `message` or `@timestamp` itself (or under them).
    pub meta_overlaps_text: bool,
}

/// Lines cut on the reader thread and turned into events by a builder thread: the bytes they
/// were cut from (mostly the file's own bytes, read straight into `text`), and where each is.
#[derive(Default)]
pub(crate) struct Lines {
    pub text: Vec<u8>,
    pub spans: Vec<Span>,
}

/// One line of [`Lines`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    /// The line is `text[start..end]`.
    pub start: usize,
    pub end: usize,
    /// File offset where the line starts.
    pub offset: u64,
    /// Cut at `max_line_bytes`.
    pub truncated: bool,
}

impl Lines {
    pub(crate) fn clear(&mut self) {
        self.text.clear();
        self.spans.clear();
    }

    /// Appends a copy of a line that starts at `offset` in its file.
    #[cfg(test)]
    pub(crate) fn push_copy(&mut self, bytes: &[u8], offset: u64) {
        let start = self.text.len();
        self.text.extend_from_slice(bytes);
        self.spans.push(Span { start, end: self.text.len(), offset, truncated: false });
    }
}

/// One file's consecutive events (or lines) in a batch: what their events are made with, and
/// the acknowledgement piece they form.
pub(crate) struct Group {
    pub tracker: Arc<AckTracker>,
    pub template: Arc<Map>,
    pub timestamp: i64,
    pub count: usize,
    /// The offset just past the group's last line.
    pub end: u64,
}

/// Events read in one pass over the files, or the lines they will be made of, with the
/// acknowledgement groups they need.
#[derive(Default)]
pub(crate) struct BatchBuilder {
    /// Lines are kept in `lines` for builder threads instead of becoming events here.
    pub deferred: bool,
    pub events: Vec<Event>,
    pub lines: Lines,
    pub groups: Vec<Group>,
    pub bytes: usize,
    pub failed: u64,
}

impl BatchBuilder {
    pub(crate) fn len(&self) -> usize {
        self.events.len() + self.lines.spans.len()
    }

    pub(super) fn push(&mut self, file: &FileContext<'_>, event: Event, end: u64, bytes: usize) {
        self.events.push(event);
        self.count(file, end, bytes);
    }

    /// Keeps a line for the builders by copying it into `lines.text`.
    pub(super) fn push_line(&mut self, file: &FileContext<'_>, line: &RawLine<'_>) {
        let start = self.lines.text.len();
        self.lines.text.extend_from_slice(line.bytes);
        let end = self.lines.text.len();
        self.push_span(file, line, start, end);
    }

    /// Keeps a line for the builders that is already `lines.text[start..end]`.
    pub(super) fn push_span(&mut self, file: &FileContext<'_>, line: &RawLine<'_>, start: usize, end: usize) {
        self.lines.spans.push(Span { start, end, offset: line.start, truncated: line.truncated });
        self.count(file, line.end, (line.end - line.start) as usize);
    }

    pub(super) fn count(&mut self, file: &FileContext<'_>, end: u64, bytes: usize) {
        self.bytes += bytes;
        match self.groups.last_mut() {
            Some(g)
                if Arc::ptr_eq(&g.tracker, file.tracker)
                    && Arc::ptr_eq(&g.template, file.template)
                    && g.timestamp == file.timestamp =>
            {
                g.count += 1;
                g.end = end;
            }
            _ => self.groups.push(Group {
                tracker: file.tracker.clone(),
                template: file.template.clone(),
                timestamp: file.timestamp,
                count: 1,
                end,
            }),
        }
    }
}

/// What every line of one file in one turn shares.
pub(super) struct FileContext<'a> {
    pub(super) tracker: &'a Arc<AckTracker>,
    pub(super) template: &'a Arc<Map>,
    pub(super) timestamp: i64,
}

/// Makes the events of lines collected with [`BatchBuilder::deferred`], group by group.
/// `spans` say where in `text` each line is. A plain text line's `message` points into `text`
/// rather than being copied (see [`SharedText`]).
pub(crate) fn build_events(
    shape: &Shape,
    text: &SharedText,
    spans: &[Span],
    groups: &[Group],
    failed: &mut u64,
) -> Vec<Event> {
    let mut events = Vec::with_capacity(spans.len());
    let mut spans = spans.iter();
    // The metadata with shared objects of this chunk's own (see `Map::reshared`).
    let mut local: Option<(&Arc<Map>, Map)> = None;
    for g in groups {
        let template = match &local {
            Some((of, copy)) if Arc::ptr_eq(of, &g.template) => copy,
            _ => &local.insert((&g.template, g.template.reshared())).1,
        };
        for &Span { start: from, end: to, offset: start, truncated } in spans.by_ref().take(g.count) {
            let decoded = decode_line(shape, Some(text), &text.as_bytes()[from..to], truncated, g.timestamp);
            events.push(make_event(shape, decoded, template, start, failed));
        }
    }
    events
}

pub(super) fn push_joined(shape: &Shape, file: &FileContext<'_>, j: multiline::Joined, out: &mut BatchBuilder) {
    // Joined lines are already decoded from the file's encoding.
    let decoded = shape.codec.decode(j.text.as_bytes(), j.truncated, file.timestamp);
    let mut event = make_event(shape, decoded, file.template, j.start, &mut out.failed);
    if j.max_lines {
        event.add_tag(multiline::TAG_MAX_LINES);
    }
    out.push(file, event, j.end, (j.end - j.start) as usize);
}

/// A line's event before its metadata: decoded from the file's encoding first unless that is
/// UTF-8, and with a text line cut out of `shared` pointing into it (see `Codec::decode_in`).
#[inline]
pub(super) fn decode_line(
    shape: &Shape,
    shared: Option<&SharedText>,
    bytes: &[u8],
    truncated: bool,
    timestamp: i64,
) -> (Event, Decoded) {
    if !shape.encoding.is_utf8() {
        return shape.codec.decode(shape.encoding.decode(bytes).as_bytes(), truncated, timestamp);
    }
    match shared {
        Some(text) => shape.codec.decode_in(text, bytes, truncated, timestamp),
        None => shape.codec.decode(bytes, truncated, timestamp),
    }
}

/// A decoded line's event, finished: a failed decode counted, the file's metadata added.
pub(super) fn make_event(
    shape: &Shape,
    (event, decoded): (Event, Decoded),
    template: &Map,
    offset: u64,
    failed: &mut u64,
) -> Event {
    if decoded == Decoded::Failed {
        *failed += 1;
    }
    with_metadata(shape, event, template, offset)
}

/// Adds a file's metadata fields (`template`, with the line's `offset`) to its event.
pub(super) fn with_metadata(shape: &Shape, mut event: Event, template: &Map, offset: u64) -> Event {
    if template.is_empty() {
        return event;
    }
    if shape.codec == Codec::Lines && !shape.meta_overlaps_text {
        // A text event holds only `message` and `@timestamp`: the metadata's top-level keys
        // are new, so they are cloned straight in, the offset put in place on the way (no
        // walk, no growth of the nested objects, no temporary copy of the template).
        let offset_path = shape.offset_field.as_ref().map_or(&[][..], FieldPath::segments);
        event.fields.reserve(template.len());
        for (k, v) in template.iter() {
            let v = match offset_path {
                [first, rest @ ..] if first == k => clone_with_offset(v, rest, offset as i64),
                _ => v.clone(),
            };
            event.fields.push_unchecked(k.clone(), v);
        }
    } else {
        let mut meta = template.clone();
        if let Some(slot) = shape.offset_field.as_ref().and_then(|p| p.get_mut(&mut meta)) {
            *slot = Value::Int(offset as i64);
        }
        for p in [&shape.path_field, &shape.offset_field, &shape.host_field].into_iter().flatten() {
            if let Some(v) = p.get(&meta) {
                let _ = event.insert(p, v.clone());
            }
        }
    }
    event
}

/// `value` cloned with `offset` at `path` inside it (where the template holds its
/// placeholder), in one pass.
pub(super) fn clone_with_offset(value: &Value, path: &[Str], offset: i64) -> Value {
    match (path, value) {
        ([], _) => Value::Int(offset),
        ([first, rest @ ..], Value::Object(m)) => {
            let mut copy = Map::with_capacity(m.len());
            for (k, v) in m.iter() {
                let v = if k == first { clone_with_offset(v, rest, offset) } else { v.clone() };
                copy.push_unchecked(k.clone(), v);
            }
            Value::Object(copy)
        }
        _ => value.clone(),
    }
}

impl Shape {
    /// The metadata fields of events from a file at `path`, with the offset at 0.
    pub(crate) fn template(&self, path: &std::path::Path) -> Arc<Map> {
        let mut m = Map::new();
        if let Some(p) = &self.path_field {
            let _ = p.insert(&mut m, Value::String(Str::from(path.to_string_lossy().as_ref())));
        }
        if let Some(p) = &self.offset_field {
            let _ = p.insert(&mut m, Value::Int(0));
        }
        if let Some(p) = &self.host_field {
            let _ = p.insert(&mut m, Value::String(self.host.clone()));
        }
        share_constant(&mut m, self.offset_field.as_ref().map(FieldPath::segments));
        Arc::new(m)
    }
}

/// Makes every nested object of a template that the offset does not go through a shared map
/// (`log.file`, `host`): each event then shares it instead of getting a copy of its own.
pub(super) fn share_constant(map: &mut Map, offset: Option<&[Str]>) {
    for (key, value) in map.iter_mut() {
        if let Value::Object(inner) = value {
            match offset {
                Some([first, rest @ ..]) if first == key => share_constant(inner, Some(rest)),
                _ => *inner = std::mem::take(inner).shared(),
            }
        }
    }
}
