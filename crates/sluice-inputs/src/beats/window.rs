//! Which ACKs a connection owes its client, and when.
//!
//! A client announces a window of `n` events, sends them, and waits for an ACK carrying the
//! sequence number of the window's last event; it may send further windows before that ACK
//! comes (pipelining), and then expects the ACKs in the order of the windows. The reader cuts
//! what it decodes into batches as it goes, so a window travels as one or more *parts*, each
//! with its own [`Acker`]; a part may share a batch with parts of other windows.
//!
//! Guarantees:
//! - a window is ACKed only once every one of its events has reached the ack point (each part's
//!   acker fired [`AckOutcome::Handled`]) and every window before it was ACKed; the ACK carries
//!   the highest sequence number of the window (its last event's, with every real client);
//! - before that, once a leading run of its parts is handled, a partial ACK carries the
//!   sequence number of the last event of that run, but only while the window's sequence
//!   numbers have been strictly increasing (so the number means "this one and every one before
//!   it"); never for a window whose numbers went backwards;
//! - a keep-alive repeats the last sequence number ACKed for the window at the head (0 before
//!   any): it tells the client the server is alive without acknowledging anything new. (A
//!   client reads the next ACK as being about its oldest unacknowledged window, so repeating
//!   the previous window's number would acknowledge the next window's first events.)
//! - once any part is abandoned (dropped before the ack point: shutdown, a pipeline stopped),
//!   nothing is ACKed any more on the connection: the client will send the window again;
//! - a window counts as awaiting its ACK ([`Windows::awaiting`]) from when it opens until its
//!   ACK is written to the client, not merely due: the reader bounds that number, so that a
//!   client that does not read its ACKs cannot make the server keep ever more windows.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::Mutex;
use sluice_core::Acker;
use sluice_core::ack::AckOutcome;
use tokio::sync::Notify;

/// A window's place in a connection's sequence of windows.
pub type WindowId = u64;

/// The ACK bookkeeping of one connection, shared by its reader, its writer and the ackers of
/// the batches it sent.
#[derive(Default)]
pub struct Windows {
    state: Mutex<State>,
    changed: Notify,
    /// Wakes the reader when ACKs were written (fewer windows await theirs).
    room: Notify,
}

#[derive(Debug, Default)]
pub struct State {
    /// Windows not yet fully ACKed, oldest first; the first has id `base`.
    windows: VecDeque<Window>,
    base: WindowId,
    /// A part was abandoned: no ACK may be sent any more.
    abandoned: bool,
    /// Windows whose ACK [`State::due`] handed out and the writer has not yet written.
    unwritten: usize,
}

#[derive(Debug)]
struct Window {
    /// Events announced.
    expected: u32,
    /// Events received (decoded and given to parts) so far.
    received: u32,
    /// Parts not yet ACKed, oldest first; the first has index `parts_base`.
    parts: VecDeque<Part>,
    parts_base: u64,
    /// The last sequence number ACKed to the client (0: none).
    acked: u32,
    /// The highest sequence number of the parts handled so far.
    handled_through: u32,
    /// The sequence numbers handled so far were strictly increasing: partial ACKs may be sent.
    partial_ok: bool,
}

#[derive(Debug)]
struct Part {
    /// The highest sequence number of the window up to this part's last event.
    through: u32,
    /// Whether the window's sequence numbers were strictly increasing up to this part's last
    /// event (from the window's first).
    increasing: bool,
    outcome: Option<AckOutcome>,
}

/// What the writer should send now.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Due {
    /// ACKs, in order.
    pub acks: Vec<u32>,
    /// Windows the ACKs finished.
    pub windows_done: usize,
}

impl State {
    /// Starts a window of `expected` events; returns its id.
    pub fn open(&mut self, expected: u32) -> WindowId {
        self.windows.push_back(Window {
            expected,
            received: 0,
            parts: VecDeque::new(),
            parts_base: 0,
            acked: 0,
            handled_through: 0,
            partial_ok: true,
        });
        self.base + self.windows.len() as u64 - 1
    }

    /// Adds a part of `events` events to window `id`; returns the part's index.
    pub fn add_part(&mut self, id: WindowId, events: u32, through: u32, increasing: bool) -> u64 {
        let w = self.window_mut(id).expect("a part of a window that is open");
        w.received += events;
        debug_assert!(w.received <= w.expected);
        w.parts.push_back(Part { through, increasing, outcome: None });
        w.parts_base + w.parts.len() as u64 - 1
    }

    /// Records what became of a part (from its acker).
    pub fn settle(&mut self, id: WindowId, part: u64, outcome: AckOutcome) {
        if outcome == AckOutcome::Abandoned {
            self.abandoned = true;
        }
        if let Some(w) = self.window_mut(id)
            && let Some(p) = part.checked_sub(w.parts_base).and_then(|i| w.parts.get_mut(i as usize))
        {
            p.outcome = Some(outcome);
        }
    }

    fn window_mut(&mut self, id: WindowId) -> Option<&mut Window> {
        let i = id.checked_sub(self.base)?;
        self.windows.get_mut(i as usize)
    }

    /// The ACKs due now, in order; the windows they finish are forgotten. Nothing once a part
    /// was abandoned.
    pub fn due(&mut self) -> Due {
        let mut due = Due::default();
        if self.abandoned {
            return due;
        }
        while let Some(w) = self.windows.front_mut() {
            while w.parts.front().is_some_and(|p| p.outcome == Some(AckOutcome::Handled)) {
                let p = w.parts.pop_front().expect("checked");
                w.parts_base += 1;
                w.handled_through = p.through;
                // Once the numbers went backwards, only the whole window can be ACKed.
                w.partial_ok &= p.increasing;
            }
            if w.received == w.expected && w.parts.is_empty() {
                // Every event in and handled: the window's ACK (0 for an empty window).
                due.acks.push(w.handled_through);
                due.windows_done += 1;
                self.windows.pop_front();
                self.base += 1;
                continue;
            }
            if w.partial_ok && w.handled_through > w.acked {
                w.acked = w.handled_through;
                due.acks.push(w.acked);
            }
            break;
        }
        self.unwritten += due.windows_done;
        due
    }

    /// The writer wrote the ACKs of `windows` windows that [`State::due`] handed out.
    pub fn written(&mut self, windows: usize) {
        self.unwritten = self.unwritten.saturating_sub(windows);
    }

    /// Windows opened whose ACK is not yet written to the client, whole or not.
    pub fn awaiting(&self) -> usize {
        self.windows.len() + self.unwritten
    }

    /// The sequence number a keep-alive repeats while a window is open (the last one ACKed for
    /// the oldest); `None` when no window is open, or once a part was abandoned.
    pub fn keepalive(&self) -> Option<u32> {
        if self.abandoned {
            return None;
        }
        self.windows.front().map(|w| w.acked)
    }

    /// Windows fully received and not yet ACKed.
    pub fn owed(&self) -> usize {
        self.windows.iter().filter(|w| w.received == w.expected).count()
    }

    /// Windows not yet ACKed, whole or not.
    pub fn open_windows(&self) -> usize {
        self.windows.len()
    }

    pub fn abandoned(&self) -> bool {
        self.abandoned
    }
}

impl Windows {
    pub fn new() -> Arc<Windows> {
        Arc::new(Windows::default())
    }

    pub fn open(&self, expected: u32) -> WindowId {
        let id = self.state.lock().open(expected);
        // An empty window's ACK is due as soon as those before it are; any other starts the
        // keep-alive clock.
        self.changed.notify_one();
        id
    }

    /// A part of `events` events of window `id`, and the acker its batch carries.
    pub fn part(self: &Arc<Self>, id: WindowId, events: u32, through: u32, increasing: bool) -> Acker {
        let index = self.state.lock().add_part(id, events, through, increasing);
        let me = self.clone();
        Acker::new(events as usize, move |outcome| {
            me.state.lock().settle(id, index, outcome);
            me.changed.notify_one();
        })
    }

    pub fn due(&self) -> Due {
        self.state.lock().due()
    }

    pub fn keepalive(&self) -> Option<u32> {
        self.state.lock().keepalive()
    }

    pub fn owed(&self) -> usize {
        self.state.lock().owed()
    }

    pub fn open_windows(&self) -> usize {
        self.state.lock().open_windows()
    }

    pub fn awaiting(&self) -> usize {
        self.state.lock().awaiting()
    }

    /// The ACKs of `windows` windows were written: the reader may go on.
    pub fn written(&self, windows: usize) {
        self.state.lock().written(windows);
        self.room.notify_one();
    }

    /// Resolves after the next [`Windows::written`] (one made since the last wait included).
    pub async fn room_made(&self) {
        self.room.notified().await
    }

    pub fn abandoned(&self) -> bool {
        self.state.lock().abandoned()
    }

    /// Resolves after the next change (a part settled, an empty window opened, or [`Windows::poke`]).
    pub async fn changed(&self) {
        self.changed.notified().await
    }

    /// Wakes the writer (the reader ended, say).
    pub fn poke(&self) {
        self.changed.notify_one();
    }
}
