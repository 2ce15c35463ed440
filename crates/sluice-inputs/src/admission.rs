//! How inputs charge the node's memory budget for the events they decode.
//!
//! A streaming input (tcp, stdin, file) reserves an estimate before it decodes a chunk — the
//! chunk's bytes plus a per-line cost for the events it will make — so that it waits for room
//! *before* the memory is spent; once the events exist, it trues the charge up to what they
//! really hold ([`sluice_core::Event::memory_size`]) and sends the charge with the batch. The
//! estimate need not be exact: the true-up corrects it, and the wait before decoding is what
//! bounds the node, since no input decodes while the budget is spent.
//!
//! Text lines all have the same shape (a message slicing the read buffer, a timestamp, maybe a
//! peer or a tag), so their cost is measured on one event and multiplied, rather than walked
//! per event; decoded JSON is walked event by event, since its shape is the client's choice.

use sluice_core::{Event, Str};

use crate::codec::Codec;

/// What one text-line event costs without its text (which lives in the shared read buffer).
pub fn line_event_bytes() -> usize {
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BYTES.get_or_init(|| Event::from_message_at(Str::default(), 0).memory_size())
}

/// The estimate to reserve before decoding `bytes` holding about `lines` lines.
pub fn estimate(codec: Codec, bytes: usize, lines: usize) -> usize {
    let per_line = line_event_bytes();
    match codec {
        // The buffer the messages point into, and one event per line.
        Codec::Lines => bytes + lines * per_line,
        // The buffer, the decoded strings (at most the line bytes again), and one map per line.
        Codec::JsonLines => 2 * bytes + lines * per_line,
    }
}

/// What decoded `events` hold, with the `buffer_bytes` of the read they came from.
pub fn measure(codec: Codec, events: &[Event], buffer_bytes: usize) -> usize {
    match (codec, events.first()) {
        (_, None) => buffer_bytes,
        (Codec::Lines, Some(first)) => buffer_bytes + events.len() * first.memory_size(),
        (Codec::JsonLines, _) => measure_each(events, buffer_bytes),
    }
}

/// What decoded `events` hold when each made its own copy of its line (`line_bytes` in all):
/// text lines then differ only in their message's length, so no event is walked.
pub fn measure_owned(codec: Codec, events: &[Event], line_bytes: usize) -> usize {
    match codec {
        Codec::Lines => events.len() * (line_event_bytes() + sluice_core::value::ALLOCATION_OVERHEAD) + line_bytes,
        Codec::JsonLines => measure_each(events, 0),
    }
}

/// What `events` of any shape hold, walked one by one, with `buffer_bytes`.
pub fn measure_each(events: &[Event], buffer_bytes: usize) -> usize {
    buffer_bytes + events.iter().map(Event::memory_size).sum::<usize>()
}

/// Lines in `data` (a last unterminated one included), for [`estimate`].
pub fn count_lines(data: &[u8]) -> usize {
    memchr::memchr_iter(b'\n', data).count() + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn estimates_cover_tiny_lines() {
        // Two bytes a line make an event each: the estimate is far above the raw bytes.
        let data = b"1\n".repeat(1000);
        let est = estimate(Codec::JsonLines, data.len(), count_lines(&data));
        assert!(est > 100 * data.len(), "{est}");
        let events: Vec<Event> = (0..1000).map(|_| Event::from_message_at("1", 0)).collect();
        let real = measure(Codec::Lines, &events, data.len());
        assert!(real <= estimate(Codec::Lines, data.len(), count_lines(&data)));
        assert_eq!(real, data.len() + 1000 * line_event_bytes());
    }
}
