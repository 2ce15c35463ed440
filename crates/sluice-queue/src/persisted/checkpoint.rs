//! A shard's checkpoint: the position in its log before which every event is acknowledged.
//!
//! A progress record must never need new disk space, or a full disk costs the record of what
//! was delivered (and a restart delivers it all again). So the file `checkpoint` is made once,
//! whole, when the shard is created: 8 KiB, two slots of 4 KiB, its blocks written (not a
//! sparse file) and fsynced with its directory. Every later checkpoint rewrites the older slot
//! in place (one `pwrite` of the slot, then `fdatasync`): the file keeps its blocks and its
//! size, so the write allocates nothing and works on a full disk. Preallocated slots rather
//! than `fallocate`d space because the record is tiny and fixed in size: two blocks are the
//! whole reservation, and a slot rewritten in place also needs no rename and no directory sync.
//!
//! A slot (within its 4 KiB block, the rest zeros): magic `SLQCKPT2`, a sequence number, the
//! segment id (its first sequence number) and the byte offset inside it, all u64 LE, then
//! CRC32C of the first 32 bytes. The reader takes the valid slot with the highest sequence
//! number. A write only ever touches the slot that is *not* the newest valid one, and each slot
//! is its own block, so a crash or a failed write mid-slot leaves the other slot (the previous
//! checkpoint) whole: the position on disk is the new one or the one before, never lost.
//!
//! Older releases wrote a 28-byte file (`SLQCKPT1`, segment, offset, CRC32C) by tmp → fsync →
//! rename. It is still read; the first checkpoint written after start-up replaces it with the
//! slot file (by the same tmp → rename, the only write here that needs new space; until it
//! succeeds the old record stays in place).
//!
//! A missing or damaged checkpoint is not fatal: the queue replays the shard from its oldest
//! segment (duplicates, never loss).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

pub(crate) const FILE: &str = "checkpoint";
const TMP: &str = "checkpoint.tmp";

const MAGIC: &[u8; 8] = b"SLQCKPT2";
const SLOT: usize = 4096;
const SLOTS: usize = 2;
/// The checkpoint file's size: every slot, each in a block of its own.
pub(crate) const FILE_LEN: usize = SLOT * SLOTS;
const SLOT_RECORD: usize = 36;

const LEGACY_MAGIC: &[u8; 8] = b"SLQCKPT1";
const LEGACY_LEN: usize = 28;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Checkpoint {
    pub segment: u64,
    pub offset: u64,
}

fn encode_slot(seq: u64, c: &Checkpoint) -> [u8; SLOT] {
    let mut b = [0u8; SLOT];
    b[..8].copy_from_slice(MAGIC);
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    b[16..24].copy_from_slice(&c.segment.to_le_bytes());
    b[24..32].copy_from_slice(&c.offset.to_le_bytes());
    let crc = crc32c::crc32c(&b[..32]);
    b[32..SLOT_RECORD].copy_from_slice(&crc.to_le_bytes());
    b
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// One slot: `Ok(None)` for a slot never written (all zeros), `Err` for a damaged one.
fn decode_slot(b: &[u8]) -> Result<Option<(u64, Checkpoint)>, String> {
    if b.iter().all(|&x| x == 0) {
        return Ok(None);
    }
    if &b[..8] != MAGIC {
        return Err("bad magic".to_string());
    }
    let crc = u32::from_le_bytes(b[32..SLOT_RECORD].try_into().expect("4 bytes"));
    if crc != crc32c::crc32c(&b[..32]) {
        return Err("checksum mismatch".to_string());
    }
    Ok(Some((u64_at(b, 8), Checkpoint { segment: u64_at(b, 16), offset: u64_at(b, 24) })))
}

fn decode_legacy(b: &[u8]) -> Result<Checkpoint, String> {
    let crc = u32::from_le_bytes(b[24..28].try_into().expect("4 bytes"));
    if crc != crc32c::crc32c(&b[..24]) {
        return Err("checksum mismatch".to_string());
    }
    Ok(Checkpoint { segment: u64_at(b, 8), offset: u64_at(b, 16) })
}

/// What a checkpoint file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found {
    pub checkpoint: Option<Checkpoint>,
    /// The sequence number of the newest valid slot (0 when there is none).
    pub seq: u64,
    /// The file is in the slot format (else missing, or in the old format).
    pub slotted: bool,
    /// A slot that did not verify beside a valid one: a write that was cut short.
    pub torn_slot: Option<String>,
}

/// Reads a shard's checkpoint file: `Err` with the reason when it is damaged (no valid record
/// at all).
pub(crate) fn load(dir: &Path) -> Result<Found, String> {
    let bytes = match fs::read(dir.join(FILE)) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(Found { checkpoint: None, seq: 0, slotted: false, torn_slot: None });
        }
        Err(e) => return Err(e.to_string()),
    };
    if bytes.len() == LEGACY_LEN && &bytes[..8] == LEGACY_MAGIC {
        let c = decode_legacy(&bytes)?;
        return Ok(Found { checkpoint: Some(c), seq: 0, slotted: false, torn_slot: None });
    }
    if bytes.len() != FILE_LEN {
        return Err(format!("{} bytes, expected {FILE_LEN} (or {LEGACY_LEN} in the old format)", bytes.len()));
    }
    let mut newest: Option<(u64, Checkpoint)> = None;
    let mut damage = None;
    for slot in bytes.chunks_exact(SLOT) {
        match decode_slot(slot) {
            Ok(Some((seq, c))) => {
                if newest.is_none_or(|(s, _)| seq > s) {
                    newest = Some((seq, c));
                }
            }
            Ok(None) => {}
            Err(reason) => damage = Some(reason),
        }
    }
    match (newest, damage) {
        (None, Some(reason)) => Err(format!("no valid slot ({reason})")),
        (newest, torn_slot) => Ok(Found {
            checkpoint: newest.map(|(_, c)| c),
            seq: newest.map_or(0, |(s, _)| s),
            slotted: true,
            torn_slot,
        }),
    }
}

/// Reads a shard's checkpoint: `Ok(None)` when there is none yet, `Err` with the reason when
/// it is damaged.
pub(crate) fn read(dir: &Path) -> Result<Option<Checkpoint>, String> {
    load(dir).map(|f| f.checkpoint)
}

/// The open checkpoint file of a shard, rewritten in place.
pub(crate) struct CheckpointFile {
    /// `None` until the slot file exists (a shard of an older release, or a creation that
    /// failed): the next write creates it.
    file: Option<File>,
    /// The sequence number of the newest slot on disk.
    seq: u64,
}

impl CheckpointFile {
    /// Opens the checkpoint file of `dir` as [`load`] found it. A new shard's file is created
    /// here (both slots empty); one in the old format is left for the first write to replace.
    pub fn open(dir: &Path, found: &Found) -> io::Result<CheckpointFile> {
        if found.slotted {
            let file = OpenOptions::new().read(true).write(true).open(dir.join(FILE))?;
            return Ok(CheckpointFile { file: Some(file), seq: found.seq });
        }
        let mut file = CheckpointFile { file: None, seq: 0 };
        if found.checkpoint.is_none()
            && let Err(e) = file.create(dir, None)
        {
            // Not fatal: the first checkpoint written makes it (until then there is none).
            tracing::warn!(dir = %dir.display(), error = %e, "cannot create the queue checkpoint file yet");
        }
        Ok(file)
    }

    /// Records `c`. In place (no new space) once the slot file exists.
    pub fn write(&mut self, dir: &Path, c: &Checkpoint) -> io::Result<()> {
        let seq = self.seq + 1;
        match &self.file {
            Some(file) => {
                // The slot after the newest: never the one holding the checkpoint on disk.
                let slot = (seq % SLOTS as u64) as usize;
                file.write_all_at(&encode_slot(seq, c), (slot * SLOT) as u64)?;
                file.sync_data()?;
                self.seq = seq;
                Ok(())
            }
            None => self.create(dir, Some(c)),
        }
    }

    /// Makes the slot file (tmp → fsync → rename → fsync dir), holding `c` if given.
    fn create(&mut self, dir: &Path, c: Option<&Checkpoint>) -> io::Result<()> {
        let mut bytes = vec![0u8; FILE_LEN];
        let seq = self.seq + 1;
        if let Some(c) = c {
            let slot = (seq % SLOTS as u64) as usize;
            bytes[slot * SLOT..(slot + 1) * SLOT].copy_from_slice(&encode_slot(seq, c));
        }
        let tmp = dir.join(TMP);
        let made = File::create(&tmp).and_then(|mut f| {
            f.write_all(&bytes)?;
            f.sync_all()?;
            drop(f);
            fs::rename(&tmp, dir.join(FILE))
        });
        if let Err(e) = made {
            // A half-written file would hold space a full disk needs.
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        sync_dir(dir)?;
        self.file = Some(OpenOptions::new().read(true).write(true).open(dir.join(FILE))?);
        if c.is_some() {
            self.seq = seq;
        }
        Ok(())
    }
}

/// Writes `c` as the old release did (a 28-byte file): for tests of the migration.
#[cfg(test)]
pub(crate) fn write_legacy(dir: &Path, c: &Checkpoint) -> io::Result<()> {
    let mut b = [0u8; LEGACY_LEN];
    b[..8].copy_from_slice(LEGACY_MAGIC);
    b[8..16].copy_from_slice(&c.segment.to_le_bytes());
    b[16..24].copy_from_slice(&c.offset.to_le_bytes());
    let crc = crc32c::crc32c(&b[..24]);
    b[24..].copy_from_slice(&crc.to_le_bytes());
    fs::write(dir.join(FILE), b)
}

pub(crate) use sluice_segment::files::sync_dir;

#[cfg(test)]
mod tests {
    use super::*;

    fn opened(dir: &Path) -> CheckpointFile {
        CheckpointFile::open(dir, &load(dir).unwrap()).unwrap()
    }

    #[test]
    fn a_new_file_holds_no_checkpoint_and_keeps_its_size_as_it_is_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()), Ok(None));
        let mut f = opened(dir.path());
        assert_eq!(read(dir.path()), Ok(None), "an empty slot file is no checkpoint");
        assert_eq!(fs::metadata(dir.path().join(FILE)).unwrap().len(), FILE_LEN as u64);
        for i in 1..=5u64 {
            f.write(dir.path(), &Checkpoint { segment: 42, offset: i * 100 }).unwrap();
            assert_eq!(read(dir.path()), Ok(Some(Checkpoint { segment: 42, offset: i * 100 })));
        }
        assert_eq!(fs::metadata(dir.path().join(FILE)).unwrap().len(), FILE_LEN as u64);
        assert!(!dir.path().join(TMP).exists());
        // A reopened file goes on from the newest slot.
        let mut f = opened(dir.path());
        f.write(dir.path(), &Checkpoint { segment: 43, offset: 64 }).unwrap();
        assert_eq!(read(dir.path()), Ok(Some(Checkpoint { segment: 43, offset: 64 })));
    }

    #[test]
    fn a_torn_slot_leaves_the_previous_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = opened(dir.path());
        f.write(dir.path(), &Checkpoint { segment: 1, offset: 100 }).unwrap();
        f.write(dir.path(), &Checkpoint { segment: 1, offset: 200 }).unwrap();
        // The newest (seq 2) is in slot 0: a write cut short there leaves slot 1's.
        let mut bytes = fs::read(dir.path().join(FILE)).unwrap();
        bytes[20] ^= 1;
        fs::write(dir.path().join(FILE), &bytes).unwrap();
        let found = load(dir.path()).unwrap();
        assert_eq!(found.checkpoint, Some(Checkpoint { segment: 1, offset: 100 }));
        assert!(found.torn_slot.unwrap().contains("checksum"));
        // The next write goes to the torn slot, never over the one that holds the record.
        let mut f = opened(dir.path());
        f.write(dir.path(), &Checkpoint { segment: 1, offset: 300 }).unwrap();
        assert_eq!(read(dir.path()), Ok(Some(Checkpoint { segment: 1, offset: 300 })));
        let bytes = fs::read(dir.path().join(FILE)).unwrap();
        assert_eq!(decode_slot(&bytes[SLOT..]).unwrap().unwrap().1.offset, 100, "the other slot is untouched");
    }

    #[test]
    fn damage_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = opened(dir.path());
        f.write(dir.path(), &Checkpoint { segment: 1, offset: 100 }).unwrap();
        let mut bytes = fs::read(dir.path().join(FILE)).unwrap();
        bytes[SLOT + 10] ^= 1;
        fs::write(dir.path().join(FILE), &bytes).unwrap();
        assert!(read(dir.path()).unwrap_err().contains("checksum"));
        fs::write(dir.path().join(FILE), [1u8; FILE_LEN]).unwrap();
        assert!(read(dir.path()).unwrap_err().contains("magic"));
        fs::write(dir.path().join(FILE), [0u8; 100]).unwrap();
        assert!(read(dir.path()).unwrap_err().contains("100 bytes"));
    }

    #[test]
    fn the_old_format_is_read_and_replaced_by_the_first_write() {
        let dir = tempfile::tempdir().unwrap();
        write_legacy(dir.path(), &Checkpoint { segment: 7, offset: 4096 }).unwrap();
        assert_eq!(read(dir.path()), Ok(Some(Checkpoint { segment: 7, offset: 4096 })));
        let mut f = opened(dir.path());
        assert_eq!(fs::metadata(dir.path().join(FILE)).unwrap().len(), LEGACY_LEN as u64, "kept until a write");
        f.write(dir.path(), &Checkpoint { segment: 7, offset: 8192 }).unwrap();
        assert_eq!(fs::metadata(dir.path().join(FILE)).unwrap().len(), FILE_LEN as u64);
        assert_eq!(read(dir.path()), Ok(Some(Checkpoint { segment: 7, offset: 8192 })));
        f.write(dir.path(), &Checkpoint { segment: 7, offset: 9000 }).unwrap();
        assert_eq!(read(dir.path()), Ok(Some(Checkpoint { segment: 7, offset: 9000 })));
        // A damaged old file is still reported as damage.
        let dir = tempfile::tempdir().unwrap();
        write_legacy(dir.path(), &Checkpoint { segment: 7, offset: 4096 }).unwrap();
        let mut bytes = fs::read(dir.path().join(FILE)).unwrap();
        bytes[10] ^= 1;
        fs::write(dir.path().join(FILE), &bytes).unwrap();
        assert!(read(dir.path()).unwrap_err().contains("checksum"));
    }
}
