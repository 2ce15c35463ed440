//! The string type of values and keys, and the shared buffers strings can point into.
//!
//! A [`Str`] is one of:
//! - inline text up to 24 bytes, which never touches the allocator (keys, levels, hosts);
//! - its own heap copy;
//! - a slice of a [`SharedText`]: a buffer of many lines read at once (the file input's
//!   chunk of lines), which every event made from it points into, so that an event's
//!   `message` costs neither an allocation and a copy where it is made nor a free on the thread
//!   that finishes it.
//!
//! Guarantees: a `Str` is always valid UTF-8 (a slice is checked when it is made); it is 24
//! bytes whatever it holds, so `Value` stays 32; equality, ordering and hashing are those of
//! the text, never of how it is stored; a change to a slice first makes it its own copy.
//!
//! A slice keeps its whole buffer alive, so a buffer less than half full of text is moved to
//! one of its own size before it is shared: a slice then holds at most about twice its share
//! of bytes. Code that will keep strings for long (an aggregation's state) should store
//! `Str::new(s.as_str())`, so that one small string does not hold a large buffer.
//!
//! ```
//! use sluice_core::{SharedText, Str};
//!
//! let buf = SharedText::new(b"first line, long enough to be worth sharing\nsecond".to_vec());
//! let first = buf.slice(0..43).unwrap();
//! assert_eq!(first, "first line, long enough to be worth sharing");
//! assert!(first.is_shared());
//! let mut own = first.clone();
//! own.push_str("!");
//! assert!(!own.is_shared());
//! assert_eq!(Str::from("second"), buf.slice(44..50).unwrap());
//! ```

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::{Deref, Range};
use std::sync::Arc;

use compact_str::CompactString;

use crate::memory::{MemoryBudget, MemoryCharge};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A string: inline, on the heap, or a slice of a [`SharedText`] (see the module comment).
#[derive(Clone)]
pub struct Str(Repr);

#[derive(Clone)]
enum Repr {
    Own(CompactString),
    Slice(Slice),
}

/// `buf[start..start + len]`, known to be UTF-8. 16 bytes, so that it fits beside the byte
/// that tells `CompactString`'s forms apart and `Str` stays 24.
#[derive(Clone)]
struct Slice {
    buf: Arc<Buffer>,
    start: u32,
    len: u32,
}

/// A shared buffer's bytes, and the pool they go back to when the last string lets go.
struct Buffer {
    bytes: Vec<u8>,
    /// The whole buffer is UTF-8 (checked once when shared): a slice of it then needs only
    /// its two ends checked to be at character boundaries.
    utf8: bool,
    home: Option<Arc<TextPool>>,
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if let Some(pool) = &self.home {
            pool.put(std::mem::take(&mut self.bytes));
        }
    }
}

/// Buffers for [`SharedText`]s to be filled again once every string in them is gone.
///
/// Why: a reader fills a buffer on one thread and the events pointing into it are finished on
/// others. Freed there, each buffer's memory went back through the allocator's cross-thread
/// path and new ones were taken from fresh pages (about 20 MiB more resident in the file
/// benchmark); handed back here, the reader fills the same warm pages again.
pub struct TextPool {
    spare: parking_lot::Mutex<Spare>,
    keep: usize,
    largest: usize,
}

/// The buffers a pool keeps, and their charge when the pool is charged to a budget.
struct Spare {
    buffers: Vec<Vec<u8>>,
    /// Capacity of `buffers`, in bytes.
    bytes: usize,
    /// What `bytes` holds of the node's budget ([`TextPool::charged`]); uncharged otherwise.
    charge: Option<MemoryCharge>,
}

impl TextPool {
    /// A pool keeping up to `keep` buffers of at most `largest` bytes of capacity (a buffer
    /// grown for an exceptional line is freed rather than kept).
    pub fn new(keep: usize, largest: usize) -> Arc<TextPool> {
        TextPool::build(keep, largest, None)
    }

    /// A pool whose kept buffers are charged to `budget`: one is kept only while the budget
    /// has room for it (so what a pool holds idle counts against the events it would crowd
    /// out, and goes when they need it), and freed otherwise.
    pub fn charged(keep: usize, largest: usize, budget: &Arc<MemoryBudget>) -> Arc<TextPool> {
        TextPool::build(keep, largest, Some(budget.empty()))
    }

    fn build(keep: usize, largest: usize, charge: Option<MemoryCharge>) -> Arc<TextPool> {
        let spare = Spare { buffers: Vec::with_capacity(keep), bytes: 0, charge };
        Arc::new(TextPool { spare: parking_lot::Mutex::new(spare), keep, largest })
    }

    /// An empty buffer with room for at least `capacity` bytes: a returned one if there is
    /// one not more than twice that big (a larger one would be less than half full, and is
    /// freed instead).
    pub fn take(&self, capacity: usize) -> Vec<u8> {
        let kept = {
            let mut spare = self.spare.lock();
            let kept = spare.buffers.pop();
            if let Some(b) = &kept {
                spare.bytes -= b.capacity();
                let bytes = spare.bytes;
                if let Some(charge) = &mut spare.charge {
                    charge.shrink_to(bytes);
                }
            }
            kept
        };
        let mut bytes = match kept {
            Some(b) if b.capacity() <= capacity.saturating_mul(2) => b,
            _ => Vec::new(),
        };
        bytes.reserve(capacity);
        bytes
    }

    fn put(&self, mut bytes: Vec<u8>) {
        if bytes.capacity() == 0 || bytes.capacity() > self.largest {
            return;
        }
        bytes.clear();
        let mut spare = self.spare.lock();
        if spare.buffers.len() >= self.keep {
            return;
        }
        if let Some(charge) = &mut spare.charge
            && !charge.try_grow(bytes.capacity())
        {
            return;
        }
        spare.bytes += bytes.capacity();
        spare.buffers.push(bytes);
    }

    /// Buffers waiting to be taken.
    pub fn spare(&self) -> usize {
        self.spare.lock().buffers.len()
    }
}

/// Longest text kept inline by `CompactString`; shorter slices are copied, not shared.
const INLINE: usize = 24;

/// A buffer of text that strings can share (see [`SharedText::slice`]).
#[derive(Clone)]
pub struct SharedText(Arc<Buffer>);

impl SharedText {
    pub fn new(bytes: Vec<u8>) -> SharedText {
        SharedText::with_home(bytes, None)
    }

    /// A buffer that goes back to `pool` when it and every string pointing into it are gone.
    pub fn pooled(bytes: Vec<u8>, pool: &Arc<TextPool>) -> SharedText {
        SharedText::with_home(bytes, Some(pool.clone()))
    }

    /// A pooled buffer that is not all text (records with binary headers, like a queue
    /// segment read back): it is not checked as a whole, so each slice checks its own bytes.
    pub fn pooled_records(bytes: Vec<u8>, pool: &Arc<TextPool>) -> SharedText {
        SharedText::build(bytes, Some(pool.clone()), false)
    }

    fn with_home(bytes: Vec<u8>, home: Option<Arc<TextPool>>) -> SharedText {
        SharedText::build(bytes, home, true)
    }

    /// A buffer less than half full is first moved to an allocation of its own size (and a
    /// pooled one goes back to its pool at once): a few lines in a large read buffer (a
    /// client sending one line at a time) must not hold the whole buffer each while a queue
    /// is full of them. So a slice holds at most about twice its share of bytes.
    fn build(mut bytes: Vec<u8>, mut home: Option<Arc<TextPool>>, check_text: bool) -> SharedText {
        if bytes.len() < bytes.capacity() / 2 {
            match home.take() {
                Some(pool) => {
                    let exact = bytes.to_vec();
                    pool.put(bytes);
                    bytes = exact;
                }
                None => bytes.shrink_to_fit(),
            }
        }
        let utf8 = check_text && simdutf8::basic::from_utf8(&bytes).is_ok();
        SharedText(Arc::new(Buffer { bytes, utf8, home }))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0.bytes
    }

    /// Where `part` lies in this buffer, if it is a slice of it (as a framer that cuts lines
    /// out of the buffer hands them out); `None` for bytes from anywhere else.
    pub fn range_of(&self, part: &[u8]) -> Option<Range<usize>> {
        let base = self.0.bytes.as_ptr() as usize;
        let start = (part.as_ptr() as usize).checked_sub(base)?;
        let end = start + part.len();
        (end <= self.0.bytes.len()).then_some(start..end)
    }

    /// The text in `range` as a string. Text that fits inline is copied (so it does not keep
    /// the buffer alive); longer text points into the buffer. Fails when the bytes are not
    /// UTF-8. Panics when `range` is out of bounds, like slicing.
    pub fn slice(&self, range: Range<usize>) -> Result<Str, simdutf8::basic::Utf8Error> {
        let buf = &self.0;
        let text = if buf.utf8 && is_char_boundary(&buf.bytes, range.start) && is_char_boundary(&buf.bytes, range.end) {
            // SAFETY: the whole buffer is UTF-8 and both ends are at character boundaries.
            unsafe { std::str::from_utf8_unchecked(&buf.bytes[range.clone()]) }
        } else {
            simdutf8::basic::from_utf8(&buf.bytes[range.clone()])?
        };
        if text.len() <= INLINE || range.end > u32::MAX as usize {
            return Ok(Str::new(text));
        }
        Ok(Str(Repr::Slice(Slice { buf: self.0.clone(), start: range.start as u32, len: text.len() as u32 })))
    }
}

/// Whether `at` starts a character in UTF-8 `bytes` (or is their end), as `str` defines it.
fn is_char_boundary(bytes: &[u8], at: usize) -> bool {
    match bytes.get(at) {
        None => at == bytes.len(),
        // Not a continuation byte (0b10xx_xxxx).
        Some(&b) => (b as i8) >= -0x40,
    }
}

impl Str {
    pub fn new(text: &str) -> Str {
        Str(Repr::Own(CompactString::new(text)))
    }

    #[inline]
    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Own(s) => s.as_str(),
            Repr::Slice(s) => {
                let bytes = &s.buf.bytes[s.start as usize..(s.start + s.len) as usize];
                // SAFETY: checked to be UTF-8 when the slice was made, and the buffer is
                // never changed while shared.
                unsafe { std::str::from_utf8_unchecked(bytes) }
            }
        }
    }

    /// Whether the text is held inline: cloning it then copies 24 bytes and nothing else.
    pub fn is_inline(&self) -> bool {
        matches!(&self.0, Repr::Own(s) if !s.is_heap_allocated())
    }

    /// Heap bytes this string owns alone: its own copy, or nothing when inline or a slice of a
    /// shared buffer (whose bytes are counted once, by whoever made the buffer).
    pub fn heap_bytes(&self) -> usize {
        match &self.0 {
            Repr::Own(s) if s.is_heap_allocated() => s.capacity() + crate::value::ALLOCATION_OVERHEAD,
            _ => 0,
        }
    }

    /// Whether this string points into a shared buffer.
    pub fn is_shared(&self) -> bool {
        matches!(self.0, Repr::Slice(_))
    }

    /// The text to change: a slice becomes its own copy first.
    fn make_mut(&mut self) -> &mut CompactString {
        if let Repr::Slice(_) = self.0 {
            self.0 = Repr::Own(CompactString::new(self.as_str()));
        }
        match &mut self.0 {
            Repr::Own(s) => s,
            Repr::Slice(_) => unreachable!("made its own copy above"),
        }
    }

    /// The text, to change in place (a slice becomes its own copy first).
    pub fn as_mut_str(&mut self) -> &mut str {
        self.make_mut().as_mut_str()
    }

    pub fn push_str(&mut self, text: &str) {
        self.make_mut().push_str(text);
    }
}

impl Default for Str {
    fn default() -> Str {
        Str(Repr::Own(CompactString::default()))
    }
}

impl Deref for Str {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Str {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for Str {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Debug for Str {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Str {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq for Str {
    #[inline]
    fn eq(&self, other: &Str) -> bool {
        self.as_str() == other.as_str()
    }
}
impl Eq for Str {}

impl PartialEq<str> for Str {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}
impl PartialEq<&str> for Str {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}
impl PartialEq<String> for Str {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other.as_str()
    }
}
impl PartialEq<Str> for str {
    fn eq(&self, other: &Str) -> bool {
        self == other.as_str()
    }
}
impl PartialEq<Str> for &str {
    fn eq(&self, other: &Str) -> bool {
        *self == other.as_str()
    }
}
impl PartialEq<Str> for String {
    fn eq(&self, other: &Str) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialOrd for Str {
    fn partial_cmp(&self, other: &Str) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Str {
    fn cmp(&self, other: &Str) -> Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl Hash for Str {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state)
    }
}

impl From<&str> for Str {
    fn from(s: &str) -> Str {
        Str::new(s)
    }
}
impl From<String> for Str {
    fn from(s: String) -> Str {
        Str(Repr::Own(CompactString::from(s)))
    }
}

impl Serialize for Str {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Str {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Str, D::Error> {
        CompactString::deserialize(d).map(|s| Str(Repr::Own(s)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: &str = "a line of text that is longer than what fits inline";

    #[test]
    fn a_str_is_24_bytes_whatever_it_holds() {
        assert_eq!(std::mem::size_of::<Str>(), 24);
        assert_eq!(std::mem::size_of::<Option<Str>>(), 24);
    }

    #[test]
    fn long_text_is_shared_and_short_text_copied() {
        let text = format!("{LONG}\nshort\n");
        let buf = SharedText::new(text.clone().into_bytes());
        let long = buf.slice(0..LONG.len()).unwrap();
        let short = buf.slice(LONG.len() + 1..LONG.len() + 6).unwrap();
        assert!(long.is_shared());
        assert!(!short.is_shared());
        assert_eq!(long, LONG);
        assert_eq!(short, "short");
        // The buffer is held by the shared string only.
        drop(buf);
        assert_eq!(long.as_str(), LONG);
        assert_eq!(
            Arc::strong_count(match &long.0 {
                Repr::Slice(s) => &s.buf,
                Repr::Own(_) => unreachable!(),
            }),
            1
        );
    }

    #[test]
    fn a_slice_of_the_buffer_is_found_and_other_bytes_are_not() {
        let buf = SharedText::new(LONG.as_bytes().to_vec());
        let bytes = buf.as_bytes();
        assert_eq!(buf.range_of(&bytes[5..20]), Some(5..20));
        assert_eq!(buf.range_of(&bytes[LONG.len()..]), Some(LONG.len()..LONG.len()));
        let elsewhere = LONG.as_bytes().to_vec();
        assert_eq!(buf.range_of(&elsewhere[5..20]), None);
    }

    #[test]
    fn invalid_utf8_is_refused() {
        let buf = SharedText::new(vec![b'a'; 40].into_iter().chain([0xff]).collect());
        assert!(buf.slice(0..41).is_err());
        assert!(buf.slice(0..40).is_ok());
        // A valid buffer cut inside a character: neither half is text.
        let text = format!("{LONG}\u{e9}{LONG}");
        let cut = LONG.len() + 1;
        let buf = SharedText::new(text.clone().into_bytes());
        assert!(buf.slice(0..cut).is_err());
        assert!(buf.slice(cut..text.len()).is_err());
        assert_eq!(buf.slice(0..cut + 1).unwrap(), format!("{LONG}\u{e9}"));
        assert_eq!(buf.slice(cut + 1..text.len()).unwrap(), LONG);
        assert_eq!(buf.slice(text.len()..text.len()).unwrap(), "");
    }

    #[test]
    fn a_change_copies_and_releases_the_buffer() {
        let buf = SharedText::new(LONG.as_bytes().to_vec());
        let shared = buf.slice(0..LONG.len()).unwrap();
        let mut changed = shared.clone();
        changed.push_str("!");
        assert!(!changed.is_shared());
        assert_eq!(changed, format!("{LONG}!"));
        assert_eq!(shared, LONG);
        let mut upper = shared;
        upper.as_mut_str().make_ascii_uppercase();
        assert!(!upper.is_shared());
        assert_eq!(Arc::strong_count(&buf.0), 1, "no string holds the buffer any more");
        assert_eq!(upper, LONG.to_ascii_uppercase());
    }

    #[test]
    fn a_mostly_empty_buffer_is_shared_from_an_allocation_of_its_own_size() {
        let pool = TextPool::new(2, 1 << 20);
        let mut bytes = pool.take(4 * LONG.len());
        bytes.extend_from_slice(LONG.as_bytes());
        let sparse = SharedText::pooled(bytes, &pool);
        assert_eq!(pool.spare(), 1, "the large buffer went back at once");
        assert_eq!(sparse.0.bytes.capacity(), LONG.len());
        let s = sparse.slice(0..LONG.len()).unwrap();
        assert!(s.is_shared());
        assert_eq!(s, LONG);
        drop((sparse, s));
        assert_eq!(pool.spare(), 1, "the small copy is not pooled");
        let mut bytes = Vec::with_capacity(4 * LONG.len());
        bytes.extend_from_slice(LONG.as_bytes());
        assert!(SharedText::new(bytes).0.bytes.capacity() < 2 * LONG.len(), "shrunk");
    }

    #[test]
    fn a_charged_pool_keeps_buffers_only_while_the_budget_has_room() {
        let budget = MemoryBudget::new(1 << 20);
        let pool = TextPool::charged(8, 1 << 20, &budget);
        let a = pool.take(256 << 10);
        let b = pool.take(256 << 10);
        assert_eq!(budget.used(), 0, "buffers in use are the events' to charge");
        pool.put(a);
        assert_eq!(pool.spare(), 1);
        assert_eq!(budget.used(), 256 << 10, "a kept buffer is charged");
        // With the rest of the budget taken, a returned buffer is freed, not kept.
        let events = budget.try_charge(budget.limit() - budget.used()).unwrap();
        pool.put(b);
        assert_eq!(pool.spare(), 1, "no room: freed");
        drop(events);
        let again = pool.take(256 << 10);
        assert!(again.capacity() >= 256 << 10);
        assert_eq!((pool.spare(), budget.used()), (0, 0), "taken back: its charge goes");
    }

    #[test]
    fn a_pooled_buffer_returns_when_its_last_string_is_gone() {
        let pool = TextPool::new(2, 1 << 20);
        let mut bytes = pool.take(100);
        bytes.extend_from_slice(LONG.as_bytes());
        let buf = SharedText::pooled(bytes, &pool);
        let s = buf.slice(0..LONG.len()).unwrap();
        drop(buf);
        assert_eq!(pool.spare(), 0, "a string still points into it");
        drop(s);
        assert_eq!(pool.spare(), 1);
        let again = pool.take(60);
        assert!(again.is_empty() && again.capacity() >= 100, "the same buffer, emptied");
        drop(SharedText::pooled(again, &pool));
        assert_eq!(pool.spare(), 1);
        assert!(pool.take(10).capacity() < 100, "one far bigger than asked for is not handed out");
        assert_eq!(pool.spare(), 0);
        // A buffer grown past `largest` is not kept, and the pool keeps at most `keep`.
        drop(SharedText::pooled(vec![0; 2 << 20], &pool));
        for _ in 0..3 {
            drop(SharedText::pooled(Vec::with_capacity(64), &pool));
        }
        assert_eq!(pool.spare(), 2);
    }

    #[test]
    fn a_records_buffer_checks_each_slice_and_goes_back_to_its_pool() {
        let pool = TextPool::new(2, 1 << 20);
        let mut bytes = pool.take(2 * LONG.len());
        bytes.extend_from_slice(&[0xFF, 0x00]); // a binary header: not text as a whole
        bytes.extend_from_slice(LONG.as_bytes());
        bytes.extend_from_slice(&[0xC3, b'a', b'b']); // a broken character after the text
        let buf = SharedText::pooled_records(bytes, &pool);
        assert!(!buf.0.utf8, "not checked as a whole");
        let s = buf.slice(2..2 + LONG.len()).unwrap();
        assert!(s.is_shared());
        assert_eq!(s, LONG);
        assert!(buf.slice(2..buf.as_bytes().len()).is_err(), "the broken character is refused");
        drop((buf, s));
        assert_eq!(pool.spare(), 1);
    }

    #[test]
    fn equality_order_and_hash_follow_the_text() {
        use std::collections::hash_map::DefaultHasher;
        let buf = SharedText::new(LONG.as_bytes().to_vec());
        let (shared, own) = (buf.slice(0..LONG.len()).unwrap(), Str::from(LONG.to_string()));
        assert_eq!(shared, own);
        assert_eq!(shared.cmp(&own), Ordering::Equal);
        let hash = |s: &Str| {
            let mut h = DefaultHasher::new();
            s.hash(&mut h);
            h.finish()
        };
        assert_eq!(hash(&shared), hash(&own));
        assert_eq!(serde_json::to_string(&shared).unwrap(), serde_json::to_string(LONG).unwrap());
    }
}
