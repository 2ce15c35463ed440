//! One file being read: its source (plain or gzip), its position and identity, and a read turn
//! (at most `read_buffer` bytes) that cuts its lines ([`super::framing`]) and hands them to
//! event making ([`super::events`]).
//!
//! Reads use `pread` at the file's own position into a buffer shared by all files (only one
//! file reads at a time), so an open file costs a descriptor and a small state, not a buffer.
//! Lines are split in place with `memchr` (one-byte delimiters) or `memmem`; only a line that
//! spans two reads is copied into the file's side buffer. A line longer than `max_line_bytes`
//! keeps its first `max_line_bytes` and is handed out, tagged, when its delimiter arrives: the
//! rest is skipped, the file keeps flowing, and the offset after it is exact.
//!
//! An unterminated last line is held until its delimiter arrives (a writer may be in the middle
//! of it) and handed out only when the file is let go (deleted or renamed away and read to its
//! end) or, for gzip files, at the end of the stream.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use sluice_core::Map;
use sluice_core::metrics::ComponentMetrics;

use super::acks::AckTracker;
use super::identity::{FileId, Fingerprint};
use super::multiline::{self};
use super::{events::*, framing::*};

/// The open source of a file's bytes.
pub(crate) enum Source {
    Plain(File),
    Gzip(Box<flate2::read::MultiGzDecoder<CountedFile>>),
}

/// A gzip file under its decoder, counting each read the decoder makes of it in the input's
/// `bytes_in`: the compressed bytes the disk gave. (The decoder reads ahead, its header as soon
/// as it is made, so its reads cannot be matched to the read turns that use them.)
pub(crate) struct CountedFile {
    pub(super) file: File,
    pub(super) metrics: Arc<ComponentMetrics>,
}

impl CountedFile {
    pub(crate) fn new(file: File, metrics: Arc<ComponentMetrics>) -> CountedFile {
        CountedFile { file, metrics }
    }
}

impl Read for CountedFile {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        self.metrics.bytes_in.add(n as u64);
        Ok(n)
    }
}

impl Source {
    pub(crate) fn plain(&self) -> Option<&File> {
        match self {
            Source::Plain(f) => Some(f),
            Source::Gzip(_) => None,
        }
    }

    /// Reads at the file's position: `pread` for plain files, the stream for gzip.
    fn read(&mut self, buf: &mut [u8], pos: u64) -> std::io::Result<usize> {
        loop {
            let r = match self {
                Source::Plain(f) => f.read_at(buf, pos),
                Source::Gzip(g) => g.read(buf),
            };
            match r {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => return r,
            }
        }
    }
}

/// A file the input knows, open or not.
pub(crate) struct Tracked {
    pub id: FileId,
    pub key: String,
    pub path: PathBuf,
    /// This file's metadata fields (path, offset placeholder, host), cloned into each event.
    pub template: Arc<Map>,
    pub source: Option<Source>,
    pub gzip: bool,
    /// Where the start offset was decided (first open): before that the file was only found.
    pub started: bool,
    /// Offset of the next byte to read (decompressed offset for gzip).
    pub pos: u64,
    /// The file's size at the last look (or as far as it was read, if further): its lag is
    /// this less `pos`.
    pub size: u64,
    pub partial: Partial,
    pub pending: multiline::Pending,
    pub fingerprint: Fingerprint,
    pub tracker: Option<Arc<AckTracker>>,
    /// The file's registry key, once started.
    pub cursor: Option<sluice_registry::Cursor>,
    /// May have unread data (last read was not at the end, or a notification came).
    pub ready: bool,
    /// The last look found no more data: check for truncation before reading again.
    pub at_end: bool,
    pub last_data: Instant,
    /// No longer at any matching path (renamed away or deleted): read to the end, then let go.
    pub released: bool,
    /// Gzip file read to its end; never opened again.
    pub done: bool,
    pub truncated_lines: u64,
}

impl Tracked {
    pub(crate) fn new(id: FileId, key: String, path: PathBuf, template: Arc<Map>, now: Instant) -> Tracked {
        let gzip = path.extension().is_some_and(|e| e == "gz");
        Tracked {
            id,
            key,
            template,
            path,
            source: None,
            gzip,
            started: false,
            pos: 0,
            size: 0,
            partial: Partial::default(),
            pending: multiline::Pending::default(),
            fingerprint: Fingerprint::default(),
            tracker: None,
            cursor: None,
            ready: true,
            at_end: false,
            last_data: now,
            released: false,
            done: false,
            truncated_lines: 0,
        }
    }

    /// Takes note of `read`, just read at `at`: the fingerprint grows, the position moves on.
    /// Returns the length of a byte order mark that starts the file (to skip), else 0.
    pub(super) fn advance(&mut self, shape: &Shape, at: u64, read: &[u8], now: Instant) -> usize {
        if !self.gzip {
            self.fingerprint.extend(at, read);
        }
        self.pos += read.len() as u64;
        self.last_data = now;
        if at == 0 { shape.encoding.bom_len(read) } else { 0 }
    }

    /// Starts again at offset 0 (truncation, or new content under the same inode).
    pub(crate) fn restart(&mut self) {
        self.pos = 0;
        self.partial.clear();
        self.pending.clear();
        self.fingerprint = Fingerprint::default();
    }
}

/// What one read turn found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Bytes were read.
    Data(usize),
    /// At the end for now.
    End,
}

/// Longest unfinished line moved in front of the next read, for [`read_in_place`].
pub(super) const CARRY_MAX: usize = 64 << 10;

/// Reads up to `buf.len()` bytes of `t` and turns the complete lines into events.
pub(crate) fn read_turn(
    t: &mut Tracked,
    shape: &Shape,
    buf: &mut [u8],
    out: &mut BatchBuilder,
    now: Instant,
    timestamp: i64,
) -> std::io::Result<Turn> {
    if out.deferred
        && shape.multiline.is_none()
        && t.tracker.is_some()
        && matches!(t.source, Some(Source::Plain(_)))
        && t.partial.carry_len().is_some_and(|n| n <= CARRY_MAX)
    {
        return read_in_place(t, shape, buf.len(), out, now, timestamp);
    }
    let Some(source) = t.source.as_mut() else { return Ok(Turn::End) };
    let at = t.pos;
    let n = source.read(buf, at)?;
    if n == 0 {
        return Ok(Turn::End);
    }
    let bom = t.advance(shape, at, &buf[..n], now);
    let (data, start_at) = (&buf[bom..n], at + bom as u64);
    let Some(tracker) = t.tracker.as_ref() else { return Ok(Turn::Data(n)) };
    let file = FileContext { tracker, template: &t.template, timestamp };
    let (partial, pending) = (&mut t.partial, &mut t.pending);
    let truncated = &mut t.truncated_lines;
    partial.feed(&shape.framing, data, start_at, &mut |line| {
        *truncated += u64::from(line.truncated);
        take_line(shape, pending, &file, line, now, out);
    });
    Ok(Turn::Data(n))
}

/// [`read_turn`] for lines that go to the builder threads: the file's bytes are read straight
/// into the chunk's text, after the file's unfinished line (moved there from the framer), so
/// every complete line is already where the builders read it and none is copied. Only a line
/// still unfinished at the end of the read is copied back into the framer.
pub(super) fn read_in_place(
    t: &mut Tracked,
    shape: &Shape,
    want: usize,
    out: &mut BatchBuilder,
    now: Instant,
    timestamp: i64,
) -> std::io::Result<Turn> {
    let Some(Source::Plain(file)) = t.source.as_ref() else { return Ok(Turn::End) };
    if t.tracker.is_none() {
        return Ok(Turn::End);
    }
    let at = t.pos;
    let mut text = std::mem::take(&mut out.lines.text);
    let base = text.len();
    let (carried_at, carried) = t.partial.carried();
    text.reserve(carried.len() + want);
    text.extend_from_slice(carried);
    let n = match pread_into(file, &mut text, want, at) {
        Ok(n) if n > 0 => n,
        other => {
            // Nothing read: the unfinished line stays with the framer.
            text.truncate(base);
            out.lines.text = text;
            return other.map(|_| Turn::End);
        }
    };
    t.partial.clear();
    // The data starts with the unfinished line, if any, which begins at `carried_at`. (A byte
    // order mark is only at offset 0, where nothing is carried.)
    let bom = t.advance(shape, at, &text[text.len() - n..], now);
    let (from, data_at) = (base + bom, carried_at.unwrap_or(at) + bom as u64);
    let Some(tracker) = t.tracker.as_ref() else { return Ok(Turn::Data(n)) };
    let file_ctx = FileContext { tracker, template: &t.template, timestamp };
    let truncated = &mut t.truncated_lines;
    // Lines the framer hands out from its own buffer (it does not, with nothing carried over;
    // kept for safety) are copied after the data.
    let mut copied: Vec<u8> = Vec::new();
    let mut copied_spans: Vec<usize> = Vec::new();
    let origin = text.as_ptr() as usize;
    let data_len = text.len();
    t.partial.feed(&shape.framing, &text[from..], data_at, &mut |line| {
        *truncated += u64::from(line.truncated);
        let start = (line.bytes.as_ptr() as usize).wrapping_sub(origin);
        if start <= data_len && data_len - start >= line.bytes.len() {
            out.push_span(&file_ctx, &line, start, start + line.bytes.len());
        } else {
            copied_spans.push(out.lines.spans.len());
            let at = copied.len();
            copied.extend_from_slice(line.bytes);
            out.push_span(&file_ctx, &line, at, copied.len());
        }
    });
    for i in copied_spans {
        out.lines.spans[i].start += data_len;
        out.lines.spans[i].end += data_len;
    }
    text.extend_from_slice(&copied);
    out.lines.text = text;
    Ok(Turn::Data(n))
}

/// `pread` of up to `want` bytes at `pos` into the spare capacity of `text`, which must have
/// room for them. Retries when interrupted.
pub(super) fn pread_into(file: &File, text: &mut Vec<u8>, want: usize, pos: u64) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    debug_assert!(text.capacity() - text.len() >= want);
    loop {
        let spare = text.spare_capacity_mut();
        let len = want.min(spare.len());
        // SAFETY: the kernel writes at most `len` bytes into the spare capacity, which is
        // valid for writes; only the bytes it reports written are then counted as initialised.
        let r = unsafe { libc::pread(file.as_raw_fd(), spare.as_mut_ptr().cast(), len, pos as libc::off_t) };
        if r >= 0 {
            // SAFETY: `r` bytes past the length were just written by the kernel.
            unsafe { text.set_len(text.len() + r as usize) };
            return Ok(r as usize);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Lets a file go: its unterminated last line and pending multiline event are handed out.
pub(crate) fn finish(t: &mut Tracked, shape: &Shape, out: &mut BatchBuilder, now: Instant, timestamp: i64) {
    let Some(tracker) = t.tracker.as_ref() else { return };
    let file = FileContext { tracker, template: &t.template, timestamp };
    let (partial, pending, end) = (&mut t.partial, &mut t.pending, t.pos);
    partial.finish(&shape.framing, end, &mut |line| {
        take_line(shape, pending, &file, line, now, out);
    });
    if let Some(m) = &shape.multiline
        && let Some(j) = m.flush(pending)
    {
        push_joined(shape, &file, j, out);
    }
}

/// Hands out a multiline event that waited longer than the timeout.
pub(crate) fn flush_idle(t: &mut Tracked, shape: &Shape, out: &mut BatchBuilder, now: Instant, timestamp: i64) {
    let (Some(m), Some(tracker)) = (&shape.multiline, t.tracker.as_ref()) else { return };
    if let Some(j) = m.flush_idle(&mut t.pending, now) {
        push_joined(shape, &FileContext { tracker, template: &t.template, timestamp }, j, out);
    }
}

pub(super) fn take_line(
    shape: &Shape,
    pending: &mut multiline::Pending,
    file: &FileContext<'_>,
    line: RawLine<'_>,
    now: Instant,
    out: &mut BatchBuilder,
) {
    match &shape.multiline {
        Some(m) => {
            let text = shape.encoding.decode(line.bytes);
            m.push(pending, &text, line.start, line.end, line.truncated, now, &mut |j| {
                push_joined(shape, file, j, out)
            });
        }
        None if out.deferred => out.push_line(file, &line),
        None => {
            let bytes = (line.end - line.start) as usize;
            let decoded = decode_line(shape, None, line.bytes, line.truncated, file.timestamp);
            let event = make_event(shape, decoded, file.template, line.start, &mut out.failed);
            out.push(file, event, line.end, bytes);
        }
    }
}
