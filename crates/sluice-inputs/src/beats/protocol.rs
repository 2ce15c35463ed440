//! Lumberjack v2 frames, as Beats send them: the decoder of what a client writes and the
//! encoder of the one frame a server writes back (the ACK).
//!
//! Every frame starts with the version byte `'2'` and a type byte; integers are big-endian
//! `u32`s:
//! - `W` window: `count`, the number of events the client will send before it waits for an ACK;
//! - `J` JSON data: `seq`, `len`, then `len` bytes of one JSON document;
//! - `C` compressed: `len`, then `len` bytes of a zlib stream that inflates to further complete
//!   frames (`J`, or `C` again);
//! - `A` ACK (server to client): `seq`, the sequence number of the last event acknowledged.
//!
//! Guarantees: nothing is allocated from a length the client announced before that length has
//! been checked against `max_frame_bytes` (a frame) or `max_window_size` (a window); a
//! compressed frame inflates to at most `max_frame_bytes` in all, nested ones included, and
//! nests at most [`MAX_NESTING`] deep; [`Inflater`] inflates it a step at a time, holding one
//! step, or one data frame when a frame is larger, never the whole block. Version 1 (legacy lumberjack: `D` data frames of
//! key/value pairs) is refused with an error saying so, as soon as its first byte is seen.

use std::ops::Range;

#[cfg(test)]
use bytes::{Bytes, BytesMut};

/// The version byte of every v2 frame.
pub const VERSION: u8 = b'2';
/// How deep compressed frames may nest inside one another.
pub const MAX_NESTING: usize = 4;

/// The bounds a decoder holds a client to.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The largest frame payload (a JSON document, a compressed block) and the most a
    /// compressed frame may inflate to.
    pub max_frame: usize,
    /// The largest window a client may announce.
    pub max_window: u32,
}

/// One frame read off the wire, cut into buffers of its own (for tests).
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    Window(u32),
    Json { seq: u32, payload: Bytes },
    Compressed(Bytes),
}

/// Why a client's bytes cannot be read as Lumberjack v2. The connection is closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error(
        "the client speaks Lumberjack protocol version 1 (frame `1{0}`), which is not supported: \
         use a client that speaks version 2, as every Beat does"
    )]
    Version1(char),
    #[error("unknown protocol version byte 0x{0:02x} (expected '2'): not a Beats/Lumberjack v2 client")]
    Version(u8),
    #[error("unknown frame type 0x{0:02x}")]
    FrameType(u8),
    #[error("the client announced a window of {size} events, more than max_window_size ({max})")]
    WindowTooLarge { size: u32, max: u32 },
    #[error("the client announced a {kind} frame of {len} bytes, more than max_frame_bytes ({max})")]
    FrameTooLarge { kind: &'static str, len: u32, max: usize },
    #[error("a compressed frame is not a valid zlib stream: {0}")]
    Inflate(String),
    #[error("a compressed frame inflates to more than max_frame_bytes ({0})")]
    InflatedTooLarge(usize),
    #[error("a compressed frame ends in the middle of a frame")]
    TruncatedInner,
    #[error("compressed frames are nested more than {MAX_NESTING} deep")]
    TooDeep,
    #[error("a window frame inside a compressed frame")]
    WindowInCompressed,
}

impl ProtocolError {
    /// Whether a limit was exceeded (rather than the bytes being malformed).
    pub fn is_limit(&self) -> bool {
        matches!(
            self,
            ProtocolError::WindowTooLarge { .. }
                | ProtocolError::FrameTooLarge { .. }
                | ProtocolError::InflatedTooLarge(_)
        )
    }
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// One complete frame at the front of a buffer, its parts as places in that buffer: the
/// connection decodes documents where they lie instead of cutting each into a buffer of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameAt {
    Window(u32),
    Json { seq: u32, payload: Range<usize> },
    Compressed(Range<usize>),
}

/// Where a data frame's document is: in the bytes read off the socket (`block: None`) or in
/// the inflated compressed block `blocks[i]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocAt {
    pub seq: u32,
    pub block: Option<usize>,
    pub range: Range<usize>,
}

impl DocAt {
    /// The document's bytes, given the read buffer and the inflated blocks it may point into.
    pub fn bytes<'a>(&self, read: &'a [u8], blocks: &'a [Vec<u8>]) -> &'a [u8] {
        match self.block {
            None => &read[self.range.clone()],
            Some(b) => &blocks[b][self.range.clone()],
        }
    }
}

/// The frame at the front of `buf` and its length in all. `Ok(None)` when `buf` does not hold a
/// whole frame yet; an error as soon as the bytes seen are wrong, without waiting for the rest
/// of the frame.
pub fn parse_frame(buf: &[u8], limits: &Limits) -> Result<Option<(FrameAt, usize)>, ProtocolError> {
    let Some(&version) = buf.first() else { return Ok(None) };
    if version != VERSION {
        if version == b'1' {
            let kind = buf.get(1).map(|&t| t as char).unwrap_or('?');
            return Err(ProtocolError::Version1(if kind.is_ascii_graphic() { kind } else { '?' }));
        }
        return Err(ProtocolError::Version(version));
    }
    let Some(&kind) = buf.get(1) else { return Ok(None) };
    match kind {
        b'W' => {
            if buf.len() < 6 {
                return Ok(None);
            }
            let size = be32(&buf[2..6]);
            if size > limits.max_window {
                return Err(ProtocolError::WindowTooLarge { size, max: limits.max_window });
            }
            Ok(Some((FrameAt::Window(size), 6)))
        }
        b'J' => {
            if buf.len() < 10 {
                return Ok(None);
            }
            let seq = be32(&buf[2..6]);
            let len = be32(&buf[6..10]);
            if len as usize > limits.max_frame {
                return Err(ProtocolError::FrameTooLarge { kind: "JSON data", len, max: limits.max_frame });
            }
            let end = 10 + len as usize;
            if buf.len() < end {
                return Ok(None);
            }
            Ok(Some((FrameAt::Json { seq, payload: 10..end }, end)))
        }
        b'C' => {
            if buf.len() < 6 {
                return Ok(None);
            }
            let len = be32(&buf[2..6]);
            if len as usize > limits.max_frame {
                return Err(ProtocolError::FrameTooLarge { kind: "compressed", len, max: limits.max_frame });
            }
            let end = 6 + len as usize;
            if buf.len() < end {
                return Ok(None);
            }
            Ok(Some((FrameAt::Compressed(6..end), end)))
        }
        other => Err(ProtocolError::FrameType(other)),
    }
}

/// Takes the next complete frame off the front of `buf`, as [`parse_frame`] finds it.
#[cfg(test)]
pub fn next_frame(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Frame>, ProtocolError> {
    let Some((frame, len)) = parse_frame(buf, limits)? else { return Ok(None) };
    let mut whole = buf.split_to(len).freeze();
    Ok(Some(match frame {
        FrameAt::Window(n) => Frame::Window(n),
        FrameAt::Json { seq, payload } => Frame::Json { seq, payload: whole.split_off(payload.start) },
        FrameAt::Compressed(payload) => Frame::Compressed(whole.split_off(payload.start)),
    }))
}

/// How many bytes the frame at the front of `buf` needs in all, once its header is there
/// (for reserving memory before reading a large frame); `None` before that.
pub fn frame_len(buf: &[u8]) -> Option<usize> {
    match (buf.first(), buf.get(1)) {
        (Some(&VERSION), Some(b'J')) if buf.len() >= 10 => Some(10 + be32(&buf[6..10]) as usize),
        (Some(&VERSION), Some(b'C')) if buf.len() >= 6 => Some(6 + be32(&buf[2..6]) as usize),
        _ => None,
    }
}

/// Inflates one compressed frame a step at a time and hands out its data frames in order, a
/// run of complete ones at a time ([`Inflater::next`]): what it holds at once is one step of
/// inflated bytes, or one data frame when a frame is larger than a step, not the whole block.
/// Nested compressed frames are inflated the same way, in place of the frame that holds them.
/// The block inflates to at most `max_frame` bytes in all, nested ones included.
pub struct Inflater {
    /// The block being inflated and the ones nested in it, outermost first.
    levels: Vec<Level>,
    /// Bytes the frame may still inflate to.
    left: usize,
    limits: Limits,
}

struct Level {
    /// The compressed bytes of a nested block; `None` for the outermost, which the caller
    /// passes to each [`Inflater::next`] (it lies in the read buffer).
    input: Option<Vec<u8>>,
    zlib: flate2::Decompress,
    /// Inflated and not yet handed out: complete frames, then the start of an incomplete one.
    out: Vec<u8>,
    ended: bool,
}

impl Level {
    fn new(input: Option<Vec<u8>>) -> Level {
        Level { input, zlib: flate2::Decompress::new(true), out: Vec::new(), ended: false }
    }
}

/// What one [`Inflater::next`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Inflated {
    /// A run of complete data frames; where their documents are was appended to the `docs`
    /// given.
    Block(Vec<u8>),
    /// Inflated more, but no data frame is complete yet: call again.
    More,
    /// The frame is done: every document was handed out.
    Done,
}

impl Inflater {
    pub fn new(limits: &Limits) -> Inflater {
        Inflater { levels: vec![Level::new(None)], left: limits.max_frame, limits: *limits }
    }

    /// The bytes it holds now: inflated bytes not handed out, nested compressed blocks.
    pub fn held(&self) -> usize {
        self.levels.iter().map(|l| l.out.len() + l.input.as_ref().map_or(0, Vec::len)).sum()
    }

    /// The most the next [`Inflater::next`] adds to [`Inflater::held`] (to charge it first).
    pub fn next_needs(&self, step: usize) -> usize {
        self.levels.last().map_or(0, |l| self.want(l, step) + l.out.len())
    }

    /// What one inflating step asks of the zlib stream: `step`, or the rest of the frame whose
    /// header is in, if larger (so that a large frame is inflated into one allocation).
    fn want(&self, level: &Level, step: usize) -> usize {
        let frame = frame_len(&level.out).unwrap_or(0);
        // One byte past the limit tells a stream that goes on from one that ends there.
        step.max(frame.saturating_sub(level.out.len())).min(self.left + 1)
    }

    /// Inflates at most one step ([`Inflater::next_needs`]) and hands out the data frames
    /// completed, their documents pointing into block `block` of the caller's list; `payload`
    /// is the outermost compressed block.
    pub fn next(
        &mut self,
        payload: &[u8],
        step: usize,
        docs: &mut Vec<DocAt>,
        block: usize,
    ) -> Result<Inflated, ProtocolError> {
        loop {
            let depth = self.levels.len();
            let Some(level) = self.levels.last_mut() else { return Ok(Inflated::Done) };
            let mut at = 0;
            let mut nested = None;
            while let Some((frame, len)) = parse_frame(&level.out[at..], &self.limits)? {
                match frame {
                    FrameAt::Window(_) => return Err(ProtocolError::WindowInCompressed),
                    FrameAt::Json { seq, payload } => {
                        docs.push(DocAt { seq, block: Some(block), range: at + payload.start..at + payload.end });
                        at += len;
                    }
                    // The documents before it are handed out first.
                    FrameAt::Compressed(_) if at > 0 => break,
                    FrameAt::Compressed(inner) => {
                        if depth + 1 > MAX_NESTING {
                            return Err(ProtocolError::TooDeep);
                        }
                        nested = Some(level.out[inner].to_vec());
                        level.out.drain(..len);
                        break;
                    }
                }
            }
            if let Some(input) = nested {
                self.levels.push(Level::new(Some(input)));
                continue;
            }
            if at > 0 {
                let rest = level.out[at..].to_vec();
                let mut frames = std::mem::replace(&mut level.out, rest);
                frames.truncate(at);
                return Ok(Inflated::Block(frames));
            }
            if level.ended {
                if !level.out.is_empty() {
                    return Err(ProtocolError::TruncatedInner);
                }
                self.levels.pop();
                continue;
            }
            let want = self.want(self.levels.last().expect("checked"), step);
            let Level { input, zlib, out, ended } = self.levels.last_mut().expect("checked");
            let produced = inflate_step(zlib, out, ended, input.as_deref().unwrap_or(payload), want)?;
            if produced > self.left {
                return Err(ProtocolError::InflatedTooLarge(self.limits.max_frame));
            }
            self.left -= produced;
            return Ok(Inflated::More);
        }
    }
}

/// Inflates up to `want` more bytes of a zlib stream from `input` onto `out`; how many it
/// inflated. `ended` is set once the stream's end marker came.
fn inflate_step(
    zlib: &mut flate2::Decompress,
    out: &mut Vec<u8>,
    ended: &mut bool,
    input: &[u8],
    want: usize,
) -> Result<usize, ProtocolError> {
    let start = out.len();
    out.reserve_exact(want);
    let target = start + want;
    while out.len() < target {
        let (read, wrote) = (zlib.total_in(), out.len());
        let rest = &input[(read as usize).min(input.len())..];
        let status = zlib
            .decompress_vec(rest, out, flate2::FlushDecompress::None)
            .map_err(|e| ProtocolError::Inflate(e.to_string()))?;
        if status == flate2::Status::StreamEnd {
            *ended = true;
            break;
        }
        if zlib.total_in() == read && out.len() == wrote {
            // No progress with room to write: the input ran out before the stream's end.
            return Err(ProtocolError::Inflate("the zlib stream ends before its end marker".to_string()));
        }
    }
    Ok(out.len() - start)
}

/// Inflates a whole compressed frame's payload at once, as [`Inflater`] does a step at a time:
/// each run of data frames becomes an entry of `blocks` and their documents are appended to
/// `out`, in order. Returns how many bytes it inflated (tests and fuzzing).
pub fn expand_compressed(
    payload: &[u8],
    limits: &Limits,
    blocks: &mut Vec<Vec<u8>>,
    out: &mut Vec<DocAt>,
) -> Result<usize, ProtocolError> {
    let mut inflater = Inflater::new(limits);
    let mut inflated = 0;
    loop {
        match inflater.next(payload, 64 << 10, out, blocks.len())? {
            Inflated::Block(b) => {
                inflated += b.len();
                blocks.push(b);
            }
            Inflated::More => {}
            Inflated::Done => return Ok(inflated),
        }
    }
}

/// The ACK frame for `seq`.
pub fn ack(seq: u32) -> [u8; 6] {
    let s = seq.to_be_bytes();
    [VERSION, b'A', s[0], s[1], s[2], s[3]]
}

/// Test support: the frames a client writes.
#[cfg(test)]
pub mod encode {
    use std::io::Write;

    pub fn window(n: u32) -> Vec<u8> {
        let mut v = vec![b'2', b'W'];
        v.extend_from_slice(&n.to_be_bytes());
        v
    }

    pub fn json(seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![b'2', b'J'];
        v.extend_from_slice(&seq.to_be_bytes());
        v.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        v.extend_from_slice(payload);
        v
    }

    pub fn compressed(frames: &[u8]) -> Vec<u8> {
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(frames).unwrap();
        let body = z.finish().unwrap();
        let mut v = vec![b'2', b'C'];
        v.extend_from_slice(&(body.len() as u32).to_be_bytes());
        v.extend_from_slice(&body);
        v
    }
}
