//! The wire format between nodes: checksummed frames over one persistent connection per peer.
//!
//! ```text
//! frame   = magic "SLCF" (4) | kind (1) | flags (1) | reserved 0 (2) | length (u32 LE) | crc32c of payload (u32 LE) | payload
//! HELLO   = version (u16 LE) | cluster name (str) | node name (str) | link epoch (u64 LE)   client → server, first frame
//! WELCOME = node name (str)                                                  server → client
//! REFUSE  = reason (str)                                                     either side, then the connection closes
//! BATCH   = seq (u64 LE) | low (u64 LE) | ring (u64 LE) | pipeline (str) | events (u32 LE) | body   client → server
//! ACK     = seq (u64 LE) | status (1: 0 taken, 1 not taken: retry, 2 not taken: the node is stopping) | reason (str)   server → client
//! str     = length (varint) | UTF-8 bytes
//! ```
//! A link's `epoch` is drawn at random when the link is made, and `seq` numbers its batches;
//! `low` is the lowest seq the sender still waits an answer for. The receiver remembers, per
//! sender and epoch, the batches it has taken above `low`: a batch sent again (after a lost
//! connection or a timeout) is answered, not taken twice.
//!
//! A node with `cluster.tls` answers a plain HELLO (no TLS) with a plain REFUSE saying so, and
//! a node without it reads a TLS record where a frame should be as "the peer speaks TLS".
//!
//! `ring` is the fingerprint of the ring the sender routed the batch with: a receiver whose ring
//! has the same one owns every event of it and need not look again.
//!
//! A batch body is one or more `sluice_segment` batch encodings back to back (the persisted
//! queue's event codec), LZ4-compressed when the `COMPRESSED` flag is set. A frame whose
//! checksum does not match, or that is longer than [`MAX_PAYLOAD`], ends the connection: the
//! sender resends everything not acknowledged on its next connection.

use sluice_core::Event;
use sluice_segment::codec;
use tokio::io::{AsyncRead, AsyncReadExt};

pub const MAGIC: [u8; 4] = *b"SLCF";
pub const VERSION: u16 = 1;
pub const HEADER_LEN: usize = 16;
/// The largest payload accepted (a batch is at most `forwarding.batch_bytes`, ≤ 64 MiB).
pub const MAX_PAYLOAD: usize = 80 << 20;

pub const COMPRESSED: u8 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Hello = 1,
    Welcome = 2,
    Refuse = 3,
    Batch = 4,
    Ack = 5,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Hello,
            2 => Kind::Welcome,
            3 => Kind::Refuse,
            4 => Kind::Batch,
            5 => Kind::Ack,
            _ => return None,
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{}", describe_bad_magic(.0))]
    BadMagic([u8; 4]),
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("frame of {0} bytes is larger than the {MAX_PAYLOAD}-byte limit")]
    TooLarge(usize),
    #[error("frame checksum mismatch (crc32c {found:08x}, header says {expected:08x})")]
    Checksum { expected: u32, found: u32 },
    #[error("malformed {0:?} frame: {1}")]
    Malformed(Kind, String),
}

/// A TLS record begins with its content type (20–23) and major version 3.
pub fn looks_like_tls(first: &[u8]) -> bool {
    first.len() >= 2 && (20..=23).contains(&first[0]) && first[1] == 3
}

fn describe_bad_magic(magic: &[u8; 4]) -> String {
    if looks_like_tls(magic) {
        "the peer speaks TLS and this node has no `cluster.tls`: give every node the same `tls` section".to_string()
    } else {
        format!("not a sluice cluster frame (bad magic {magic:02x?}): is the peer a sluice node of this version?")
    }
}

#[derive(Debug)]
pub struct Frame {
    pub kind: Kind,
    pub flags: u8,
    pub payload: Vec<u8>,
}

/// Appends one frame to `out`.
pub fn put_frame(out: &mut Vec<u8>, kind: Kind, flags: u8, payload: &[u8]) {
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&[kind as u8, flags, 0, 0]);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    out.extend_from_slice(payload);
}

/// Reads the next frame; `Ok(None)` at a clean end of stream between frames.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> Result<Option<Frame>, FrameError> {
    let mut header = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        let n = r.read(&mut header[got..]).await?;
        if n == 0 {
            if got == 0 {
                return Ok(None);
            }
            return Err(
                std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed inside a frame").into()
            );
        }
        got += n;
    }
    let magic: [u8; 4] = header[0..4].try_into().expect("4 bytes");
    if magic != MAGIC {
        return Err(FrameError::BadMagic(magic));
    }
    let kind = Kind::from_u8(header[4]).ok_or(FrameError::UnknownKind(header[4]))?;
    let flags = header[5];
    let len = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes")) as usize;
    let expected = u32::from_le_bytes(header[12..16].try_into().expect("4 bytes"));
    if len > MAX_PAYLOAD {
        return Err(FrameError::TooLarge(len));
    }
    // Read into spare capacity: no zero-filling of a buffer about to be overwritten.
    let mut payload = Vec::with_capacity(len);
    let got = (&mut *r).take(len as u64).read_to_end(&mut payload).await?;
    if got != len {
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "connection closed inside a frame").into());
    }
    let found = crc32c::crc32c(&payload);
    if found != expected {
        return Err(FrameError::Checksum { expected, found });
    }
    Ok(Some(Frame { kind, flags, payload }))
}

pub fn put_str(out: &mut Vec<u8>, s: &str) {
    codec::put_varint(out, s.len() as u64);
    out.extend_from_slice(s.as_bytes());
}

/// A reader over a frame's payload.
pub struct Payload<'a> {
    kind: Kind,
    rest: &'a [u8],
}

impl<'a> Payload<'a> {
    pub fn new(frame: &'a Frame) -> Payload<'a> {
        Payload { kind: frame.kind, rest: &frame.payload }
    }

    fn bad(&self, what: &str) -> FrameError {
        FrameError::Malformed(self.kind, what.to_string())
    }

    pub fn u8(&mut self) -> Result<u8, FrameError> {
        let (&b, rest) = self.rest.split_first().ok_or_else(|| self.bad("truncated"))?;
        self.rest = rest;
        Ok(b)
    }

    pub fn u16(&mut self) -> Result<u16, FrameError> {
        Ok(u16::from_le_bytes(self.bytes(2)?.try_into().expect("2 bytes")))
    }

    pub fn u32(&mut self) -> Result<u32, FrameError> {
        Ok(u32::from_le_bytes(self.bytes(4)?.try_into().expect("4 bytes")))
    }

    pub fn u64(&mut self) -> Result<u64, FrameError> {
        Ok(u64::from_le_bytes(self.bytes(8)?.try_into().expect("8 bytes")))
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        if self.rest.len() < n {
            return Err(self.bad("truncated"));
        }
        let (b, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(b)
    }

    pub fn str(&mut self) -> Result<&'a str, FrameError> {
        let len = codec::get_varint(&mut self.rest).map_err(|e| self.bad(&e.to_string()))? as usize;
        let b = self.bytes(len)?;
        std::str::from_utf8(b).map_err(|_| self.bad("a name is not UTF-8"))
    }

    pub fn rest(self) -> &'a [u8] {
        self.rest
    }
}

/// A whole batch frame, header included, built in one buffer: `seq`, `low`, pipeline, event
/// count, then the bodies back to back (LZ4-compressed together if `compress`).
pub fn batch_frame(
    seq: u64,
    low: u64,
    ring: u64,
    pipeline: &str,
    events: u32,
    bodies: &[&[u8]],
    compress: bool,
) -> Vec<u8> {
    let size: usize = bodies.iter().map(|b| b.len()).sum();
    let mut out = Vec::with_capacity(HEADER_LEN + 32 + pipeline.len() + if compress { size / 2 } else { size });
    out.extend_from_slice(&[0; HEADER_LEN]);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&low.to_le_bytes());
    out.extend_from_slice(&ring.to_le_bytes());
    put_str(&mut out, pipeline);
    out.extend_from_slice(&events.to_le_bytes());
    let flags = if compress {
        let joined: Vec<u8> = bodies.concat();
        out.extend_from_slice(&lz4_flex::block::compress_prepend_size(&joined));
        COMPRESSED
    } else {
        for b in bodies {
            out.extend_from_slice(b);
        }
        0
    };
    let len = (out.len() - HEADER_LEN) as u32;
    let crc = crc32c::crc32c(&out[HEADER_LEN..]);
    out[0..4].copy_from_slice(&MAGIC);
    out[4] = Kind::Batch as u8;
    out[5] = flags;
    out[8..12].copy_from_slice(&len.to_le_bytes());
    out[12..16].copy_from_slice(&crc.to_le_bytes());
    out
}

/// A received batch.
#[derive(Debug)]
pub struct BatchFrame {
    pub seq: u64,
    /// Every batch below this one was answered "taken" (the sender waits for none of them).
    pub low: u64,
    pub pipeline: String,
    pub events: Vec<Event>,
}

/// A batch frame's fields before its events.
#[derive(Debug, Clone)]
pub struct BatchHeader {
    pub seq: u64,
    pub low: u64,
    /// The fingerprint of the sender's ring.
    pub ring: u64,
    pub pipeline: String,
    pub count: usize,
    body_at: usize,
}

/// Reads a batch frame's header (cheap: the events are decoded by [`decode_batch_events`]).
pub fn batch_header(frame: &Frame) -> Result<BatchHeader, FrameError> {
    let mut p = Payload::new(frame);
    let seq = p.u64()?;
    let low = p.u64()?;
    let ring = p.u64()?;
    let pipeline = p.str()?.to_string();
    let count = p.u32()? as usize;
    let body_at = frame.payload.len() - p.rest().len();
    Ok(BatchHeader { seq, low, ring, pipeline, count, body_at })
}

/// Decodes a batch frame's events; they must number what the header says.
pub fn decode_batch_events(frame: &Frame, header: &BatchHeader) -> Result<Vec<Event>, FrameError> {
    let raw = &frame.payload[header.body_at..];
    let decompressed;
    let mut body = if frame.flags & COMPRESSED != 0 {
        decompressed = lz4_flex::block::decompress_size_prepended(raw)
            .map_err(|e| FrameError::Malformed(Kind::Batch, format!("LZ4: {e}")))?;
        &decompressed[..]
    } else {
        raw
    };
    let count = header.count;
    let mut events = Vec::with_capacity(count.min(1 << 16));
    while !body.is_empty() {
        codec::decode_batch_into(&mut body, &mut events)
            .map_err(|e| FrameError::Malformed(Kind::Batch, format!("events: {e}")))?;
    }
    if events.len() != count {
        return Err(FrameError::Malformed(
            Kind::Batch,
            format!("{} events where the header says {count}", events.len()),
        ));
    }
    Ok(events)
}

/// Decodes a whole batch frame.
pub fn decode_batch(frame: &Frame) -> Result<BatchFrame, FrameError> {
    let h = batch_header(frame)?;
    let events = decode_batch_events(frame, &h)?;
    Ok(BatchFrame { seq: h.seq, low: h.low, pipeline: h.pipeline, events })
}

pub const ACK_TAKEN: u8 = 0;
pub const ACK_RETRY: u8 = 1;
/// Not taken, and the node is stopping: a sender that is stopping too processes it itself.
pub const ACK_STOPPING: u8 = 2;

pub fn ack_payload(seq: u64, status: u8, reason: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + reason.len());
    out.extend_from_slice(&seq.to_le_bytes());
    out.push(status);
    put_str(&mut out, reason);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_batch_survives_the_round_trip_compressed_or_not() {
        let events: Vec<Event> = (0..50).map(|i| Event::from_message_at(format!("line {i}"), i)).collect();
        let mut body = Vec::new();
        codec::encode_batch(&events[..20], &mut body).unwrap();
        codec::encode_batch(&events[20..], &mut body).unwrap();
        let (first, second) = body.split_at(body.len() / 3);
        for compress in [false, true] {
            let wire = batch_frame(7, 3, 9, "web", 50, &[first, second], compress);
            let frame = read_frame(&mut &wire[..]).await.unwrap().unwrap();
            let b = decode_batch(&frame).unwrap();
            assert_eq!((b.seq, b.low, b.pipeline.as_str()), (7, 3, "web"));
            assert_eq!(b.events, events);
        }
    }

    #[tokio::test]
    async fn damage_is_detected() {
        let mut wire = Vec::new();
        put_frame(&mut wire, Kind::Ack, 0, &ack_payload(1, ACK_TAKEN, ""));
        let mut flipped = wire.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(matches!(read_frame(&mut &flipped[..]).await, Err(FrameError::Checksum { .. })));
        let http = read_frame(&mut &b"GET / HTTP/1.1\r\n\r\n"[..]).await;
        assert!(matches!(&http, Err(FrameError::BadMagic(_))));
        assert!(http.unwrap_err().to_string().contains("bad magic"));
        // A TLS ClientHello's record header, then an alert's: said to be TLS, not "bad magic".
        for tls in [&[0x16u8, 0x03, 0x01, 0x00, 0xc8, 0x01][..], &[0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32]] {
            let e = read_frame(&mut &[tls, &[0u8; 16][..]].concat()[..]).await.unwrap_err().to_string();
            assert!(e.contains("speaks TLS") && e.contains("no `cluster.tls`"), "{e}");
        }
        assert!(read_frame(&mut &wire[..wire.len() - 1]).await.is_err(), "a torn frame is an error");
        assert!(read_frame(&mut &[][..]).await.unwrap().is_none(), "a clean end is not");
        let w = batch_frame(1, 0, 9, "web", 3, &[&[0]], false);
        let f = read_frame(&mut &w[..]).await.unwrap().unwrap();
        assert!(decode_batch(&f).is_err(), "a count that does not match is refused");
    }
}
