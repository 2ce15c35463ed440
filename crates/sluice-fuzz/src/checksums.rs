//! Rewrites the checksums of fuzzed files so that they hold.
//!
//! A mutated byte almost always breaks a CRC, and a parser stops at the first bad checksum, so
//! without help a fuzzer never gets past the checksum of the record it mutates. Each function
//! here walks what looks like the format's records and stores the checksum each would need,
//! so the targets also feed the parsers damaged *contents* under valid checksums. Walking stops
//! where a length is implausible; what follows is left as it was.

use sluice_segment::crc::crc32c;
use sluice_segment::{FRAME_OVERHEAD, SEGMENT_HEADER_LEN};

fn u32_at(buf: &[u8], at: usize) -> Option<usize> {
    let bytes = buf.get(at..at + 4)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?) as usize)
}

fn put_crc(buf: &mut [u8], at: usize, covered: std::ops::Range<usize>) {
    let crc = crc32c(&buf[covered]);
    buf[at..at + 4].copy_from_slice(&crc.to_le_bytes());
}

/// A segment file: the header's checksum, then each frame's checksum and trailing length.
pub fn fix_segment(buf: &[u8]) -> Vec<u8> {
    let mut out = buf.to_vec();
    if out.len() < SEGMENT_HEADER_LEN {
        return out;
    }
    put_crc(&mut out, 60, 0..60);
    let mut pos = SEGMENT_HEADER_LEN;
    while let Some(len) = u32_at(&out, pos) {
        if len < 8 || pos + FRAME_OVERHEAD + len > out.len() {
            break;
        }
        let end = pos + 4 + len;
        put_crc(&mut out, end, pos..end);
        out[end + 4..end + 8].copy_from_slice(&(len as u32).to_le_bytes());
        pos = end + 8;
    }
    out
}

/// A queue checkpoint: the 28-byte format (CRC of bytes 0..24 at 24) or the slot format (in
/// each 4 KiB slot, the CRC of bytes 0..32 at 32).
pub fn fix_checkpoint(buf: &[u8]) -> Vec<u8> {
    let mut out = buf.to_vec();
    if out.len() == 28 {
        put_crc(&mut out, 24, 0..24);
    } else {
        let mut slot = 0;
        while slot + 36 <= out.len() {
            put_crc(&mut out, slot + 32, slot..slot + 32);
            slot += 4096;
        }
    }
    out
}

/// A registry snapshot or op log: the header's CRC (of bytes 0..24, at 24), then each record's
/// (`len | crc32c(payload) | payload`).
pub fn fix_registry(buf: &[u8]) -> Vec<u8> {
    let mut out = buf.to_vec();
    if out.len() < 32 {
        return out;
    }
    put_crc(&mut out, 24, 0..24);
    let mut pos = 32;
    while let Some(len) = u32_at(&out, pos) {
        if pos + 8 + len > out.len() {
            break;
        }
        put_crc(&mut out, pos + 4, pos + 8..pos + 8 + len);
        pos += 8 + len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_segment::{FrameResult, SegmentHeader, append_frame, scan_frames};

    #[test]
    fn a_segment_with_changed_bytes_reads_back_whole_once_fixed() {
        let mut segment = SegmentHeader { first_seq: 5, ..Default::default() }.encode().to_vec();
        for seq in 5..8 {
            append_frame(&mut segment, seq, |o: &mut Vec<u8>| o.extend_from_slice(b"\x01\x01a\x05\x01b")).unwrap();
        }
        segment[33] ^= 1;
        segment[SEGMENT_HEADER_LEN + 14] ^= 1;
        let fixed = fix_segment(&segment);
        assert_eq!(SegmentHeader::decode(&fixed).unwrap().first_seq, 5);
        let frames = scan_frames(&fixed, SEGMENT_HEADER_LEN).filter(|f| matches!(f, FrameResult::Frame { .. })).count();
        assert_eq!(frames, 3);
    }

    #[test]
    fn checkpoints_and_registry_records_get_their_crcs() {
        let fixed = fix_checkpoint(&[7u8; 28]);
        assert_eq!(u32_at(&fixed, 24), Some(crc32c(&[7u8; 24]) as usize));
        let fixed = fix_checkpoint(&[1u8; 8192]);
        assert_eq!(u32_at(&fixed, 4096 + 32), Some(crc32c(&[1u8; 32]) as usize));
        let mut log = vec![0u8; 32];
        log.extend_from_slice(&3u32.to_le_bytes());
        log.extend_from_slice(&[0; 4]);
        log.extend_from_slice(b"abc");
        let fixed = fix_registry(&log);
        assert_eq!(u32_at(&fixed, 36), Some(crc32c(b"abc") as usize));
    }
}
