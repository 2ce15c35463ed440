//! A batch: the unit in which events move between every stage.

use crate::ack::AckSet;
use crate::event::Event;
use crate::memory::MemoryCharge;

#[derive(Debug, Default)]
pub struct Batch {
    pub events: Vec<Event>,
    pub acks: AckSet,
    /// The bytes these events stand for (raw line lengths at the input), for queue limits.
    pub bytes: usize,
    /// The memory these events hold in the node's budget, given back when the batch (or the
    /// last piece of it) is dropped.
    pub memory: MemoryCharge,
    /// Its producer sends nothing more until these events are acknowledged (a Beats client
    /// whose window this batch completes, an http client waiting for its answer): a queue hands it to a worker at once instead of
    /// holding it for up to `batch.delay` while a fuller batch gathers, which would add that
    /// delay to every window's round trip.
    pub awaited: bool,
}

impl Batch {
    pub fn new(events: Vec<Event>, acks: AckSet, bytes: usize) -> Batch {
        debug_assert!(acks.is_empty() || acks.covered() == events.len());
        Batch { events, acks, bytes, memory: MemoryCharge::none(), awaited: false }
    }

    /// A batch whose events nobody waits for.
    pub fn untracked(events: Vec<Event>, bytes: usize) -> Batch {
        Batch { events, acks: AckSet::none(), bytes, memory: MemoryCharge::none(), awaited: false }
    }

    /// The batch with its memory charge attached.
    pub fn with_memory(mut self, memory: MemoryCharge) -> Batch {
        self.memory = memory;
        self
    }

    /// The batch marked [`Batch::awaited`].
    pub fn awaited(mut self) -> Batch {
        self.awaited = true;
        self
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Splits off the first `n` events (with their acks and a proportional share of bytes).
    /// Whether the batch is awaited stays with the rest, which holds its last events.
    pub fn split_front(&mut self, n: usize) -> Batch {
        let n = n.min(self.events.len());
        let bytes = if self.events.is_empty() { 0 } else { self.bytes * n / self.events.len() };
        let memory = self.memory.split_share(n, self.events.len());
        // The front gets a vector of its own size: cut with `split_off`, it would keep the
        // whole batch's allocation (a 256 KiB read of short lines is 131,072 events, 3 MiB of
        // vector) through the workers and outputs, outside the memory budget, and the rest
        // would be copied into a new allocation at every cut.
        let front: Vec<Event> = self.events.drain(..n).collect();
        self.bytes -= bytes;
        Batch { events: front, acks: self.acks.split_front(n), bytes, memory, awaited: false }
    }

    /// Appends another batch's events after ours.
    pub fn append(&mut self, mut other: Batch) {
        if self.events.is_empty() {
            std::mem::swap(&mut self.events, &mut other.events);
        } else {
            self.events.append(&mut other.events);
        }
        self.acks.append(other.acks);
        self.bytes += other.bytes;
        self.memory.merge(std::mem::take(&mut other.memory));
        self.awaited |= other.awaited;
    }

    /// Marks every event of the batch handled, releasing the inputs' acknowledgements.
    pub fn complete(self) {
        self.acks.complete();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_piece_split_off_the_front_holds_only_its_own_events() {
        let events: Vec<Event> = (0..10_000).map(|i| Event::from_message_at(i.to_string(), i)).collect();
        let mut batch = Batch::untracked(events, 100_000);
        let front = batch.split_front(10);
        assert_eq!((front.len(), batch.len()), (10, 9_990));
        assert!(front.events.capacity() < 64, "the front kept {} slots", front.events.capacity());
        assert_eq!((front.bytes, batch.bytes), (100, 99_900));
        assert_eq!(front.events[9].timestamp_nanos(), Some(9));
        assert_eq!(batch.events[0].timestamp_nanos(), Some(10));
        let all = batch.split_front(usize::MAX);
        assert_eq!((all.len(), batch.len()), (9_990, 0));
    }
}
