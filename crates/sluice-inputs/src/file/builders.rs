//! Turning lines into events on more than one thread, pushed in the order they were read.
//!
//! One reader thread does the file work that must stay in order (reads, line framing,
//! offsets, rotation); with plain (not multiline) lines it hands the cut lines over in chunks,
//! and a few builder threads do what costs most per line: UTF-8 checks or decoding, JSON
//! parsing, and making the event with its metadata. So one busy file is no longer held to the
//! speed of one core.
//!
//! Guarantees:
//! - The queue receives the chunks in the order the reader made them: a builder pushes its
//!   chunk only when every earlier chunk has been pushed (or given up at shutdown), so one
//!   file's events stay in file order.
//! - Offsets are exactly as when the reader builds events itself: the reader registers each
//!   chunk's acknowledgement pieces when it hands the chunk over, in read order, and a chunk
//!   that is not pushed (shutdown) reports them abandoned, which stops the file's cursor.
//! - Dropping [`Builders`] lets every chunk already handed over be pushed (or given up at
//!   shutdown) and joins the threads.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};
use sluice_core::{AckSet, Batch, MemoryCharge, SharedText, TextPool};

use super::events::{self, Group, Lines, Shape};
use crate::InputContext;

/// Lines of one or more files and the acknowledgement of each file's share.
pub(crate) struct Chunk {
    pub lines: Lines,
    pub groups: Vec<Group>,
    pub acks: AckSet,
    pub bytes: usize,
    /// Reserved from the memory budget for the chunk's text and events, trued up once built.
    pub memory: MemoryCharge,
}

/// The builder threads of one file input.
pub(crate) struct Builders {
    jobs: Option<SyncSender<(u64, Chunk)>>,
    spare: Receiver<Lines>,
    threads: Vec<JoinHandle<()>>,
    next: u64,
    stopped: Arc<AtomicBool>,
    /// Bytes of text in recent chunks: a new chunk's buffer starts a little bigger, so that it
    /// is not grown (and copied) line by line.
    text_hint: usize,
    /// Chunk text buffers, back once the events that share them are finished.
    texts: Arc<TextPool>,
}

/// Chunk text buffers kept for reuse: enough for the chunks in the builders, a full memory
/// queue (8,192 events are 8 chunks) and the workers. A buffer grown past
/// `TEXT_KEEP_LARGEST` by long lines is freed instead, so the pool holds at most 32 MiB.
const TEXT_KEEP: usize = 16;
const TEXT_KEEP_LARGEST: usize = 2 << 20;

/// Whose turn it is to push.
struct Turns {
    next: Mutex<u64>,
    changed: Condvar,
}

impl Turns {
    fn wait_for(&self, seq: u64) {
        let mut next = self.next.lock();
        while *next != seq {
            self.changed.wait(&mut next);
        }
    }

    fn advance(&self) {
        *self.next.lock() += 1;
        self.changed.notify_all();
    }
}

/// Takes chunk `seq`'s turn when dropped, so that a builder that fails in any way still lets
/// the later chunks through.
struct Turn<'a> {
    turns: &'a Turns,
    seq: u64,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.turns.wait_for(self.seq);
        self.turns.advance();
    }
}

impl Builders {
    /// How many builder threads suit this machine; none on one core (the reader builds).
    pub(crate) fn suggested_threads() -> usize {
        match std::thread::available_parallelism().map_or(1, |n| n.get()) {
            1 => 0,
            n => n.min(4),
        }
    }

    pub(crate) fn start(
        threads: usize,
        shape: Arc<Shape>,
        ctx: &InputContext,
        handle: &tokio::runtime::Handle,
    ) -> std::io::Result<Builders> {
        let (jobs, queue) = sync_channel::<(u64, Chunk)>(threads);
        let queue = Arc::new(Mutex::new(queue));
        let (give_back, spare) = sync_channel::<Lines>(threads * 2 + 2);
        let turns = Arc::new(Turns { next: Mutex::new(0), changed: Condvar::new() });
        let stopped = Arc::new(AtomicBool::new(false));
        let texts = TextPool::new(TEXT_KEEP, TEXT_KEEP_LARGEST);
        let mut handles = Vec::with_capacity(threads);
        for i in 0..threads {
            let worker = Worker {
                queue: queue.clone(),
                shape: shape.clone(),
                ctx: ctx.clone(),
                handle: handle.clone(),
                turns: turns.clone(),
                give_back: give_back.clone(),
                stopped: stopped.clone(),
                texts: texts.clone(),
            };
            let spawned = std::thread::Builder::new().name(format!("file-build-{i}")).spawn(move || worker.run());
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) if handles.is_empty() => return Err(e),
                Err(e) => {
                    tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, error = %e,
                        started = handles.len(), "file input could not start all its event builder threads");
                    break;
                }
            }
        }
        Ok(Builders { jobs: Some(jobs), spare, threads: handles, next: 0, stopped, text_hint: 0, texts })
    }

    /// Hands a chunk over, waiting while every builder is busy. Fails once a push failed
    /// (the pipeline is stopping): the chunk is then given up.
    pub(crate) fn submit(&mut self, chunk: Chunk) -> Result<(), ()> {
        if self.stopped.load(Ordering::Acquire) {
            return Err(());
        }
        let jobs = self.jobs.as_ref().ok_or(())?;
        // The largest recent chunk, slowly forgotten: chunks vary with how many lines the
        // last read turn added, and a buffer sized for the smaller ones would grow (doubling,
        // and copying) for the larger ones.
        self.text_hint = chunk.lines.text.len().max(self.text_hint - self.text_hint / 8);
        jobs.send((self.next, chunk)).map_err(|_| ())?;
        self.next += 1;
        Ok(())
    }

    /// An emptied line buffer to fill next, for reads of up to `read` bytes. The line ends are
    /// reused when a builder gave them back; the text comes from the pool, as events may still
    /// share the last one's. It has room for a recent chunk plus one more read (reads go
    /// straight into it), so that it rarely grows, which would double it and leave it less
    /// than half full.
    pub(crate) fn spare_lines(&self, read: usize) -> Lines {
        let mut lines = self.spare.try_recv().unwrap_or_default();
        lines.text = self.texts.take(self.text_hint + read);
        lines
    }
}

impl Drop for Builders {
    fn drop(&mut self) {
        self.jobs = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

struct Worker {
    queue: Arc<Mutex<Receiver<(u64, Chunk)>>>,
    shape: Arc<Shape>,
    ctx: InputContext,
    handle: tokio::runtime::Handle,
    turns: Arc<Turns>,
    give_back: SyncSender<Lines>,
    stopped: Arc<AtomicBool>,
    texts: Arc<TextPool>,
}

impl Worker {
    fn run(self) {
        loop {
            let job = self.queue.lock().recv();
            let Ok((seq, chunk)) = job else { return };
            let turn = Turn { turns: &self.turns, seq };
            let Chunk { mut lines, groups, acks, bytes, mut memory } = chunk;
            let text_bytes = lines.text.len();
            let mut failed = 0;
            let text = SharedText::pooled(std::mem::take(&mut lines.text), &self.texts);
            let events = events::build_events(&self.shape, &text, &lines.spans, &groups, &mut failed);
            drop(text);
            drop(groups);
            lines.clear();
            let _ = self.give_back.try_send(lines);
            if failed > 0 {
                self.ctx.metrics.failed.add(failed);
            }
            memory.true_up(crate::admission::measure(self.shape.codec, &events, text_bytes));
            let batch = Batch::new(events, acks, bytes).with_memory(memory);
            self.turns.wait_for(seq);
            if self.stopped.load(Ordering::Acquire) {
                // Dropped: its acknowledgement reports the lines abandoned.
                drop(batch);
            } else if self.handle.block_on(self.ctx.send(batch)).is_err() {
                self.stopped.store(true, Ordering::Release);
            }
            drop(turn);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sluice_core::ack::AckOutcome;
    use sluice_core::{Acker, Map, Str};
    use tokio::sync::oneshot;

    use super::*;
    use crate::codec::Codec;
    use crate::file::acks::AckTracker;
    use crate::file::decode::TextEncoding;
    use crate::file::events::Group;
    use crate::file::framing::Framing;

    fn shape() -> Arc<Shape> {
        let utf8 = TextEncoding::for_label("utf-8").unwrap();
        Arc::new(Shape {
            framing: Framing::new("\n", utf8, 1024),
            codec: Codec::Lines,
            encoding: utf8,
            multiline: None,
            path_field: None,
            offset_field: None,
            host_field: None,
            host: Str::new("h"),
            meta_overlaps_text: false,
        })
    }

    /// Lines `first..first + n` as one chunk with one acknowledgement.
    fn chunk(first: usize, n: usize) -> (Chunk, oneshot::Receiver<AckOutcome>) {
        let mut lines = Lines::default();
        for i in first..first + n {
            lines.push_copy(format!("line {i}").as_bytes(), i as u64);
        }
        let group =
            Group { tracker: AckTracker::new(|_| {}), template: Arc::new(Map::new()), timestamp: 0, count: n, end: 0 };
        let (acker, done) = Acker::with_notify(n);
        (
            Chunk {
                lines,
                groups: vec![group],
                acks: AckSet::single(acker, n),
                bytes: n,
                memory: MemoryCharge::none(),
            },
            done,
        )
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn chunks_reach_the_queue_in_the_order_they_were_handed_over() {
        let (ctx, mut rx) = crate::tcp::tests::context();
        let handle = tokio::runtime::Handle::current();
        let (chunks, per_chunk) = (300, 7);
        let waits = tokio::task::spawn_blocking(move || {
            let mut builders = Builders::start(3, shape(), &ctx, &handle).unwrap();
            let mut waits = Vec::new();
            for c in 0..chunks {
                let (chunk, done) = chunk(c * per_chunk, per_chunk);
                builders.submit(chunk).unwrap();
                waits.push(done);
            }
            // Dropping the builders lets every chunk handed over be pushed.
            drop(builders);
            waits
        })
        .await
        .unwrap();
        let mut next = 0;
        while next < chunks * per_chunk {
            let batch = rx.recv().await.expect("every chunk pushed");
            for e in &batch.events {
                assert_eq!(e.message(), Some(format!("line {next}").as_str()), "out of order");
                next += 1;
            }
            batch.complete();
        }
        for done in waits {
            assert_eq!(done.await.unwrap(), AckOutcome::Handled);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn messages_share_their_chunk_buffer_which_returns_to_the_pool_when_they_are_gone() {
        let (ctx, mut rx) = crate::tcp::tests::context();
        let handle = tokio::runtime::Handle::current();
        let long = "a line long enough that copying it would cost an allocation";
        let builders = tokio::task::spawn_blocking(move || {
            let mut builders = Builders::start(1, shape(), &ctx, &handle).unwrap();
            let mut lines = builders.spare_lines(0);
            for i in 0..3 {
                lines.push_copy(format!("{long} {i}").as_bytes(), i);
            }
            let group = Group {
                tracker: AckTracker::new(|_| {}),
                template: Arc::new(Map::new()),
                timestamp: 0,
                count: 3,
                end: 0,
            };
            let (acker, _done) = Acker::with_notify(3);
            let chunk = Chunk {
                lines,
                groups: vec![group],
                acks: AckSet::single(acker, 3),
                bytes: 3,
                memory: MemoryCharge::none(),
            };
            builders.submit(chunk).unwrap();
            builders
        })
        .await
        .unwrap();
        let batch = rx.recv().await.expect("the chunk is pushed");
        for (i, e) in batch.events.iter().enumerate() {
            let message = e.fields.get("message").and_then(|m| match m {
                sluice_core::Value::String(s) => Some(s),
                _ => None,
            });
            let message = message.expect("a message");
            assert_eq!(message.as_str(), format!("{long} {i}"));
            assert!(message.is_shared(), "not copied");
        }
        assert_eq!(builders.texts.spare(), 0, "the events still point into it");
        drop(batch);
        assert_eq!(builders.texts.spare(), 1, "back for the next chunk");
        tokio::task::spawn_blocking(move || drop(builders)).await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_chunk_that_cannot_be_pushed_is_abandoned_and_later_ones_are_refused() {
        let (ctx, rx) = crate::tcp::tests::context();
        drop(rx); // the queue is gone: every push fails
        let handle = tokio::runtime::Handle::current();
        let (done, refused) = tokio::task::spawn_blocking(move || {
            let mut builders = Builders::start(2, shape(), &ctx, &handle).unwrap();
            let (first, done) = chunk(0, 3);
            builders.submit(first).unwrap();
            // Once a builder's push failed, the input stops handing chunks over.
            let mut refused = false;
            for i in 1..200 {
                if builders.submit(chunk(i * 3, 3).0).is_err() {
                    refused = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            (done, refused)
        })
        .await
        .unwrap();
        assert_eq!(done.await.unwrap(), AckOutcome::Abandoned, "its input learns the lines were not taken");
        assert!(refused, "later chunks are refused once a push failed");
    }
}
