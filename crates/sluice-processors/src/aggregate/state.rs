//! The group table of `aggregate`: shards of open groups, each shard behind its own lock.
//!
//! A shard keeps its groups in a map from the encoded identification key to the group, and the
//! same keys in a queue in the order the groups were opened, with their deadlines. Groups open
//! in time order and all live `group_duration`, so deadlines are monotonic per shard (the time
//! a shard uses never goes back, see [`Shard::enter`]): conclusion and eviction pop from the
//! front, and no tick scans the table.
//!
//! A shard also holds the acknowledgements of the events its groups consumed: not per group
//! (ten thousand groups times thousands of batches would be millions of entries) but per time
//! slot, a queue of `(slot end, acks)` where one batch's pieces of one acker merge into one
//! entry. An event consumed at time `t <= end` went into a group that concludes by
//! `t + group_duration <= end + group_duration`, so a slot's acks are released only by a
//! conclusion at `now >= end + group_duration`, after every such group has been concluded in the
//! same locked section (or earlier, when evicted).

use std::borrow::Borrow;
use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::time::{Duration, Instant};

use parking_lot::{Mutex, MutexGuard};
use sluice_core::{AckSet, Event, Value};

use super::actions::GroupState;

/// One open group.
#[derive(Debug)]
pub(crate) struct Group {
    /// Wall clock (nanoseconds since the epoch) of its first event's arrival.
    pub start_nanos: i64,
    /// The identification keys' values, for the actions that report them.
    pub values: Box<[Option<Value>]>,
    pub state: GroupState,
}

/// An encoded key tuple with its hash, owned (in the map and the order queue).
#[derive(Debug, Clone)]
pub(crate) struct GroupKey {
    hash: u64,
    bytes: Box<[u8]>,
}

/// A key as the map compares it, owned or borrowed: lookups need no allocation.
trait KeyView {
    fn key_hash(&self) -> u64;
    fn key_bytes(&self) -> &[u8];
}

impl KeyView for GroupKey {
    fn key_hash(&self) -> u64 {
        self.hash
    }
    fn key_bytes(&self) -> &[u8] {
        &self.bytes
    }
}

struct KeyRef<'a> {
    hash: u64,
    bytes: &'a [u8],
}

impl KeyView for KeyRef<'_> {
    fn key_hash(&self) -> u64 {
        self.hash
    }
    fn key_bytes(&self) -> &[u8] {
        self.bytes
    }
}

impl<'a> Borrow<dyn KeyView + 'a> for GroupKey {
    fn borrow(&self) -> &(dyn KeyView + 'a) {
        self
    }
}

impl Hash for dyn KeyView + '_ {
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64(self.key_hash());
    }
}

impl PartialEq for dyn KeyView + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.key_hash() == other.key_hash() && self.key_bytes() == other.key_bytes()
    }
}

impl Eq for dyn KeyView + '_ {}

impl Hash for GroupKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        // As `dyn KeyView` does: the two must agree.
        h.write_u64(self.hash);
    }
}

impl PartialEq for GroupKey {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.bytes == other.bytes
    }
}

impl Eq for GroupKey {}

/// The map's hasher: the key is already hashed (XXH3), so its hash is only remixed (the shard
/// was picked from the same hash, and the map must not see those bits all alike).
#[derive(Default)]
pub(crate) struct Premixed(u64);

impl Hasher for Premixed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not used by the keys here; kept correct for any other caller.
        for b in bytes {
            self.0 = fold_mul(self.0 ^ u64::from(*b), 0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = fold_mul(n, 0xA076_1D64_78BD_642F);
    }
}

fn fold_mul(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

type Groups = HashMap<GroupKey, Group, BuildHasherDefault<Premixed>>;

/// One shard of the table.
pub(crate) struct Shard {
    groups: Groups,
    /// `(deadline, key)` in the order the groups were opened.
    order: VecDeque<(Instant, GroupKey)>,
    /// `(slot end, acks of the events consumed in the slot)`, oldest first.
    slots: VecDeque<(Instant, AckSet)>,
    /// Events of groups concluded early (evicted at `max_groups`), for the next conclusion.
    pub evicted: Vec<Event>,
    /// This shard's share of `max_groups`.
    cap: usize,
    /// The latest time a consumer used here: time in a shard never goes back.
    latest: Option<Instant>,
}

impl Shard {
    /// The time to use for this batch: `now`, or the latest time already used if that is later
    /// (batches read the clock before they take the lock, in any order).
    pub(crate) fn enter(&mut self, now: Instant) -> Instant {
        let t = self.latest.map_or(now, |l| l.max(now));
        self.latest = Some(t);
        t
    }

    pub(crate) fn group_mut(&mut self, hash: u64, bytes: &[u8]) -> Option<&mut Group> {
        self.groups.get_mut(&KeyRef { hash, bytes } as &dyn KeyView)
    }

    pub(crate) fn is_full(&self) -> bool {
        self.groups.len() >= self.cap
    }

    /// Opens a group concluding at `deadline` (never earlier than those already open).
    pub(crate) fn open(&mut self, hash: u64, bytes: &[u8], deadline: Instant, group: Group) -> &mut Group {
        let key = GroupKey { hash, bytes: bytes.into() };
        debug_assert!(self.order.back().is_none_or(|(d, _)| *d <= deadline));
        self.order.push_back((deadline, key.clone()));
        self.groups.entry(key).or_insert(group)
    }

    /// Takes out the oldest group if it is due at `now` (or any oldest group, with `None`).
    pub(crate) fn pop_due(&mut self, now: Option<Instant>) -> Option<Group> {
        let (deadline, _) = self.order.front()?;
        if now.is_some_and(|now| *deadline > now) {
            return None;
        }
        let (_, key) = self.order.pop_front()?;
        let group = self.groups.remove(&key);
        debug_assert!(group.is_some(), "every queued key has its group");
        group
    }

    /// Holds the acknowledgements of events consumed at `now` (a time from [`Shard::enter`]).
    pub(crate) fn hold(&mut self, now: Instant, acks: AckSet, slot: Duration) {
        if acks.is_empty() {
            return;
        }
        match self.slots.back_mut() {
            Some((end, set)) if *end >= now => set.append(acks),
            _ => self.slots.push_back((now + slot, acks)),
        }
    }

    /// Moves into `out` the acknowledgements of every slot whose groups have all concluded by
    /// `now` (every slot, with `None`). Call after concluding the groups due at `now`.
    pub(crate) fn release(&mut self, now: Option<Instant>, duration: Duration, out: &mut AckSet) {
        while let Some((end, _)) = self.slots.front() {
            if now.is_some_and(|now| *end + duration > now) {
                break;
            }
            if let Some((_, set)) = self.slots.pop_front() {
                out.append(set);
            }
        }
    }

    /// Gives memory back after a burst of groups has concluded.
    pub(crate) fn compact(&mut self) {
        let len = self.groups.len();
        if self.groups.capacity() > 1024 && len * 4 < self.groups.capacity() {
            self.groups.shrink_to(len * 2);
            self.order.shrink_to(len * 2);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.groups.len()
    }
}

/// The shards, and how a key picks one.
pub(crate) struct Table {
    shards: Box<[Mutex<Shard>]>,
    /// log2 of the number of shards.
    bits: u32,
}

impl Table {
    /// A table for at most `max_groups` open groups. Small tables have one shard, so that the
    /// group evicted at the bound is exactly the oldest; larger ones split the bound evenly
    /// over up to 16 shards.
    pub(crate) fn new(max_groups: usize) -> Table {
        let wanted = (max_groups / 1024).clamp(1, 16);
        let bits = usize::BITS - 1 - wanted.leading_zeros();
        let n = 1usize << bits;
        let shards = (0..n)
            .map(|i| {
                Mutex::new(Shard {
                    groups: Groups::default(),
                    order: VecDeque::new(),
                    slots: VecDeque::new(),
                    evicted: Vec::new(),
                    cap: max_groups / n + usize::from(i < max_groups % n),
                    latest: None,
                })
            })
            .collect();
        Table { shards, bits }
    }

    pub(crate) fn shard_count(&self) -> usize {
        self.shards.len()
    }

    /// The shard of a key's hash: the top bits of a multiply, which depend on every bit of the
    /// hash (cluster routing may leave this node only hashes alike in some bits).
    #[inline]
    pub(crate) fn shard_of(&self, hash: u64) -> usize {
        if self.bits == 0 { 0 } else { (hash.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - self.bits)) as usize }
    }

    pub(crate) fn lock(&self, shard: usize) -> MutexGuard<'_, Shard> {
        self.shards[shard].lock()
    }

    /// Open groups, summed over the shards (takes each lock briefly).
    pub(crate) fn open_groups(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }
}
