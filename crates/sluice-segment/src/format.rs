//! The segment header and the checksummed frames that follow it.
//!
//! Writing is [`append_frame`] (or [`try_append_frame`] when the body can fail): one contiguous
//! run of bytes per frame appended to a caller-owned buffer, so a batch of frames becomes one
//! `write`. Reading is [`FrameCursor`] over an in-memory buffer: every header and trailer is
//! parsed from that buffer (never one syscall per field), bodies are borrowed, and the only work
//! per frame beyond bounds checks is one CRC32C pass over `len ‖ payload`.
//!
//! Recovery rules (see [`FrameResult`]): a complete frame whose checksum fails is skipped by its
//! own length; a header that cannot be trusted (length out of range, leading and trailing
//! lengths disagree) is skipped by [`resync`], which looks for the next offset where a whole
//! valid frame parses; a tail after which no valid frame parses is torn and reported once.

use crate::buf::ByteBuf;
use crate::crc::{crc32c, crc32c_append};

/// The first 8 bytes of every segment file.
pub const SEGMENT_MAGIC: [u8; 8] = *b"SLQSEG\0\x01";
/// The format version this crate writes and reads.
pub const FORMAT_VERSION: u16 = 1;
/// Size of the segment header; the first frame starts at this offset.
pub const SEGMENT_HEADER_LEN: usize = 64;
/// Header flag bit 0: frame bodies are compressed. Reserved, not written by format version 1.
pub const FLAG_COMPRESSED: u16 = 1;
/// Codec id: each frame body is one event ([`crate::codec::encode_event`]).
pub const CODEC_EVENT: u8 = 1;
/// Codec id: each frame body is a varint count and that many events ([`crate::codec::encode_batch`]).
pub const CODEC_BATCH: u8 = 2;

/// Bytes before the payload: the leading `u32` length.
pub const FRAME_HEADER_LEN: usize = 4;
/// Bytes after the payload: `u32` CRC32C and the trailing `u32` length.
pub const FRAME_TRAILER_LEN: usize = 8;
/// Framing bytes around a payload: leading length, checksum, trailing length.
pub const FRAME_OVERHEAD: usize = FRAME_HEADER_LEN + FRAME_TRAILER_LEN;
/// Every payload starts with its frame's sequence number, so a payload is at least this long.
pub const SEQ_LEN: usize = 8;
/// Largest payload [`append_frame`] writes and [`FrameCursor::new`] accepts: 64 MiB.
pub const DEFAULT_MAX_FRAME_LEN: u32 = 64 << 20;

const HEADER_CRC_AT: usize = SEGMENT_HEADER_LEN - 4;

/// Errors of the segment header and of frame writing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    #[error("segment header needs {SEGMENT_HEADER_LEN} bytes, got {0}")]
    ShortHeader(usize),
    #[error("not a sluice segment: magic is {0:02x?}")]
    BadMagic([u8; 8]),
    #[error("unsupported segment format version {0} (this build reads version {FORMAT_VERSION})")]
    UnsupportedVersion(u16),
    #[error("segment header checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BadChecksum { stored: u32, computed: u32 },
    #[error("frame payload of {len} bytes exceeds the maximum of {max} bytes")]
    FrameTooLarge { len: usize, max: u32 },
}

/// The fixed 64-byte header at the start of every segment file. See the crate docs for the layout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SegmentHeader {
    /// Bit 0 is [`FLAG_COMPRESSED`]; other bits are reserved and written as zero.
    pub flags: u16,
    /// How frame bodies are encoded: [`CODEC_EVENT`], [`CODEC_BATCH`], or a caller's own id.
    pub codec: u8,
    /// The shard (independent segment log) this segment belongs to.
    pub shard: u32,
    /// Sequence number of the first frame written to this segment.
    pub first_seq: u64,
    /// Creation time, nanoseconds since the Unix epoch.
    pub created_unix_nanos: i64,
}

impl SegmentHeader {
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_LEN] {
        let mut h = [0u8; SEGMENT_HEADER_LEN];
        h[0..8].copy_from_slice(&SEGMENT_MAGIC);
        h[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        h[10..12].copy_from_slice(&self.flags.to_le_bytes());
        h[12] = self.codec;
        h[16..20].copy_from_slice(&self.shard.to_le_bytes());
        h[24..32].copy_from_slice(&self.first_seq.to_le_bytes());
        h[32..40].copy_from_slice(&self.created_unix_nanos.to_le_bytes());
        let crc = crc32c(&h[..HEADER_CRC_AT]);
        h[HEADER_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// Parses the first 64 bytes of `bytes`. Checks, in order: length, magic, version, checksum.
    /// Reserved bytes are covered by the checksum but otherwise ignored.
    pub fn decode(bytes: &[u8]) -> Result<SegmentHeader, FormatError> {
        let Some(h) = bytes.first_chunk::<SEGMENT_HEADER_LEN>() else {
            return Err(FormatError::ShortHeader(bytes.len()));
        };
        let magic: [u8; 8] = h[0..8].try_into().expect("8 bytes");
        if magic != SEGMENT_MAGIC {
            return Err(FormatError::BadMagic(magic));
        }
        let version = u16::from_le_bytes([h[8], h[9]]);
        if version != FORMAT_VERSION {
            return Err(FormatError::UnsupportedVersion(version));
        }
        let stored = read_u32(h, HEADER_CRC_AT);
        let computed = crc32c(&h[..HEADER_CRC_AT]);
        if stored != computed {
            return Err(FormatError::BadChecksum { stored, computed });
        }
        Ok(SegmentHeader {
            flags: u16::from_le_bytes([h[10], h[11]]),
            codec: h[12],
            shard: read_u32(h, 16),
            first_seq: read_u64(h, 24),
            created_unix_nanos: read_u64(h, 32) as i64,
        })
    }
}

#[inline(always)]
fn read_u32(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"))
}

#[inline(always)]
fn read_u64(buf: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(buf[at..at + 8].try_into().expect("8 bytes"))
}

/// The frame checksum, for a writer that holds the length and the payload apart (e.g. for
/// `writev`): CRC32C of `len.to_le_bytes() ‖ payload`, without copying.
#[inline]
pub fn frame_checksum(len: u32, payload: &[u8]) -> u32 {
    crc32c_append(crc32c(&len.to_le_bytes()), payload)
}

/// Total bytes a frame with a body of `body_len` bytes takes on disk.
#[inline]
pub const fn frame_size(body_len: usize) -> usize {
    FRAME_OVERHEAD + SEQ_LEN + body_len
}

/// Appends one frame to `out`: `len | seq | body | crc | len`. `body` appends the frame body to
/// the vector it is given (the same `out`, so nothing is copied). Returns the frame's total size.
///
/// If the payload would exceed [`DEFAULT_MAX_FRAME_LEN`], `out` is restored to its previous
/// length and [`FormatError::FrameTooLarge`] is returned.
#[inline]
pub fn append_frame<B: ByteBuf>(out: &mut B, seq: u64, body: impl FnOnce(&mut B)) -> Result<usize, FormatError> {
    try_append_frame(out, seq, |b| {
        body(b);
        Ok::<(), FormatError>(())
    })
}

/// [`append_frame`] for a body that can fail (an encoder). On any error `out` is restored to
/// its previous length, so a failed frame leaves no bytes behind.
#[inline]
pub fn try_append_frame<B: ByteBuf, E: From<FormatError>>(
    out: &mut B,
    seq: u64,
    body: impl FnOnce(&mut B) -> Result<(), E>,
) -> Result<usize, E> {
    let start = out.len();
    out.extend_from_slice(&[0u8; FRAME_HEADER_LEN]);
    out.extend_from_slice(&seq.to_le_bytes());
    if let Err(e) = body(out) {
        out.truncate(start);
        return Err(e);
    }
    let payload_len = out.len() - start - FRAME_HEADER_LEN;
    if payload_len > DEFAULT_MAX_FRAME_LEN as usize {
        out.truncate(start);
        return Err(FormatError::FrameTooLarge { len: payload_len, max: DEFAULT_MAX_FRAME_LEN }.into());
    }
    let len = (payload_len as u32).to_le_bytes();
    out.as_mut_slice()[start..start + FRAME_HEADER_LEN].copy_from_slice(&len);
    // `len ‖ payload` is contiguous in `out`: one CRC pass, no copy.
    let crc = crc32c(&out.as_slice()[start..]);
    let mut trailer = [0u8; FRAME_TRAILER_LEN];
    trailer[..4].copy_from_slice(&crc.to_le_bytes());
    trailer[4..].copy_from_slice(&len);
    out.extend_from_slice(&trailer);
    Ok(out.len() - start)
}

/// Why bytes were not accepted as a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Corruption {
    /// Both lengths agree but the CRC32C of `len ‖ payload` does not match the stored one.
    Checksum { stored: u32, computed: u32 },
    /// The leading and trailing lengths differ.
    LengthMismatch { leading: u32, trailing: u32 },
    /// The length is zero, shorter than a sequence number, or above the maximum frame size.
    LengthOutOfRange(u32),
    /// The frame the length announces runs past the end of the buffer (or fewer than 4 bytes
    /// were left for a length).
    Truncated { len: u32 },
}

/// One step of a frame scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameResult<'a> {
    /// A whole, verified frame at `offset`: its sequence number and codec body.
    Frame { offset: usize, seq: u64, body: &'a [u8] },
    /// A complete frame (both lengths agree, it fits in the buffer) whose checksum fails. The
    /// cursor has skipped exactly this frame (`FRAME_OVERHEAD + len` bytes); count it and go on.
    Corrupt { offset: usize, len: u32, reason: Corruption },
    /// `len` bytes at `offset` are not a frame (bad length, lengths disagree, or a hole), and a
    /// valid frame starts at `offset + len`, where the cursor now is.
    Garbage { offset: usize, len: usize, reason: Corruption },
    /// No frame can be read at `offset`. From [`FrameCursor::next_frame`]: the buffer ends
    /// mid-frame or the length is zero or too short (read more, or at end of file, truncate).
    /// From the iterator: additionally, no valid frame starts anywhere after `offset`, so
    /// everything from `offset` on is a torn or unwritten tail to truncate.
    Torn { offset: usize },
    /// The buffer ends exactly at a frame boundary.
    End,
}

/// A verified frame found by [`frame_ending_at`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameRef<'a> {
    pub offset: usize,
    pub seq: u64,
    pub body: &'a [u8],
}

impl FrameRef<'_> {
    /// Offset just past this frame.
    pub fn end(&self) -> usize {
        self.offset + frame_size(self.body.len())
    }
}

enum Parse<'a> {
    Ok {
        len: u32,
        seq: u64,
        body: &'a [u8],
    },
    /// Complete frame with a bad checksum.
    Corrupt {
        len: u32,
        reason: Corruption,
    },
    /// Unusable header; the frame may be incomplete or the tail unwritten.
    Torn(Corruption),
    /// Untrustworthy header: resynchronise.
    Bad(Corruption),
}

/// Parses the frame at the start of `rest`. Reads the length, then the checksum and the trailing
/// length together from the buffer, then runs one CRC pass.
#[inline(always)]
fn parse(rest: &[u8], max_len: u32) -> Parse<'_> {
    let Some(head) = rest.first_chunk::<FRAME_HEADER_LEN>() else {
        return Parse::Torn(Corruption::Truncated { len: 0 });
    };
    let len = u32::from_le_bytes(*head);
    if (len as usize) < SEQ_LEN {
        return Parse::Torn(Corruption::LengthOutOfRange(len));
    }
    if len > max_len {
        return Parse::Bad(Corruption::LengthOutOfRange(len));
    }
    let covered = FRAME_HEADER_LEN + len as usize;
    let Some(trailer) = rest.get(covered..covered + FRAME_TRAILER_LEN) else {
        return Parse::Torn(Corruption::Truncated { len });
    };
    let stored = read_u32(trailer, 0);
    let trailing = read_u32(trailer, 4);
    if trailing != len {
        return Parse::Bad(Corruption::LengthMismatch { leading: len, trailing });
    }
    let framed = &rest[..covered];
    let computed = crc32c(framed);
    if computed != stored {
        return Parse::Corrupt { len, reason: Corruption::Checksum { stored, computed } };
    }
    Parse::Ok { len, seq: read_u64(framed, FRAME_HEADER_LEN), body: &framed[FRAME_HEADER_LEN + SEQ_LEN..] }
}

/// The first offset at or after `from` where a whole valid frame (length in range, both lengths
/// equal, checksum correct) parses, or `None`. Used to step over garbage without losing the
/// frames after it. Runs of zero bytes are skipped in bulk.
///
/// This is a search, not a proof: a body that itself contains the bytes of a valid frame can be
/// mistaken for one when the frame around it is damaged. Callers check sequence continuity.
pub fn resync(buf: &[u8], from: usize, max_frame_len: u32) -> Option<usize> {
    let mut i = from;
    while i.checked_add(FRAME_OVERHEAD + SEQ_LEN).is_some_and(|end| end <= buf.len()) {
        let len = read_u32(buf, i);
        if len == 0 {
            // A valid length has a non-zero byte, so no frame starts before the first non-zero
            // byte after this run, less 3.
            let nonzero = buf[i + 4..].iter().position(|&b| b != 0)?;
            i = i + 4 + nonzero - 3;
            continue;
        }
        if matches!(parse(&buf[i..], max_frame_len), Parse::Ok { .. }) {
            return Some(i);
        }
        i += 1;
    }
    None
}

/// The verified frame that ends exactly at `end` (exclusive), found through its trailing
/// length: for walking a segment backwards (e.g. to find the last sequence number).
pub fn frame_ending_at(buf: &[u8], end: usize, max_frame_len: u32) -> Option<FrameRef<'_>> {
    let trailing_at = end.checked_sub(4)?;
    let len = read_u32(buf.get(..end)?, trailing_at);
    let start = end.checked_sub(FRAME_OVERHEAD + len as usize)?;
    match parse(&buf[start..end], max_frame_len) {
        Parse::Ok { seq, body, .. } => Some(FrameRef { offset: start, seq, body }),
        _ => None,
    }
}

/// Scans frames in an in-memory buffer, from `start`, with [`DEFAULT_MAX_FRAME_LEN`].
///
/// The returned iterator assumes `buf` holds everything up to the end of the segment: it yields
/// `Frame`, `Corrupt` and `Garbage` items and, if the segment has a torn tail, one final `Torn`.
pub fn scan_frames(buf: &[u8], start: usize) -> FrameCursor<'_> {
    FrameCursor::new(buf, start)
}

/// A position in a buffer of frames. Use [`FrameCursor::next_frame`] to step one frame at a time
/// (e.g. over a buffer that may not hold the whole file yet), or iterate it to recover a whole
/// segment tail.
#[derive(Clone, Debug)]
pub struct FrameCursor<'a> {
    buf: &'a [u8],
    pos: usize,
    max_len: u32,
    finished: bool,
}

impl<'a> FrameCursor<'a> {
    /// A cursor at `start` accepting payloads up to [`DEFAULT_MAX_FRAME_LEN`].
    pub fn new(buf: &'a [u8], start: usize) -> Self {
        Self::with_max_frame_len(buf, start, DEFAULT_MAX_FRAME_LEN)
    }

    /// A cursor at `start` accepting payloads up to `max_frame_len` bytes. A `start` past the
    /// end of `buf` is the end.
    pub fn with_max_frame_len(buf: &'a [u8], start: usize, max_frame_len: u32) -> Self {
        FrameCursor { buf, pos: start.min(buf.len()), max_len: max_frame_len, finished: false }
    }

    /// The offset of the next frame to read.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// The buffer being scanned.
    pub fn buffer(&self) -> &'a [u8] {
        self.buf
    }

    /// Reads the frame at the current position.
    ///
    /// `Frame` and `Corrupt` advance past the frame. A length above the maximum or disagreeing
    /// lengths trigger [`resync`]: `Garbage` if a valid frame follows (the cursor moves there),
    /// `Torn` otherwise. A zero or too-short length, or a frame running past the end of the
    /// buffer, is `Torn` without searching further; `Torn` and `End` do not move the cursor.
    #[inline]
    pub fn next_frame(&mut self) -> FrameResult<'a> {
        self.step().0
    }

    /// One step; the flag tells whether a `Torn` result already searched the rest of the buffer.
    #[inline(always)]
    fn step(&mut self) -> (FrameResult<'a>, bool) {
        let offset = self.pos;
        let rest = &self.buf[offset..];
        if rest.is_empty() {
            return (FrameResult::End, false);
        }
        match parse(rest, self.max_len) {
            Parse::Ok { len, seq, body } => {
                self.pos += FRAME_OVERHEAD + len as usize;
                (FrameResult::Frame { offset, seq, body }, false)
            }
            Parse::Corrupt { len, reason } => {
                self.pos += FRAME_OVERHEAD + len as usize;
                (FrameResult::Corrupt { offset, len, reason }, false)
            }
            Parse::Torn(_) => (FrameResult::Torn { offset }, false),
            Parse::Bad(reason) => (self.skip_garbage(offset, reason), true),
        }
    }

    #[cold]
    fn skip_garbage(&mut self, offset: usize, reason: Corruption) -> FrameResult<'a> {
        match resync(self.buf, offset + 1, self.max_len) {
            Some(next) => {
                self.pos = next;
                FrameResult::Garbage { offset, len: next - offset, reason }
            }
            None => FrameResult::Torn { offset },
        }
    }

    #[cold]
    fn torn_reason(&self) -> Corruption {
        match parse(&self.buf[self.pos..], self.max_len) {
            Parse::Torn(reason) | Parse::Bad(reason) | Parse::Corrupt { reason, .. } => reason,
            Parse::Ok { len, .. } => Corruption::LengthOutOfRange(len),
        }
    }
}

impl<'a> Iterator for FrameCursor<'a> {
    type Item = FrameResult<'a>;

    /// Like [`FrameCursor::next_frame`], for a buffer holding the rest of the segment: a `Torn`
    /// header is first checked with [`resync`]; if valid frames follow it is `Garbage` and the
    /// scan goes on, otherwise the final item is `Torn`. `End` ends the iteration.
    #[inline]
    fn next(&mut self) -> Option<FrameResult<'a>> {
        if self.finished {
            return None;
        }
        match self.step() {
            (FrameResult::End, _) => {
                self.finished = true;
                None
            }
            (FrameResult::Torn { offset }, searched) => {
                let next = if searched { None } else { resync(self.buf, offset + 1, self.max_len) };
                match next {
                    Some(next) => {
                        let reason = self.torn_reason();
                        self.pos = next;
                        Some(FrameResult::Garbage { offset, len: next - offset, reason })
                    }
                    None => {
                        self.finished = true;
                        Some(FrameResult::Torn { offset })
                    }
                }
            }
            (item, _) => Some(item),
        }
    }
}

impl std::iter::FusedIterator for FrameCursor<'_> {}

#[cfg(test)]
mod tests {
    use super::*;

    use sluice_testkit::Rng;

    fn header() -> SegmentHeader {
        SegmentHeader { flags: 0, codec: CODEC_BATCH, shard: 3, first_seq: 1_000, created_unix_nanos: -42 }
    }

    /// A written frame: offset, end, sequence number, body.
    type Written = (usize, usize, u64, Vec<u8>);

    /// A segment: header, then `n` frames with bodies of varied length.
    fn segment(n: usize, rng: &mut Rng) -> (Vec<u8>, Vec<Written>) {
        let mut buf = header().encode().to_vec();
        let mut frames = Vec::new();
        for i in 0..n {
            let body: Vec<u8> = (0..rng.index(90)).map(|_| (rng.next_u64() % 251) as u8).collect();
            let offset = buf.len();
            let seq = 1_000 + i as u64;
            append_frame(&mut buf, seq, |b| b.extend_from_slice(&body)).unwrap();
            frames.push((offset, buf.len(), seq, body));
        }
        (buf, frames)
    }

    fn good_frames(buf: &[u8], start: usize) -> Vec<(usize, u64, Vec<u8>)> {
        scan_frames(buf, start)
            .filter_map(|r| match r {
                FrameResult::Frame { offset, seq, body } => Some((offset, seq, body.to_vec())),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn header_round_trips_and_is_64_bytes() {
        let h = header();
        let bytes = h.encode();
        assert_eq!(bytes.len(), 64);
        assert_eq!(&bytes[..8], b"SLQSEG\0\x01");
        assert_eq!(&bytes[8..10], &[1, 0]);
        assert_eq!(bytes[12], CODEC_BATCH);
        assert!(bytes[40..60].iter().all(|&b| b == 0));
        assert_eq!(u32::from_le_bytes(bytes[60..].try_into().unwrap()), crc32c(&bytes[..60]));
        assert_eq!(SegmentHeader::decode(&bytes), Ok(h));
        // Trailing bytes after the header are not the header's business.
        let mut longer = bytes.to_vec();
        longer.extend_from_slice(b"frames");
        assert_eq!(SegmentHeader::decode(&longer), Ok(h));
    }

    #[test]
    fn header_errors_are_distinct() {
        let good = header().encode();
        assert_eq!(SegmentHeader::decode(&good[..63]), Err(FormatError::ShortHeader(63)));
        let mut bad = good;
        bad[0] = b'X';
        assert!(matches!(SegmentHeader::decode(&bad), Err(FormatError::BadMagic(_))));
        let mut bad = good;
        bad[8] = 2;
        assert_eq!(SegmentHeader::decode(&bad), Err(FormatError::UnsupportedVersion(2)));
        for at in [10, 12, 16, 24, 33, 45, 61] {
            let mut bad = good;
            bad[at] ^= 0x10;
            assert!(matches!(SegmentHeader::decode(&bad), Err(FormatError::BadChecksum { .. })), "byte {at}");
        }
    }

    #[test]
    fn frame_layout_is_exact() {
        let mut out = vec![0xAA];
        let n = append_frame(&mut out, 0x0102_0304_0506_0708, |b| b.extend_from_slice(b"hello")).unwrap();
        assert_eq!(n, 12 + 8 + 5);
        assert_eq!(n, frame_size(5));
        let f = &out[1..];
        assert_eq!(&f[0..4], &13u32.to_le_bytes());
        assert_eq!(&f[4..12], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(&f[12..17], b"hello");
        assert_eq!(read_u32(f, 17), crc32c(&f[..17]));
        assert_eq!(read_u32(f, 17), frame_checksum(13, &f[4..17]));
        assert_eq!(&f[21..25], &13u32.to_le_bytes());
    }

    #[test]
    fn frames_round_trip_forwards_and_backwards() {
        let mut rng = Rng::with_seed(7);
        let (buf, frames) = segment(50, &mut rng);
        let got = good_frames(&buf, SEGMENT_HEADER_LEN);
        assert_eq!(got, frames.iter().map(|(o, _, s, b)| (*o, *s, b.clone())).collect::<Vec<_>>());
        let mut cursor = FrameCursor::new(&buf, SEGMENT_HEADER_LEN);
        for _ in 0..50 {
            assert!(matches!(cursor.next_frame(), FrameResult::Frame { .. }));
        }
        assert_eq!(cursor.next_frame(), FrameResult::End);
        assert_eq!(cursor.position(), buf.len());
        // Backwards through the trailing lengths.
        let mut end = buf.len();
        for (offset, _, seq, body) in frames.iter().rev() {
            let f = frame_ending_at(&buf, end, DEFAULT_MAX_FRAME_LEN).unwrap();
            assert_eq!((f.offset, f.seq, f.body), (*offset, *seq, &body[..]));
            assert_eq!(f.end(), end);
            end = f.offset;
        }
        assert_eq!(end, SEGMENT_HEADER_LEN);
        assert_eq!(frame_ending_at(&buf, end, DEFAULT_MAX_FRAME_LEN), None);
        assert_eq!(frame_ending_at(&buf, buf.len() + 1, DEFAULT_MAX_FRAME_LEN), None);
    }

    #[test]
    fn bad_checksum_skips_exactly_one_frame() {
        let mut rng = Rng::with_seed(11);
        let (mut buf, frames) = segment(5, &mut rng);
        let (o, e, ..) = frames[2];
        buf[o + 6] ^= 1; // inside the sequence number
        let items: Vec<_> = scan_frames(&buf, SEGMENT_HEADER_LEN).collect();
        assert_eq!(items.len(), 5);
        assert!(matches!(items[2], FrameResult::Corrupt { offset, len, reason: Corruption::Checksum { .. } }
            if offset == o && FRAME_OVERHEAD + len as usize == e - o));
        assert_eq!(good_frames(&buf, SEGMENT_HEADER_LEN).len(), 4);
    }

    #[test]
    fn torn_tail_at_every_cut() {
        let mut rng = Rng::with_seed(3);
        let (buf, frames) = segment(4, &mut rng);
        let (last, ..) = frames[3];
        for cut in last + 1..buf.len() {
            let items: Vec<_> = scan_frames(&buf[..cut], SEGMENT_HEADER_LEN).collect();
            assert_eq!(items.len(), 4, "cut {cut}");
            assert_eq!(items[3], FrameResult::Torn { offset: last }, "cut {cut}");
            let mut cursor = FrameCursor::new(&buf[..cut], last);
            assert_eq!(cursor.next_frame(), FrameResult::Torn { offset: last });
            assert_eq!(cursor.next_frame(), FrameResult::Torn { offset: last });
            assert_eq!(cursor.position(), last);
        }
        assert_eq!(scan_frames(&buf[..last], SEGMENT_HEADER_LEN).count(), 3);
    }

    #[test]
    fn zero_filled_preallocation_is_a_torn_tail() {
        let mut rng = Rng::with_seed(5);
        let (mut buf, frames) = segment(3, &mut rng);
        let end = buf.len();
        buf.resize(end + (1 << 20), 0);
        let items: Vec<_> = scan_frames(&buf, SEGMENT_HEADER_LEN).collect();
        assert_eq!(items.len(), 4);
        assert_eq!(items[3], FrameResult::Torn { offset: frames[2].1 });
    }

    #[test]
    fn recycled_segment_shows_stale_frames_by_sequence() {
        // Old frames (seq 1..) overwritten at the start by newer frames (seq 100..) and a torn one.
        let mut old = Vec::new();
        for s in 1..=20 {
            append_frame(&mut old, s, |b| b.extend_from_slice(&[b'o'; 40])).unwrap();
        }
        let mut new = Vec::new();
        for s in 100..103 {
            append_frame(&mut new, s, |b| b.extend_from_slice(&[b'n'; 70])).unwrap();
        }
        let torn_at = new.len();
        append_frame(&mut new, 103, |b| b.extend_from_slice(&[b'n'; 70])).unwrap();
        new.truncate(new.len() - 30);
        let mut buf = old.clone();
        buf[..new.len()].copy_from_slice(&new);
        let items: Vec<_> = scan_frames(&buf, 0).collect();
        let seqs: Vec<u64> = items
            .iter()
            .filter_map(|r| if let FrameResult::Frame { seq, .. } = r { Some(*seq) } else { None })
            .collect();
        // The fresh frames, then stale ones the caller recognises by their lower sequence.
        assert_eq!(&seqs[..3], &[100, 101, 102]);
        assert!(seqs[3..].iter().all(|&s| s < 100));
        assert!(!seqs[3..].is_empty());
        assert!(items.iter().any(|r| matches!(r, FrameResult::Garbage { offset, .. } | FrameResult::Corrupt { offset, .. } if *offset == torn_at)));
    }

    #[test]
    fn oversized_and_mismatched_lengths_resync() {
        let mut rng = Rng::with_seed(9);
        let (buf, frames) = segment(6, &mut rng);
        let (o1, e1, ..) = frames[1];
        let mut bad = buf.clone();
        bad[o1..o1 + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let items: Vec<_> = scan_frames(&bad, SEGMENT_HEADER_LEN).collect();
        assert_eq!(
            items[1],
            FrameResult::Garbage { offset: o1, len: e1 - o1, reason: Corruption::LengthOutOfRange(u32::MAX) }
        );
        assert_eq!(good_frames(&bad, SEGMENT_HEADER_LEN).len(), 5);

        let mut bad = buf.clone();
        bad[e1 - 1] ^= 0x40; // trailing length
        let items: Vec<_> = scan_frames(&bad, SEGMENT_HEADER_LEN).collect();
        assert!(matches!(items[1], FrameResult::Garbage { offset, len, reason: Corruption::LengthMismatch { .. } }
            if offset == o1 && len == e1 - o1));
        assert_eq!(good_frames(&bad, SEGMENT_HEADER_LEN).len(), 5);

        // Junk inserted between frames.
        let mut junk = buf[..e1].to_vec();
        junk.extend_from_slice(b"\x07\x00\x00 this is not a frame at all \xff\xfe");
        junk.extend_from_slice(&buf[e1..]);
        assert_eq!(good_frames(&junk, SEGMENT_HEADER_LEN).len(), 6);

        // A small maximum turns long frames into garbage, but short ones still parse.
        let mut small = Vec::new();
        append_frame(&mut small, 1, |b| b.extend_from_slice(&[1; 100])).unwrap();
        append_frame(&mut small, 2, |b| b.extend_from_slice(&[2; 10])).unwrap();
        let items: Vec<_> = FrameCursor::with_max_frame_len(&small, 0, 64).collect();
        assert!(matches!(items[0], FrameResult::Garbage { offset: 0, len: 120, .. }));
        assert!(matches!(items[1], FrameResult::Frame { seq: 2, .. }));
        assert_eq!(resync(&small, 0, 64), Some(120));
        assert_eq!(resync(&small, 121, 64), None);
        assert_eq!(resync(&small, usize::MAX, 64), None);
    }

    #[test]
    fn oversized_frames_are_refused_and_rolled_back() {
        let max = DEFAULT_MAX_FRAME_LEN as usize;
        let mut out = b"keep".to_vec();
        // The largest payload is accepted and reads back.
        append_frame(&mut out, 1, |b| b.resize(b.len() + max - SEQ_LEN, 7)).unwrap();
        assert!(
            matches!(FrameCursor::new(&out, 4).next_frame(), FrameResult::Frame { seq: 1, body, .. } if body.len() == max - SEQ_LEN)
        );
        out.truncate(4);
        let err = append_frame(&mut out, 1, |b| b.resize(b.len() + max - SEQ_LEN + 1, 0)).unwrap_err();
        assert_eq!(
            err,
            FormatError::FrameTooLarge { len: DEFAULT_MAX_FRAME_LEN as usize + 1, max: DEFAULT_MAX_FRAME_LEN }
        );
        assert_eq!(out, b"keep");
        let err = try_append_frame(&mut out, 1, |b| {
            b.push(1);
            Err(FormatError::ShortHeader(0))
        })
        .unwrap_err();
        assert_eq!(err, FormatError::ShortHeader(0));
        assert_eq!(out, b"keep");
    }

    /// Every item is well-formed and the scan ends; returns the frames.
    fn checked_scan(buf: &[u8], start: usize, max: u32) -> Vec<(usize, u64, Vec<u8>)> {
        let mut frames = Vec::new();
        let mut last = None;
        let mut torn = false;
        for item in FrameCursor::with_max_frame_len(buf, start, max) {
            assert!(!torn, "nothing after Torn");
            let offset = match item {
                FrameResult::Frame { offset, seq, body } => {
                    frames.push((offset, seq, body.to_vec()));
                    offset
                }
                FrameResult::Corrupt { offset, len, .. } => {
                    assert!(offset + FRAME_OVERHEAD + len as usize <= buf.len());
                    offset
                }
                FrameResult::Garbage { offset, len, .. } => {
                    assert!(len > 0 && offset + len <= buf.len());
                    offset
                }
                FrameResult::Torn { offset } => {
                    torn = true;
                    offset
                }
                FrameResult::End => panic!("the iterator does not yield End"),
            };
            assert!(last.is_none_or(|l| offset > l));
            last = Some(offset);
        }
        // The step-by-step API never panics either.
        let mut cursor = FrameCursor::with_max_frame_len(buf, start, max);
        for _ in 0..=buf.len() {
            match cursor.next_frame() {
                FrameResult::End | FrameResult::Torn { .. } => break,
                _ => {}
            }
        }
        frames
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut rng = Rng::with_seed(0x9E37_79B9_7F4A_7C15);
        for round in 0..2_000 {
            let len = rng.index(600);
            let mut buf: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            if round % 3 == 0 {
                // Plausible small lengths make the parser go further.
                for chunk in buf.chunks_mut(37) {
                    if chunk.len() >= 4 {
                        chunk[..4].copy_from_slice(&(rng.index(64) as u32).to_le_bytes());
                    }
                }
            }
            let start = rng.index(len + 2);
            checked_scan(&buf, start, 1 + rng.index(128) as u32);
            checked_scan(&buf, start, DEFAULT_MAX_FRAME_LEN);
            let _ = resync(&buf, start, 64);
            let _ = frame_ending_at(&buf, start, 64);
            let _ = SegmentHeader::decode(&buf);
        }
    }

    #[test]
    fn every_single_byte_flip_keeps_every_untouched_frame() {
        let mut rng = Rng::with_seed(0xDEAD_BEEF);
        let (buf, frames) = segment(30, &mut rng);
        for at in SEGMENT_HEADER_LEN..buf.len() {
            let mut bad = buf.clone();
            bad[at] ^= 1 + rng.index(255) as u8;
            let got = checked_scan(&bad, SEGMENT_HEADER_LEN, DEFAULT_MAX_FRAME_LEN);
            let want: Vec<_> = frames
                .iter()
                .filter(|(o, e, ..)| !(*o..*e).contains(&at))
                .map(|(o, _, s, b)| (*o, *s, b.clone()))
                .collect();
            assert_eq!(got, want, "flip at {at}");
        }
    }

    #[test]
    fn scattered_flips_keep_untouched_frames() {
        let mut rng = Rng::with_seed(12345);
        let (buf, frames) = segment(40, &mut rng);
        for _ in 0..500 {
            let mut bad = buf.clone();
            let hits: Vec<usize> =
                (0..1 + rng.index(4)).map(|_| SEGMENT_HEADER_LEN + rng.index(buf.len() - 64)).collect();
            for &at in &hits {
                bad[at] ^= 1 + rng.index(255) as u8;
            }
            let got = checked_scan(&bad, SEGMENT_HEADER_LEN, DEFAULT_MAX_FRAME_LEN);
            for (o, e, s, b) in &frames {
                if !hits.iter().any(|h| (*o..*e).contains(h)) {
                    assert!(got.contains(&(*o, *s, b.clone())), "lost frame at {o} with flips at {hits:?}");
                }
            }
        }
    }
}
