//! Test support shared by Sluice's crates (a dev-dependency only).
//!
//! [`SmallTmpfs`]: a real file system of a few megabytes that the tests fill up, so that a full
//! disk is the kernel's ENOSPC and not a simulation. Mounting needs root; where the process may
//! not mount, [`SmallTmpfs::mount`] says why on stderr and returns `None`, and the test returns
//! early (it cannot check anything there).
//!
//! [`opensearch::OpenSearch`]: a real single-node OpenSearch started from Maven Central jars by
//! `servers/opensearch/run`; a test that needs it fails when it cannot be started.
//!
//! [`kafka::Kafka`]: a real Apache Kafka broker (KRaft, one node) started from Maven Central jars
//! by `servers/kafka/run`, with topic administration and an independent Java client; a test
//! that needs it fails when it cannot be started.

pub mod kafka;
pub mod opensearch;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A small tmpfs, unmounted (and its mount point removed) when dropped, whatever happened.
pub struct SmallTmpfs {
    dir: Option<tempfile::TempDir>,
}

impl SmallTmpfs {
    /// Mounts a tmpfs of `size` (`"2m"`, `"256k"`); `None`, with the reason printed, where this
    /// process may not mount one.
    pub fn mount(size: &str) -> Option<SmallTmpfs> {
        let dir = tempfile::tempdir().ok()?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output();
        match out {
            Ok(out) if out.status.success() => Some(SmallTmpfs { dir: Some(dir) }),
            Ok(out) => {
                eprintln!("skipped: cannot mount a tmpfs: {}", String::from_utf8_lossy(&out.stderr).trim());
                None
            }
            Err(e) => {
                eprintln!("skipped: cannot run mount: {e}");
                None
            }
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.as_ref().expect("mounted until dropped").path()
    }

    /// Fills the file system with a file named `ballast`, then frees about `keep` bytes of it:
    /// the next writes fill the disk. Returns the file's path (remove it to give the space back).
    pub fn fill_leaving(&self, keep: u64) -> PathBuf {
        let path = self.path().join("ballast");
        let mut f = std::fs::File::create(&path).expect("create the ballast file");
        let chunk = vec![0xa5u8; 64 * 1024];
        loop {
            match f.write(&chunk) {
                Ok(n) if n > 0 => {}
                Ok(_) => break,
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(28), "filling the disk must end in ENOSPC: {e}");
                    break;
                }
            }
        }
        let len = f.metadata().expect("the ballast's size").len();
        f.set_len(len.saturating_sub(keep)).expect("free what is to be kept");
        let _ = f.sync_all();
        path
    }

    /// Fills the file system: no page left.
    pub fn fill(&self) -> PathBuf {
        self.fill_leaving(0)
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let path = self.path().to_path_buf();
        if !Command::new("umount").arg(&path).status().is_ok_and(|s| s.success()) {
            let _ = Command::new("umount").arg("-l").arg(&path).status();
        }
        drop(self.dir.take());
    }
}
