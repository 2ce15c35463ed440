//! The byte buffers frames and event encodings are appended to.
//!
//! `Vec<u8>` is one. A writer with its own buffer (the persisted queue's block-aligned one,
//! written with direct I/O) implements [`ByteBuf`] so that events are encoded straight into
//! the memory the device reads, not into a vector and then copied there.
//!
//! ```
//! use sluice_segment::{ByteBuf, append_frame};
//!
//! let mut out = Vec::new();
//! append_frame(&mut out, 1, |body| body.extend_from_slice(b"hello")).unwrap();
//! assert_eq!(ByteBuf::len(&out), out.len());
//! ```

/// A growable byte buffer: what the encoders need of a `Vec<u8>`.
pub trait ByteBuf {
    /// Bytes appended so far (those [`ByteBuf::as_slice`] returns).
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Makes room for at least `additional` more bytes, keeping those appended.
    fn reserve(&mut self, additional: usize);

    fn push(&mut self, byte: u8);

    fn extend_from_slice(&mut self, bytes: &[u8]);

    /// Forgets the bytes after the first `len` (no effect if there are fewer).
    fn truncate(&mut self, len: usize);

    fn as_slice(&self) -> &[u8];

    fn as_mut_slice(&mut self) -> &mut [u8];

    /// The start of the buffer: byte `i` of [`ByteBuf::as_slice`] is at `as_mut_ptr() + i`, and
    /// the spare room [`ByteBuf::reserve`] made follows the appended bytes.
    fn as_mut_ptr(&mut self) -> *mut u8;

    /// Sets the length to `len`.
    ///
    /// # Safety
    /// `len` is within the room [`ByteBuf::reserve`] made, and every byte up to it was
    /// written.
    unsafe fn set_len(&mut self, len: usize);
}

impl ByteBuf for Vec<u8> {
    #[inline(always)]
    fn len(&self) -> usize {
        Vec::len(self)
    }

    #[inline(always)]
    fn reserve(&mut self, additional: usize) {
        Vec::reserve(self, additional)
    }

    #[inline(always)]
    fn push(&mut self, byte: u8) {
        Vec::push(self, byte)
    }

    #[inline(always)]
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        Vec::extend_from_slice(self, bytes)
    }

    #[inline(always)]
    fn truncate(&mut self, len: usize) {
        Vec::truncate(self, len)
    }

    #[inline(always)]
    fn as_slice(&self) -> &[u8] {
        self
    }

    #[inline(always)]
    fn as_mut_slice(&mut self) -> &mut [u8] {
        self
    }

    #[inline(always)]
    fn as_mut_ptr(&mut self) -> *mut u8 {
        Vec::as_mut_ptr(self)
    }

    #[inline(always)]
    unsafe fn set_len(&mut self, len: usize) {
        // SAFETY: the caller's promise is `Vec::set_len`'s.
        unsafe { Vec::set_len(self, len) }
    }
}
