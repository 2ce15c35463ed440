//! The stateful form of a processor: one that keeps events (or what it learned from them)
//! across batches and emits new events later, on a timer.
//!
//! `aggregate` is the first; a `dedupe` or a `tail_sampler` has the same shape. A stateful
//! processor declares its identification keys, which is how cluster mode knows to route every
//! event with the same key values to one node before it.
//!
//! **Acknowledgements.** An event a stateful processor *consumes* (folds into a group and does
//! not pass on) is not handled until what the group emits is delivered. So [`Stateful::consume`]
//! takes the acknowledgements of the events it consumes out of the batch's set (with
//! `AckSet::split_front`: a worker's batch carries one acker, so which events' share it takes
//! does not matter) and holds them; [`Stateful::conclude`] hands them back with the events it
//! emits, in an [`Emitted`]; the worker completes them once those events are delivered (or
//! dropped on purpose, or dead-lettered). If what was emitted is never delivered (a shutdown cut
//! short) the held acknowledgements are dropped uncompleted, and their inputs hear "abandoned".
//! Events a stateful processor drops on purpose (a rate limiter, a duplicate) stay in the
//! batch's set and are handled with it, like `drop`'s.
//!
//! **Time.** Groups are concluded by the worker's timer calling [`Stateful::conclude`] every
//! [`Stateful::tick`], never only when the next event arrives; at shutdown, after the last batch,
//! `conclude(now, true)` concludes every group.

use std::time::{Duration, Instant};

use sluice_core::{AckSet, Event, KeySpec};

/// What one call to [`Stateful::consume`] did to a batch.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Consumed {
    /// Taken out of the batch into groups; their acknowledgements are held.
    pub consumed: u64,
    /// Taken out of the batch and dropped on purpose (handled with the batch).
    pub dropped: u64,
    /// Selected events that lacked some identification key (grouped with the others lacking
    /// the same keys).
    pub missing_keys: u64,
}

/// Events a stateful processor emits, with the acknowledgements of the events they stand for.
#[derive(Debug, Default)]
pub struct Emitted {
    pub events: Vec<Event>,
    /// To complete once `events` are handled.
    pub acks: AckSet,
}

/// A point-in-time view of a stateful processor, for `/metrics` and `/stats`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct StatefulStats {
    pub groups_open: u64,
    pub groups_concluded: u64,
    /// Concluded early because `max_groups` was reached.
    pub groups_evicted: u64,
    pub events_consumed: u64,
    pub events_emitted: u64,
    pub events_missing_keys: u64,
}

pub trait Stateful: Send + Sync {
    /// The fields whose values identify a group.
    fn identification_keys(&self) -> &KeySpec;

    /// Applies the processor to the events `selected` picks (the processor's `if:`; the others
    /// pass untouched). Events it consumes or drops leave `events` (the rest keep their order);
    /// the acknowledgements of consumed events are split off `acks`, which covers `events`.
    fn consume(&self, events: &mut Vec<Event>, selected: &dyn Fn(&Event) -> bool, acks: &mut AckSet) -> Consumed;

    /// Concludes the groups that are due at `now` (every group if `all`) and returns what they
    /// emit. Called every [`Stateful::tick`] from one task; `consume` runs meanwhile on others.
    fn conclude(&self, now: Instant, all: bool) -> Emitted;

    /// How often `conclude` should run.
    fn tick(&self) -> Duration;

    fn stats(&self) -> StatefulStats;
}
