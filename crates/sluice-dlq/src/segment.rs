//! Reading one segment file frame by frame through a bounded buffer, and recovering a segment a
//! crash left open.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

use sluice_segment::{
    DEFAULT_MAX_FRAME_LEN, FRAME_OVERHEAD, FrameCursor, FrameResult, SEGMENT_HEADER_LEN, SegmentHeader, resync,
};

use sluice_segment::files::read_at_most;

use crate::CODEC_DEAD_LETTER;
use crate::entry::entry_time;
use crate::naming::Summary;

/// Bytes read from a segment at a time (more when one frame is larger).
const CHUNK: usize = 1 << 20;

/// What the next read of a segment found.
#[derive(Debug)]
pub(crate) enum Next<'a> {
    /// A whole, verified frame of this segment, ending at `end`.
    Frame { offset: u64, end: u64, body: &'a [u8] },
    /// Damage at `offset`; reading goes on at `next`.
    Damaged { offset: u64, next: u64, reason: String },
    /// No whole frame at `offset` before the readable end: a frame still being written, or a
    /// torn tail.
    Torn { offset: u64 },
    /// The readable end, at a frame boundary.
    End,
}

/// What a segment's header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HeaderState {
    Ok,
    /// Not all 64 bytes are there (being created, or cut).
    Short,
    /// Damaged, or not a dead letter segment of this id.
    Bad(String),
}

/// A segment file being read.
pub(crate) struct SegmentFile {
    pub id: u64,
    file: File,
    buf: Vec<u8>,
    /// File offset of `buf[0]`.
    buf_at: u64,
    /// File offset of the next frame.
    pub pos: u64,
    /// The last read stopped at the end of the file (before the limit it was asked for).
    eof: bool,
}

/// Checks a segment header: ours, and for this segment.
pub(crate) fn check_header(bytes: &[u8], id: u64) -> Result<SegmentHeader, String> {
    let h = SegmentHeader::decode(bytes).map_err(|e| e.to_string())?;
    if h.codec != CODEC_DEAD_LETTER {
        return Err(format!("codec id {} is not a dead letter segment's ({CODEC_DEAD_LETTER})", h.codec));
    }
    if h.first_seq >> 32 != id {
        return Err(format!("header belongs to segment {}, not {id}", h.first_seq >> 32));
    }
    Ok(h)
}

impl SegmentFile {
    /// Opens a segment and checks its header. A damaged header does not stop reading: every
    /// frame proves itself by its checksum and by a sequence number of this segment.
    pub fn open(path: &Path, id: u64, pos: u64) -> io::Result<(SegmentFile, HeaderState)> {
        let file = File::open(path)?;
        let mut header = [0u8; SEGMENT_HEADER_LEN];
        let n = read_at_most(&file, &mut header, 0)?;
        let state = if n < SEGMENT_HEADER_LEN {
            HeaderState::Short
        } else {
            match check_header(&header, id) {
                Ok(_) => HeaderState::Ok,
                Err(reason) => HeaderState::Bad(reason),
            }
        };
        let pos = pos.max(SEGMENT_HEADER_LEN as u64);
        Ok((SegmentFile { id, file, buf: Vec::new(), buf_at: pos, pos, eof: false }, state))
    }

    /// The file's current length (for a reader with no writer to ask).
    pub fn file_len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    /// Reads the frame at `pos`, looking no further than `limit` (the readable length). A frame
    /// is returned only whole and verified, and only if its sequence number belongs to this
    /// segment; everything else is `Damaged` (with where to go on) or, when nothing valid
    /// follows before `limit`, `Torn`.
    pub fn next(&mut self, limit: u64) -> io::Result<Next<'_>> {
        if self.pos >= limit {
            return Ok(Next::End);
        }
        if self.pos < self.buf_at || self.pos >= self.buf_at + self.buf.len() as u64 {
            self.fill(limit, CHUNK)?;
        }
        loop {
            let rel = (self.pos - self.buf_at) as usize;
            // A file shorter than the limit (cut by hand) ends the search too.
            let reaches_limit = self.eof || self.buf_at + self.buf.len() as u64 >= limit;
            let offset = self.pos;
            let mut cursor = FrameCursor::new(&self.buf, rel);
            match cursor.next_frame() {
                FrameResult::Frame { seq, .. } if seq >> 32 != self.id => {
                    let next = cursor.position() as u64 + self.buf_at;
                    self.pos = next;
                    let reason = format!("frame sequence {seq:#x} belongs to segment {}, not {}", seq >> 32, self.id);
                    return Ok(Next::Damaged { offset, next, reason });
                }
                FrameResult::Frame { .. } => {
                    let end_rel = cursor.position();
                    let end = end_rel as u64 + self.buf_at;
                    self.pos = end;
                    // The body is `len | seq |` after the frame's start and `| crc | len` before its end.
                    let body = &self.buf[rel + 12..end_rel - 8];
                    return Ok(Next::Frame { offset, end, body });
                }
                FrameResult::Corrupt { reason, .. } | FrameResult::Garbage { reason, .. } => {
                    let next = cursor.position() as u64 + self.buf_at;
                    self.pos = next;
                    return Ok(Next::Damaged { offset, next, reason: format!("{reason:?}") });
                }
                FrameResult::End => return Ok(Next::End),
                FrameResult::Torn { .. } if !reaches_limit => {
                    // The frame (or the next valid one) may lie beyond the buffer: read more.
                    let len = self.buf.get(rel..rel + 4).map_or(0, |b| u32::from_le_bytes(b.try_into().expect("4")));
                    let frame = if len <= DEFAULT_MAX_FRAME_LEN { len as usize + FRAME_OVERHEAD } else { 0 };
                    let want = (self.buf.len() - rel).saturating_mul(2).max(frame).max(CHUNK);
                    self.fill(limit, want)?;
                }
                FrameResult::Torn { .. } => {
                    return Ok(match resync(&self.buf, rel + 1, DEFAULT_MAX_FRAME_LEN) {
                        Some(next_rel) => {
                            let next = next_rel as u64 + self.buf_at;
                            self.pos = next;
                            Next::Damaged { offset, next, reason: "unreadable frame header".into() }
                        }
                        None => Next::Torn { offset },
                    });
                }
            }
        }
    }

    /// Makes `buf` hold at least `want` bytes from `pos` (or up to `limit`).
    fn fill(&mut self, limit: u64, want: usize) -> io::Result<()> {
        let have_end = self.buf_at + self.buf.len() as u64;
        let want_end = (self.pos + want as u64).min(limit);
        if self.pos >= self.buf_at && want_end <= have_end {
            return Ok(());
        }
        self.eof = false;
        if self.pos >= self.buf_at && self.pos < have_end && want_end > have_end {
            // Keep what is already read from `pos` on, and read the rest after it.
            self.buf.drain(..(self.pos - self.buf_at) as usize);
        } else {
            self.buf.clear();
        }
        self.buf_at = self.pos;
        let start = self.buf.len();
        let target = (want_end - self.pos) as usize;
        self.buf.resize(target, 0);
        let n = read_at_most(&self.file, &mut self.buf[start..], self.pos + start as u64)?;
        self.eof = start + n < target;
        self.buf.truncate(start + n);
        Ok(())
    }
}

/// What scanning a segment found.
#[derive(Debug, Default)]
pub(crate) struct Scanned {
    /// The summary of the valid prefix; `entries == 0` if none.
    pub summary: Option<Summary>,
    /// Length of the valid prefix (frames, damaged ones included, before a torn tail).
    pub valid_len: u64,
    pub file_len: u64,
    /// Damaged frames (with their offsets and reasons) before the tail.
    pub damaged: Vec<(u64, String)>,
    /// Why the header is unusable, if it is.
    pub bad_header: Option<String>,
}

/// Reads a whole segment and summarises it: entries, oldest and newest times, the valid length.
/// Nothing is changed on disk.
pub(crate) fn scan(path: &Path, id: u64) -> io::Result<Scanned> {
    let file = File::open(path)?;
    let file_len = file.metadata()?.len();
    let mut out = Scanned { file_len, valid_len: SEGMENT_HEADER_LEN as u64, ..Default::default() };
    let (mut seg, header) = SegmentFile::open(path, id, 0)?;
    match header {
        HeaderState::Ok => {}
        HeaderState::Short => out.bad_header = Some(format!("the file has {file_len} bytes, less than a header")),
        HeaderState::Bad(reason) => out.bad_header = Some(reason),
    }
    if let Some(reason) = &out.bad_header {
        out.damaged.push((0, format!("segment header: {reason}")));
    }
    let mut summary = Summary { entries: 0, bytes: 0, oldest: i64::MAX, newest: i64::MIN };
    loop {
        match seg.next(file_len)? {
            Next::Frame { end, body, offset } => match entry_time(body) {
                Some(t) => {
                    summary.entries += 1;
                    summary.oldest = summary.oldest.min(t);
                    summary.newest = summary.newest.max(t);
                    out.valid_len = end;
                }
                None => {
                    out.damaged.push((offset, "entry body shorter than its time".into()));
                    out.valid_len = end;
                }
            },
            Next::Damaged { offset, next, reason } => {
                out.damaged.push((offset, reason));
                out.valid_len = next;
            }
            Next::Torn { .. } | Next::End => break,
        }
    }
    summary.bytes = out.valid_len;
    out.summary = (summary.entries > 0).then_some(summary);
    Ok(out)
}

/// Cuts a segment file to `len` and makes that durable.
pub(crate) fn truncate(path: &Path, len: u64) -> io::Result<()> {
    let f = OpenOptions::new().write(true).open(path)?;
    f.set_len(len)?;
    f.sync_all()
}
