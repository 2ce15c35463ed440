//! A shard's read cache: the last window read back from a segment, the open handle of that
//! segment, and the buffers windows are read into (with `O_DIRECT` where the filesystem takes
//! it, see `direct.rs`). Guarantees: consecutive pieces of one segment cost one read; a window
//! read through the page cache is never written again while events point into it; the handle
//! of a segment that is deleted is closed at once (`Shard::close_segment`).

use std::fs::{File, OpenOptions};
use std::io::{self, ErrorKind};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

use sluice_core::{SharedText, TextPool};
use sluice_segment::EventDecoder;

use super::direct::{AlignedBuf, BLOCK};
use super::shard::{READ_WINDOW, segment_path};

/// Read buffers a shard keeps for reuse, and the largest it keeps.
const READ_BUFFERS_KEPT: usize = 4;
const READ_BUFFER_LARGEST: usize = 2 * READ_WINDOW;

pub(super) struct ReadCache {
    pub(super) segment: u64,
    /// File offset of the first valid byte; `len` bytes are valid.
    start: u64,
    len: usize,
    /// The last window read through the page cache. Events decoded from it point into it
    /// (their long strings are slices of it), so it is never written again: the next window
    /// goes to another buffer, and this one returns to `pool` when its last event is gone.
    pub(super) text: Option<SharedText>,
    pool: Arc<TextPool>,
    /// Reads with `O_DIRECT` into `aligned` (see `direct.rs` for why); off after the
    /// filesystem refuses one. Events from it are copies: the buffer is reused.
    direct: bool,
    aligned: AlignedBuf,
    pub(super) file: Option<(u64, File)>,
    /// Remembers the previous event's root keys, so they are not checked and built again.
    decoder: EventDecoder,
}

/// A window of a segment, as [`ReadCache::fill`] gives it.
pub(super) struct Window<'a> {
    pub(super) bytes: &'a [u8],
    /// The buffer `bytes` lies in, when strings may point into it.
    pub(super) text: Option<SharedText>,
    pub(super) decoder: &'a mut EventDecoder,
}

impl ReadCache {
    pub(super) fn new(direct: bool) -> ReadCache {
        ReadCache {
            segment: u64::MAX,
            start: 0,
            len: 0,
            text: None,
            pool: TextPool::new(READ_BUFFERS_KEPT, READ_BUFFER_LARGEST),
            direct,
            aligned: AlignedBuf::default(),
            file: None,
            decoder: EventDecoder::new(),
        }
    }

    /// Makes `[from, from + want)` of the segment available (`want` capped by the caller).
    pub(super) fn fill(&mut self, dir: &Path, segment: u64, from: u64, want: usize) -> io::Result<Window<'_>> {
        let cached =
            self.segment == segment && self.start <= from && from + want as u64 <= self.start + self.len as u64;
        if !cached {
            if self.file.as_ref().is_none_or(|(id, _)| *id != segment) {
                self.file = None;
                let path = segment_path(dir, segment);
                if self.direct {
                    match OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&path) {
                        Ok(f) => self.file = Some((segment, f)),
                        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => self.direct = false,
                        Err(e) => return Err(e),
                    }
                }
                if self.file.is_none() {
                    self.file = Some((segment, File::open(path)?));
                }
            }
            self.segment = u64::MAX;
            self.text = None;
            let (_, file) = self.file.as_ref().expect("opened above");
            if self.direct {
                match read_direct(file, &mut self.aligned, from, want) {
                    Ok((start, len)) => (self.start, self.len) = (start, len),
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                        // Opened but not readable directly: buffered from now on.
                        self.direct = false;
                        self.file = None;
                        return self.fill(dir, segment, from, want);
                    }
                    Err(e) => return Err(e),
                }
            } else {
                let mut bytes = self.pool.take(want);
                read_exact_into(file, &mut bytes, want, from)?;
                self.text = Some(SharedText::pooled_records(bytes, &self.pool));
                (self.start, self.len) = (from, want);
            }
            self.segment = segment;
        }
        let at = (from - self.start) as usize;
        let decoder = &mut self.decoder;
        match &self.text {
            Some(text) => Ok(Window { bytes: &text.as_bytes()[at..at + want], text: Some(text.clone()), decoder }),
            None => Ok(Window { bytes: &self.aligned.filled(self.len)[at..at + want], text: None, decoder }),
        }
    }
}

/// Reads exactly `want` bytes at `offset` into the spare capacity of the empty `bytes`,
/// without zeroing it first (a window is megabytes, read many times a second).
fn read_exact_into(file: &File, bytes: &mut Vec<u8>, want: usize, offset: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    debug_assert!(bytes.is_empty());
    bytes.reserve(want);
    while bytes.len() < want {
        let got = bytes.len();
        // SAFETY: pread writes at most `want - got` bytes into the spare capacity reserved
        // above, and only the bytes it reports are then counted as initialised.
        let n = unsafe {
            libc::pread(
                file.as_raw_fd(),
                bytes.as_mut_ptr().add(got).cast(),
                want - got,
                (offset + got as u64) as libc::off_t,
            )
        };
        match n {
            0 => return Err(io::Error::new(ErrorKind::UnexpectedEof, "segment shorter than its recorded length")),
            n if n < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() != ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            // SAFETY: the `n` bytes after `got` were just written by pread.
            n => unsafe { bytes.set_len(got + n as usize) },
        }
    }
    Ok(())
}

/// Reads `[from, from + want)` with block-aligned offset and length into `buf`; returns the
/// file offset of `buf`'s first byte and how many bytes from there hold what was asked for.
/// Bytes past `from + want` were read too but are not reported: the writer may not have
/// written them yet.
fn read_direct(file: &File, buf: &mut AlignedBuf, from: u64, want: usize) -> io::Result<(u64, usize)> {
    let start = from & !(BLOCK as u64 - 1);
    let need = (from - start) as usize + want;
    let len = need.next_multiple_of(BLOCK);
    let out = buf.slice(len)?;
    let mut got = 0;
    while got < need {
        let n = file.read_at(&mut out[got..len], start + got as u64)?;
        // Only the end of the file gives a short read; anything else cannot continue aligned.
        if n == 0 || (got + n < need && (got + n) % BLOCK != 0) {
            return Err(io::Error::new(ErrorKind::UnexpectedEof, "segment shorter than its recorded length"));
        }
        got += n;
    }
    Ok((start, need))
}
