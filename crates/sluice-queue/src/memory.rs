//! The bounded memory queue.
//!
//! Batches wait in a FIFO guarded by a short lock that is never held across an await. A push
//! waits while admitting the batch would exceed `max_events` or `max_bytes` — except into an
//! empty queue, so that a batch larger than the limits still moves rather than deadlocks. A pop
//! takes up to `max_events` from the front, splitting an input batch where needed (the pieces
//! share its acknowledgement), and waits up to `delay` for more once it holds at least one
//! event, so workers get full batches under load and prompt ones when traffic is light. A pop
//! that has taken an awaited batch (its producer sends nothing more until it is acknowledged,
//! see [`Batch::awaited`]) does not wait: the wait could only add to that producer's round trip.
//! Nor does a pop already holding events when an awaited batch comes in, even if another pop
//! takes that batch: what it holds may be the earlier part of what the same producer waits on
//! (the first reads of a Beats window), and nothing more of that comes until the ACK.

use std::collections::VecDeque;
use std::time::Duration;

use async_trait::async_trait;
use parking_lot::Mutex;
use serde::Deserialize;
use sluice_config::ByteSize;
use sluice_core::{Batch, Queue, QueueClosed, QueueStats, WaitGuard, WaitTime};
use tokio::sync::Notify;

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryQueueConfig {
    pub max_events: usize,
    pub max_bytes: ByteSize,
}

impl Default for MemoryQueueConfig {
    fn default() -> Self {
        MemoryQueueConfig { max_events: 8192, max_bytes: ByteSize(32 << 20) }
    }
}

#[derive(Default)]
struct State {
    batches: VecDeque<Batch>,
    events: usize,
    bytes: usize,
    closed: bool,
    /// Awaited batches pushed so far: a waiting pop that holds events goes when it moves.
    awaited_pushes: u64,
}

pub struct MemoryQueue {
    state: Mutex<State>,
    not_empty: Notify,
    not_full: Notify,
    max_events: usize,
    max_bytes: usize,
    /// Time producers waited on a full queue, waits in progress included.
    blocked: WaitTime,
}

impl MemoryQueue {
    pub fn new(max_events: usize, max_bytes: usize) -> MemoryQueue {
        MemoryQueue {
            state: Mutex::new(State::default()),
            not_empty: Notify::new(),
            not_full: Notify::new(),
            max_events: max_events.max(1),
            max_bytes: max_bytes.max(1),
            blocked: WaitTime::default(),
        }
    }

    pub fn from_config(c: MemoryQueueConfig) -> Result<MemoryQueue, String> {
        if c.max_events == 0 {
            return Err("queue.max_events must be at least 1".to_string());
        }
        if c.max_bytes.0 == 0 {
            return Err("queue.max_bytes must be more than 0".to_string());
        }
        Ok(MemoryQueue::new(c.max_events, c.max_bytes.as_usize()))
    }

    /// Moves up to `want` events from the front of the queue into `into`.
    fn take(&self, state: &mut State, want: usize, into: &mut Option<Batch>) -> usize {
        let mut taken = 0;
        while taken < want {
            let Some(front) = state.batches.front_mut() else { break };
            let piece = if front.len() <= want - taken {
                state.batches.pop_front().expect("front exists")
            } else {
                front.split_front(want - taken)
            };
            taken += piece.len();
            state.events -= piece.len();
            state.bytes -= piece.bytes;
            match into {
                Some(b) => b.append(piece),
                None => *into = Some(piece),
            }
        }
        taken
    }
}

#[async_trait]
impl Queue for MemoryQueue {
    async fn push(&self, batch: Batch) -> Result<(), QueueClosed> {
        if batch.is_empty() {
            batch.complete();
            return Ok(());
        }
        let mut _blocked: Option<WaitGuard<'_>> = None;
        loop {
            let notified = self.not_full.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.state.lock();
                if s.closed {
                    return Err(QueueClosed);
                }
                let fits = s.events + batch.len() <= self.max_events && s.bytes + batch.bytes <= self.max_bytes;
                if fits || s.events == 0 {
                    s.awaited_pushes += u64::from(batch.awaited);
                    s.events += batch.len();
                    s.bytes += batch.bytes;
                    s.batches.push_back(batch);
                    drop(s);
                    self.not_empty.notify_waiters();
                    return Ok(());
                }
            }
            if _blocked.is_none() {
                _blocked = Some(self.blocked.start());
            }
            notified.await;
        }
    }

    async fn pop(&self, max_events: usize, delay: Duration) -> Option<Batch> {
        let max_events = max_events.max(1);
        let mut out: Option<Batch> = None;
        let mut have = 0;
        let mut deadline: Option<tokio::time::Instant> = None;
        // The awaited pushes when this pop first held events: everything pushed before is held.
        let mut awaited_seen: Option<u64> = None;
        loop {
            let notified = self.not_empty.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let (closed, awaited_since) = {
                let mut s = self.state.lock();
                let got = self.take(&mut s, max_events - have, &mut out);
                have += got;
                if got > 0 {
                    self.not_full.notify_waiters();
                }
                let seen = *awaited_seen.get_or_insert(s.awaited_pushes);
                (s.closed, have > 0 && s.awaited_pushes != seen)
            };
            if have == 0 {
                awaited_seen = None;
            }
            let awaited = awaited_since || out.as_ref().is_some_and(|b| b.awaited);
            if have >= max_events || (closed && have > 0) || (have > 0 && (delay.is_zero() || awaited)) {
                return out;
            }
            if closed {
                return None;
            }
            if have > 0 {
                let d = *deadline.get_or_insert_with(|| tokio::time::Instant::now() + delay);
                if tokio::time::timeout_at(d, notified).await.is_err() {
                    // Time is up: one last look, then go with what there is.
                    let mut s = self.state.lock();
                    if self.take(&mut s, max_events - have, &mut out) > 0 {
                        self.not_full.notify_waiters();
                    }
                    return out;
                }
            } else {
                notified.await;
            }
        }
    }

    fn close(&self) {
        self.state.lock().closed = true;
        self.not_empty.notify_waiters();
        self.not_full.notify_waiters();
    }

    fn stats(&self) -> QueueStats {
        let s = self.state.lock();
        QueueStats {
            kind: "memory",
            events: s.events as u64,
            bytes: s.bytes as u64,
            max_events: self.max_events as u64,
            max_bytes: self.max_bytes as u64,
            blocked_nanos: self.blocked.total_nanos(),
            ..QueueStats::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_core::{AckSet, Acker, Event};
    use std::sync::Arc;

    fn batch(n: usize, bytes: usize) -> Batch {
        Batch::untracked((0..n).map(|i| Event::from_message_at(i.to_string(), 0)).collect(), bytes)
    }

    #[tokio::test]
    async fn fifo_and_batching() {
        let q = MemoryQueue::new(100, 1 << 20);
        q.push(batch(3, 30)).await.unwrap();
        q.push(batch(4, 40)).await.unwrap();
        let b = q.pop(5, Duration::ZERO).await.unwrap();
        assert_eq!(b.len(), 5);
        assert_eq!(b.events.iter().map(|e| e.message().unwrap()).collect::<Vec<_>>(), ["0", "1", "2", "0", "1"]);
        let b = q.pop(5, Duration::ZERO).await.unwrap();
        assert_eq!(b.len(), 2);
        assert_eq!(q.stats().events, 0);
        assert_eq!(q.stats().bytes, 0);
    }

    #[tokio::test]
    async fn full_queue_blocks_until_room() {
        let q = Arc::new(MemoryQueue::new(5, 1 << 20));
        q.push(batch(5, 5)).await.unwrap();
        let q2 = q.clone();
        let pusher = tokio::spawn(async move { q2.push(batch(2, 2)).await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!pusher.is_finished(), "push must wait while the queue is full");
        // A wait in progress shows before it ends: an outage is visible while it lasts.
        let during = q.stats().blocked_nanos;
        assert!(during >= 40_000_000, "blocked {during} ns while a push has waited 50 ms");
        assert_eq!(q.pop(3, Duration::ZERO).await.unwrap().len(), 3);
        pusher.await.unwrap().unwrap();
        assert_eq!(q.stats().events, 4);
        assert!(q.stats().blocked_nanos >= during);
    }

    #[tokio::test]
    async fn byte_limit_blocks_too() {
        let q = Arc::new(MemoryQueue::new(1000, 100));
        q.push(batch(1, 90)).await.unwrap();
        let q2 = q.clone();
        let pusher = tokio::spawn(async move { q2.push(batch(1, 20)).await });
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!pusher.is_finished());
        q.pop(10, Duration::ZERO).await.unwrap();
        pusher.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn oversized_batch_enters_an_empty_queue() {
        let q = MemoryQueue::new(2, 10);
        q.push(batch(50, 5000)).await.unwrap();
        assert_eq!(q.pop(100, Duration::ZERO).await.unwrap().len(), 50);
    }

    #[tokio::test]
    async fn pop_waits_for_delay_to_fill() {
        let q = Arc::new(MemoryQueue::new(100, 1 << 20));
        q.push(batch(1, 1)).await.unwrap();
        let q2 = q.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            q2.push(batch(2, 2)).await.unwrap();
        });
        let b = q.pop(3, Duration::from_secs(5)).await.unwrap();
        assert_eq!(b.len(), 3, "the pop should have waited for the batch to fill");
        q.push(batch(1, 1)).await.unwrap();
        let started = std::time::Instant::now();
        let b = q.pop(3, Duration::from_millis(30)).await.unwrap();
        assert_eq!(b.len(), 1);
        assert!(started.elapsed() >= Duration::from_millis(25));
    }

    #[tokio::test]
    async fn an_awaited_batch_is_handed_over_without_waiting_for_more() {
        let q = MemoryQueue::new(100, 1 << 20);
        q.push(batch(2, 2)).await.unwrap();
        q.push(batch(3, 3).awaited()).await.unwrap();
        let b = tokio::time::timeout(Duration::from_secs(5), q.pop(10, Duration::from_secs(30)))
            .await
            .expect("the pop waited for the delay")
            .unwrap();
        assert_eq!(b.len(), 5);
        assert!(b.awaited);
        // Split by a pop, the mark stays with the part holding the batch's last events.
        q.push(batch(4, 4).awaited()).await.unwrap();
        let front = q.pop(3, Duration::from_secs(30)).await.unwrap();
        assert_eq!((front.len(), front.awaited), (3, false));
        let rest = q.pop(10, Duration::from_secs(30)).await.unwrap();
        assert_eq!((rest.len(), rest.awaited), (1, true));
    }

    /// A pop holding the first part of a Beats window must not wait for a fuller batch once
    /// the window's last part has come in, even when another worker took that part: the
    /// client sends nothing more until the whole window is acknowledged.
    #[tokio::test]
    async fn a_pop_holding_events_goes_when_another_takes_an_awaited_batch() {
        let q = Arc::new(MemoryQueue::new(100, 1 << 20));
        let q2 = q.clone();
        let holder = tokio::spawn(async move { q2.pop(10, Duration::from_secs(30)).await });
        tokio::task::yield_now().await;
        q.push(batch(3, 3)).await.unwrap();
        // The holder takes the window's first part and waits for more.
        tokio::task::yield_now().await;
        assert_eq!(q.stats().events, 0, "the holder took the first part");
        // The window's last part comes in and another worker takes it before the holder looks.
        q.push(batch(4, 4).awaited()).await.unwrap();
        let other = q.pop(10, Duration::from_secs(30)).await.unwrap();
        assert_eq!((other.len(), other.awaited), (4, true));
        let held = tokio::time::timeout(Duration::from_secs(5), holder)
            .await
            .expect("the holder waited for a fuller batch after the awaited one came in")
            .unwrap()
            .unwrap();
        assert_eq!(held.len(), 3);
        // A pop that began after the awaited push still waits for its batch to fill.
        q.push(batch(1, 1)).await.unwrap();
        let q3 = q.clone();
        let later = tokio::spawn(async move { q3.pop(10, Duration::from_secs(30)).await });
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        assert!(!later.is_finished(), "a pop after the awaited batch waits as before");
        q.push(batch(9, 9)).await.unwrap();
        assert_eq!(tokio::time::timeout(Duration::from_secs(5), later).await.unwrap().unwrap().unwrap().len(), 10);
    }

    #[tokio::test]
    async fn close_drains_then_ends() {
        let q = MemoryQueue::new(100, 1 << 20);
        q.push(batch(2, 2)).await.unwrap();
        q.close();
        assert_eq!(q.push(batch(1, 1)).await, Err(QueueClosed));
        assert_eq!(q.pop(10, Duration::from_secs(10)).await.unwrap().len(), 2);
        assert!(q.pop(10, Duration::from_secs(10)).await.is_none());
    }

    #[tokio::test]
    async fn close_wakes_a_waiting_worker() {
        let q = Arc::new(MemoryQueue::new(100, 1 << 20));
        let q2 = q.clone();
        let worker = tokio::spawn(async move { q2.pop(10, Duration::from_millis(10)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        q.close();
        assert!(worker.await.unwrap().is_none());
    }

    #[tokio::test]
    async fn split_batches_ack_once_all_pieces_complete() {
        let q = MemoryQueue::new(100, 1 << 20);
        let (acker, mut done) = Acker::with_notify(10);
        let events = (0..10).map(|i| Event::from_message_at(i.to_string(), 0)).collect();
        q.push(Batch::new(events, AckSet::single(acker, 10), 10)).await.unwrap();
        let a = q.pop(4, Duration::ZERO).await.unwrap();
        let b = q.pop(100, Duration::ZERO).await.unwrap();
        a.complete();
        assert!(done.try_recv().is_err());
        b.complete();
        assert_eq!(done.try_recv().unwrap(), sluice_core::ack::AckOutcome::Handled);
    }
}
