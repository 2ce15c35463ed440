//! Which file is which: device + inode, checked against a fingerprint of the first bytes.
//!
//! Device and inode survive a rename, so a rotated file keeps its identity and its offset. An
//! inode number can be reused once a file is deleted, and a file can be rewritten in place, so
//! the identity also carries a fingerprint: the length and CRC32C of the file's first bytes, up
//! to [`FINGERPRINT_MAX`]. The fingerprint grows with the file while it is smaller than that,
//! so small and empty files have one too (empty: length 0) and are read like any other.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};

pub(crate) const FINGERPRINT_MAX: u64 = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct FileId {
    pub dev: u64,
    pub ino: u64,
}

impl FileId {
    pub(crate) fn of(meta: &std::fs::Metadata) -> FileId {
        FileId { dev: meta.dev(), ino: meta.ino() }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Fingerprint {
    pub len: u64,
    pub crc: u32,
}

impl Fingerprint {
    /// Extends the fingerprint with bytes read at `at`, as far as they continue it.
    pub(crate) fn extend(&mut self, at: u64, bytes: &[u8]) {
        if self.len >= FINGERPRINT_MAX || at > self.len {
            return;
        }
        let skip = (self.len - at) as usize;
        if skip >= bytes.len() {
            return;
        }
        let take = ((FINGERPRINT_MAX - self.len) as usize).min(bytes.len() - skip);
        self.crc = crc32c::crc32c_append(self.crc, &bytes[skip..skip + take]);
        self.len += take as u64;
    }

    pub(crate) fn to_json(self) -> serde_json::Value {
        serde_json::json!({"len": self.len, "crc32c": self.crc})
    }

    pub(crate) fn from_json(v: &serde_json::Value) -> Option<Fingerprint> {
        Some(Fingerprint { len: v.get("len")?.as_u64()?, crc: u32::try_from(v.get("crc32c")?.as_u64()?).ok()? })
    }
}

/// The fingerprint of the first `len` bytes of `file` (fewer if the file is shorter).
pub(crate) fn fingerprint(file: &File, len: u64) -> io::Result<Fingerprint> {
    let len = len.min(FINGERPRINT_MAX) as usize;
    let mut buf = [0u8; FINGERPRINT_MAX as usize];
    let mut got = 0;
    while got < len {
        match file.read_at(&mut buf[got..len], got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Fingerprint { len: got as u64, crc: crc32c::crc32c(&buf[..got]) })
}

/// Whether `file` still starts with the bytes `expected` was taken from.
pub(crate) fn still_matches(file: &File, expected: Fingerprint) -> io::Result<bool> {
    Ok(fingerprint(file, expected.len)? == expected)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn grows_with_the_file_and_detects_rewrites() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.log");
        let mut f = File::create(&path).unwrap();
        let r = File::open(&path).unwrap();
        assert_eq!(fingerprint(&r, FINGERPRINT_MAX).unwrap().len, 0);
        f.write_all(b"x").unwrap();
        let one = fingerprint(&r, FINGERPRINT_MAX).unwrap();
        assert_eq!(one.len, 1);
        let mut grown = Fingerprint::default();
        grown.extend(0, b"x");
        assert_eq!(grown, one);
        f.write_all(&[b'y'; 3000]).unwrap();
        let full = fingerprint(&r, FINGERPRINT_MAX).unwrap();
        assert_eq!(full.len, FINGERPRINT_MAX);
        grown.extend(1, &[b'y'; 3000]);
        assert_eq!(grown, full);
        assert!(still_matches(&r, one).unwrap());
        std::fs::write(&path, b"z").unwrap();
        assert!(!still_matches(&r, one).unwrap());
        assert_eq!(Fingerprint::from_json(&full.to_json()), Some(full));
    }
}
