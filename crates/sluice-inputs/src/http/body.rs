//! A request body, from the socket to events, within the request's limits.
//!
//! Three steps, each charging the node's memory budget for what it is about to hold and
//! waiting (up to the request's deadline) when the budget is spent:
//! - [`read_body`] gathers the body's frames, refusing more than `max_body_bytes`, and counts
//!   them as received (the input's `bytes_in`: the body as sent, before inflating);
//! - [`gunzip`] inflates a gzip body a step at a time, refusing output past `max_body_bytes`;
//! - [`BodyParser`] decodes the events a chunk at a time, so that the events of a chunk are
//!   charged before the next chunk is decoded, and stops at `max_events_per_request`.
//!
//! Why not tower-http's `RequestBodyLimitLayer` and `RequestDecompressionLayer`: layered
//! the right way round they would bound the inflated size too, but neither charges the node's
//! memory budget or waits for it, and that budget is what keeps many concurrent clients from
//! exhausting memory together. The steps here are the budget's hooks; the inflating itself is
//! `flate2`'s.
//!
//! A request may hold at most [`Admission::cap`] of the budget (half of it): one that needs
//! more could only ever be admitted alone, so it is refused as too large rather than left to
//! wait. The parse is the module comment of `http`'s: `[` starts one JSON array; anything else
//! is a sequence of whitespace-separated JSON values. A malformed body is refused whole, with
//! the message naming the element or line ([`describe_error`] reads the body again for it, so
//! the fast path keeps no positions).

use std::io::Read;
use std::pin::Pin;

use axum::body::{Body, HttpBody};
use serde::Deserialize;
use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use sluice_core::metrics::Counter;
use sluice_core::{ChargeError, Event, MemoryCharge, Value};
use tokio::time::Instant;

use crate::codec::event_from_value;

/// Events decoded between two charges of the budget (and two yields to the runtime).
pub const CHUNK_BYTES: usize = 256 << 10;
/// Inflated bytes between two charges.
const GUNZIP_STEP: usize = 1 << 20;

/// Why a request is refused; each maps to one status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 413: more bytes than `max_body_bytes`, raw or inflated.
    BodyTooLarge,
    /// 413: more events than `max_events_per_request`.
    TooManyEvents(usize),
    /// 413: the events need more memory than one request may hold.
    NeedsTooMuchMemory { needed: usize, cap: usize },
    /// 429: no room in the memory budget before the deadline.
    NoRoom,
    /// 429: no room in the memory budget now, and the requests already waiting for it keep
    /// their share of it: this one lets its body go rather than wait holding it.
    NoRoomToWait,
    /// 408: the body did not arrive in time (set by the caller).
    BodyTimeout,
    /// 400: the body is not what it claims (gzip, JSON); the reason.
    Malformed(String),
}

/// What one request holds of the memory budget, and its limits.
///
/// The request takes what it needs as it goes only while that is free at once
/// ([`Admission::try_take`]); when it is not, it gives back the reservation beyond what it
/// holds and waits for the total it now knows it needs ([`Admission::reserve`]). What it holds
/// (the body read so far, inflated) stays charged while it waits, so the budget counts the
/// memory the process really has; waiting requests together may keep half the budget
/// that way and one needs at most half of it (the cap), so waiters holding part of the budget
/// can never wait for each other forever. A request that would wait holding memory when that
/// share is taken is answered 429 at once and lets its body go. Waiters are served in arrival
/// order, so the oldest is served first as memory comes back.
pub struct Admission {
    charge: MemoryCharge,
    /// The bytes of the charge spoken for (the rest is reserved ahead).
    used: usize,
    /// The most this request may hold.
    pub cap: usize,
    pub deadline: Instant,
}

impl Admission {
    pub fn new(charge: MemoryCharge, cap: usize, deadline: Instant) -> Admission {
        Admission { charge, used: 0, cap, deadline }
    }

    /// Gives back the reservation beyond what is spoken for and waits, keeping that, until
    /// `total` bytes are reserved (at most the cap). What was spoken for stays spoken for.
    pub async fn reserve(&mut self, total: usize) -> Result<(), Refusal> {
        if self.used > self.cap {
            return Err(Refusal::NeedsTooMuchMemory { needed: self.used, cap: self.cap });
        }
        let total = total.clamp(self.used, self.cap);
        if total <= self.charge.bytes() {
            return Ok(());
        }
        self.charge.shrink_to(self.used);
        let more = total.saturating_sub(self.charge.bytes());
        self.charge.grow_keeping(more, self.cap, Some(self.deadline)).await.map_err(|e| match e {
            ChargeError::NeverFits { needed, .. } => Refusal::NeedsTooMuchMemory { needed, cap: self.cap },
            ChargeError::TimedOut => Refusal::NoRoom,
            ChargeError::NoShareToWait => Refusal::NoRoomToWait,
        })
    }

    /// Speaks for `bytes` more: from the reservation, or from the budget if free at once.
    /// `Ok(false)` when the request must wait for them ([`Admission::reserve`]).
    pub fn try_take(&mut self, bytes: usize) -> Result<bool, Refusal> {
        let want = self.used + bytes;
        if want > self.cap {
            return Err(Refusal::NeedsTooMuchMemory { needed: want, cap: self.cap });
        }
        if want > self.charge.bytes() && !self.charge.try_grow(want - self.charge.bytes()) {
            return Ok(false);
        }
        self.used = want;
        Ok(true)
    }

    /// Speaks for `bytes` more, waiting (holding nothing) if they are not free at once.
    pub async fn take(&mut self, bytes: usize) -> Result<(), Refusal> {
        if !self.try_take(bytes)? {
            self.reserve(self.used + bytes).await?;
            self.used += bytes;
        }
        Ok(())
    }

    /// No longer speaks for `bytes` (a buffer dropped, events given up).
    pub fn give_back(&mut self, bytes: usize) {
        self.used = self.used.saturating_sub(bytes);
    }

    pub fn used(&self) -> usize {
        self.used
    }

    /// The charge for what is spoken for; the reservation beyond it is given back.
    pub fn settle(mut self) -> MemoryCharge {
        self.charge.shrink_to(self.used);
        self.charge
    }
}

/// Reads the whole body, at most `limit` bytes, charging each frame as it arrives and counting
/// it in `received` (as sent: a gzip body compressed).
pub async fn read_body(
    body: &mut Body,
    limit: usize,
    hint: usize,
    admission: &mut Admission,
    received: &Counter,
) -> Result<Vec<u8>, Refusal> {
    let hint = hint.min(limit);
    // The declared length is waited for before anything is read, while nothing is held.
    admission.reserve(admission.used() + hint).await?;
    let mut out = Vec::with_capacity(hint);
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await {
        let frame = frame.map_err(|e| Refusal::Malformed(format!("cannot read the request body: {e}")))?;
        if let Ok(data) = frame.into_data() {
            received.add(data.len() as u64);
            if out.len() + data.len() > limit {
                return Err(Refusal::BodyTooLarge);
            }
            admission.take(data.len()).await?;
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

/// Reads and forgets what is left of a refused body, up to `limit` bytes: a client that is
/// still sending when it is refused then reads its answer, instead of having its connection
/// reset under it. Holds one frame at a time; what it reads counts in `received` too.
pub async fn discard_rest(body: &mut Body, limit: usize, received: &Counter) {
    let mut seen = 0;
    while let Some(Ok(frame)) = std::future::poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await {
        let n = frame.data_ref().map_or(0, |d| d.len());
        received.add(n as u64);
        seen += n;
        if seen > limit {
            return;
        }
    }
}

/// Inflates a gzip body (several members allowed), at most `limit` bytes, charging each step.
pub async fn gunzip(raw: &[u8], limit: usize, admission: &mut Admission) -> Result<Vec<u8>, Refusal> {
    let mut decoder = flate2::read::MultiGzDecoder::new(raw);
    let mut out = Vec::new();
    loop {
        let step = GUNZIP_STEP.min(limit + 1 - out.len());
        admission.take(step).await?;
        // Exactly the step: left to itself `read_to_end` doubles the vector, holding up to
        // twice what was charged (and the old copy while it moves).
        out.reserve_exact(step);
        let before = out.len();
        (&mut decoder)
            .take(step as u64)
            .read_to_end(&mut out)
            .map_err(|e| Refusal::Malformed(format!("invalid gzip body: {e}")))?;
        let got = out.len() - before;
        admission.give_back(step - got);
        if out.len() > limit {
            return Err(Refusal::BodyTooLarge);
        }
        if got < step {
            return Ok(out);
        }
        tokio::task::yield_now().await;
    }
}

/// The body's events, each chunk spoken for in the admission before the next is decoded.
///
/// When a chunk's memory is not free at once, the events decoded so far are dropped (so that
/// a waiting request holds at most its body), their room is given back, and the request waits
/// for twice what it needed so far before decoding again from the start: it waits at most
/// about log2(cap / body) times, and while it waits it holds its body, charged.
pub async fn decode_events(
    body: &[u8],
    timestamp: i64,
    max_events: usize,
    admission: &mut Admission,
) -> Result<Vec<Event>, Refusal> {
    let base = admission.used();
    loop {
        let mut parser = BodyParser::new(body, timestamp);
        let mut events = Vec::new();
        let mut spoken = 0;
        let short = loop {
            let Some((chunk, bytes)) = parser.next_chunk(CHUNK_BYTES, max_events)? else {
                break None;
            };
            if !admission.try_take(bytes)? {
                break Some(spoken + bytes);
            }
            spoken += bytes;
            events.extend(chunk);
            tokio::task::yield_now().await;
        };
        let Some(needed) = short else {
            return Ok(events);
        };
        drop(events);
        admission.give_back(spoken);
        admission.reserve(base + 2 * needed).await?;
    }
}

/// Decodes a body into events, a chunk at a time (see the module comment for the rules).
pub struct BodyParser<'a> {
    body: &'a [u8],
    pos: usize,
    /// Inside a JSON array (`[` consumed), not yet at its end.
    array: bool,
    done: bool,
    values: usize,
    timestamp: i64,
}

impl<'a> BodyParser<'a> {
    pub fn new(body: &'a [u8], timestamp: i64) -> BodyParser<'a> {
        let body = body.strip_prefix("\u{feff}".as_bytes()).unwrap_or(body);
        let start = skip_whitespace(body, 0);
        let array = body.get(start) == Some(&b'[');
        BodyParser {
            body,
            pos: if array { start + 1 } else { start },
            array,
            done: start == body.len(),
            values: 0,
            timestamp,
        }
    }

    /// The next events, whose memory adds up to about `chunk_bytes` (at least one event if any
    /// remain), with that memory; `None` at the end. Stops with [`Refusal::TooManyEvents`]
    /// before decoding value `max_events + 1`.
    pub fn next_chunk(
        &mut self,
        chunk_bytes: usize,
        max_events: usize,
    ) -> Result<Option<(Vec<Event>, usize)>, Refusal> {
        if self.done {
            return Ok(None);
        }
        let mut events = Vec::new();
        let mut bytes = 0;
        while bytes < chunk_bytes {
            let Some(value) = self.next_value()? else {
                self.done = true;
                break;
            };
            if self.values == max_events {
                return Err(Refusal::TooManyEvents(max_events));
            }
            self.values += 1;
            let event = event_from_value(value, self.timestamp);
            bytes += event.memory_size();
            events.push(event);
        }
        Ok(if events.is_empty() { None } else { Some((events, bytes)) })
    }

    fn malformed(&self) -> Refusal {
        Refusal::Malformed(describe_error(self.body))
    }

    fn next_value(&mut self) -> Result<Option<Value>, Refusal> {
        if self.array {
            self.pos = skip_whitespace(self.body, self.pos);
            match self.body.get(self.pos) {
                None => return Err(self.malformed()),
                Some(b']') => {
                    self.pos += 1;
                    self.array = false;
                    if skip_whitespace(self.body, self.pos) < self.body.len() {
                        return Err(self.malformed());
                    }
                    return Ok(None);
                }
                Some(b',') if self.values > 0 => self.pos = skip_whitespace(self.body, self.pos + 1),
                Some(_) if self.values == 0 => {}
                Some(_) => return Err(self.malformed()),
            }
        }
        let mut stream = serde_json::Deserializer::from_slice(&self.body[self.pos..]).into_iter::<Value>();
        match stream.next() {
            Some(Ok(value)) => {
                self.pos += stream.byte_offset();
                Ok(Some(value))
            }
            Some(Err(_)) => Err(self.malformed()),
            None if self.array => Err(self.malformed()),
            None => Ok(None),
        }
    }
}

/// Past JSON's whitespace (space, tab, line feed, carriage return; not form feed, which
/// `u8::is_ascii_whitespace` would also skip, so that a body of form feeds is refused as JSON
/// refuses it rather than taken as empty).
fn skip_whitespace(body: &[u8], mut pos: usize) -> usize {
    while body.get(pos).is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r')) {
        pos += 1;
    }
    pos
}

/// Why `body` does not parse, naming the array element or the line and value: read again
/// without keeping any value, only when a body was found malformed.
pub fn describe_error(body: &[u8]) -> String {
    let body = body.strip_prefix("\u{feff}".as_bytes()).unwrap_or(body);
    let start = skip_whitespace(body, 0);
    if body.get(start) == Some(&b'[') {
        let index = std::cell::Cell::new(0usize);
        let mut de = serde_json::Deserializer::from_slice(body);
        if let Err(e) = (CountedArray { index: &index }).deserialize(&mut de) {
            return format!("invalid JSON in element {} of the array (counting from 0): {e}", index.get());
        }
        match de.end() {
            Err(e) => format!("unexpected text after the JSON array: {e}"),
            Ok(()) => "invalid JSON".to_string(),
        }
    } else {
        for (i, value) in serde_json::Deserializer::from_slice(body).into_iter::<Checked>().enumerate() {
            if let Err(e) = value {
                return format!("invalid JSON on line {} (value {i}, counting from 0): {e}", e.line());
            }
        }
        "invalid JSON".to_string()
    }
}

/// Any JSON value, read and checked as the events are (strings must be UTF-8) but not kept:
/// serde's `IgnoredAny` skips strings without checking them, so it would find no error in a
/// body the event parser refuses.
struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Checked, D::Error> {
        d.deserialize_any(CheckedVisitor)
    }
}

struct CheckedVisitor;

impl<'de> Visitor<'de> for CheckedVisitor {
    type Value = Checked;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_str<E>(self, _: &str) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_unit<E>(self) -> Result<Checked, E> {
        Ok(Checked)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Checked, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Checked)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Checked, A::Error> {
        while map.next_entry::<Checked, Checked>()?.is_some() {}
        Ok(Checked)
    }
}

/// A JSON array read without keeping its elements, counting them, so an error can name one.
struct CountedArray<'a> {
    index: &'a std::cell::Cell<usize>,
}

impl<'de> DeserializeSeed<'de> for CountedArray<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for CountedArray<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON array")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element::<Checked>()?.is_some() {
            self.index.set(self.index.get() + 1);
        }
        Ok(())
    }
}

/// The whole body's events at once, without a memory budget (tests and fuzzing).
pub fn parse_all(body: &[u8], timestamp: i64, max_events: usize) -> Result<Vec<Event>, Refusal> {
    let mut parser = BodyParser::new(body, timestamp);
    let mut events = Vec::new();
    while let Some((chunk, _)) = parser.next_chunk(usize::MAX, max_events)? {
        events.extend(chunk);
    }
    Ok(events)
}

/// For the fuzz target of the request body path: the number of events `body` makes, or the 400
/// reason. Checks on the way that the chunked parse agrees with a whole-body parse by serde.
#[doc(hidden)]
pub fn parse_body_for_fuzzing(body: &[u8]) -> Result<usize, String> {
    let whole = parse_all(body, 0, usize::MAX);
    let mut parser = BodyParser::new(body, 0);
    let mut chunked = 0;
    let result = loop {
        match parser.next_chunk(1, usize::MAX) {
            Ok(Some((events, _))) => chunked += events.len(),
            Ok(None) => break Ok(chunked),
            Err(Refusal::Malformed(reason)) => break Err(reason),
            Err(other) => break Err(format!("{other:?}")),
        }
    };
    match (&whole, &result) {
        (Ok(events), Ok(n)) => assert_eq!(events.len(), *n, "chunked and whole parses disagree"),
        (Err(_), Err(_)) => {}
        _ => panic!("chunked and whole parses disagree: {whole:?} against {result:?}"),
    }
    let reference = reference_count(body);
    assert_eq!(result.is_ok(), reference.is_some(), "the parse disagrees with serde_json on {body:?}");
    if let (Ok(n), Some(r)) = (&result, reference) {
        assert_eq!(*n, r);
    }
    result
}

/// How many events serde_json's own whole-body parse finds, or `None` if it refuses the body.
fn reference_count(body: &[u8]) -> Option<usize> {
    let body = body.strip_prefix("\u{feff}".as_bytes()).unwrap_or(body);
    let start = skip_whitespace(body, 0);
    if body.get(start) == Some(&b'[') {
        let mut de = serde_json::Deserializer::from_slice(body);
        let values = Vec::<Checked>::deserialize(&mut de).ok()?;
        de.end().ok()?;
        Some(values.len())
    } else {
        serde_json::Deserializer::from_slice(body).into_iter::<Checked>().try_fold(0, |n, v| v.ok().map(|_| n + 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &[u8]) -> Result<Vec<Event>, String> {
        parse_all(body, 0, usize::MAX).map_err(|r| match r {
            Refusal::Malformed(m) => m,
            other => format!("{other:?}"),
        })
    }

    #[test]
    fn body_rules() {
        let ev = parse(br#"[{"a":1}, "text", 5, [1]]"#).unwrap();
        assert_eq!(ev.len(), 4);
        assert_eq!(ev[0].fields.get("a"), Some(&Value::Int(1)));
        assert_eq!(ev[1].message(), Some("text"));
        assert_eq!(ev[2].message(), Some("5"));
        assert_eq!(ev[3].message(), Some("[1]"));
        assert_eq!(parse(b"  \n ").unwrap().len(), 0);
        assert_eq!(parse(b"[]").unwrap().len(), 0);
        assert_eq!(parse(b" [ ] \n").unwrap().len(), 0);
        // A pretty-printed single object is one value.
        assert_eq!(parse(b"{\n  \"a\": 1\n}\n").unwrap().len(), 1);
        let e = parse(b"[{\"a\":1},{\"b\":}]").unwrap_err();
        assert!(e.contains("element 1 of the array"), "{e}");
        let e = parse(b"[{\"a\":1}] x").unwrap_err();
        assert!(e.contains("after the JSON array"), "{e}");
        let e = parse(b"{\"a\":1}\n\n{\"b\":2}\n{oops}\n").unwrap_err();
        assert!(e.contains("line 4") && e.contains("value 2"), "{e}");
        for bad in [&b"[1,]"[..], b"[,1]", b"[1 2]", b"[1", b"[", b"[1,", b"[1]]", b"1,2"] {
            assert!(parse(bad).is_err(), "{:?} was accepted", String::from_utf8_lossy(bad));
        }
        assert_eq!(parse(b"\xef\xbb\xbf[1,2]").unwrap().len(), 2, "a BOM is skipped");
    }

    #[test]
    fn chunks_are_bounded_by_memory_and_events_by_the_limit() {
        let body = b"1 ".repeat(10_000);
        let mut parser = BodyParser::new(&body, 0);
        let (first, bytes) = parser.next_chunk(10_000, usize::MAX).unwrap().unwrap();
        assert!((10_000..10_000 + 1024).contains(&bytes), "{bytes}");
        assert_eq!(bytes, first.iter().map(Event::memory_size).sum::<usize>());
        assert!(first.len() < 100, "{} events in a chunk of 10,000 bytes", first.len());
        assert_eq!(parse_all(&body, 0, 10_000).unwrap().len(), 10_000);
        assert_eq!(parse_all(&body, 0, 9_999).unwrap_err(), Refusal::TooManyEvents(9_999));
        let array = format!("[{}1]", "1,".repeat(9_999));
        assert_eq!(parse_all(array.as_bytes(), 0, 100).unwrap_err(), Refusal::TooManyEvents(100));
    }

    #[test]
    fn the_fuzzing_entry_point_agrees_with_serde() {
        for body in [&b"[1, {\"a\": [1,2]}, \"x\"]"[..], b"1 2 3", b"{}{}", b"[", b"", b"[1,]", b"\"a\"\"b\""] {
            let _ = parse_body_for_fuzzing(body);
        }
        assert_eq!(parse_body_for_fuzzing(b"{} {} {}"), Ok(3));
        assert!(parse_body_for_fuzzing(b"\x0c").is_err(), "a form feed is not JSON whitespace");
        assert!(parse_body_for_fuzzing(b"[1,\x0c2]").is_err());
        // A string that is not UTF-8 is refused, with its place named.
        let e = parse_body_for_fuzzing(b"[\"a\", \"\xff\"]").unwrap_err();
        assert!(e.contains("element 1"), "{e}");
        let e = parse_body_for_fuzzing(b"{\"a\": 1}\n{\"b\": \"\xc3\"}").unwrap_err();
        assert!(e.contains("line 2"), "{e}");
    }
}
