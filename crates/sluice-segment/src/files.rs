//! File-system helpers shared by the persisted queue and the dead letter queue: durable
//! directory entries, the one-writer lock of a directory, and positioned reads.

use std::fs::{File, TryLockError};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Makes a directory's entries (files created, renamed or deleted in it) durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Takes an exclusive, non-blocking `flock` on `path` (created if missing). `Ok(None)` if
/// another holder has it: another process, or another open of the file in this process. The
/// lock lasts as long as the returned file is open.
pub fn try_lock_exclusive(path: &Path) -> io::Result<Option<File>> {
    let file = File::options().create(true).truncate(false).write(true).open(path)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(TryLockError::WouldBlock) => Ok(None),
        Err(TryLockError::Error(e)) => Err(e),
    }
}

/// Reads into `buf` from `offset` until `buf` is full or the file ends; returns the bytes read.
pub fn read_at_most(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_excludes_a_second_holder_until_released() {
        let dir = std::env::temp_dir().join(format!("sluice-segment-lock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("lock");
        let first = try_lock_exclusive(&path).unwrap();
        assert!(first.is_some());
        assert!(try_lock_exclusive(&path).unwrap().is_none());
        drop(first);
        assert!(try_lock_exclusive(&path).unwrap().is_some());
        sync_dir(&dir).unwrap();
        let data = dir.join("data");
        std::fs::write(&data, b"hello").unwrap();
        let f = File::open(&data).unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(read_at_most(&f, &mut buf, 1).unwrap(), 4);
        assert_eq!(&buf[..4], b"ello");
        assert_eq!(read_at_most(&f, &mut buf, 9).unwrap(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
