//! The on-disk record format of Sluice's persisted queue and dead letter queue.
//!
//! A segment file is a 64-byte header followed by frames. Each frame is self-delimiting and
//! checksummed, carries its sequence number, and holds a body in the binary event codec. This
//! crate only formats and parses bytes in memory; files, fsync and acknowledgements belong to the
//! queue and DLQ that use it.
//!
//! - [`format`](mod@format): [`SegmentHeader`], [`append_frame`], [`FrameCursor`] / [`scan_frames`],
//!   [`resync`] and [`frame_ending_at`].
//! - [`codec`](mod@codec): [`encode_event`], [`encode_batch`], [`decode_event`], [`decode_batch_into`],
//!   and [`EventDecoder`], which remembers the previous event's root keys across frames.
//! - [`buf`](mod@buf): [`ByteBuf`], what frames are appended to (`Vec<u8>`, or a writer's own
//!   buffer).
//! - [`crc`](mod@crc): [`crc::crc32c`], the frames' checksum, three streams at a time for the
//!   sizes log records have.
//! - [`files`]: the file-system helpers both users share ([`files::sync_dir`],
//!   [`files::try_lock_exclusive`], [`files::read_at_most`]).
//!
//! # Byte layout (format version 1; this is a contract)
//!
//! All integers are little-endian. CRC32C is the Castagnoli CRC (`crc32c("123456789") ==
//! 0xe3069283`), initial value 0, as computed by the `crc32c` crate.
//!
//! Segment header, 64 bytes at offset 0:
//!
//! ```text
//! offset size field
//!  0     8    magic              b"SLQSEG\0\x01"
//!  8     2    format version     u16 = 1
//! 10     2    flags              u16; bit 0 = compressed bodies (reserved, 0 in version 1)
//! 12     1    codec id           u8; 1 = one event per body, 2 = batch per body
//! 13     3    reserved           zero
//! 16     4    shard              u32
//! 20     4    reserved           zero
//! 24     8    first sequence     u64, sequence number of the segment's first frame
//! 32     8    created            i64, nanoseconds since the Unix epoch
//! 40    20    reserved           zero
//! 60     4    header checksum    u32 = CRC32C(bytes 0..60)
//! ```
//!
//! Decoding checks length, magic, version and checksum, in that order; flags and codec id are
//! returned as stored, for the caller to refuse what it does not support.
//!
//! Frames follow back to back from offset 64. A frame with a payload of `len` bytes takes
//! `len + 12` bytes:
//!
//! ```text
//! offset    size      field
//! 0         4         len        u32, payload length, 8 <= len <= max frame length (64 MiB)
//! 4         8         seq        u64, the frame's sequence number   } payload
//! 12        len - 8   body       codec body                         }
//! 4 + len   4         crc        u32 = CRC32C(bytes 0 .. 4 + len), i.e. of len_le ‖ payload
//! 8 + len   4         len        u32, equal to the leading len
//! ```
//!
//! Event codec (body of a frame in a codec 1 or 2 segment; details in [`codec`]): a batch is
//! `varint count` followed by that many events; an event is its root object as `varint count`
//! followed by `(varint key length, UTF-8 key, value)` pairs; a value is one tag byte
//! (0 null, 1 false, 2 true, 3 int, 4 float, 5 string, 6 timestamp, 7 array, 8 object) then
//! its data: zigzag LEB128 for int and timestamp (nanoseconds), 8 bytes for a float's bit
//! pattern, length-prefixed UTF-8 for a string, a count and items for containers.
//!
//! # Guarantees
//!
//! - A frame is returned only if its two lengths agree and its CRC32C matches: every frame read
//!   back is a frame that was written, whole.
//! - A complete frame with a bad checksum ([`FrameResult::Corrupt`]) costs that frame only; an
//!   untrustworthy length ([`FrameResult::Garbage`]) is stepped over with [`resync`] to the next
//!   valid frame, so damage does not hide the intact frames after it (tested: any single-byte
//!   change loses only the frame it hits). Resync is a search: a damaged frame whose body embeds
//!   the bytes of a valid frame can yield that inner frame, which its `seq` gives away.
//! - A tail that ends mid-frame or was never written is reported once as [`FrameResult::Torn`]
//!   with the offset to truncate at. Stale frames in a reused or preallocated file are valid
//!   frames with older sequence numbers: readers compare `seq` with what they expect.
//! - No bytes make the parser or the decoder panic, loop, or allocate beyond a bound set by the
//!   input's length; nesting is capped at [`codec::MAX_DEPTH`], and the encoder refuses what the
//!   decoder would refuse.
//! - Reading borrows frame bodies from the caller's buffer: the only allocation per frame is the
//!   decoded event itself.
//!
//! # Example
//!
//! ```
//! use sluice_core::{Event, Value};
//! use sluice_segment::{
//!     CODEC_BATCH, FrameResult, SEGMENT_HEADER_LEN, SegmentHeader, append_frame, decode_batch_body, encode_batch,
//!     scan_frames, try_append_frame,
//! };
//!
//! let header = SegmentHeader { codec: CODEC_BATCH, shard: 0, first_seq: 7, ..Default::default() };
//! let mut segment = header.encode().to_vec();
//! let batch = [Event::from_message_at("hello", 1), Event::from_message_at("world", 2)];
//! try_append_frame(&mut segment, 7, |body| encode_batch(&batch, body).map_err(sluice_segment::Error::from)).unwrap();
//! append_frame(&mut segment, 9, |body| encode_batch(&batch[..1], body).unwrap()).unwrap();
//!
//! assert_eq!(SegmentHeader::decode(&segment).unwrap(), header);
//! let mut events = Vec::new();
//! for item in scan_frames(&segment, SEGMENT_HEADER_LEN) {
//!     match item {
//!         FrameResult::Frame { seq, body, .. } => events.extend(decode_batch_body(body).unwrap().into_iter().map(|e| (seq, e))),
//!         other => panic!("unexpected {other:?}"),
//!     }
//! }
//! assert_eq!(events.len(), 3);
//! assert_eq!(events[1].1.message(), Some("world"));
//! assert_eq!(events[2].0, 9);
//! assert_eq!(events[2].1.fields.get("@timestamp"), Some(&Value::Timestamp(1)));
//!
//! // A crash in the middle of the last frame: the tail is reported, the first frame survives.
//! segment.truncate(segment.len() - 3);
//! let items: Vec<_> = scan_frames(&segment, SEGMENT_HEADER_LEN).collect();
//! assert!(matches!(items[..], [FrameResult::Frame { seq: 7, .. }, FrameResult::Torn { .. }]));
//! ```

pub mod buf;
pub mod codec;
pub mod crc;
pub mod files;
pub mod format;

pub use buf::ByteBuf;
pub use codec::{
    CodecError, EventDecoder, decode_batch_body, decode_batch_into, decode_event, decode_event_body, decode_value,
    encode_batch, encode_event, encode_value,
};
pub use format::{
    CODEC_BATCH, CODEC_EVENT, Corruption, DEFAULT_MAX_FRAME_LEN, FLAG_COMPRESSED, FORMAT_VERSION, FRAME_OVERHEAD,
    FormatError, FrameCursor, FrameRef, FrameResult, SEGMENT_HEADER_LEN, SEGMENT_MAGIC, SegmentHeader, append_frame,
    frame_checksum, frame_ending_at, frame_size, resync, scan_frames, try_append_frame,
};

/// Either kind of error, for code that writes or reads frames and events together.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Format(#[from] FormatError),
    #[error(transparent)]
    Codec(#[from] CodecError),
}
