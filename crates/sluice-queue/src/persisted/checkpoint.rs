//! A shard's checkpoint: the position in its log before which every event is acknowledged.
//!
//! 28 bytes: magic `SLQCKPT1`, the segment id (its first sequence number) and the byte offset
//! inside it, both u64 LE, then CRC32C of the first 24 bytes. Written to a temporary file,
//! fsynced, renamed over the old one, and the directory fsynced, so a crash leaves either the
//! old checkpoint or the new one, never a mix. A missing or damaged checkpoint is not fatal:
//! the queue replays the shard from its oldest segment (duplicates, never loss).

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

const MAGIC: &[u8; 8] = b"SLQCKPT1";
pub(crate) const FILE: &str = "checkpoint";
const LEN: usize = 28;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    pub segment: u64,
    pub offset: u64,
}

impl Checkpoint {
    fn encode(&self) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[..8].copy_from_slice(MAGIC);
        b[8..16].copy_from_slice(&self.segment.to_le_bytes());
        b[16..24].copy_from_slice(&self.offset.to_le_bytes());
        let crc = crc32c::crc32c(&b[..24]);
        b[24..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Result<Checkpoint, String> {
        if b.len() != LEN {
            return Err(format!("{} bytes instead of {LEN}", b.len()));
        }
        if &b[..8] != MAGIC {
            return Err("bad magic".to_string());
        }
        let crc = u32::from_le_bytes(b[24..28].try_into().expect("4 bytes"));
        if crc != crc32c::crc32c(&b[..24]) {
            return Err("checksum mismatch".to_string());
        }
        Ok(Checkpoint {
            segment: u64::from_le_bytes(b[8..16].try_into().expect("8 bytes")),
            offset: u64::from_le_bytes(b[16..24].try_into().expect("8 bytes")),
        })
    }
}

/// Reads a shard's checkpoint: `Ok(None)` when there is none yet, `Err` with the reason when
/// it is damaged.
pub(crate) fn read(dir: &Path) -> Result<Option<Checkpoint>, String> {
    match fs::read(dir.join(FILE)) {
        Ok(bytes) => Checkpoint::decode(&bytes).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e.to_string()),
    }
}

pub(crate) fn write(dir: &Path, c: &Checkpoint) -> io::Result<()> {
    let tmp = dir.join("checkpoint.tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(&c.encode())?;
    f.sync_data()?;
    drop(f);
    fs::rename(&tmp, dir.join(FILE))?;
    sync_dir(dir)
}

pub(crate) use sluice_segment::files::sync_dir;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()), Ok(None));
        let c = Checkpoint { segment: 42, offset: 4096 };
        write(dir.path(), &c).unwrap();
        assert_eq!(read(dir.path()), Ok(Some(c)));
        let mut bytes = fs::read(dir.path().join(FILE)).unwrap();
        bytes[10] ^= 1;
        fs::write(dir.path().join(FILE), &bytes).unwrap();
        assert!(read(dir.path()).unwrap_err().contains("checksum"));
        fs::write(dir.path().join(FILE), [0u8; LEN]).unwrap();
        assert!(read(dir.path()).unwrap_err().contains("magic"));
    }
}
