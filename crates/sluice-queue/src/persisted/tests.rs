use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use sluice_core::ack::AckOutcome;
use sluice_core::{AckSet, Acker, Batch, Event, Queue, Value};
use sluice_testkit::{SmallTmpfs, wait_until_async};

use super::*;

fn settings(dir: &Path, shards: usize, segment_bytes: u64) -> Settings {
    Settings {
        path: dir.to_path_buf(),
        max_bytes: 64 << 20,
        segment_bytes,
        shards,
        sync: SyncPolicy::Commit,
        sync_interval: Duration::from_millis(50),
        checkpoint_interval: Duration::from_millis(20),
        memory_bytes: 16 << 20,
        direct_io: true,
        stage_hold: writer::STAGE_HOLD,
    }
}

/// One shard of 1 MiB segments that keeps nothing in memory: every event is read back.
fn read_back_settings(dir: &Path, direct_io: bool) -> Settings {
    Settings { memory_bytes: 0, direct_io, ..settings(dir, 1, 1 << 20) }
}

async fn open(s: Settings) -> PersistedQueue {
    let q = PersistedQueue::new(s);
    q.start().await.unwrap();
    q
}

fn numbered(from: i64, n: i64) -> Vec<Event> {
    (from..from + n)
        .map(|i| {
            let mut e =
                Event::from_message_at(format!("event number {i} with some padding to look like a log line"), i);
            e.fields.insert("n", Value::Int(i));
            e
        })
        .collect()
}

/// Pushes a batch whose input waits for its acknowledgement; what the queue tells it.
async fn push_awaited(q: &PersistedQueue, events: Vec<Event>) -> tokio::sync::oneshot::Receiver<AckOutcome> {
    let n = events.len();
    let (acker, done) = Acker::with_notify(n);
    q.push(Batch::new(events, AckSet::single(acker, n), n * 80)).await.unwrap();
    done
}

/// Pushes with an acker and waits until the queue acknowledges (durable).
async fn push_durable(q: &PersistedQueue, events: Vec<Event>) {
    let done = push_awaited(q, events).await;
    assert_eq!(tokio::time::timeout(Duration::from_secs(10), done).await.unwrap().unwrap(), AckOutcome::Handled);
}

fn numbers(b: &Batch) -> Vec<i64> {
    b.events
        .iter()
        .map(|e| e.fields.get("n").and_then(|v| if let Value::Int(i) = v { Some(*i) } else { None }).unwrap())
        .collect()
}

/// Pops until `n` events were taken or nothing comes for a while; completes them if `ack`.
async fn drain(q: &PersistedQueue, n: usize, ack: bool) -> Vec<i64> {
    let mut got = Vec::new();
    while got.len() < n {
        match tokio::time::timeout(Duration::from_secs(2), q.pop(1000, Duration::ZERO)).await {
            Ok(Some(b)) => {
                got.extend(numbers(&b));
                if ack {
                    b.complete();
                } else {
                    std::mem::forget(b.acks);
                }
            }
            _ => break,
        }
    }
    got
}

/// Opens the queue (again) with `s`, takes and acknowledges up to `n` events, and closes it.
async fn drain_reopened(s: Settings, n: usize) -> Vec<i64> {
    let q = open(s).await;
    let got = drain(&q, n, true).await;
    q.shutdown().await;
    got
}

/// Reopens the queue with `s`: none of up to `n` events may come back, as every one was
/// acknowledged before.
async fn assert_nothing_delivered_again(s: Settings, n: usize) {
    assert_eq!(drain_reopened(s, n).await, Vec::<i64>::new(), "nothing completed is delivered again");
}

/// How long a condition on the queue's threads may take to hold.
const PATIENCE: Duration = Duration::from_secs(5);

/// Where the live frames of a segment end (frames are walked by their length fields).
fn live_end(bytes: &[u8]) -> u64 {
    let mut at = 64;
    while at + 4 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        if len == 0 || at + len + 12 > bytes.len() {
            break;
        }
        at += len + 12;
    }
    at as u64
}

/// How many acknowledged segment files shard 0 keeps for reuse.
fn spares(dir: &Path) -> usize {
    fs::read_dir(dir.join("shard-0"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(recovery::FREE_SUFFIX))
        .count()
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = fs::read_dir(dir.join("shard-0"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_events_are_not_delivered_again_after_restart() {
    // Each policy moves the durable position its own way (after the syncer's fdatasync, after
    // the writer's timed one, at the write): the checkpoint must follow under all three.
    for sync in [SyncPolicy::Commit, SyncPolicy::Interval, SyncPolicy::None] {
        let dir = tempfile::tempdir().unwrap();
        let s = || Settings { sync, ..settings(dir.path(), 2, 1 << 20) };
        let q = open(s()).await;
        push_durable(&q, numbered(0, 500)).await;
        push_durable(&q, numbered(500, 500)).await;
        let got = drain(&q, 1000, true).await;
        assert_eq!(got.iter().copied().collect::<BTreeSet<_>>(), (0..1000).collect(), "{sync:?}");
        q.shutdown().await;

        let q = open(s()).await;
        push_durable(&q, numbered(1000, 10)).await;
        let got = drain(&q, 10, true).await;
        assert_eq!(got, (1000..1010).collect::<Vec<_>>(), "only the new events ({sync:?})");
        q.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_inputs_end_a_pop_hands_out_its_partial_batch_without_waiting_for_more() {
    let dir = tempfile::tempdir().unwrap();
    let q = Arc::new(open(settings(dir.path(), 1, 1 << 20)).await);
    push_durable(&q, numbered(0, 5)).await;
    // A worker asking for a full batch, ready to wait a minute for it to fill.
    let waiting = tokio::spawn({
        let q = q.clone();
        async move { q.pop(1000, Duration::from_secs(60)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiting.is_finished(), "the pop waits for its batch to fill while inputs may still push");
    q.inputs_ended();
    let batch = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the pop returns once the inputs have ended")
        .unwrap()
        .expect("a batch");
    assert_eq!(numbers(&batch), (0..5).collect::<Vec<_>>());
    batch.complete();

    // Later pops do not wait either.
    push_durable(&q, numbered(5, 3)).await;
    let batch = tokio::time::timeout(Duration::from_secs(10), q.pop(1000, Duration::from_secs(60))).await.unwrap();
    assert_eq!(numbers(batch.as_ref().unwrap()), vec![5, 6, 7]);
    batch.unwrap().complete();
    q.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_events_come_back_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let q = open(settings(dir.path(), 1, 1 << 20)).await;
    push_durable(&q, numbered(0, 300)).await;
    let first = q.pop(100, Duration::ZERO).await.unwrap();
    assert_eq!(numbers(&first), (0..100).collect::<Vec<_>>());
    first.complete();
    let second = q.pop(100, Duration::ZERO).await.unwrap();
    std::mem::forget(second.acks); // taken but never handled: a crash mid-delivery
    tokio::time::sleep(Duration::from_millis(100)).await; // a checkpoint interval
    q.shutdown().await;

    let got = drain_reopened(settings(dir.path(), 1, 1 << 20), 200).await;
    assert_eq!(got, (100..300).collect::<Vec<_>>(), "everything after the acknowledged prefix, in order");
}

/// Pushes `batches` batches of 100 numbered events while a consumer takes them 100 at a time,
/// pausing a millisecond after each take, with the CPUs made to look `busy` (or not) to the
/// queue. Returns the events read back from disk, and checks that all arrived, in order.
async fn push_past_a_slower_consumer(busy: bool, batches: i64) -> u64 {
    let dir = tempfile::tempdir().unwrap();
    // A budget of 8 batches.
    let q = Arc::new(open(Settings { memory_bytes: 64 << 10, ..settings(dir.path(), 1, 1 << 20) }).await);
    q.inner.pacing.force_busy(Some(busy));
    let total = batches * 100;
    let consumer = {
        let q = q.clone();
        tokio::spawn(async move {
            let mut got = Vec::new();
            while (got.len() as i64) < total {
                let b = tokio::time::timeout(Duration::from_secs(10), q.pop(100, Duration::ZERO)).await;
                let b = b.expect("the consumer waited 10 s for events").unwrap();
                got.extend(numbers(&b));
                b.complete();
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            got
        })
    };
    for i in 0..batches {
        let events = numbered(i * 100, 100);
        tokio::time::timeout(Duration::from_secs(10), q.push(Batch::new(events, AckSet::none(), 8000)))
            .await
            .expect("a push waited 10 s")
            .unwrap();
    }
    assert_eq!(consumer.await.unwrap(), (0..total).collect::<Vec<_>>());
    let read_back = q.metrics().events_read_back.load(Ordering::Relaxed);
    Arc::into_inner(q).unwrap().shutdown().await;
    read_back
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_busy_cpus_pushes_wait_for_the_workers_instead_of_spilling() {
    // 25 times the memory budget. Spills happen only when the consumer pauses for longer than
    // SPILL_AFTER (a slow test machine); without waiting, most events are read back (below).
    let read_back = push_past_a_slower_consumer(true, 200).await;
    assert!(read_back <= 2_000, "{read_back} of 20,000 events read back although the workers kept taking");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_idle_cpus_pushes_spill_past_the_memory_budget() {
    let read_back = push_past_a_slower_consumer(false, 200).await;
    assert!(read_back >= 10_000, "only {read_back} of 20,000 events read back: the pushes waited for the workers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_do_not_wait_for_workers_that_take_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let q = open(Settings { memory_bytes: 64 << 10, ..settings(dir.path(), 1, 1 << 20) }).await;
    q.inner.pacing.force_busy(Some(true));
    // One batch taken, then the workers stall (an output that stopped): 25 budgets' worth of
    // pushes go to disk after at most one wait of SPILL_AFTER each, not after the workers.
    q.push(Batch::new(numbered(0, 100), AckSet::none(), 8000)).await.unwrap();
    q.pop(100, Duration::ZERO).await.unwrap().complete();
    for i in 1..=200 {
        tokio::time::timeout(Duration::from_secs(10), q.push(Batch::new(numbered(i * 100, 100), AckSet::none(), 8000)))
            .await
            .expect("a push waited 10 s for workers that take nothing")
            .unwrap();
    }
    let got = drain(&q, 20_000, true).await;
    assert_eq!(got, (100..20_100).collect::<Vec<_>>());
    assert!(q.metrics().events_read_back.load(Ordering::Relaxed) > 0);
    q.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_taken_whole_from_memory_keeps_its_event_vector() {
    let dir = tempfile::tempdir().unwrap();
    let q = open(settings(dir.path(), 1, 1 << 20)).await;
    let events = numbered(0, 500);
    let vector = events.as_ptr();
    let done = push_awaited(&q, events).await;
    let b = q.pop(500, Duration::from_secs(5)).await.unwrap();
    assert_eq!(numbers(&b), (0..500).collect::<Vec<_>>());
    assert_eq!(b.events.as_ptr(), vector, "the events were copied on their way through the queue");
    b.complete();
    assert_eq!(tokio::time::timeout(Duration::from_secs(10), done).await.unwrap().unwrap(), AckOutcome::Handled);
    q.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_event_batches_are_held_as_one_entry_and_taken_a_few_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let q = open(settings(dir.path(), 1, 1 << 20)).await;
    // 400 one-event batches pushed back to back, then all awaited. A push costs far less than
    // a write, so the writer takes them in groups of many, and each group's in-memory batches
    // make one entry.
    let mut waits = Vec::new();
    for i in 0..400 {
        let done = push_awaited(&q, numbered(i, 1)).await;
        waits.push(done);
    }
    for w in waits {
        assert_eq!(w.await.unwrap(), AckOutcome::Handled);
    }
    let entries = q.shards()[0].state.lock().readable.len();
    assert!(entries < 200, "{entries} entries for 400 batches: in-memory batches are not merged");

    // Taken 7 at a time, in order, and completed out of order: every second piece first.
    let mut pieces = Vec::new();
    let mut got = Vec::new();
    while got.len() < 400 {
        let b = q.pop(7, Duration::ZERO).await.unwrap();
        assert!(b.len() <= 7);
        got.extend(numbers(&b));
        pieces.push(b);
    }
    assert_eq!(got, (0..400).collect::<Vec<_>>());
    let (odd, even): (Vec<_>, Vec<_>) = pieces.into_iter().enumerate().partition(|(i, _)| i % 2 == 1);
    odd.into_iter().chain(even).for_each(|(_, b)| b.complete());
    tokio::time::sleep(Duration::from_millis(100)).await; // a checkpoint interval
    q.shutdown().await;

    // Every piece acknowledged as exactly its own range: nothing comes back.
    let q = open(settings(dir.path(), 1, 1 << 20)).await;
    push_durable(&q, numbered(400, 1)).await;
    assert_eq!(drain(&q, 1, true).await, vec![400], "only the new event");
    q.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segments_rotate_and_acknowledged_ones_are_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let q = open(settings(dir.path(), 1, 64 << 10)).await;
    for i in 0..20 {
        push_durable(&q, numbered(i * 100, 100)).await;
    }
    assert!(segments(dir.path()).len() > 3, "small segments rotate: {:?}", segments(dir.path()));
    let got = drain(&q, 2000, true).await;
    assert_eq!(got.len(), 2000);
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(segments(dir.path()).len(), 1, "only the active segment is left");
    q.shutdown().await;
}

/// A segment wholly acknowledged is retired as soon as the writer has moved past it, not at
/// the next `checkpoint_interval`: its file goes to the spare pool in time for the next
/// segment, which then rewrites cached pages instead of allocating fresh ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_segments_are_retired_without_waiting_for_the_checkpoint_interval() {
    let dir = tempfile::tempdir().unwrap();
    let s = Settings { checkpoint_interval: Duration::from_secs(3600), ..settings(dir.path(), 1, 64 << 10) };
    let q = open(s).await;
    for i in 0..20 {
        push_durable(&q, numbered(i * 100, 100)).await;
        assert_eq!(drain(&q, 100, true).await.len(), 100);
    }
    wait_until_async("acknowledged segments retired and kept", PATIENCE, || {
        segments(dir.path()).len() <= 2 && spares(dir.path()) > 0
    })
    .await;
    assert!(segments(dir.path()).len() <= 2, "acknowledged segments retired: {:?}", segments(dir.path()));
    assert!(spares(dir.path()) > 0, "a retired segment is kept for reuse");
    q.shutdown().await;
}

/// A checkpoint the background thread cannot write (here its temporary file's name is taken by
/// a directory) is logged and tried again; meanwhile the queue goes on, and no segment is
/// retired, since no checkpoint past it is on disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_that_cannot_be_written_retires_nothing_and_is_tried_again() {
    let dir = tempfile::tempdir().unwrap();
    let shard_dir = dir.path().join("shard-0");
    let q = open(settings(dir.path(), 1, 64 << 10)).await;
    q.inner.fail_checkpoints.store(u32::MAX, Ordering::Relaxed);
    for i in 0..20 {
        push_durable(&q, numbered(i * 100, 100)).await;
    }
    assert_eq!(drain(&q, 2000, true).await, (0..2000).collect::<Vec<_>>());
    tokio::time::sleep(Duration::from_millis(150)).await; // several checkpoint intervals
    assert_eq!(checkpoint::read(&shard_dir).unwrap(), None, "a checkpoint was written");
    let kept = segments(dir.path()).len();
    assert!(kept > 3, "segments retired without a checkpoint past them: {kept} left");
    // The writer was not held up: more events are written, synced and delivered.
    push_durable(&q, numbered(2000, 100)).await;
    assert_eq!(drain(&q, 100, true).await, (2000..2100).collect::<Vec<_>>());
    // Once the checkpoint can be written, it is, and the acknowledged segments go.
    q.inner.fail_checkpoints.store(0, Ordering::Relaxed);
    wait_until_async("segments never retired", PATIENCE, || segments(dir.path()).len() <= 1).await;
    assert!(checkpoint::read(&shard_dir).unwrap().is_some());
    q.shutdown().await;
    assert_nothing_delivered_again(settings(dir.path(), 1, 64 << 10), 2100).await;
}

/// Shutdown does not wait forever for a last checkpoint that cannot be written: the queue
/// closes, and the next start delivers again what came after the checkpoint on disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_when_the_last_checkpoint_cannot_be_written() {
    let dir = tempfile::tempdir().unwrap();
    let q = open(settings(dir.path(), 1, 1 << 20)).await;
    q.inner.fail_checkpoints.store(u32::MAX, Ordering::Relaxed);
    push_durable(&q, numbered(0, 100)).await;
    assert_eq!(drain(&q, 100, true).await, (0..100).collect::<Vec<_>>());
    tokio::time::timeout(Duration::from_secs(10), q.shutdown()).await.expect("shutdown hung on the checkpoint");
    assert_eq!(
        drain_reopened(settings(dir.path(), 1, 1 << 20), 100).await,
        (0..100).collect::<Vec<_>>(),
        "delivered again, none lost"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_tail_is_cut_and_everything_before_it_survives() {
    let dir = tempfile::tempdir().unwrap();
    let q = open(settings(dir.path(), 1, 1 << 20)).await;
    push_durable(&q, numbered(0, 50)).await;
    q.shutdown().await;
    let seg = segments(dir.path()).pop().unwrap();
    // A crash mid-write: half a frame right after the last one (the rest of the file is the
    // segment's pre-written space).
    let mut bytes = fs::read(&seg).unwrap();
    let live = live_end(&bytes);
    let half: Vec<u8> = bytes[64..94].to_vec();
    bytes[live as usize..live as usize + 30].copy_from_slice(&half);
    fs::write(&seg, &bytes).unwrap();
    let len = live;
    let q = open(settings(dir.path(), 1, 1 << 20)).await;
    assert_eq!(fs::metadata(&seg).unwrap().len(), len, "the torn tail was cut");
    assert_eq!(q.metrics().torn_tails.load(Ordering::Relaxed), 1);
    push_durable(&q, numbered(50, 10)).await;
    let got = drain(&q, 60, true).await;
    assert_eq!(got, (0..60).collect::<Vec<_>>());
    q.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_frame_is_skipped_and_counted_and_its_neighbours_survive() {
    // Both read paths: whole blocks read directly, and windows read through the page cache
    // that the events then point into.
    for direct_io in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let s = Settings { direct_io, ..settings(dir.path(), 1, 1 << 20) };
        let q = open(s.clone()).await;
        push_durable(&q, numbered(0, 100)).await;
        q.shutdown().await;
        let seg = segments(dir.path()).pop().unwrap();
        let mut bytes = fs::read(&seg).unwrap();
        // Flip a byte inside the body of the 11th frame.
        let mut offset = 64;
        for _ in 0..10 {
            let len = u32::from_le_bytes(bytes[offset..offset + 4].try_into().unwrap()) as usize;
            offset += len + 12;
        }
        bytes[offset + 30] ^= 0xff;
        fs::write(&seg, &bytes).unwrap();

        let q = open(s).await;
        let got = drain(&q, 99, true).await;
        let expected: Vec<i64> = (0..100).filter(|i| *i != 10).collect();
        assert_eq!(got, expected, "only the damaged frame is missing (direct_io {direct_io})");
        assert_eq!(q.metrics().corrupt_frames.load(Ordering::Relaxed), 1);
        q.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zeroed_or_deleted_checkpoint_replays_from_the_segments() {
    for damage in ["zero", "delete"] {
        let dir = tempfile::tempdir().unwrap();
        let q = open(settings(dir.path(), 1, 1 << 20)).await;
        push_durable(&q, numbered(0, 40)).await;
        drain(&q, 20, true).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        q.shutdown().await;
        let ckpt = dir.path().join("shard-0").join("checkpoint");
        match damage {
            "zero" => fs::write(&ckpt, [0u8; 28]).unwrap(),
            _ => fs::remove_file(&ckpt).unwrap(),
        }
        let got = drain_reopened(settings(dir.path(), 1, 1 << 20), 40).await;
        assert_eq!(got, (0..40).collect::<Vec<_>>(), "{damage}: everything replayed, nothing lost");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_holds_inputs_back_until_acks_make_room() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path(), 1, 64 << 10);
    s.max_bytes = 64 << 10;
    let q = Arc::new(open(s).await);
    let mut pushed = 0;
    while q.stats().bytes < 56 << 10 {
        push_durable(&q, numbered(pushed, 50)).await;
        pushed += 50;
    }
    let q2 = q.clone();
    let blocked = tokio::spawn(async move { q2.push(Batch::untracked(numbered(100_000, 100), 16 << 10)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!blocked.is_finished(), "the push waits while the queue is full");
    let got = drain(&q, pushed as usize, true).await;
    assert_eq!(got.len(), pushed as usize);
    tokio::time::timeout(Duration::from_secs(5), blocked).await.unwrap().unwrap().unwrap();
    assert!(q.stats().blocked_nanos > 0);
    q.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_read_back_through_the_page_cache_point_into_the_read_buffer() {
    let dir = tempfile::tempdir().unwrap();
    let q = open(read_back_settings(dir.path(), false)).await;
    push_durable(&q, numbered(0, 200)).await;
    let mut got = Vec::new();
    while got.len() < 200 {
        let b = q.pop(64, Duration::ZERO).await.unwrap();
        for e in &b.events {
            let Some(Value::String(m)) = e.fields.get("message") else { panic!("no message") };
            assert!(m.is_shared(), "a read-back message is a slice of the read buffer, not a copy");
        }
        got.extend(numbers(&b));
        b.complete();
    }
    assert_eq!(got, (0..200).collect::<Vec<_>>());
    q.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_read_back_is_retried_and_nothing_is_lost() {
    for direct_io in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let q = open(read_back_settings(dir.path(), direct_io)).await;
        push_durable(&q, numbered(0, 50)).await;
        // The segment loses its frames under the running queue: reads come up short.
        let seg = segments(dir.path()).pop().unwrap();
        let whole = fs::read(&seg).unwrap();
        fs::OpenOptions::new().write(true).open(&seg).unwrap().set_len(64).unwrap();
        let short = tokio::time::timeout(Duration::from_millis(300), q.pop(100, Duration::ZERO)).await;
        assert!(short.is_err(), "nothing is handed out from a short read (direct_io {direct_io})");
        // Once the bytes are back, the same events come, in order, once.
        fs::write(&seg, &whole).unwrap();
        assert_eq!(drain(&q, 50, true).await, (0..50).collect::<Vec<_>>(), "direct_io {direct_io}");
        assert_eq!(q.metrics().corrupt_frames.load(Ordering::Relaxed), 0, "a short read is not damage");
        q.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_back_from_disk_beyond_the_memory_budget() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path(), 2, 256 << 10);
    s.memory_bytes = 16 << 10;
    let q = open(s).await;
    for i in 0..30 {
        push_durable(&q, numbered(i * 100, 100)).await;
    }
    // Most of them are on disk only; each is counted once.
    assert_eq!(q.stats().events, 3000);
    // Taken and given back (abandoned), read again: still counted once.
    let taken = q.pop(150, Duration::ZERO).await.unwrap();
    let given_back = taken.len() as u64;
    assert_eq!(q.stats().events, 3000);
    drop(taken);
    assert_eq!(q.stats().events, 3000);
    let got = drain(&q, 3000, true).await;
    assert_eq!(got.iter().copied().collect::<BTreeSet<_>>(), (0..3000).collect());
    assert_eq!(got.len(), 3000, "no duplicates");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let stats = q.stats();
    assert_eq!(stats.events, 0, "every event acknowledged");
    // 16 KiB holds about 200 of these: the rest, and those given back, were read back.
    assert!(stats.events_from_memory <= 250, "from memory: {}", stats.events_from_memory);
    assert!(stats.events_read_back >= 2750, "read back: {}", stats.events_read_back);
    assert_eq!(stats.events_from_memory + stats.events_read_back, 3000 + given_back, "each hand-over counted");
    assert!(stats.bytes_read_back >= stats.events_read_back * 80, "frame bytes: {}", stats.bytes_read_back);
    q.shutdown().await;
}

/// One shard that cannot open fails the start with an error naming it, and leaves the shards
/// that did open untouched: once the cause is gone, their events are all there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_that_cannot_open_fails_the_start_and_names_itself() {
    let dir = tempfile::tempdir().unwrap();
    let q = open(settings(dir.path(), 1, 1 << 20)).await;
    push_durable(&q, numbered(0, 10)).await;
    q.shutdown().await;
    drop(q);

    // A plain file where the second shard's directory belongs.
    let blocker = dir.path().join("shard-1");
    fs::write(&blocker, b"not a directory").unwrap();
    let failed = PersistedQueue::new(settings(dir.path(), 2, 1 << 20));
    let e = failed.start().await.unwrap_err();
    assert!(e.contains("shard-1") && e.contains(&dir.path().display().to_string()), "{e}");
    drop(failed);

    fs::remove_file(&blocker).unwrap();
    let q = open(settings(dir.path(), 2, 1 << 20)).await;
    let mut got = drain(&q, 10, true).await;
    got.sort();
    assert_eq!(got, (0..10).collect::<Vec<_>>());
    q.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_cannot_open_the_same_queue() {
    let dir = tempfile::tempdir().unwrap();
    let q = open(settings(dir.path(), 1, 1 << 20)).await;
    let other = PersistedQueue::new(settings(dir.path(), 1, 1 << 20));
    let err = other.start().await.unwrap_err();
    assert!(err.contains("in use by another process"), "{err}");
    q.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reused_segments_never_yield_their_old_frames() {
    let dir = tempfile::tempdir().unwrap();
    let q = open(settings(dir.path(), 1, 64 << 10)).await;
    // Fill and acknowledge several segments, so acknowledged files go to the free pool...
    for i in 0..12 {
        push_durable(&q, numbered(i * 100, 100)).await;
    }
    assert_eq!(drain(&q, 1200, true).await.len(), 1200);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(spares(dir.path()) > 0, "acknowledged segments are kept for reuse");
    // ...then write fewer events than a segment holds into reused files, and restart.
    for i in 0..3 {
        push_durable(&q, numbered(10_000 + i * 100, 100)).await;
    }
    q.shutdown().await;
    let q = open(settings(dir.path(), 1, 64 << 10)).await;
    let got = drain(&q, 1000, true).await;
    assert_eq!(got, (10_000..10_300).collect::<Vec<_>>(), "only live events, none of the files' old frames");
    assert_eq!(q.metrics().torn_tails.load(Ordering::Relaxed), 0, "unused space is not damage");
    q.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_piece_of_only_damaged_frames_does_not_stall_the_reader() {
    let dir = tempfile::tempdir().unwrap();
    let q = open(read_back_settings(dir.path(), true)).await;
    push_durable(&q, numbered(0, 10)).await;
    push_durable(&q, numbered(10, 10)).await;
    // Damage every frame of the first batch, under the running queue.
    let seg = segments(dir.path()).pop().unwrap();
    let mut bytes = fs::read(&seg).unwrap();
    let mut at = 64;
    for _ in 0..10 {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        bytes[at + 20] ^= 0xff;
        at += len + 12;
    }
    fs::write(&seg, &bytes).unwrap();
    let got = tokio::time::timeout(Duration::from_secs(5), q.pop(100, Duration::ZERO)).await.unwrap().unwrap();
    assert_eq!(numbers(&got), (10..20).collect::<Vec<_>>(), "the reader went on past the damaged piece");
    got.complete();
    assert_eq!(q.metrics().corrupt_frames.load(Ordering::Relaxed), 10);
    q.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_the_codec_refuses_is_counted_and_its_neighbours_are_stored() {
    let dir = tempfile::tempdir().unwrap();
    let q = open(settings(dir.path(), 1, 1 << 20)).await;
    let mut events = numbered(0, 3);
    let mut deep = Value::Null;
    for _ in 0..300 {
        deep = Value::Array(vec![deep]);
    }
    events[1].fields.insert("deep", deep);
    push_durable(&q, events).await;
    let got = drain(&q, 2, true).await;
    assert_eq!(got, [0, 2], "the two storable events");
    assert_eq!(q.stats().unstored, 1);
    q.shutdown().await;
    let q = open(settings(dir.path(), 1, 1 << 20)).await;
    assert!(tokio::time::timeout(Duration::from_millis(300), q.pop(10, Duration::ZERO)).await.is_err(), "nothing left");
    q.shutdown().await;
}

/// A batch none of whose events can be stored still gets its acknowledgement, at once, even
/// when nothing else comes to be written (with direct I/O it leaves no frames to stage).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_the_codec_refuses_whole_is_still_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let q = open(staging_settings(dir.path(), 1 << 20)).await;
    let mut deep = Value::Null;
    for _ in 0..300 {
        deep = Value::Array(vec![deep]);
    }
    let mut events = numbered(0, 1);
    events[0].fields.insert("deep", deep);
    push_durable(&q, events).await;
    assert_eq!(q.stats().unstored, 1);
    push_durable(&q, numbered(1, 2)).await;
    assert_eq!(drain(&q, 2, true).await, [1, 2]);
    q.shutdown().await;
}

/// Read back from disk, a block read ahead of the writer must not be taken for frames the
/// writer adds to that same block later (direct reads fetch whole blocks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_appended_to_a_block_already_read_are_read_fresh() {
    for direct_io in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let q = open(read_back_settings(dir.path(), direct_io)).await;
        for round in 0..6 {
            // A few small events each round: every round ends inside the block the last began in.
            push_durable(&q, numbered(round * 7, 7)).await;
            let got = drain(&q, 7, true).await;
            assert_eq!(got, (round * 7..round * 7 + 7).collect::<Vec<_>>(), "round {round}, direct_io {direct_io}");
        }
        assert_eq!(q.stats().corrupt_frames, 0);
        q.shutdown().await;
    }
}

/// The workers get a group once it is written; its input's acknowledgement, and the
/// checkpoint, wait for the fdatasync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_get_events_before_the_fdatasync_and_inputs_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let shard_dir = dir.path().join("shard-0");
    let q = open(settings(dir.path(), 1, 1 << 20)).await;
    super::syncer::tests::hold_syncs(dir.path());
    let mut done = push_awaited(&q, numbered(0, 10)).await;
    assert_eq!(drain(&q, 10, true).await, (0..10).collect::<Vec<_>>(), "delivered before the fdatasync");
    tokio::time::sleep(Duration::from_millis(150)).await; // several checkpoint intervals
    assert!(done.try_recv().is_err(), "the input is acknowledged before its events are durable");
    let at = checkpoint::read(&shard_dir).unwrap().map_or(0, |c| c.offset);
    assert!(at <= sluice_segment::SEGMENT_HEADER_LEN as u64, "the checkpoint passed unsynced frames: {at}");
    super::syncer::tests::release_syncs(dir.path());
    let outcome = tokio::time::timeout(Duration::from_secs(10), done).await.unwrap().unwrap();
    assert_eq!(outcome, AckOutcome::Handled);
    q.shutdown().await;
    assert_nothing_delivered_again(settings(dir.path(), 1, 1 << 20), 10).await;
}

/// A failed fdatasync proves nothing about what it covered: those events are not acknowledged
/// (their inputs see them abandoned), although the workers got them when they were written;
/// and the checkpoint does not pass them until a later fdatasync succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_not_acknowledged_when_fdatasync_fails() {
    let dir = tempfile::tempdir().unwrap();
    let shard_dir = dir.path().join("shard-0");
    let q = open(settings(dir.path(), 1, 1 << 20)).await;
    super::syncer::tests::fail_next_syncs(dir.path(), 1);
    let done = push_awaited(&q, numbered(0, 10)).await;
    let outcome = tokio::time::timeout(Duration::from_secs(10), done).await.unwrap().unwrap();
    assert_eq!(outcome, AckOutcome::Abandoned, "not acknowledged after a failed fdatasync");
    assert_eq!(q.stats().fsync_failures, 1, "the failure is counted");
    // Delivered and completed: the input that sees them abandoned sends them again, a duplicate.
    assert_eq!(drain(&q, 10, true).await, (0..10).collect::<Vec<_>>());
    assert_eq!(q.inner.mem_bytes.load(Ordering::Relaxed), 0, "the memory budget is returned");
    tokio::time::sleep(Duration::from_millis(150)).await; // several checkpoint intervals
    let at = checkpoint::read(&shard_dir).unwrap().map_or(0, |c| c.offset);
    assert!(at <= sluice_segment::SEGMENT_HEADER_LEN as u64, "the checkpoint passed frames no fdatasync covered: {at}");
    // The next group's fdatasync succeeds: it is acknowledged, and the checkpoint moves past both.
    push_durable(&q, numbered(10, 10)).await;
    assert_eq!(drain(&q, 10, true).await, (10..20).collect::<Vec<_>>());
    let live = live_end(&fs::read(&segments(dir.path())[0]).unwrap());
    wait_until_async("the checkpoint never reached the end of the frames", PATIENCE, || {
        checkpoint::read(&shard_dir).unwrap().map_or(0, |c| c.offset) == live
    })
    .await;
    q.shutdown().await;
    assert_nothing_delivered_again(settings(dir.path(), 1, 1 << 20), 20).await;
}

/// One shard whose staged frames (direct I/O) wait for their write until something forces it:
/// a batch an input waits for, a full stage, a new segment, or the queue closing.
fn staging_settings(dir: &Path, segment_bytes: u64) -> Settings {
    Settings { stage_hold: Duration::from_secs(600), ..settings(dir, 1, segment_bytes) }
}

async fn push_untracked(q: &PersistedQueue, events: Vec<Event>) {
    let bytes = events.len() * 80;
    q.push(Batch::untracked(events, bytes)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_nobody_waits_for_reach_the_workers_at_once_and_are_written_soon_after() {
    let dir = tempfile::tempdir().unwrap();
    let q = open(settings(dir.path(), 1, 1 << 20)).await;
    push_untracked(&q, numbered(0, 20)).await;
    assert_eq!(drain(&q, 20, false).await, (0..20).collect::<Vec<_>>());
    // Staged or not, the frames reach the file without anything else happening.
    wait_until_async("the frames were never written", PATIENCE, || {
        let segment = segments(dir.path()).pop().expect("a segment");
        live_end(&fs::read(&segment).unwrap()) > sluice_segment::SEGMENT_HEADER_LEN as u64
    })
    .await;
    q.shutdown().await;
    assert_eq!(
        drain_reopened(settings(dir.path(), 1, 1 << 20), 20).await,
        (0..20).collect::<Vec<_>>(),
        "not acknowledged: delivered again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_given_back_before_its_frames_are_written_is_read_once_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let q = open(staging_settings(dir.path(), 1 << 20)).await;
    push_untracked(&q, numbered(0, 50)).await;
    push_untracked(&q, numbered(50, 50)).await;
    let pop =
        || async { tokio::time::timeout(Duration::from_secs(5), q.pop(50, Duration::ZERO)).await.unwrap().unwrap() };
    let first = pop().await;
    assert_eq!(numbers(&first), (0..50).collect::<Vec<_>>());
    first.complete();
    let second = pop().await;
    assert_eq!(numbers(&second), (50..100).collect::<Vec<_>>());
    // A delivery cut short: the range goes back, to be read from disk, where (with direct
    // I/O) it is not yet, and where it does not start at the end of what is.
    drop(second);
    let mut got = match tokio::time::timeout(Duration::from_millis(300), q.pop(1000, Duration::ZERO)).await {
        Ok(Some(b)) => {
            let n = numbers(&b);
            b.complete();
            n
        }
        _ => Vec::new(),
    };
    // An input waiting for its batch has it written at once, with the staged frames before it.
    push_durable(&q, numbered(100, 10)).await;
    got.extend(drain(&q, 60 - got.len(), true).await);
    assert_eq!(got, (50..110).collect::<Vec<_>>());
    q.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_frames_are_written_when_the_queue_closes_and_when_a_segment_is_sealed() {
    let dir = tempfile::tempdir().unwrap();
    let q = open(staging_settings(dir.path(), 64 << 10)).await;
    // About 230 KB of frames in 64 KiB segments, none of them awaited, in groups of one batch.
    for from in (0..2000).step_by(50) {
        push_untracked(&q, numbered(from, 50)).await;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    q.shutdown().await;
    let sealed = segments(dir.path()).len();
    assert!(sealed >= 3, "several segments were sealed: {sealed}");
    assert_eq!(drain_reopened(staging_settings(dir.path(), 64 << 10), 2000).await, (0..2000).collect::<Vec<_>>());
}

/// A new segment that cannot be created (here its shard's directory is gone for a moment) holds
/// the group back, unacknowledged, and the writer tries again: once the directory is back,
/// everything is written, acknowledged and delivered once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_that_cannot_be_created_holds_its_group_until_it_can() {
    let dir = tempfile::tempdir().unwrap();
    let q = open(settings(dir.path(), 1, 64 << 10)).await;
    push_durable(&q, numbered(0, 400)).await;
    assert_eq!(segments(dir.path()).len(), 1);
    let (shard_dir, away) = (dir.path().join("shard-0"), dir.path().join("shard-0.away"));
    fs::rename(&shard_dir, &away).unwrap();
    // About 46 KB more: past the 64 KiB segment, so the writer needs a new one.
    let mut done = push_awaited(&q, numbered(400, 400)).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(done.try_recv().is_err(), "acknowledged without a segment to hold it");
    fs::rename(&away, &shard_dir).unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(10), done).await.unwrap().unwrap();
    assert_eq!(outcome, AckOutcome::Handled);
    assert!(segments(dir.path()).len() >= 2, "the group went to a new segment");
    assert_eq!(drain(&q, 800, true).await, (0..800).collect::<Vec<_>>());
    q.shutdown().await;
    assert_nothing_delivered_again(settings(dir.path(), 1, 64 << 10), 800).await;
}

/// A full disk under staged writes (direct I/O, batches nobody waits for, then one an input
/// waits for): the writer keeps the frames and tries again, the input hears nothing meanwhile
/// and the stall shows; once writes succeed every frame is on disk, once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn staged_frames_wait_out_a_full_disk_and_are_all_written_after() {
    let dir = tempfile::tempdir().unwrap();
    let q = open(staging_settings(dir.path(), 1 << 20)).await;
    // The next three writes fail, as on a full disk: about 0.7 s of backoff.
    q.inner.fail_writes.store(3, Ordering::Relaxed);
    push_untracked(&q, numbered(0, 100)).await;
    let mut done = push_awaited(&q, numbered(100, 10)).await;
    wait_until_async("the stall never showed", PATIENCE, || q.stats().stalled_nanos > 0).await;
    assert!(done.try_recv().is_err(), "acknowledged while nothing could be written");
    let outcome = tokio::time::timeout(Duration::from_secs(10), done).await.unwrap().unwrap();
    assert_eq!(outcome, AckOutcome::Handled);
    assert_eq!(q.inner.fail_writes.load(Ordering::Relaxed), 0, "every failure was met");
    assert_eq!(q.stats().unstored, 0);
    q.shutdown().await;
    assert_eq!(drain_reopened(staging_settings(dir.path(), 1 << 20), 110).await, (0..110).collect::<Vec<_>>());
}

/// The queue closing while the disk stays full gives up what it could not write: those events
/// are counted as not stored, the input waiting for one of them is told (abandoned), nothing
/// half-written is left, and the shutdown ends. (Only the first group waits out the backoff;
/// later ones get one try. That is not timed here.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_on_a_full_disk_gives_up_staged_and_pending_events() {
    let dir = tempfile::tempdir().unwrap();
    let q = open(staging_settings(dir.path(), 1 << 20)).await;
    q.inner.fail_writes.store(u32::MAX, Ordering::Relaxed);
    push_untracked(&q, numbered(0, 50)).await;
    let done = push_awaited(&q, numbered(50, 10)).await;
    wait_until_async("the stall never showed", PATIENCE, || q.stats().stalled_nanos > 0).await;
    // Waits behind the stalled write: a second group, given up at shutdown too.
    push_untracked(&q, numbered(60, 30)).await;
    tokio::time::timeout(Duration::from_secs(30), q.shutdown()).await.expect("shutdown hung on a full disk");
    assert_eq!(q.stats().unstored, 90, "every event not written is counted");
    let outcome = tokio::time::timeout(Duration::from_secs(5), done).await.unwrap();
    assert_ne!(outcome, Ok(AckOutcome::Handled), "an input told its unwritten batch was handled");
    assert_eq!(drain_reopened(staging_settings(dir.path(), 1 << 20), 90).await, Vec::<i64>::new());
}

/// A filesystem that takes `O_DIRECT` opens but refuses a direct write, in the middle of a
/// segment: that write and every later one go through the page cache, and the frames before
/// and after the switch are all on disk, in order, with nothing damaged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_direct_write_refused_mid_segment_is_made_through_the_page_cache() {
    let dir = tempfile::tempdir().unwrap();
    let q = open(settings(dir.path(), 1, 1 << 20)).await;
    push_durable(&q, numbered(0, 10)).await;
    q.inner.refuse_direct_writes.store(1, Ordering::Relaxed);
    push_durable(&q, numbered(10, 10)).await;
    assert_eq!(q.inner.refuse_direct_writes.load(Ordering::Relaxed), 0, "the refusal was met");
    push_durable(&q, numbered(20, 10)).await;
    assert_eq!(q.stats().unstored, 0);
    assert_eq!(drain(&q, 30, false).await, (0..30).collect::<Vec<_>>());
    q.shutdown().await;
    let q = open(settings(dir.path(), 1, 1 << 20)).await;
    assert_eq!(drain(&q, 30, true).await, (0..30).collect::<Vec<_>>(), "not acknowledged: all read back");
    assert_eq!(q.stats().corrupt_frames, 0, "nothing damaged at the switch");
    q.shutdown().await;
}

/// The disk fills while events are delivered: the progress is still recorded (the checkpoint
/// is rewritten in place, it needs no new space), the last checkpoint at shutdown too, and a
/// restart on the still-full disk delivers none of the delivered events again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_still_records_progress_and_a_restart_delivers_nothing_again() {
    let Some(disk) = SmallTmpfs::mount("4m") else { return };
    let path = disk.path().join("queue");
    let s = || Settings { max_bytes: 1 << 20, ..settings(&path, 1, 256 << 10) };
    let q = open(s()).await;
    push_durable(&q, numbered(0, 1000)).await;
    disk.fill();
    assert_eq!(drain(&q, 1000, true).await, (0..1000).collect::<Vec<_>>());
    let shard_dir = path.join("shard-0");
    wait_until_async("delivered events were never recorded", PATIENCE, || q.stats().checkpoint_lag_events == 0).await;
    q.shutdown().await;
    assert!(checkpoint::read(&shard_dir).unwrap().is_some());
    assert_nothing_delivered_again(s(), 1000).await;
}

/// Checkpoints that fail (an I/O error): the lag shows the events delivered and not recorded,
/// each failure is counted, and once a checkpoint succeeds the lag is back to zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checkpoint_lag_counts_what_a_restart_would_deliver_again() {
    let dir = tempfile::tempdir().unwrap();
    let q = open(settings(dir.path(), 1, 1 << 20)).await;
    push_durable(&q, numbered(0, 100)).await;
    assert_eq!(drain(&q, 100, true).await, (0..100).collect::<Vec<_>>());
    wait_until_async("the lag never came back to zero", PATIENCE, || q.stats().checkpoint_lag_events == 0).await;
    q.inner.fail_checkpoints.store(u32::MAX, Ordering::Relaxed);
    push_durable(&q, numbered(100, 300)).await;
    assert_eq!(drain(&q, 300, true).await, (100..400).collect::<Vec<_>>());
    wait_until_async("no checkpoint failed", PATIENCE, || q.metrics().checkpoint_failures.load(Ordering::Relaxed) >= 2)
        .await;
    assert_eq!(q.stats().checkpoint_lag_events, 300, "delivered, not recorded");
    q.inner.fail_checkpoints.store(0, Ordering::Relaxed);
    wait_until_async("the lag never came back to zero", PATIENCE, || q.stats().checkpoint_lag_events == 0).await;
    q.shutdown().await;
    assert_nothing_delivered_again(settings(dir.path(), 1, 1 << 20), 400).await;
}

/// Paths of the files this process holds open under `dir` that were deleted.
fn deleted_but_open(dir: &Path) -> Vec<String> {
    let dir = dir.to_string_lossy().to_string();
    fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .map(|p| p.to_string_lossy().to_string())
        .filter(|p| p.starts_with(&dir) && p.ends_with("(deleted)"))
        .collect()
}

/// Frames in a segment file (walked by their length fields).
fn frames_in(path: &Path) -> usize {
    let bytes = fs::read(path).unwrap();
    let (mut at, mut n) = (64, 0);
    while at + 4 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        if len == 0 || at + len + 12 > bytes.len() {
            break;
        }
        at += len + 12;
        n += 1;
    }
    n
}

/// Segments read back and acknowledged are deleted once the spare pool is full, the last one
/// read among them: no handle of the process keeps a deleted segment's space.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_segment_is_not_held_open() {
    for direct_io in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let s = Settings { memory_bytes: 0, direct_io, ..settings(dir.path(), 1, 64 << 10) };
        let q = open(s).await;
        for i in 0..60 {
            push_durable(&q, numbered(i * 100, 100)).await;
        }
        let files = segments(dir.path());
        assert!(files.len() > 4, "several segments to retire");
        // Everything but the segment being written: the reader's last file is a sealed one.
        let unread = frames_in(files.last().unwrap()) as i64;
        let read = 6000 - unread;
        let mut got = Vec::new();
        while got.len() < read as usize {
            let b = q.pop(1000.min(read as usize - got.len()), Duration::ZERO).await.unwrap();
            got.extend(numbers(&b));
            b.complete();
        }
        assert!(got == (0..read).collect::<Vec<_>>(), "the sealed segments, in order");
        wait_until_async("segments never retired", PATIENCE, || {
            segments(dir.path()).len() <= 1 && spares(dir.path()) == 2
        })
        .await;
        assert_eq!(deleted_but_open(dir.path()), Vec::<String>::new(), "direct_io {direct_io}");
        assert!(drain(&q, unread as usize, true).await == (read..6000).collect::<Vec<_>>(), "the rest");
        q.shutdown().await;
    }
}

/// A segment whose end was torn by a crash: the cut is counted in events, and a damaged header
/// (the whole segment cut) counts every event that was in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_tail_counts_the_events_it_cuts() {
    let dir = tempfile::tempdir().unwrap();
    let q = open(settings(dir.path(), 1, 1 << 20)).await;
    push_durable(&q, numbered(0, 50)).await;
    q.shutdown().await;
    let seg = segments(dir.path()).pop().unwrap();
    let bytes = fs::read(&seg).unwrap();
    let live = live_end(&bytes) as usize;
    // The last frame loses its last 10 bytes.
    fs::write(&seg, &bytes[..live - 10]).unwrap();
    let q = open(settings(dir.path(), 1, 1 << 20)).await;
    assert_eq!(q.metrics().torn_tails.load(Ordering::Relaxed), 1);
    assert_eq!(q.metrics().torn_tail_events.load(Ordering::Relaxed), 1, "one event cut");
    assert_eq!(drain(&q, 50, false).await, (0..49).collect::<Vec<_>>());
    q.shutdown().await;

    let mut bytes = fs::read(&seg).unwrap();
    bytes[0] ^= 0xff;
    fs::write(&seg, &bytes).unwrap();
    let q = open(settings(dir.path(), 1, 1 << 20)).await;
    assert_eq!(q.metrics().torn_tail_events.load(Ordering::Relaxed), 49, "the whole segment cut");
    q.shutdown().await;
}

/// With direct I/O, a group an input waits for reaches the workers only once it is written:
/// while the disk refuses the write, the workers see nothing of it, so a stop during a full
/// disk never answers "not stored" for events already delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_an_input_waits_for_reaches_the_workers_only_once_written() {
    let dir = tempfile::tempdir().unwrap();
    let q = open(settings(dir.path(), 1, 1 << 20)).await;
    q.inner.fail_writes.store(3, Ordering::Relaxed);
    let done = push_awaited(&q, numbered(0, 10)).await;
    wait_until_async("the stall never showed", PATIENCE, || q.stats().stalled_nanos > 0).await;
    let early = tokio::time::timeout(Duration::from_millis(100), q.pop(100, Duration::ZERO)).await;
    assert!(
        early.is_err() || early.as_ref().unwrap().is_none(),
        "delivered before its write: {:?}",
        early.ok().flatten().map(|b| numbers(&b))
    );
    assert_eq!(drain(&q, 10, true).await, (0..10).collect::<Vec<_>>());
    let outcome = tokio::time::timeout(Duration::from_secs(10), done).await.unwrap().unwrap();
    assert_eq!(outcome, AckOutcome::Handled);
    q.shutdown().await;
}

/// A queue whose checkpoint is in the old release's format (a 28-byte file) opens where that
/// checkpoint says, and its first checkpoint after the start replaces the file with the slot
/// format.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_of_the_old_format_is_read_and_migrated() {
    let dir = tempfile::tempdir().unwrap();
    let shard_dir = dir.path().join("shard-0");
    let q = open(settings(dir.path(), 1, 1 << 20)).await;
    push_durable(&q, numbered(0, 40)).await;
    let first = q.pop(20, Duration::ZERO).await.unwrap();
    assert_eq!(numbers(&first), (0..20).collect::<Vec<_>>());
    first.complete();
    wait_until_async("the lag never came back to zero", PATIENCE, || q.stats().checkpoint_lag_events == 0).await;
    q.shutdown().await;
    let at = checkpoint::read(&shard_dir).unwrap().expect("a checkpoint");
    fs::remove_file(shard_dir.join(checkpoint::FILE)).unwrap();
    checkpoint::write_legacy(&shard_dir, &at).unwrap();

    let q = open(settings(dir.path(), 1, 1 << 20)).await;
    assert_eq!(drain(&q, 20, true).await, (20..40).collect::<Vec<_>>(), "resumed where the old checkpoint says");
    wait_until_async("the lag never came back to zero", PATIENCE, || q.stats().checkpoint_lag_events == 0).await;
    q.shutdown().await;
    let len = fs::metadata(shard_dir.join(checkpoint::FILE)).unwrap().len();
    assert_eq!(len, checkpoint::FILE_LEN as u64, "migrated to the slot format");
    assert_nothing_delivered_again(settings(dir.path(), 1, 1 << 20), 40).await;
}
