//! Newline framing over a byte stream.
//!
//! Complete lines are handed out as slices of the chunk just read, without copying; only a
//! line that spans two reads is assembled in a side buffer. A line longer than `max_line_bytes`
//! is cut at that length, handed out flagged as truncated, and the rest of it is skipped up to
//! the next newline: one huge line never stalls the stream or grows memory without bound.
//! A trailing `\r` is removed, so CRLF text reads the same as LF text, and it does not count
//! toward the limit. Where the reads split the stream never changes the lines handed out.

use memchr::memchr_iter;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Line<'a> {
    pub bytes: &'a [u8],
    pub truncated: bool,
}

#[derive(Debug)]
pub struct LineFramer {
    partial: Vec<u8>,
    max_line_bytes: usize,
    /// Inside an over-long line whose head was already handed out.
    skipping: bool,
}

impl LineFramer {
    pub fn new(max_line_bytes: usize) -> LineFramer {
        LineFramer { partial: Vec::new(), max_line_bytes: max_line_bytes.max(1), skipping: false }
    }

    /// Splits `data`, calling `emit` for each finished line, in order.
    pub fn feed(&mut self, data: &[u8], mut emit: impl FnMut(Line<'_>)) {
        let mut start = 0;
        for nl in memchr_iter(b'\n', data) {
            let piece = &data[start..nl];
            start = nl + 1;
            if self.skipping {
                self.skipping = false;
                continue;
            }
            if self.partial.is_empty() {
                self.emit_line(piece, &mut emit);
            } else {
                self.partial.extend_from_slice(piece);
                let whole = std::mem::take(&mut self.partial);
                self.emit_line(&whole, &mut emit);
                self.partial = whole;
                self.partial.clear();
            }
        }
        let rest = &data[start..];
        if self.skipping || rest.is_empty() {
            return;
        }
        let room = self.max_line_bytes.saturating_sub(self.partial.len());
        // A CR one byte past the limit may be the end of a CRLF line of exactly the limit,
        // whose LF has not arrived yet: hold it (one byte over) until the next read tells.
        let held_cr = self.partial.len() + rest.len() == self.max_line_bytes + 1 && rest.ends_with(b"\r");
        if rest.len() > room && !held_cr {
            self.partial.extend_from_slice(&rest[..room]);
            emit(Line { bytes: &self.partial[..self.max_line_bytes], truncated: true });
            self.partial.clear();
            self.skipping = true;
        } else {
            self.partial.extend_from_slice(rest);
        }
    }

    /// At end of stream: hands out an unterminated last line, if any.
    pub fn finish(&mut self, mut emit: impl FnMut(Line<'_>)) {
        if !self.partial.is_empty() && !self.skipping {
            let whole = std::mem::take(&mut self.partial);
            self.emit_line(&whole, &mut emit);
        }
        self.partial.clear();
        self.skipping = false;
    }

    /// Bytes held for an unfinished line: at most `max_line_bytes`, plus one for a CR whose LF
    /// may follow.
    pub fn pending(&self) -> usize {
        self.partial.len()
    }

    fn emit_line(&self, line: &[u8], emit: &mut impl FnMut(Line<'_>)) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.len() > self.max_line_bytes {
            emit(Line { bytes: &line[..self.max_line_bytes], truncated: true });
        } else {
            emit(Line { bytes: line, truncated: false });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(chunks: &[&[u8]], max: usize) -> Vec<(String, bool)> {
        let mut f = LineFramer::new(max);
        let mut out = Vec::new();
        for c in chunks {
            f.feed(c, |l| out.push((String::from_utf8_lossy(l.bytes).into_owned(), l.truncated)));
        }
        f.finish(|l| out.push((String::from_utf8_lossy(l.bytes).into_owned(), l.truncated)));
        out
    }

    #[test]
    fn splits_across_chunks() {
        let out = run(&[b"ab", b"c\nde", b"f\r\n\ng"], 100);
        assert_eq!(out, [("abc".into(), false), ("def".into(), false), ("".into(), false), ("g".into(), false)]);
    }

    #[test]
    fn long_lines_are_cut_and_the_stream_goes_on() {
        let out = run(&[b"0123456789abc\nok\n"], 4);
        assert_eq!(out, [("0123".into(), true), ("ok".into(), false)]);
        let out = run(&[b"0123", b"4567", b"89\nok\n"], 4);
        assert_eq!(out, [("0123".into(), true), ("ok".into(), false)]);
        let out = run(&[b"01", b"2345", b"\nok"], 4);
        assert_eq!(out, [("0123".into(), true), ("ok".into(), false)]);
    }

    #[test]
    fn exactly_max_is_not_truncated() {
        let out = run(&[b"0123\n", b"45", b"67\n"], 4);
        assert_eq!(out, [("0123".into(), false), ("4567".into(), false)]);
    }

    #[test]
    fn a_crlf_line_of_exactly_max_is_not_truncated_whatever_the_reads() {
        let whole = run(&[b"0123\r\nok\n"], 4);
        assert_eq!(whole, [("0123".into(), false), ("ok".into(), false)]);
        // The read ends between the CR and the LF: the CR may still be the line's end.
        assert_eq!(run(&[b"0123\r", b"\nok\n"], 4), whole);
        assert_eq!(run(&[b"01", b"23\r", b"\nok\n"], 4), whole);
        assert_eq!(run(&[b"0123", b"\r", b"\nok\n"], 4), whole);
        // A CR followed by more text is part of an over-long line.
        assert_eq!(run(&[b"0123\r", b"x\nok\n"], 4), run(&[b"0123\rx\nok\n"], 4));
        assert_eq!(run(&[b"0123\r", b"x\nok\n"], 4), [("0123".into(), true), ("ok".into(), false)]);
        assert_eq!(run(&[b"0123\r", b"\r\nok\n"], 4), [("0123".into(), true), ("ok".into(), false)]);
        // At the end of the stream, a held CR is the line's last byte, stripped as usual.
        assert_eq!(run(&[b"0123\r"], 4), [("0123".into(), false)]);
        assert_eq!(run(&[b"0123", b"\r"], 4), [("0123".into(), false)]);
    }
}
