//! Test support shared by Sluice's crates (a dev-dependency only).
//!
//! [`SmallTmpfs`]: a real file system of a few megabytes that the tests fill up, so that a full
//! disk is the kernel's ENOSPC and not a simulation. Mounting needs root; where the process may
//! not mount, [`SmallTmpfs::mount`] fails the test with the reason (see [`root`]: under
//! `SLUICE_SKIP_ROOT_TESTS=1` it says the test is skipped and returns `None` instead).
//!
//! [`server::Server`]: the one launcher of the real servers under `servers/<name>/run`, with
//! [`free_port`]. [`opensearch::OpenSearch`] (a real single-node OpenSearch) and
//! [`kafka::Kafka`] (a real Apache Kafka broker, KRaft, one node, with topic administration and
//! an independent Java client) are built on it; a test that needs one fails when it cannot be
//! started.
//!
//! [`Rng`]: the seeded random generator of tests and benchmarks; a test's seed is printed and
//! replayed with `SLUICE_TEST_SEED`. [`eventually`] and [`wait_until`] (and their async twins):
//! the bounded polling loop.

pub mod kafka;
pub mod opensearch;
pub mod rng;
pub mod root;
pub mod server;
pub mod wait;

pub use rng::Rng;
pub use server::free_port;
pub use wait::{eventually, eventually_async, eventually_some, wait_until, wait_until_async};

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A small tmpfs, unmounted (and its mount point removed) when dropped, whatever happened.
pub struct SmallTmpfs {
    dir: Option<tempfile::TempDir>,
}

impl SmallTmpfs {
    /// Mounts a tmpfs of `size` (`"2m"`, `"256k"`). Where this process may not mount one, the
    /// test fails saying why, or, under `SLUICE_SKIP_ROOT_TESTS=1`, is reported skipped and
    /// gets `None` (it then returns: there is nothing it can check).
    ///
    /// # Panics
    /// When the tmpfs cannot be mounted and root tests are not skipped.
    pub fn mount(size: &str) -> Option<SmallTmpfs> {
        let what = format!("a {size} tmpfs");
        let dir = match tempfile::tempdir() {
            Ok(dir) => dir,
            Err(e) => panic!("cannot make a mount point for {what}: {e}"),
        };
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output();
        match out {
            Ok(out) if out.status.success() => return Some(SmallTmpfs { dir: Some(dir) }),
            Ok(out) => root::root_unavailable(&what, String::from_utf8_lossy(&out.stderr).trim()),
            Err(e) => root::root_unavailable(&what, &format!("cannot run mount: {e}")),
        }
        None
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
