//! How a file's bytes are cut into lines: the delimiter in the file's encoding, the length cap
//! (a longer line keeps its first `max_line_bytes`, tagged, and the rest is skipped with the
//! offset after it exact), a trailing CR, and a line that spans two reads.

use memchr::memmem;

use super::decode::TextEncoding;

/// How lines are cut: delimiter, code unit, length cap.
#[derive(Debug, Clone)]
pub(crate) struct Framing {
    pub(super) delimiter: Vec<u8>,
    pub(super) finder: memmem::Finder<'static>,
    /// Bytes of an encoded `\r`, stripped from the end of lines when the delimiter is `\n`.
    pub(super) cr: Option<Vec<u8>>,
    pub(super) unit: usize,
    pub(super) max_line_bytes: usize,
}

impl Framing {
    pub(crate) fn new(delimiter: &str, encoding: TextEncoding, max_line_bytes: usize) -> Framing {
        let bytes = encoding.encode_delimiter(delimiter);
        let unit = encoding.unit();
        let max = (max_line_bytes.max(unit) / unit) * unit;
        Framing {
            finder: memmem::Finder::new(&bytes).into_owned(),
            cr: (delimiter == "\n").then(|| encoding.encode_delimiter("\r")),
            delimiter: bytes,
            unit,
            max_line_bytes: max,
        }
    }
}

/// A line cut out of a file: its bytes, where it starts, and the offset just past its delimiter.
pub(crate) struct RawLine<'a> {
    pub bytes: &'a [u8],
    pub start: u64,
    pub end: u64,
    pub truncated: bool,
}

/// The unfinished line of one file.
#[derive(Debug, Default)]
pub(crate) struct Partial {
    pub(super) kept: Vec<u8>,
    /// Bytes of the line seen so far, skipped ones included.
    pub(super) len: u64,
    pub(super) start: u64,
    /// The line's last bytes (up to the delimiter's length), to find a delimiter that straddles
    /// two reads.
    pub(super) tail: Vec<u8>,
}

impl Partial {
    /// Bytes of the unfinished line, if all of them are kept (none skipped for being over
    /// `max_line_bytes`), so that it can be framed again from its start.
    pub(super) fn carry_len(&self) -> Option<usize> {
        (self.len == self.kept.len() as u64).then_some(self.kept.len())
    }

    /// The unfinished line, to be framed again from its start followed by the next read (see
    /// [`Partial::carry_len`]): its file offset (none if there is no such line) and its bytes.
    /// [`Partial::clear`] once they are placed.
    pub(super) fn carried(&self) -> (Option<u64>, &[u8]) {
        debug_assert!(self.carry_len().is_some());
        ((self.len > 0).then_some(self.start), &self.kept)
    }

    pub(crate) fn clear(&mut self) {
        self.kept = Vec::new();
        self.tail.clear();
        self.len = 0;
    }

    /// A delimiter split between the end of the unfinished line and the start of `data`:
    /// how many of its bytes are in `data`.
    pub(super) fn straddling(&self, f: &Framing, data: &[u8]) -> Option<usize> {
        let d = &f.delimiter;
        (1..d.len())
            .find(|&k| {
                self.tail.ends_with(&d[..k])
                    && data.starts_with(&d[k..])
                    && (self.len - k as u64).is_multiple_of(f.unit as u64)
            })
            .map(|k| d.len() - k)
    }

    /// Splits `data`, read at offset `at`, into lines.
    pub(crate) fn feed(&mut self, f: &Framing, mut data: &[u8], mut at: u64, emit: &mut impl FnMut(RawLine<'_>)) {
        if self.len > 0
            && f.delimiter.len() > 1
            && let Some(rest) = self.straddling(f, data)
        {
            let head = (f.delimiter.len() - rest) as u64;
            let truncated = self.len - head > f.max_line_bytes as u64;
            let kept = std::mem::take(&mut self.kept);
            let keep = kept.len().min((self.len - head) as usize);
            let bytes = if truncated { &kept[..keep] } else { strip_cr(f, &kept[..keep]) };
            emit(RawLine { bytes, start: self.start, end: at + rest as u64, truncated });
            self.kept = kept;
            self.kept.clear();
            self.tail.clear();
            self.len = 0;
            data = &data[rest..];
            at += rest as u64;
        }
        let mut line_start = 0usize;
        let mut from = 0usize;
        while from < data.len() {
            let found = if f.delimiter.len() == 1 {
                memchr::memchr(f.delimiter[0], &data[from..])
            } else {
                f.finder.find(&data[from..])
            };
            let Some(rel) = found else { break };
            let pos = from + rel;
            let before = self.len + (pos - line_start) as u64;
            if f.unit > 1 && !before.is_multiple_of(f.unit as u64) {
                from = pos + 1;
                continue;
            }
            let end = at + (pos + f.delimiter.len()) as u64;
            if self.len == 0 {
                let bytes = &data[line_start..pos];
                let (bytes, truncated) = cap(f, bytes);
                emit(RawLine { bytes: strip_cr(f, bytes), start: at + line_start as u64, end, truncated });
            } else {
                self.keep(f, &data[line_start..pos]);
                let truncated = self.len > f.max_line_bytes as u64;
                let kept = std::mem::take(&mut self.kept);
                let bytes = if truncated { &kept[..] } else { strip_cr(f, &kept) };
                emit(RawLine { bytes, start: self.start, end, truncated });
                self.kept = kept;
                self.kept.clear();
                self.tail.clear();
                self.len = 0;
            }
            line_start = pos + f.delimiter.len();
            from = line_start;
        }
        if line_start < data.len() {
            if self.len == 0 {
                self.start = at + line_start as u64;
            }
            self.keep(f, &data[line_start..]);
        }
    }

    pub(super) fn keep(&mut self, f: &Framing, piece: &[u8]) {
        let room = (f.max_line_bytes as u64).saturating_sub(self.kept.len() as u64) as usize;
        self.kept.extend_from_slice(&piece[..piece.len().min(room)]);
        self.len += piece.len() as u64;
        let want = f.delimiter.len() - 1;
        if want > 0 {
            self.tail.extend_from_slice(&piece[piece.len().saturating_sub(want)..]);
            let extra = self.tail.len().saturating_sub(want);
            self.tail.drain(..extra);
        }
    }

    /// Hands out an unterminated last line ending at `end`.
    pub(crate) fn finish(&mut self, f: &Framing, end: u64, emit: &mut impl FnMut(RawLine<'_>)) {
        if self.len > 0 {
            let kept = std::mem::take(&mut self.kept);
            let truncated = self.len > f.max_line_bytes as u64;
            emit(RawLine { bytes: &kept, start: self.start, end, truncated });
        }
        self.clear();
    }
}

pub(super) fn cap<'a>(f: &Framing, bytes: &'a [u8]) -> (&'a [u8], bool) {
    if bytes.len() > f.max_line_bytes { (&bytes[..f.max_line_bytes], true) } else { (bytes, false) }
}

pub(super) fn strip_cr<'a>(f: &Framing, bytes: &'a [u8]) -> &'a [u8] {
    match f.cr.as_deref() {
        // One byte in UTF-8 and the other single-byte encodings: compared inline (this runs
        // once per line; a slice comparison would be a call).
        Some(&[cr]) => match bytes.split_last() {
            Some((&last, rest)) if last == cr => rest,
            _ => bytes,
        },
        Some(cr) => bytes.strip_suffix(cr).unwrap_or(bytes),
        None => bytes,
    }
}
