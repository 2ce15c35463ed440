//! Model-based tests of the persisted queue through its public surface (`sluice_queue::build`
//! from a config and the `Queue` trait): random sequences of pushes, pops, completions in any
//! order, batches dropped or forgotten mid-delivery, and restarts, checked against a model of
//! what the queue owes its users:
//!
//! - (a) nothing acknowledged is lost: every event whose push was acknowledged (its acker fired
//!   `Handled`) is, at the end, delivered and completed;
//! - (b) nothing that was never pushed comes out, and every event comes out intact;
//! - (c) what was completed does not come back: not in the same run, and not after a restart
//!   at which nothing was outstanding (the queue checkpoints at shutdown); after a restart with
//!   batches outstanding only events completed in that run may come back (the checkpoint is the
//!   contiguous completed prefix);
//! - (d) with one shard, events come out in push order;
//! - a torn write (garbage after the last frame of a segment) loses nothing acknowledged.
//!
//! A failing case prints the operation sequence; `PROPTEST_CASES` changes the number of cases.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use sluice_config::model::ComponentSpec;
use sluice_core::ack::AckOutcome;
use sluice_core::{AckSet, Acker, Batch, Event, Queue, Value};
use tokio::sync::oneshot;

/// How long an operation that must finish may take before the test calls it stuck.
const STUCK: Duration = Duration::from_secs(10);
/// How long a pop may take when acknowledged events surely wait in the queue.
const LIVENESS: Duration = Duration::from_secs(2);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

#[derive(Debug, Clone, Copy)]
struct QueueParams {
    shards: usize,
    /// `memory_bytes`: 0 makes every batch go back to disk for reading.
    memory: &'static str,
    direct_io: bool,
}

fn spec(path: &Path, p: QueueParams) -> ComponentSpec {
    let text = format!(
        "pipelines:
  p:
    inputs: [{{type: stdin}}]
    outputs: [{{type: stdout}}]
    queue: {{type: persisted, path: '{}', shards: {}, segment_bytes: 64KiB, max_bytes: 4MiB, \
         checkpoint_interval: 10ms, memory_bytes: {}, direct_io: {}}}
",
        path.display(),
        p.shards,
        p.memory,
        p.direct_io
    );
    let root = sluice_config::model::load_str(&text, "model.yml").unwrap();
    root.pipelines.into_iter().next().unwrap().queue
}

async fn open(spec: &ComponentSpec, data_dir: &Path) -> Arc<dyn Queue> {
    let q = sluice_queue::build(spec, "p", data_dir).unwrap();
    tokio::time::timeout(STUCK, q.start()).await.expect("start is stuck").unwrap();
    q
}

fn message(id: i64) -> String {
    format!("model event {id} with some padding so that frames look like log lines")
}

fn event(id: i64) -> Event {
    let mut e = Event::from_message_at(message(id), id);
    e.fields.insert("id", Value::Int(id));
    e
}

/// The id of an event that came out of the queue, checking that it came out intact.
fn id_of(e: &Event) -> Result<i64, String> {
    let id = match e.fields.get("id") {
        Some(Value::Int(i)) => *i,
        other => return Err(format!("an event without an integer id came out: {other:?} in {e:?}")),
    };
    if e.message() != Some(message(id).as_str()) {
        return Err(format!("event {id} came out damaged: {e:?}"));
    }
    Ok(id)
}

#[derive(Clone)]
enum Op {
    /// Pushes `n` events; waits for the queue's acknowledgement if `wait`.
    Push {
        n: usize,
        wait: bool,
    },
    Pop {
        max: usize,
    },
    AckOldest,
    /// Completes the outstanding batch chosen by the index (modulo their number).
    AckRandom(usize),
    /// Drops an outstanding batch without completing it (a worker that gave up mid-delivery):
    /// its events were not handled and must not count as acknowledged.
    DropOutstanding(usize),
    /// Forgets an outstanding batch: its acknowledgement never fires (a crash mid-delivery).
    ForgetOutstanding(usize),
    /// Shutdown and reopen; outstanding batches are forgotten first, as if the process died.
    Restart,
}

impl fmt::Debug for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::Push { n, wait: true } => write!(f, "Push({n})"),
            Op::Push { n, wait: false } => write!(f, "PushNoWait({n})"),
            Op::Pop { max } => write!(f, "Pop({max})"),
            Op::AckOldest => write!(f, "AckOldest"),
            Op::AckRandom(i) => write!(f, "AckRandom({i})"),
            Op::DropOutstanding(i) => write!(f, "Drop({i})"),
            Op::ForgetOutstanding(i) => write!(f, "Forget({i})"),
            Op::Restart => write!(f, "Restart"),
        }
    }
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1usize..200, prop::bool::weighted(0.8)).prop_map(|(n, wait)| Op::Push { n, wait }),
        6 => (1usize..300).prop_map(|max| Op::Pop { max }),
        3 => Just(Op::AckOldest),
        3 => any::<usize>().prop_map(Op::AckRandom),
        1 => any::<usize>().prop_map(Op::DropOutstanding),
        1 => any::<usize>().prop_map(Op::ForgetOutstanding),
        1 => Just(Op::Restart),
    ]
}

fn params(shards: impl Strategy<Value = usize>) -> impl Strategy<Value = QueueParams> {
    (shards, prop::sample::select(vec!["0", "16KiB", "16MiB"]), any::<bool>())
        .prop_map(|(shards, memory, direct_io)| QueueParams { shards, memory, direct_io })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Pushed; in the queue, not delivered in this run.
    Queued,
    /// Delivered in this run, in a batch not yet completed.
    Outstanding,
    /// Delivered in this run and dropped or forgotten: may be delivered again (must be after a
    /// restart).
    Open,
    /// Completed, and must never be delivered again.
    Completed,
    /// Completed, but a restart with a gap before it happened since: may come back.
    MaybeQueued,
}

/// What the queue owes, per event id.
struct Model {
    params: QueueParams,
    state: Vec<State>,
    /// Set once the push's acknowledgement fired `Handled`.
    acked: Vec<bool>,
    /// Acknowledgements of pushes not waited for: (first id, count, receiver).
    unconfirmed: Vec<(i64, usize, oneshot::Receiver<AckOutcome>)>,
    /// Batches delivered and not completed, with their ids.
    outstanding: Vec<(Batch, Vec<i64>)>,
    /// Ids completed in this run (they may come back after an unclean restart).
    completed_this_run: Vec<i64>,
    /// Something was dropped or forgotten in this run.
    gaps: bool,
    /// Highest id delivered for the first time in this run (for the one-shard order check).
    last_in_order: Option<i64>,
    runs: usize,
    delivered: usize,
}

impl Model {
    fn new(params: QueueParams) -> Model {
        Model {
            params,
            state: Vec::new(),
            acked: Vec::new(),
            unconfirmed: Vec::new(),
            outstanding: Vec::new(),
            completed_this_run: Vec::new(),
            gaps: false,
            last_in_order: None,
            runs: 1,
            delivered: 0,
        }
    }

    fn poll_acks(&mut self) -> Result<(), String> {
        let mut still = Vec::new();
        for (first, n, mut rx) in self.unconfirmed.drain(..) {
            match rx.try_recv() {
                Ok(AckOutcome::Handled) => (first..first + n as i64).for_each(|id| self.acked[id as usize] = true),
                Ok(AckOutcome::Abandoned) | Err(oneshot::error::TryRecvError::Closed) => {}
                Err(oneshot::error::TryRecvError::Empty) => still.push((first, n, rx)),
            }
        }
        self.unconfirmed = still;
        Ok(())
    }

    /// Checks a batch that came out of the queue and records it as outstanding.
    fn deliver(&mut self, batch: Batch, max: usize) -> Result<(), String> {
        if batch.is_empty() || batch.len() > max {
            return Err(format!("pop({max}) returned {} events", batch.len()));
        }
        if batch.acks.covered() != batch.len() {
            return Err(format!("a batch of {} events acknowledges {}", batch.len(), batch.acks.covered()));
        }
        let mut ids = Vec::with_capacity(batch.len());
        for e in &batch.events {
            let id = id_of(e)?;
            let Some(state) = self.state.get_mut(id as usize) else {
                return Err(format!("event {id} came out but was never pushed (b)"));
            };
            let before = *state;
            match before {
                State::Queued | State::Open | State::MaybeQueued => *state = State::Outstanding,
                State::Outstanding => return Err(format!("event {id} was delivered twice in one run")),
                State::Completed => {
                    return Err(format!("event {id} was delivered again after it was completed (c)"));
                }
            }
            if self.params.shards == 1 && before != State::Open {
                // Events delivered again after a gap (Open) may come out of order; first
                // deliveries of a run must follow push order.
                if self.last_in_order.is_some_and(|last| id <= last) {
                    return Err(format!(
                        "one shard: event {id} came out after event {} (push order broken, d)",
                        self.last_in_order.unwrap()
                    ));
                }
                self.last_in_order = Some(id);
            }
            ids.push(id);
        }
        self.delivered += ids.len();
        self.outstanding.push((batch, ids));
        Ok(())
    }

    fn complete(&mut self, i: usize) {
        let (batch, ids) = self.outstanding.remove(i);
        batch.complete();
        for id in ids {
            self.state[id as usize] = State::Completed;
            self.completed_this_run.push(id);
        }
    }

    /// The batch is gone without completion (dropped or forgotten).
    fn lose(&mut self, i: usize, forget: bool) {
        let (batch, ids) = self.outstanding.remove(i);
        if forget {
            std::mem::forget(batch.acks);
        } else {
            drop(batch);
        }
        for id in ids {
            self.state[id as usize] = State::Open;
        }
        self.gaps = true;
    }

    /// Acknowledged events known to be waiting in the queue in this run: a pop must find them.
    fn surely_waiting(&self) -> usize {
        (0..self.state.len()).filter(|&i| self.state[i] == State::Queued && self.acked[i]).count()
    }

    /// A restart: everything not completed is back in the queue; if anything was dropped or
    /// forgotten (or is outstanding now) the checkpoint may stop before events completed in this
    /// run, so those may come back.
    fn restarted(&mut self) {
        while !self.outstanding.is_empty() {
            self.lose(0, true);
        }
        for s in &mut self.state {
            if matches!(*s, State::Open | State::Outstanding) {
                *s = State::Queued;
            }
        }
        if self.gaps {
            for id in self.completed_this_run.drain(..) {
                if self.state[id as usize] == State::Completed {
                    self.state[id as usize] = State::MaybeQueued;
                }
            }
        }
        self.completed_this_run.clear();
        self.gaps = false;
        self.last_in_order = None;
        self.runs += 1;
    }
}

async fn push(q: &Arc<dyn Queue>, m: &mut Model, n: usize, wait: bool) -> Result<(), String> {
    let first = m.state.len() as i64;
    let events: Vec<Event> = (first..first + n as i64).map(event).collect();
    let bytes = events.iter().map(|e| e.message().map_or(0, str::len)).sum();
    m.state.extend(std::iter::repeat_n(State::Queued, n));
    m.acked.extend(std::iter::repeat_n(false, n));
    let (acker, rx) = Acker::with_notify(n);
    match tokio::time::timeout(STUCK, q.push(Batch::new(events, AckSet::single(acker, n), bytes))).await {
        Err(_) => return Err(format!("push of {n} events is stuck: {:?}", q.stats())),
        Ok(Err(e)) => return Err(format!("push failed: {e}")),
        Ok(Ok(())) => {}
    }
    m.unconfirmed.push((first, n, rx));
    if wait {
        let (_, _, rx) = m.unconfirmed.pop().unwrap();
        match tokio::time::timeout(STUCK, rx).await {
            Ok(Ok(AckOutcome::Handled)) => (first..first + n as i64).for_each(|id| m.acked[id as usize] = true),
            other => return Err(format!("push of {n} events not acknowledged: {other:?}")),
        }
    }
    Ok(())
}

/// Pops once. When acknowledged events surely wait, the pop must return them (liveness);
/// otherwise an empty queue is given a short while.
async fn pop(q: &Arc<dyn Queue>, m: &mut Model, max: usize) -> Result<bool, String> {
    m.poll_acks()?;
    let waiting = m.surely_waiting();
    let patience = if waiting > 0 { LIVENESS } else { Duration::from_millis(15) };
    match tokio::time::timeout(patience, q.pop(max, Duration::ZERO)).await {
        Ok(Some(batch)) => m.deliver(batch, max).map(|()| true),
        Ok(None) => Err("pop returned None on an open queue".to_string()),
        Err(_) if waiting > 0 => {
            let owed: Vec<usize> = (0..m.state.len()).filter(|&i| m.state[i] == State::Queued && m.acked[i]).collect();
            Err(format!(
                "{waiting} acknowledged events are owed but pop returns nothing (lost? a): {:?}",
                &owed[..owed.len().min(20)]
            ))
        }
        Err(_) => Ok(false),
    }
}

async fn restart(
    q: Arc<dyn Queue>,
    m: &mut Model,
    spec: &ComponentSpec,
    data: &Path,
) -> Result<Arc<dyn Queue>, String> {
    // Forgotten before shutdown, as if the process had died with them in hand.
    while !m.outstanding.is_empty() {
        m.lose(0, true);
    }
    tokio::time::timeout(STUCK, q.shutdown()).await.map_err(|_| "shutdown is stuck".to_string())?;
    drop(q);
    // Shutdown writes what was pending: those pushes are acknowledged by now.
    m.poll_acks()?;
    m.restarted();
    Ok(open(spec, data).await)
}

/// Pops and completes until nothing acknowledged is left waiting and the queue stays empty.
async fn drain(q: &Arc<dyn Queue>, m: &mut Model) -> Result<(), String> {
    loop {
        if !pop(q, m, 1000).await? {
            return Ok(());
        }
        while !m.outstanding.is_empty() {
            m.complete(0);
        }
    }
}

async fn run_model(params: QueueParams, ops: Vec<Op>) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let path: PathBuf = dir.path().join("q");
    let spec = spec(&path, params);
    let mut m = Model::new(params);
    let mut q = open(&spec, dir.path()).await;
    for op in ops {
        match op {
            Op::Push { n, wait } => push(&q, &mut m, n, wait).await?,
            Op::Pop { max } => {
                pop(&q, &mut m, max).await?;
            }
            Op::AckOldest if !m.outstanding.is_empty() => m.complete(0),
            Op::AckRandom(i) if !m.outstanding.is_empty() => m.complete(i % m.outstanding.len()),
            Op::DropOutstanding(i) if !m.outstanding.is_empty() => m.lose(i % m.outstanding.len(), false),
            Op::ForgetOutstanding(i) if !m.outstanding.is_empty() => m.lose(i % m.outstanding.len(), true),
            Op::Restart => q = restart(q, &mut m, &spec, dir.path()).await?,
            Op::AckOldest | Op::AckRandom(_) | Op::DropOutstanding(_) | Op::ForgetOutstanding(_) => {}
        }
    }
    // The end: a restart (what is outstanding is lost with the process), then everything out.
    q = restart(q, &mut m, &spec, dir.path()).await?;
    drain(&q, &mut m).await?;
    m.poll_acks()?;
    // (a) every acknowledged event was delivered and completed.
    let lost: Vec<usize> = (0..m.state.len())
        .filter(|&i| m.acked[i] && !matches!(m.state[i], State::Completed | State::MaybeQueued))
        .collect();
    if !lost.is_empty() {
        return Err(format!(
            "{} acknowledged events were never delivered again (a): {:?}",
            lost.len(),
            &lost[..lost.len().min(20)]
        ));
    }
    let stats = q.stats();
    if stats.bytes != 0 || stats.events != 0 {
        return Err(format!(
            "everything is completed but the queue counts {} events, {} bytes",
            stats.events, stats.bytes
        ));
    }
    // Everything is completed and nothing is outstanding: after a clean restart nothing comes
    // back (c).
    q = restart(q, &mut m, &spec, dir.path()).await?;
    for s in &mut m.state {
        if *s == State::MaybeQueued {
            *s = State::Completed;
        }
    }
    if pop(&q, &mut m, 1000).await? {
        return Err("after a clean restart with everything completed, events came back (c)".to_string());
    }
    q.shutdown().await;
    Ok(())
}

/// Where the live frames of a segment end: after the last frame whose sequence number follows
/// on from the header's (a reused file may hold older frames, or zeros, after them).
fn live_end(bytes: &[u8]) -> usize {
    use sluice_segment::{FrameCursor, FrameResult, SEGMENT_HEADER_LEN, SegmentHeader};
    let Ok(header) = SegmentHeader::decode(bytes) else { return bytes.len() };
    let mut expected = header.first_seq;
    let mut cursor = FrameCursor::new(bytes, SEGMENT_HEADER_LEN);
    let mut end = SEGMENT_HEADER_LEN;
    while let FrameResult::Frame { seq, .. } = cursor.next_frame() {
        if seq < expected {
            break;
        }
        expected = seq + 1;
        end = cursor.position();
    }
    end
}

/// Writes `garbage` into the last segment of shard `shard` (modulo the shards that have one):
/// right after its live frames (a write torn by a crash), or after the end of the file.
fn tear(path: &Path, shard: usize, garbage: &[u8], at_live_end: bool) -> Option<(PathBuf, usize)> {
    let mut shards: Vec<PathBuf> = std::fs::read_dir(path)
        .unwrap()
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("shard-")))
        .collect();
    shards.sort();
    let last_segments: Vec<PathBuf> = shards
        .iter()
        .filter_map(|dir| {
            let mut segs: Vec<PathBuf> = std::fs::read_dir(dir)
                .unwrap()
                .filter_map(|e| Some(e.ok()?.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "seg"))
                .collect();
            segs.sort();
            segs.pop()
        })
        .collect();
    let seg = last_segments.get(shard % last_segments.len().max(1))?.clone();
    let mut bytes = std::fs::read(&seg).unwrap();
    let at = if at_live_end { live_end(&bytes) } else { bytes.len() };
    let end = at + garbage.len();
    if bytes.len() < end {
        bytes.resize(end, 0);
    }
    bytes[at..end].copy_from_slice(garbage);
    std::fs::write(&seg, &bytes).unwrap();
    Some((seg, at))
}

#[derive(Debug, Clone)]
enum Garbage {
    Random(Vec<u8>),
    Zeros(usize),
    /// A plausible frame length, then random bytes: a frame cut short.
    CutFrame(u32, Vec<u8>),
}

impl Garbage {
    fn bytes(&self) -> Vec<u8> {
        match self {
            Garbage::Random(b) => b.clone(),
            Garbage::Zeros(n) => vec![0; *n],
            Garbage::CutFrame(len, rest) => {
                let mut b = len.to_le_bytes().to_vec();
                b.extend_from_slice(rest);
                b.truncate(199);
                b
            }
        }
    }
}

fn garbage() -> impl Strategy<Value = Garbage> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 1..200).prop_map(Garbage::Random),
        (1usize..200).prop_map(Garbage::Zeros),
        (60u32..400, prop::collection::vec(any::<u8>(), 0..195)).prop_map(|(l, r)| Garbage::CutFrame(l, r)),
    ]
}

async fn run_torn(
    params: QueueParams,
    pushes: Vec<usize>,
    completed: usize,
    shard: usize,
    garbage: Garbage,
    at_live_end: bool,
    more: usize,
) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q");
    let spec = spec(&path, params);
    let mut m = Model::new(params);
    let q = open(&spec, dir.path()).await;
    for n in pushes {
        push(&q, &mut m, n, true).await?;
    }
    // Some are delivered and completed before the crash.
    let mut left = completed;
    while left > 0 && pop(&q, &mut m, left).await? {
        left -= m.outstanding.last().map_or(0, |(b, _)| b.len());
        m.complete(m.outstanding.len() - 1);
    }
    tokio::time::timeout(STUCK, q.shutdown()).await.map_err(|_| "shutdown is stuck".to_string())?;
    drop(q);
    m.restarted();
    let bytes = garbage.bytes();
    let torn = tear(&path, shard, &bytes, at_live_end);
    let q = open(&spec, dir.path()).await;
    // The queue takes new events after the tear, and they survive another restart too.
    push(&q, &mut m, more, true).await?;
    let q = restart(q, &mut m, &spec, dir.path()).await?;
    drain(&q, &mut m).await?;
    let lost: Vec<usize> = (0..m.state.len())
        .filter(|&i| m.acked[i] && !matches!(m.state[i], State::Completed | State::MaybeQueued))
        .collect();
    q.shutdown().await;
    if !lost.is_empty() {
        return Err(format!(
            "after {} garbage bytes written to (segment, offset) {:?}, {} acknowledged events are lost: {:?}",
            bytes.len(),
            torn,
            lost.len(),
            &lost[..lost.len().min(20)]
        ));
    }
    Ok(())
}

fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(cases);
    ProptestConfig { cases, max_shrink_iters: 200, max_shrink_time: 60_000, ..ProptestConfig::default() }
}

proptest! {
    #![proptest_config(config(64))]

    /// (a), (b), (c) with 1 to 3 shards.
    #[test]
    fn persisted_queue_matches_the_model(params in params(1usize..=3), ops in prop::collection::vec(op(), 1..40)) {
        let result = runtime().block_on(run_model(params, ops.clone()));
        prop_assert!(result.is_ok(), "{}\nparams: {params:?}\nops: {ops:?}", result.unwrap_err());
    }
}

proptest! {
    #![proptest_config(config(32))]

    /// (d): with one shard, events come out in push order (and (a)-(c) hold too).
    #[test]
    fn one_shard_keeps_push_order(params in params(Just(1usize)), ops in prop::collection::vec(op(), 1..40)) {
        let result = runtime().block_on(run_model(params, ops.clone()));
        prop_assert!(result.is_ok(), "{}\nparams: {params:?}\nops: {ops:?}", result.unwrap_err());
    }
}

proptest! {
    #![proptest_config(config(64))]

    /// Garbage after the last frame of a segment (a torn write) loses nothing acknowledged.
    #[test]
    fn a_torn_write_loses_nothing_acknowledged(
        params in params(1usize..=3),
        pushes in prop::collection::vec(1usize..200, 1..8),
        completed in 0usize..300,
        shard in 0usize..3,
        garbage in garbage(),
        at_live_end in any::<bool>(),
        more in 1usize..100,
    ) {
        let result =
            runtime().block_on(run_torn(params, pushes.clone(), completed, shard, garbage.clone(), at_live_end, more));
        prop_assert!(
            result.is_ok(),
            "{}\nparams: {params:?} pushes: {pushes:?} completed: {completed} shard: {shard} garbage: {garbage:?} \
             at_live_end: {at_live_end}",
            result.unwrap_err()
        );
    }
}

/// A worker that drops a batch without completing it (a delivery aborted at shutdown) has not
/// handled its events: they must come back after a restart.
#[test]
fn a_batch_dropped_without_completion_comes_back_after_restart() {
    for (memory, direct_io) in [("0", false), ("0", true), ("16MiB", false)] {
        let ops = vec![Op::Push { n: 10, wait: true }, Op::Pop { max: 10 }, Op::DropOutstanding(0)];
        let result = runtime().block_on(run_model(QueueParams { shards: 1, memory, direct_io }, ops));
        assert!(result.is_ok(), "memory_bytes {memory}, direct_io {direct_io}: {}", result.unwrap_err());
    }
}

/// Events completed right after start, before a shard's writer thread first runs, must still be
/// checkpointed at shutdown (and not delivered again after a clean restart).
#[test]
fn events_completed_right_after_start_are_checkpointed() {
    let params = QueueParams { shards: 1, memory: "16MiB", direct_io: false };
    for round in 0..20 {
        let result: Result<(), String> = runtime().block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let spec = spec(&dir.path().join("q"), params);
            let mut m = Model::new(params);
            let q = open(&spec, dir.path()).await;
            push(&q, &mut m, 5, true).await?;
            // Restart, then at once take and complete everything; then a clean restart.
            let q = restart(q, &mut m, &spec, dir.path()).await?;
            drain(&q, &mut m).await?;
            let q = restart(q, &mut m, &spec, dir.path()).await?;
            let again = pop(&q, &mut m, 1000).await;
            q.shutdown().await;
            again.map(|_| ())
        });
        assert!(result.is_ok(), "round {round}: {}", result.unwrap_err());
    }
}
