//! Syslog over a TCP byte stream (RFC 6587): octet counting (`LEN SP MSG`) or newline framing,
//! detected per connection from its first byte.
//!
//! What it guarantees:
//! - The framing is chosen by the first byte that is not a line break: a digit means octet
//!   counting, anything else (normally the `<` of a PRI) newline framing. Line breaks and NULs
//!   between octet-counted frames are skipped (some senders end each frame with one).
//! - Where the reads split the stream never changes the messages handed out; a frame held in
//!   one read is handed out as a slice of it, without a copy.
//! - Bounded: an octet-counted frame whose length is over `max_message_bytes` (or a length
//!   field of more than 10 digits) is an error ([`FrameError`]); the connection must be closed,
//!   since nothing after it can be trusted. A newline-framed message longer than the limit is
//!   cut, handed out flagged truncated, and the rest skipped ([`LineFramer`]).
//! - Robust: an octet-counting connection whose frame does not start with `LEN SP` (a sender
//!   that switched to newlines, or a message that merely began with a digit) is read as
//!   newline-framed from there on, the bytes already taken included; nothing is lost.

use crate::framing::LineFramer;

/// One message, as framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Frame<'a> {
    pub bytes: &'a [u8],
    /// Cut to `max_message_bytes` (newline framing only).
    pub truncated: bool,
}

/// Why the stream cannot be framed any further.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum FrameError {
    #[error("an octet-counted frame announces {length} bytes, over max_message_bytes ({max})")]
    TooLong { length: u64, max: usize },
    #[error("an octet-counted frame's length field has more than {MAX_DIGITS} digits")]
    LengthTooLong,
}

/// The framing a connection turned out to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Framing {
    OctetCounting,
    Newline,
}

impl Framing {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Framing::OctetCounting => "octet-counting",
            Framing::Newline => "newline",
        }
    }
}

/// Digits a length field may have (lengths up to 9,999,999,999 bytes: more than any limit).
const MAX_DIGITS: usize = 10;

#[derive(Debug)]
enum Octet {
    /// Before or inside `LEN`: the digits read so far.
    Length(Vec<u8>),
    /// Inside `MSG`, with this many bytes still to come (those before are in `partial`).
    Body(usize),
}

#[derive(Debug)]
pub(super) struct SyslogFramer {
    max: usize,
    framing: Option<Framing>,
    octet: Octet,
    /// The start of an octet-counted message whose end has not arrived yet.
    partial: Vec<u8>,
    lines: LineFramer,
    /// Set when an octet-counting connection fell back to newlines (for one warning).
    fell_back: bool,
}

impl SyslogFramer {
    pub(super) fn new(max_message_bytes: usize) -> SyslogFramer {
        let max = max_message_bytes.max(1);
        SyslogFramer {
            max,
            framing: None,
            octet: Octet::Length(Vec::new()),
            partial: Vec::new(),
            lines: LineFramer::new(max),
            fell_back: false,
        }
    }

    /// The framing detected, once the first byte has arrived.
    pub(super) fn framing(&self) -> Option<Framing> {
        self.framing
    }

    /// True once, after an octet-counting connection fell back to newline framing.
    pub(super) fn take_fell_back(&mut self) -> bool {
        std::mem::take(&mut self.fell_back)
    }

    /// Frames `data`, calling `emit` for each finished message, in order.
    pub(super) fn feed(&mut self, data: &[u8], mut emit: impl FnMut(Frame<'_>)) -> Result<(), FrameError> {
        let mut data = data;
        if self.framing.is_none() {
            let Some(first) = data.iter().position(|b| !is_separator(*b)) else { return Ok(()) };
            data = &data[first..];
            self.framing = Some(if data[0].is_ascii_digit() { Framing::OctetCounting } else { Framing::Newline });
        }
        if self.framing == Some(Framing::Newline) {
            self.feed_lines(data, &mut emit);
            return Ok(());
        }
        while !data.is_empty() {
            match &mut self.octet {
                Octet::Length(digits) => {
                    if digits.is_empty() {
                        let skip = data.iter().position(|b| !is_separator(*b)).unwrap_or(data.len());
                        data = &data[skip..];
                        if data.is_empty() {
                            break;
                        }
                    }
                    let n = data.iter().take_while(|b| b.is_ascii_digit()).count();
                    if digits.len() + n > MAX_DIGITS {
                        return Err(FrameError::LengthTooLong);
                    }
                    digits.extend_from_slice(&data[..n]);
                    data = &data[n..];
                    match data.first() {
                        None => break,
                        Some(b' ') if !digits.is_empty() => {
                            data = &data[1..];
                            let length: u64 =
                                std::str::from_utf8(digits).ok().and_then(|d| d.parse().ok()).unwrap_or(0);
                            if length > self.max as u64 {
                                return Err(FrameError::TooLong { length, max: self.max });
                            }
                            // An empty frame (`0 `) hands nothing out.
                            self.octet =
                                if length == 0 { Octet::Length(Vec::new()) } else { Octet::Body(length as usize) };
                            self.partial.clear();
                        }
                        Some(_) => {
                            // Not `LEN SP`: newline framing from here, with the digits taken.
                            let taken = std::mem::take(digits);
                            self.framing = Some(Framing::Newline);
                            self.fell_back = true;
                            self.octet = Octet::Length(Vec::new());
                            self.feed_lines(&taken, &mut emit);
                            self.feed_lines(data, &mut emit);
                            return Ok(());
                        }
                    }
                }
                Octet::Body(remaining) => {
                    let take = (*remaining).min(data.len());
                    let (body, rest) = data.split_at(take);
                    *remaining -= take;
                    data = rest;
                    if *remaining > 0 {
                        self.partial.extend_from_slice(body);
                        break;
                    }
                    if self.partial.is_empty() {
                        emit(Frame { bytes: body, truncated: false });
                    } else {
                        self.partial.extend_from_slice(body);
                        emit(Frame { bytes: &self.partial, truncated: false });
                        self.partial.clear();
                    }
                    self.octet = Octet::Length(Vec::new());
                }
            }
        }
        Ok(())
    }

    /// At end of stream: hands out an unfinished message (an unterminated last line, or an
    /// octet-counted frame cut short, flagged truncated).
    pub(super) fn finish(&mut self, mut emit: impl FnMut(Frame<'_>)) {
        match self.framing {
            Some(Framing::Newline) => self.lines.finish(|l| emit(Frame { bytes: l.bytes, truncated: l.truncated })),
            Some(Framing::OctetCounting) if matches!(self.octet, Octet::Body(_)) && !self.partial.is_empty() => {
                emit(Frame { bytes: &self.partial, truncated: true });
            }
            _ => {}
        }
        self.partial.clear();
        self.octet = Octet::Length(Vec::new());
    }

    /// Bytes held for an unfinished message.
    pub(super) fn pending(&self) -> usize {
        self.partial.len() + self.lines.pending()
    }

    fn feed_lines(&mut self, data: &[u8], emit: &mut impl FnMut(Frame<'_>)) {
        self.lines.feed(data, |l| emit(Frame { bytes: l.bytes, truncated: l.truncated }));
    }
}

/// Bytes skipped before a frame: line breaks and NULs.
fn is_separator(b: u8) -> bool {
    matches!(b, b'\n' | b'\r' | b'\0')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frames `chunks` in order; the messages (lossy text, truncated flag) and any error.
    fn run(chunks: &[&[u8]], max: usize) -> (Vec<(String, bool)>, Option<FrameError>, Option<Framing>) {
        let mut f = SyslogFramer::new(max);
        let mut out = Vec::new();
        let mut push = |fr: Frame<'_>| out.push((String::from_utf8_lossy(fr.bytes).into_owned(), fr.truncated));
        for c in chunks {
            if let Err(e) = f.feed(c, &mut push) {
                return (out, Some(e), f.framing());
            }
        }
        f.finish(&mut push);
        (out, None, f.framing())
    }

    fn messages(v: &[(String, bool)]) -> Vec<&str> {
        v.iter().map(|(m, _)| m.as_str()).collect()
    }

    #[test]
    fn newline_framing_is_detected_from_a_pri() {
        let (out, err, framing) = run(&[b"<13>one\n<13>two\r\n<13>three"], 100);
        assert_eq!(messages(&out), ["<13>one", "<13>two", "<13>three"]);
        assert_eq!((err, framing), (None, Some(Framing::Newline)));
        // Leading blank lines do not decide.
        let (out, _, framing) = run(&[b"\r\n", b"\n<13>x\n"], 100);
        assert_eq!((messages(&out), framing), (vec!["<13>x"], Some(Framing::Newline)));
        // A message without a PRI is newline-framed too.
        let (out, _, framing) = run(&[b"plain text\nmore\n"], 100);
        assert_eq!((messages(&out), framing), (vec!["plain text", "more"], Some(Framing::Newline)));
    }

    #[test]
    fn octet_counting_is_detected_from_a_digit() {
        let (out, err, framing) = run(&[b"7 <13>one9 <13>two\nx"], 100);
        assert_eq!(messages(&out), ["<13>one", "<13>two\nx"], "a newline inside a counted frame is its text");
        assert_eq!((err, framing), (None, Some(Framing::OctetCounting)));
        // Newlines after frames (some senders add one) are skipped.
        let (out, _, _) = run(&[b"7 <13>one\n7 <13>two\r\n"], 100);
        assert_eq!(messages(&out), ["<13>one", "<13>two"]);
        // An empty frame hands nothing out.
        let (out, _, _) = run(&[b"0 7 <13>one"], 100);
        assert_eq!(messages(&out), ["<13>one"]);
    }

    #[test]
    fn octet_counted_frames_split_across_reads_are_whole() {
        let stream = b"12 <13>message1\n10 <13>second13 <13>third one";
        let whole = run(&[stream], 100).0;
        assert_eq!(messages(&whole), ["<13>message1", "<13>second", "<13>third one"]);
        // Every way of cutting the stream in two and in three gives the same messages.
        for i in 0..=stream.len() {
            assert_eq!(run(&[&stream[..i], &stream[i..]], 100).0, whole, "cut at {i}");
            for j in i..=stream.len() {
                assert_eq!(run(&[&stream[..i], &stream[i..j], &stream[j..]], 100).0, whole, "cut at {i}, {j}");
            }
        }
        // One byte a read.
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(run(&bytes, 100).0, whole);
    }

    #[test]
    fn an_oversized_length_is_an_error() {
        let (out, err, _) = run(&[b"5 <13>a", b"101 <13>", b"rest"], 100);
        assert_eq!(messages(&out), ["<13>a"]);
        assert_eq!(err, Some(FrameError::TooLong { length: 101, max: 100 }));
        // Exactly the limit is fine.
        let body = format!("<13>{}", "x".repeat(96));
        let (out, err, _) = run(&[format!("100 {body}").as_bytes()], 100);
        assert_eq!((messages(&out), err), (vec![body.as_str()], None));
        // A length field without end.
        let (_, err, _) = run(&[b"1234567", b"8901234 "], 100);
        assert_eq!(err, Some(FrameError::LengthTooLong));
        let e = FrameError::TooLong { length: 101, max: 100 }.to_string();
        assert!(e.contains("101 bytes") && e.contains("max_message_bytes (100)"), "{e}");
    }

    #[test]
    fn a_frame_without_a_length_falls_back_to_newlines() {
        // A message that starts with digits but is newline-framed.
        let (out, err, framing) = run(&[b"2026-11-26 started\n<13>next\n"], 100);
        assert_eq!(messages(&out), ["2026-11-26 started", "<13>next"]);
        assert_eq!((err, framing), (None, Some(Framing::Newline)));
        // A sender that switches after a counted frame; split anywhere, the same.
        let stream = b"7 <13>one<13>two\n<13>three\n";
        let whole = run(&[stream], 100).0;
        assert_eq!(messages(&whole), ["<13>one", "<13>two", "<13>three"]);
        for i in 0..=stream.len() {
            assert_eq!(run(&[&stream[..i], &stream[i..]], 100).0, whole, "cut at {i}");
        }
        let mut f = SyslogFramer::new(100);
        f.feed(b"12x\n", |_| {}).unwrap();
        assert!(f.take_fell_back() && !f.take_fell_back());
    }

    #[test]
    fn long_newline_messages_are_cut_and_a_frame_cut_short_is_flagged() {
        let (out, _, _) = run(&[b"<13>0123456789\n<13>ok\n"], 8);
        assert_eq!(out, [("<13>0123".to_string(), true), ("<13>ok".to_string(), false)]);
        let (out, _, _) = run(&[b"20 <13>only part"], 100);
        assert_eq!(out, [("<13>only part".to_string(), true)]);
    }
}
