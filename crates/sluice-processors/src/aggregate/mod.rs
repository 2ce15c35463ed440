//! `aggregate`: groups events by identification keys for `group_duration` and acts on each group.
//!
//! The first stateful processor (see [`crate::stateful`]): the worker hands it whole batches
//! through [`Stateful::consume`] and concludes its groups on a timer through
//! [`Stateful::conclude`]; [`Processor::process`] is never called on it (it keeps the event).
//!
//! - Events for which `aggregate_when` is false (and those the `if:` leaves out) pass untouched.
//! - The others are grouped by the encoded values of `identification_keys`
//!   ([`sluice_core::KeySpec`]); events lacking some keys form one group with the others that
//!   lack the same keys, and are counted in `events_missing_keys`.
//! - A group opens with its first event and concludes `group_duration` later, on the timer.
//!   `count`, `sum`, `histogram` and `put_all` consume the group's events and emit one event
//!   when it concludes; `remove_duplicates`, `rate_limiter` and `percent_sampler` only decide
//!   which events stay in the batch, and their concluded groups emit nothing.
//! - At `max_groups` open groups, a new group first concludes the oldest open group (of its
//!   shard: tables of more than 2047 groups are split into up to 16 shards, each bounded by an
//!   equal share) early, as if its time were up: nothing is lost, and it counts in
//!   `groups_evicted` (and in `groups_concluded`).
//! - Consumed events' acknowledgements are held until a conclusion returns them with (or after)
//!   the events their groups emitted; see [`state`] for how they are kept per time slot. As a
//!   slot spans many groups, a conclusion may return acknowledgements of events whose groups
//!   were emitted by an earlier conclusion (or none with no events at all): they are safe to
//!   complete only because the emitter handles each conclusion's events before the next one.
//! - `sum` and `histogram` skip values that are missing or not numbers (text is not parsed):
//!   the event still counts in `sum`'s `/count`, adds nothing to its `/sum`, and is not observed
//!   by `histogram`; such events are counted by [`Aggregate::values_skipped`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::value::now_nanos;
use sluice_core::{AckSet, Event, KeySpec};
use sluice_expr::Condition;

use crate::{Consumed, Emitted, Processor, Stateful, StatefulStats, Verdict};

mod actions;
mod config;
mod state;
#[cfg(test)]
mod tests;

use actions::{Action, Fate};
use state::{Group, Shard, Table};

pub(crate) struct Aggregate {
    keys: KeySpec,
    duration: Duration,
    /// The timer's period, and the length of an acknowledgement slot.
    tick: Duration,
    when: Option<Condition>,
    action: Action,
    table: Table,
    concluded: AtomicU64,
    evicted: AtomicU64,
    consumed: AtomicU64,
    emitted: AtomicU64,
    missing_keys: AtomicU64,
    skipped: AtomicU64,
}

pub(crate) fn build(spec: &ComponentSpec) -> Result<Arc<dyn Processor>, ConfigError> {
    Ok(Arc::new(Aggregate::from_spec(spec)?))
}

impl Aggregate {
    fn from_spec(spec: &ComponentSpec) -> Result<Aggregate, ConfigError> {
        let c = config::read(spec)?;
        let duration = c.group_duration.0;
        let action = Action::from_config(c.action).map_err(|e| spec.key_error("action", e))?;
        if matches!(action, Action::RateLimiter { .. }) && duration < Duration::from_secs(1) {
            // A group's bucket starts full: groups renewed faster than every second would let
            // more than the rate through.
            return Err(spec.key_error("group_duration", "must be at least 1s with `rate_limiter`"));
        }
        Ok(Aggregate {
            keys: KeySpec::new(c.identification_keys),
            duration,
            tick: (duration / 8).clamp(Duration::from_millis(10), Duration::from_secs(1)),
            when: c.aggregate_when,
            action,
            table: Table::new(c.max_groups),
            concluded: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            consumed: AtomicU64::new(0),
            emitted: AtomicU64::new(0),
            missing_keys: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
        })
    }

    /// Events of `sum` and `histogram` whose value was missing or not a number. Not exported
    /// yet: [`StatefulStats`] has no field for it.
    #[cfg_attr(not(test), expect(dead_code, reason = "StatefulStats has no field for it yet"))]
    pub(crate) fn values_skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    /// The event a group emits when it concludes at wall clock `end_nanos`, if any.
    fn finish(&self, group: Group, end_nanos: i64) -> Option<Event> {
        self.action.emit(self.keys.paths(), &group.values, group.state, group.start_nanos, end_nanos)
    }

    /// [`Stateful::consume`] at a given time (tests pass their own).
    fn consume_at(
        &self,
        now: Instant,
        events: &mut Vec<Event>,
        selected: &dyn Fn(&Event) -> bool,
        acks: &mut AckSet,
    ) -> Consumed {
        // The selected events, with their keys encoded into one buffer, bucketed by shard.
        let mut picked: Vec<Picked> = Vec::new();
        let mut bytes: Vec<u8> = Vec::new();
        let mut scratch = Vec::new();
        let mut out = Consumed::default();
        let shards = self.table.shard_count();
        let mut per_shard = vec![0u32; shards + 1];
        for (i, e) in events.iter().enumerate() {
            if !selected(e) || self.when.as_ref().is_some_and(|w| !w.eval(e)) {
                continue;
            }
            let key = self.keys.hash(e, &mut scratch);
            if key.missing > 0 {
                out.missing_keys += 1;
            }
            let start = bytes.len() as u32;
            bytes.extend_from_slice(&scratch);
            let shard = self.table.shard_of(key.hash);
            per_shard[shard + 1] += 1;
            picked.push(Picked {
                index: i as u32,
                shard: shard as u32,
                hash: key.hash,
                start,
                end: bytes.len() as u32,
            });
        }
        if picked.is_empty() {
            return out;
        }
        // A counting sort by shard keeps each shard's events in batch order.
        for s in 1..=shards {
            per_shard[s] += per_shard[s - 1];
        }
        let mut order = vec![0u32; picked.len()];
        let mut next = per_shard.clone();
        for (j, p) in picked.iter().enumerate() {
            order[next[p.shard as usize] as usize] = j as u32;
            next[p.shard as usize] += 1;
        }

        let mut fates = vec![Fate::Keep; events.len()];
        let wall = now_nanos();
        let mut skipped = 0;
        for s in 0..shards {
            let range = per_shard[s] as usize..per_shard[s + 1] as usize;
            if range.is_empty() {
                continue;
            }
            let mut shard = self.table.lock(s);
            let now = shard.enter(now);
            let mut consumed = 0usize;
            for &j in &order[range] {
                let p = &picked[j as usize];
                let key = &bytes[p.start as usize..p.end as usize];
                let event = &mut events[p.index as usize];
                let fate = match shard.group_mut(p.hash, key) {
                    Some(group) => self.action.fold(&mut group.state, event, now, &mut skipped),
                    None => {
                        if shard.is_full() {
                            self.evict_oldest(&mut shard, wall);
                        }
                        let group = self.open_group(event, now, wall);
                        let group = shard.open(p.hash, key, now + self.duration, group);
                        self.action.first(&mut group.state, event, now, &mut skipped)
                    }
                };
                match fate {
                    Fate::Keep => {}
                    Fate::Consume => consumed += 1,
                    Fate::Drop => out.dropped += 1,
                }
                fates[p.index as usize] = fate;
            }
            if consumed > 0 {
                // One acker per worker batch: which events' share is taken does not matter.
                shard.hold(now, acks.split_front(consumed), self.tick);
                out.consumed += consumed as u64;
            }
        }
        let mut fate = fates.into_iter();
        events.retain(|_| fate.next() == Some(Fate::Keep));

        self.consumed.fetch_add(out.consumed, Ordering::Relaxed);
        self.missing_keys.fetch_add(out.missing_keys, Ordering::Relaxed);
        if skipped > 0 {
            self.skipped.fetch_add(skipped, Ordering::Relaxed);
        }
        out
    }

    fn open_group(&self, event: &Event, now: Instant, wall: i64) -> Group {
        let values = if self.action.reports_keys() {
            self.keys.paths().iter().map(|p| event.get(p).cloned()).collect()
        } else {
            Box::default()
        };
        Group { start_nanos: wall, values, state: self.action.open(now) }
    }

    /// Concludes the shard's oldest group early, to make room; what it emits waits in the shard
    /// for the next conclusion (which also releases its acknowledgements, never earlier).
    fn evict_oldest(&self, shard: &mut Shard, wall: i64) {
        if let Some(group) = shard.pop_due(None) {
            if let Some(e) = self.finish(group, wall) {
                shard.evicted.push(e);
            }
            self.evicted.fetch_add(1, Ordering::Relaxed);
            self.concluded.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// A selected event of the batch: where it is, its shard, and its encoded key.
struct Picked {
    index: u32,
    shard: u32,
    hash: u64,
    start: u32,
    end: u32,
}

impl Processor for Aggregate {
    fn process(&self, _event: &mut Event) -> Verdict {
        // The worker calls `stateful()` and hands whole batches to `consume` instead.
        Verdict::Keep
    }

    fn stateful(&self) -> Option<&dyn Stateful> {
        Some(self)
    }
}

impl Stateful for Aggregate {
    fn identification_keys(&self) -> &KeySpec {
        &self.keys
    }

    fn consume(&self, events: &mut Vec<Event>, selected: &dyn Fn(&Event) -> bool, acks: &mut AckSet) -> Consumed {
        self.consume_at(Instant::now(), events, selected, acks)
    }

    fn conclude(&self, now: Instant, all: bool) -> Emitted {
        let due = if all { None } else { Some(now) };
        let wall = now_nanos();
        let mut out = Emitted::default();
        let mut concluded = 0;
        for s in 0..self.table.shard_count() {
            let mut shard = self.table.lock(s);
            // Groups first, then the slots whose groups have all concluded by now.
            while let Some(group) = shard.pop_due(due) {
                concluded += 1;
                out.events.extend(self.finish(group, wall));
            }
            out.events.append(&mut shard.evicted);
            shard.release(due, self.duration, &mut out.acks);
            shard.compact();
        }
        self.concluded.fetch_add(concluded, Ordering::Relaxed);
        self.emitted.fetch_add(out.events.len() as u64, Ordering::Relaxed);
        out
    }

    fn tick(&self) -> Duration {
        self.tick
    }

    fn stats(&self) -> StatefulStats {
        StatefulStats {
            groups_open: self.table.open_groups() as u64,
            groups_concluded: self.concluded.load(Ordering::Relaxed),
            groups_evicted: self.evicted.load(Ordering::Relaxed),
            events_consumed: self.consumed.load(Ordering::Relaxed),
            events_emitted: self.emitted.load(Ordering::Relaxed),
            events_missing_keys: self.missing_keys.load(Ordering::Relaxed),
        }
    }
}
