//! What the registry, its cursors and its writer share: one slot per key (its newest offset,
//! metadata and dirty flag, written by the ack path with atomics only), the list of keys pending
//! for the writer, and the control block the writer is woken and stopped through.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex, RwLock};

use crate::format::Meta;
use crate::*;

pub(crate) const DIRTY: u8 = 1;
/// The key has been committed (or given metadata) at least once and so exists.
pub(crate) const LIVE: u8 = 2;
/// The key was removed; this slot is detached and its updates are ignored.
pub(crate) const REMOVED: u8 = 4;

pub(crate) struct Slot {
    pub(crate) key: Box<str>,
    pub(crate) offset: AtomicU64,
    pub(crate) state: AtomicU8,
    pub(crate) meta: Mutex<Arc<Meta>>,
    pub(crate) updated_ms: AtomicU64,
}

pub(crate) enum PendingOp {
    Slot(Arc<Slot>),
    Remove(Box<str>),
}

#[derive(Default)]
pub(crate) struct Control {
    /// Flush requests made / fully handled (written and fsynced, or failed).
    pub(crate) requested: u64,
    pub(crate) completed: u64,
    /// The error of the last cycle, if it failed.
    pub(crate) last_error: Option<String>,
    pub(crate) stop: bool,
    pub(crate) stopped: bool,
}

pub(crate) struct Shared {
    pub(crate) dir: PathBuf,
    pub(crate) slots: RwLock<HashMap<Box<str>, Arc<Slot>>>,
    pub(crate) pending: Mutex<Vec<PendingOp>>,
    pub(crate) control: Mutex<Control>,
    pub(crate) wake: Condvar,
    /// `flush_interval` is zero: a commit that makes the pending list non-empty wakes the writer.
    pub(crate) eager: bool,
    pub(crate) disabled: bool,
    /// An in-memory registry ([`Registry::in_memory`]): nothing is queued or written.
    pub(crate) memory_only: bool,
    pub(crate) warned_memory_only: std::sync::atomic::AtomicBool,
    pub(crate) stats: Arc<RegistryMetrics>,
    /// Test support: the number of upcoming file writes to fail, and with what errno (0: a
    /// plain error).
    #[cfg(test)]
    pub(crate) fail_writes: Arc<std::sync::atomic::AtomicU32>,
    #[cfg(test)]
    pub(crate) fail_errno: Arc<std::sync::atomic::AtomicI32>,
}

impl Shared {
    pub(crate) fn push(&self, op: PendingOp) {
        let was_empty = {
            let mut p = self.pending.lock();
            p.push(op);
            p.len() == 1
        };
        if self.eager && was_empty {
            // Taking the control lock orders this wake-up after the writer's "is anything
            // pending?" check, so it cannot be lost.
            let _c = self.control.lock();
            self.wake.notify_all();
        }
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

pub(crate) fn ms_to_time(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

pub(crate) fn entry_of(slot: &Slot) -> Option<Entry> {
    if slot.state.load(Ordering::Acquire) & LIVE == 0 {
        return None;
    }
    Some(Entry {
        key: slot.key.to_string(),
        offset: slot.offset.load(Ordering::Acquire),
        meta: slot.meta.lock().value.clone(),
        updated: ms_to_time(slot.updated_ms.load(Ordering::Relaxed)),
    })
}
