//! [`Cursor`]: the acknowledgement path. A commit stores the offset in the key's slot and, only
//! when the slot was clean, queues it for the writer: no syscall, no allocation in steady state,
//! and no lock the writer holds during I/O.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::Value;

use crate::format::{self, Meta};
use crate::state::*;

/// A handle on one key for the acknowledgement path. Cheap to clone.
#[derive(Clone)]
pub struct Cursor {
    pub(crate) slot: Arc<Slot>,
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cursor")
            .field("key", &self.slot.key)
            .field("offset", &self.slot.offset.load(Ordering::Relaxed))
            .finish()
    }
}

impl Cursor {
    /// Records `offset` as the key's newest cursor. No syscall, no allocation in steady state,
    /// and no lock the writer holds during I/O; the writer persists it with its next flush.
    /// Only the commit that finds the key clean queues it (a short, uncontended lock); with a
    /// zero flush interval that commit also wakes the writer.
    #[inline]
    pub fn commit(&self, offset: u64) {
        if self.shared.disabled {
            return;
        }
        let slot = &*self.slot;
        // SeqCst pairs with the writer's `fetch_and(!DIRTY)` then offset load: either the writer
        // reads this offset, or this commit sees the slot clean and queues it again.
        slot.offset.store(offset, Ordering::SeqCst);
        if slot.state.load(Ordering::SeqCst) & (DIRTY | LIVE) != (DIRTY | LIVE) {
            self.mark_dirty();
        }
    }

    #[cold]
    pub(crate) fn mark_dirty(&self) {
        let prev = self.slot.state.fetch_or(DIRTY | LIVE, Ordering::SeqCst);
        if prev & DIRTY == 0 {
            self.shared.push(PendingOp::Slot(self.slot.clone()));
        }
    }

    /// Replaces the key's metadata (file identity, path after a rename); rare. Persisted with
    /// the next flush. Like a commit, it creates the key if it does not exist yet.
    pub fn set_meta(&self, meta: Value) {
        let meta = Meta::new(meta);
        if meta.bytes.len() > format::MAX_META_LEN {
            tracing::error!(key = %self.slot.key, bytes = meta.bytes.len(), limit = format::MAX_META_LEN,
                "registry metadata too large; keeping the previous metadata");
            return;
        }
        *self.slot.meta.lock() = Arc::new(meta);
        self.mark_dirty();
    }

    pub fn key(&self) -> &str {
        &self.slot.key
    }

    /// The newest offset committed through any handle on this key (or loaded at start-up).
    pub fn offset(&self) -> u64 {
        self.slot.offset.load(Ordering::Relaxed)
    }
}
