//! Writing a segment with `O_DIRECT`, bypassing the page cache.
//!
//! Why: on the machines this runs on, a buffered append spends most of its CPU time in the
//! kernel filling freshly allocated page-cache pages (about 450 MiB/s per writer at 76% of a
//! core), while a direct write of the same bytes runs at about 2 GB/s for a fifth of a core.
//! A persisted queue that absorbs a backlog writes mostly into fresh pages, and its CPU time is
//! taken from the workers.
//!
//! Direct I/O needs the buffer, the file offset and the length aligned to the block size, and
//! frames are not. So every write starts at the block holding the end of the live frames and
//! carries that block's live head again, then the new frames, then zeros up to the next block
//! boundary. Rewriting the head stores the same bytes in the same place, so a crash in the
//! middle of it cannot damage frames already acknowledged; the zeros right after the live
//! frames are the end marker the reader and recovery expect. The writer encodes events
//! straight into a [`StageBuf`] that starts with that head, so the buffer is written as it is.
//!
//! Each direct write also costs a fixed tens of µs of CPU time on a virtual machine (the
//! hypervisor exit, pinning the buffer's pages), so the writer stages groups no input waits
//! for and writes them together (see `writer::Stage`).
//!
//! Where the filesystem refuses `O_DIRECT` (some network filesystems; tmpfs before Linux 6.6,
//! which takes it since), the writer keeps using buffered writes: [`DirectFile::open`] returns
//! `None`. A filesystem that takes the open but refuses a write is noticed there too (EINVAL).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use sluice_segment::ByteBuf;

/// Alignment of buffer, offset and length. 4 KiB covers every common logical block size.
pub(crate) const BLOCK: usize = 4096;

/// The end marker: this many zero bytes after the last live frame.
const END_MARKER: usize = 4;

/// A buffer whose usable part starts on a block boundary. A reader keeps one for its life:
/// allocating it per read would fault in fresh zeroed pages every time.
///
/// It is its own anonymous mapping, aligned to 2 MiB and advised to use transparent huge
/// pages. Why: a direct write pins every page of its buffer and hands the device one segment
/// per physically contiguous run. In 4 KiB pages, a 1 MiB write took 256 pins and was split
/// into two or more requests, each a costly exit to the hypervisor on a virtual machine.
#[derive(Default)]
pub(crate) struct AlignedBuf {
    map: Option<Mapping>,
}

/// An anonymous private mapping, unmapped on drop.
struct Mapping {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned by one `AlignedBuf` and only reached through it.
unsafe impl Send for Mapping {}

/// Huge page size on x86-64 and aarch64 (with 4 KiB base pages).
pub(crate) const HUGE: usize = 2 << 20;

impl Mapping {
    fn new(len: usize) -> io::Result<Mapping> {
        let len = len.next_multiple_of(HUGE);
        // Over-map by one huge page to place the buffer on a huge-page boundary.
        let total = len + HUGE;
        // SAFETY: an anonymous private mapping, checked below; no existing memory is touched.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let head = (raw as usize).next_multiple_of(HUGE) - raw as usize;
        // SAFETY: both trimmed pieces lie inside the mapping just made, on page boundaries.
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            let tail = total - head - len;
            if tail > 0 {
                libc::munmap(raw.cast::<u8>().add(head + len).cast(), tail);
            }
            let ptr = raw.cast::<u8>().add(head);
            // A hint: without huge pages the buffer works the same, only slower.
            libc::madvise(ptr.cast(), len, libc::MADV_HUGEPAGE);
            Ok(Mapping { ptr: std::ptr::NonNull::new_unchecked(ptr), len })
        }
    }

    /// Faults every page in now. Why: on the virtual machines measured the first touch of
    /// fresh memory runs at about 2 GB/s (the host supplies each page), and a queue's first
    /// writes should not pay for it.
    fn populate(&mut self) {
        // SAFETY: the range is this mapping; MADV_POPULATE_WRITE only faults pages in.
        let done = unsafe { libc::madvise(self.ptr.as_ptr().cast(), self.len, libc::MADV_POPULATE_WRITE) } == 0;
        if !done {
            // Kernels before 5.14: one write per page does the same.
            for page in (0..self.len).step_by(BLOCK) {
                // SAFETY: `page` is within the mapping, which is writable.
                unsafe { self.ptr.as_ptr().add(page).write_volatile(0) };
            }
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the region was mapped by `Mapping::new` and nothing refers to it any more.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

impl AlignedBuf {
    pub fn new(len: usize) -> io::Result<AlignedBuf> {
        Ok(AlignedBuf { map: Some(Mapping::new(len.max(BLOCK))?) })
    }

    fn capacity(&self) -> usize {
        self.map.as_ref().map_or(0, |m| m.len)
    }

    fn bytes(&self) -> &[u8] {
        match &self.map {
            // SAFETY: the mapping is `len` readable bytes (zeroed when mapped) owned by `self`.
            Some(m) => unsafe { std::slice::from_raw_parts(m.ptr.as_ptr(), m.len) },
            None => &[],
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.map {
            // SAFETY: as in `bytes`, and `&mut self` makes this the only reference.
            Some(m) => unsafe { std::slice::from_raw_parts_mut(m.ptr.as_ptr(), m.len) },
            None => &mut [],
        }
    }

    /// The first `len` bytes, as last written through [`AlignedBuf::slice`].
    pub fn filled(&self, len: usize) -> &[u8] {
        &self.bytes()[..len]
    }

    /// The first `len` bytes, to write into; grows (losing the contents) when too small.
    pub fn slice(&mut self, len: usize) -> io::Result<&mut [u8]> {
        if len > self.capacity() {
            *self = AlignedBuf::new(len.next_power_of_two())?;
        }
        Ok(&mut self.bytes_mut()[..len])
    }
}

/// The writer's buffer: the frames of the groups not yet written, encoded straight into it
/// ([`ByteBuf`]), after a `head`.
///
/// With direct I/O the head holds the live bytes of the block on disk that the frames follow,
/// so from its first byte the buffer is exactly what the next write puts at that block: no
/// copy into a write buffer (it cost as much CPU time as encoding the events). Through the page
/// cache the head is empty. Growing keeps the contents.
#[derive(Default)]
pub(crate) struct StageBuf {
    buf: AlignedBuf,
    head: usize,
    len: usize,
}

impl StageBuf {
    /// A buffer with room for `len` bytes before it grows, its pages already faulted in.
    pub fn with_capacity(len: usize) -> io::Result<StageBuf> {
        let mut buf = AlignedBuf::new(len)?;
        if let Some(map) = &mut buf.map {
            map.populate();
        }
        Ok(StageBuf { buf, head: 0, len: 0 })
    }

    /// The frames, without the head.
    pub fn frames(&self) -> &[u8] {
        &self.buf.bytes()[self.head..self.head + self.len]
    }

    /// Room for `total` bytes from the buffer's start, keeping head and frames.
    fn ensure(&mut self, total: usize) -> io::Result<()> {
        if total > self.buf.capacity() {
            let mut bigger = AlignedBuf::new(total.next_power_of_two())?;
            let used = self.head + self.len;
            bigger.bytes_mut()[..used].copy_from_slice(&self.buf.bytes()[..used]);
            self.buf = bigger;
        }
        Ok(())
    }

    /// Makes `head` the bytes before the frames (when the writer moves to another segment or
    /// resumes one), keeping the frames after it.
    pub fn set_head(&mut self, head: &[u8]) -> io::Result<()> {
        self.ensure(head.len() + self.len)?;
        let bytes = self.buf.bytes_mut();
        bytes.copy_within(self.head..self.head + self.len, head.len());
        bytes[..head.len()].copy_from_slice(head);
        self.head = head.len();
        Ok(())
    }

    /// The frames followed by the end marker, for a write through the page cache.
    pub fn frames_with_marker(&mut self) -> io::Result<&[u8]> {
        let end = self.head + self.len;
        self.ensure(end + END_MARKER)?;
        let bytes = self.buf.bytes_mut();
        bytes[end..end + END_MARKER].fill(0);
        Ok(&bytes[self.head..end + END_MARKER])
    }

    /// Head, frames, then zeros (the end marker at least) to the next block boundary.
    fn blocks(&mut self) -> io::Result<&[u8]> {
        let end = self.head + self.len;
        let padded = (end + END_MARKER).next_multiple_of(BLOCK);
        self.ensure(padded)?;
        let bytes = self.buf.bytes_mut();
        bytes[end..padded].fill(0);
        Ok(&bytes[..padded])
    }

    /// After [`StageBuf::blocks`] was written: the live part of its last block is the next head.
    fn blocks_written(&mut self) {
        let end = self.head + self.len;
        let last_block = end & !(BLOCK - 1);
        self.buf.bytes_mut().copy_within(last_block..end, 0);
        self.head = end - last_block;
        self.len = 0;
    }

    /// Forgets the frames (written through the page cache, or given up); the head stays.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Grows or aborts, as a `Vec` does when memory runs out.
    fn reserve_or_abort(&mut self, additional: usize) {
        let total = self.head + self.len + additional;
        if let Err(e) = self.ensure(total) {
            tracing::error!(bytes = total, error = %e, "cannot map the persisted queue's write buffer");
            std::alloc::handle_alloc_error(
                std::alloc::Layout::from_size_align(total, BLOCK).unwrap_or(std::alloc::Layout::new::<[u8; BLOCK]>()),
            );
        }
    }
}

impl ByteBuf for StageBuf {
    #[inline(always)]
    fn len(&self) -> usize {
        self.len
    }

    #[inline]
    fn reserve(&mut self, additional: usize) {
        if self.head + self.len + additional > self.buf.capacity() {
            self.reserve_or_abort(additional);
        }
    }

    #[inline]
    fn push(&mut self, byte: u8) {
        self.extend_from_slice(&[byte]);
    }

    #[inline]
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.reserve(bytes.len());
        let at = self.head + self.len;
        self.buf.bytes_mut()[at..at + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    #[inline(always)]
    fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    #[inline]
    fn as_slice(&self) -> &[u8] {
        self.frames()
    }

    #[inline]
    fn as_mut_slice(&mut self) -> &mut [u8] {
        let (head, len) = (self.head, self.len);
        &mut self.buf.bytes_mut()[head..head + len]
    }

    #[inline]
    fn as_mut_ptr(&mut self) -> *mut u8 {
        let head = self.head;
        self.buf.bytes_mut()[head..].as_mut_ptr()
    }

    #[inline(always)]
    unsafe fn set_len(&mut self, len: usize) {
        debug_assert!(self.head + len <= self.buf.capacity());
        self.len = len;
    }
}

/// An open segment written with `O_DIRECT`.
pub(crate) struct DirectFile {
    file: File,
    /// The segment this handle writes, to notice when the writer moved on to another.
    pub segment: u64,
    /// Live bytes of the block that held the end of the live frames when the file was opened
    /// (the first `opening_len`). After that the writer's [`StageBuf`] keeps the live head.
    opening: [u8; BLOCK],
    opening_len: usize,
}

impl DirectFile {
    /// Opens `path` for direct writes after the `live_len` bytes already there (read back from
    /// `buffered`, the writer's ordinary handle). `None` if the filesystem does not do direct
    /// I/O.
    pub fn open(path: &Path, segment: u64, live_len: u64, buffered: &File) -> io::Result<Option<DirectFile>> {
        let file = match OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(path) {
            Ok(f) => f,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(None),
            Err(e) => return Err(e),
        };
        let block_start = live_len & !(BLOCK as u64 - 1);
        let opening_len = (live_len - block_start) as usize;
        let mut opening = [0u8; BLOCK];
        buffered.read_exact_at(&mut opening[..opening_len], block_start)?;
        Ok(Some(DirectFile { file, segment, opening, opening_len }))
    }

    /// The live bytes of the last block when the file was opened: the head a [`StageBuf`]
    /// needs before its first write here.
    pub fn opening_head(&self) -> &[u8] {
        &self.opening[..self.opening_len]
    }

    /// Writes a block-aligned buffer at a block-aligned offset, as it is.
    pub fn write_raw(&self, blocks: &[u8], at: u64) -> io::Result<()> {
        self.file.write_all_at(blocks, at)
    }

    /// Writes the frames of `stage` at `at`, the end of the live frames, followed by the end
    /// marker; `stage`'s head must be the live bytes of `at`'s block. On success the stage
    /// keeps only the new head. EINVAL means the filesystem accepted the open but not the
    /// write: the caller falls back.
    pub fn write(&self, stage: &mut StageBuf, at: u64) -> io::Result<()> {
        let block_start = at & !(BLOCK as u64 - 1);
        let head = (at - block_start) as usize;
        if stage.head != head {
            return Err(io::Error::other(format!(
                "direct writer out of step: live end at block offset {head}, {} bytes staged before the frames",
                stage.head
            )));
        }
        self.file.write_all_at(stage.blocks()?, block_start)?;
        stage.blocks_written();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn live(path: &Path) -> Vec<u8> {
        std::fs::read(path).unwrap()
    }

    /// Opens `path` for direct writes after `live_len` bytes, with a stage whose head is set.
    fn open(path: &Path, live_len: u64) -> Option<(DirectFile, StageBuf)> {
        let buffered = OpenOptions::new().read(true).write(true).open(path).unwrap();
        let d = DirectFile::open(path, 1, live_len, &buffered).unwrap()?;
        let mut stage = StageBuf::with_capacity(BLOCK).unwrap();
        stage.set_head(d.opening_head()).unwrap();
        Some((d, stage))
    }

    #[test]
    fn writes_land_exactly_after_the_live_bytes_with_zeros_after() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seg");
        // Stale bytes beyond the live head, as in a reused segment file.
        std::fs::write(&path, vec![0xAAu8; 3 * BLOCK]).unwrap();
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().write_all_at(&[7u8; 64], 0).unwrap();
        let Some((d, mut stage)) = open(&path, 64) else {
            eprintln!("no O_DIRECT on this filesystem; nothing to test");
            return;
        };
        let mut expected = vec![7u8; 64];
        let mut at = 64u64;
        // Small writes, one that crosses blocks, and one that makes the stage grow.
        for (i, len) in [10usize, 4000, 1, 5000, 96, 3 * BLOCK + 5].into_iter().enumerate() {
            let frames = vec![i as u8 + 1; len];
            stage.extend_from_slice(&frames);
            d.write(&mut stage, at).unwrap();
            assert!(stage.is_empty(), "a write leaves no frames staged");
            at += len as u64;
            expected.extend_from_slice(&frames);
            let bytes = live(&path);
            assert_eq!(&bytes[..expected.len()], &expected[..], "after write {i}");
            let marker_end = (expected.len() + END_MARKER).next_multiple_of(BLOCK);
            assert!(bytes[expected.len()..marker_end].iter().all(|&b| b == 0), "zeros follow write {i}");
        }
        // A write that does not start at the live end is refused, not misplaced.
        stage.extend_from_slice(b"x");
        assert!(d.write(&mut stage, at + 1).is_err());
    }

    /// What the docs say about tmpfs: it takes `O_DIRECT` (Linux 6.6 and later; earlier kernels
    /// refuse the open with EINVAL), and a segment there is written directly, in place. Where it
    /// is refused, `DirectFile::open` says so with `None` and the queue uses the page cache.
    #[test]
    fn tmpfs_and_o_direct() {
        let Some(mount) = sluice_testkit::SmallTmpfs::mount("1m") else { return };
        let dir = tempfile::tempdir_in(mount.path()).unwrap();
        let path = dir.path().join("seg");
        std::fs::write(&path, vec![0u8; 2 * BLOCK]).unwrap();
        let kernel_accepts = OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(&path);
        let buffered = OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let opened = DirectFile::open(&path, 1, 0, &buffered).unwrap();
        match kernel_accepts {
            Ok(_) => {
                eprintln!("tmpfs at {} accepts O_DIRECT", mount.path().display());
                let d = opened.expect("the kernel accepts O_DIRECT here, so the queue writes directly");
                let mut stage = StageBuf::with_capacity(BLOCK).unwrap();
                stage.set_head(d.opening_head()).unwrap();
                stage.extend_from_slice(b"frames");
                d.write(&mut stage, 0).unwrap();
                assert_eq!(&live(&path)[..6], b"frames");
            }
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
                eprintln!("tmpfs at {} refuses O_DIRECT (EINVAL)", mount.path().display());
                assert!(opened.is_none(), "refused: the queue falls back to the page cache");
            }
        }
    }

    #[test]
    fn resumes_after_existing_live_bytes_and_keeps_staged_frames_when_the_head_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("seg");
        let existing: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &existing).unwrap();
        // Frames staged before the handle for their segment was opened (the writer moved on to
        // a new segment): setting the head moves them, it does not overwrite them.
        let mut stage = StageBuf::with_capacity(BLOCK).unwrap();
        stage.set_head(&[9u8; 100]).unwrap();
        stage.extend_from_slice(b"next");
        let buffered = OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let Some(d) = DirectFile::open(&path, 1, existing.len() as u64, &buffered).unwrap() else { return };
        stage.set_head(d.opening_head()).unwrap();
        assert_eq!(stage.frames(), b"next");
        d.write(&mut stage, existing.len() as u64).unwrap();
        let bytes = live(&path);
        assert_eq!(&bytes[..existing.len()], &existing[..]);
        assert_eq!(&bytes[existing.len()..existing.len() + 4], b"next");
    }

    #[test]
    fn a_stage_grows_keeping_its_head_and_frames() {
        let mut stage = StageBuf::with_capacity(BLOCK).unwrap();
        stage.set_head(&[1u8; 10]).unwrap();
        let frames: Vec<u8> = (0..3 * BLOCK).map(|i| (i % 253) as u8).collect();
        for chunk in frames.chunks(1000) {
            stage.extend_from_slice(chunk);
        }
        assert_eq!(stage.frames(), &frames[..]);
        assert_eq!(&stage.blocks().unwrap()[..10], &[1u8; 10]);
        // Through the page cache: the frames, then the end marker.
        let with_marker = stage.frames_with_marker().unwrap().to_vec();
        assert_eq!(&with_marker[..frames.len()], &frames[..]);
        assert_eq!(&with_marker[frames.len()..], &[0u8; END_MARKER]);
    }
}
