//! The `kafka` input's consumer thread: polls librdkafka, hands records over, pauses under
//! backpressure, commits acknowledged offsets, and handles rebalances.
//!
//! One dedicated OS thread owns the consumer (librdkafka runs rebalance callbacks inside
//! `poll`, and a revocation may wait; no async worker is ever blocked). It polls records into
//! chunks of at most [`CHUNK_RECORDS`] records or [`CHUNK_BYTES`] bytes and hands them to the
//! input's task over a small channel. Guarantees:
//!
//! - **Commits.** librdkafka commits nothing by itself (`enable.auto.commit` and
//!   `enable.auto.offset.store` are off). Every `commit_interval` the thread commits, per
//!   partition, the offset after the contiguous run of records whose events reached the ack
//!   point ([`super::offsets`]), asynchronously; a failed commit is counted, logged and made
//!   again at the next tick. A partition given up (revocation, shutdown) is committed
//!   synchronously first (waiting at most [`COMMIT_TIMEOUT`] for the coordinator).
//! - **Rebalance.** On a revocation, the [`Context`] stops the revoked partitions from taking
//!   new events, waits at most `revoke_timeout` for their events in flight to be acknowledged,
//!   commits their offsets synchronously and only then lets librdkafka release them. Their
//!   events acknowledged later commit nothing (the tracker's epochs). A lost assignment (the
//!   member was expelled) commits nothing: another member owns the partitions already.
//! - **Backpressure.** When the channel is full (the pipeline's queue or the memory budget is
//!   full), the chunk just polled is kept and room is waited for without polling; only when
//!   the stall lasts [`PAUSE_AFTER`] is every assigned partition paused (pausing throws away
//!   what librdkafka fetched ahead), and polling goes
//!   on (every 10 ms) so that the member keeps its place in the group (`max.poll.interval.ms`)
//!   and rebalances are served. librdkafka re-fetches, on resume, from the record after the
//!   last one it returned: nothing polled is dropped, nothing is skipped.
//! - **Shutdown.** The thread stops polling, waits at most `revoke_timeout` for the events in
//!   flight, commits synchronously, and closes the consumer (which leaves the group).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ffi::CString;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::{Message, Offset, TopicPartitionList};
use sluice_kafka::LogAs;
use tokio::sync::mpsc::{self, error::TrySendError};
use tokio_util::sync::CancellationToken;

use super::decode::{Fields, Record};
use super::figures::Figures;
use super::offsets::{OffsetTracker, PartitionKey};

/// Most records in one chunk (one batch of the pipeline, at most).
pub(super) const CHUNK_RECORDS: usize = 1024;
/// Most value bytes in one chunk.
pub(super) const CHUNK_BYTES: usize = 1 << 20;
/// How long one poll waits for a record when there is room downstream.
const POLL_WAIT: Duration = Duration::from_millis(100);
/// How long one poll waits while paused (the channel is checked for room between polls).
const PAUSED_POLL_WAIT: Duration = Duration::from_millis(10);
/// How long a full hand-off is waited for before the partitions are paused. Pausing throws
/// away what librdkafka has fetched ahead, so a pipeline that is full for a moment (a batch
/// being written) must not cost a refetch: only a stall this long pauses.
const PAUSE_AFTER: Duration = Duration::from_millis(500);
/// librdkafka's warnings and errors (a broker away repeats them) are logged at most this often.
const LOG_EVERY: Duration = Duration::from_secs(10);
/// The longest a synchronous commit (revocation, shutdown) waits for the coordinator's answer.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(10);

/// Records polled together, handed to the input's task.
#[derive(Default)]
pub(super) struct Chunk {
    pub records: Vec<Record>,
    pub bytes: usize,
}

/// What the consumer's callbacks and the thread share.
pub(super) struct Shared {
    pub tracker: Arc<OffsetTracker>,
    pub figures: Arc<Figures>,
    pub revoke_timeout: Duration,
    pub pipeline: String,
    pub id: String,
    /// How the consumer reaches the brokers, for the log (`sluice_kafka::describe`).
    connection: String,
    /// When a librdkafka warning was last logged, and how many were held back since.
    logged: Mutex<(Option<Instant>, u64)>,
    /// The same for refused credentials or TLS handshakes: apart, so that librdkafka's own
    /// line on the failure does not hold back the one that says what it means.
    refused_logged: Mutex<(Option<Instant>, u64)>,
}

impl Shared {
    pub(super) fn new(
        tracker: Arc<OffsetTracker>,
        figures: Arc<Figures>,
        revoke_timeout: Duration,
        pipeline: &str,
        id: &str,
        connection: String,
    ) -> Shared {
        Shared {
            tracker,
            figures,
            revoke_timeout,
            pipeline: pipeline.to_string(),
            id: id.to_string(),
            connection,
            logged: Mutex::new((None, 0)),
            refused_logged: Mutex::new((None, 0)),
        }
    }

    /// Whether to log a repeated warning now; with how many were held back before it.
    fn may_log(&self) -> Option<u64> {
        Shared::due(&self.logged)
    }

    fn due(logged: &Mutex<(Option<Instant>, u64)>) -> Option<u64> {
        let mut l = logged.lock();
        if l.0.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            let held = l.1;
            *l = (Some(Instant::now()), 0);
            Some(held)
        } else {
            l.1 += 1;
            None
        }
    }

    /// Commits `offsets` and waits for the answer (at most [`COMMIT_TIMEOUT`]); updates the
    /// figures.
    fn commit_sync(&self, consumer: &BaseConsumer<Context>, offsets: &[(PartitionKey, i64)], why: &str) {
        if offsets.is_empty() {
            return;
        }
        match commit_and_wait(consumer, &list(offsets), COMMIT_TIMEOUT) {
            Ok(()) => {
                self.figures.commits.fetch_add(1, Ordering::Relaxed);
                for (key, offset) in offsets {
                    self.figures.set_committed(key, *offset);
                }
                tracing::debug!(pipeline = %self.pipeline, input = %self.id, offsets = %describe(offsets), "kafka input committed offsets ({why})");
            }
            Err(e) => {
                self.figures.commit_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(pipeline = %self.pipeline, input = %self.id, offsets = %describe(offsets), error = %e,
                    "kafka input could not commit offsets ({why}); their records will be read again by whoever consumes the partitions next");
            }
        }
    }

    /// Gives up `keys`: no new events for them, a bounded wait for those in flight, then a
    /// synchronous commit.
    fn give_up(&self, consumer: &BaseConsumer<Context>, keys: &[PartitionKey], why: &str) {
        if keys.is_empty() {
            return;
        }
        self.tracker.close(keys);
        let started = Instant::now();
        let left = self.tracker.wait_settled(keys, started + self.revoke_timeout);
        if left > 0 {
            self.figures.revoke_timeouts.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(pipeline = %self.pipeline, input = %self.id, partitions = %names(keys), batch_parts_in_flight = left,
                revoke_timeout = ?self.revoke_timeout,
                "kafka input: events of partitions being given up ({why}) were not all acknowledged within revoke_timeout; \
                 their offsets stay where the acknowledged events end, and the rest will be read again");
        }
        let offsets = self.tracker.release(keys);
        self.commit_sync(consumer, &offsets, why);
        self.figures.forget(keys);
        tracing::info!(pipeline = %self.pipeline, input = %self.id, partitions = %names(keys), committed = %describe(&offsets),
            waited_ms = started.elapsed().as_millis() as u64, "kafka input gave up partitions ({why})");
    }
}

/// The consumer's callbacks: logs, rebalances, commit results.
pub(super) struct Context(pub Arc<Shared>);

impl ClientContext for Context {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        let s = &self.0;
        match LogAs::of(level) {
            LogAs::Warning => {
                if let Some(held) = s.may_log() {
                    tracing::warn!(pipeline = %s.pipeline, input = %s.id, facility = fac, held_back = held,
                        "librdkafka: {message} (logged at most once per 10 s)");
                }
            }
            LogAs::Info => {
                tracing::info!(pipeline = %s.pipeline, input = %s.id, facility = fac, "librdkafka: {message}")
            }
            LogAs::Debug => {
                tracing::debug!(pipeline = %s.pipeline, input = %s.id, facility = fac, "librdkafka: {message}")
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let s = &self.0;
        if let Some(refusal) = sluice_kafka::refusal(&error, reason) {
            if let Some(held) = Shared::due(&s.refused_logged) {
                tracing::error!(pipeline = %s.pipeline, input = %s.id, error = %error, held_back = held,
                    "kafka input cannot read: {refusal} ({}): {reason}; nothing is read until the configuration \
                     or the broker changes (librdkafka retries; logged at most once per 10 s)", s.connection);
            }
            return;
        }
        if let Some(held) = s.may_log() {
            tracing::warn!(pipeline = %s.pipeline, input = %s.id, error = %error, held_back = held,
                "kafka input: {reason} (librdkafka retries; logged at most once per 10 s)");
        }
    }
}

impl ConsumerContext for Context {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let s = &self.0;
        match rebalance {
            Rebalance::Assign(tpl) => {
                let keys = keys(tpl);
                s.figures.rebalances.fetch_add(1, Ordering::Relaxed);
                s.tracker.assign(keys.iter().cloned());
                s.figures.assigned.store(s.tracker.owned().len() as u64, Ordering::Relaxed);
                tracing::info!(pipeline = %s.pipeline, input = %s.id, partitions = %names(&keys), "kafka input assigned partitions");
            }
            Rebalance::Revoke(tpl) => {
                let keys = keys(tpl);
                s.figures.rebalances.fetch_add(1, Ordering::Relaxed);
                if consumer.assignment_lost() {
                    // Another member owns them already: committing would be refused, and
                    // would be wrong. Their events in flight commit nothing (new epochs).
                    s.tracker.close(&keys);
                    s.tracker.release(&keys);
                    s.figures.forget(&keys);
                    tracing::warn!(pipeline = %s.pipeline, input = %s.id, partitions = %names(&keys),
                        "kafka input lost its partitions (the group expelled this member: session timeout or max.poll.interval.ms); \
                         their uncommitted records will be read again");
                } else {
                    s.give_up(consumer, &keys, "revoked by a rebalance");
                }
                s.figures.assigned.store(s.tracker.owned().len() as u64, Ordering::Relaxed);
            }
            Rebalance::Error(e) => {
                tracing::warn!(pipeline = %s.pipeline, input = %s.id, error = %e, "kafka input: rebalance error");
            }
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        let s = &self.0;
        match result {
            Ok(()) => {
                s.figures.commits.fetch_add(1, Ordering::Relaxed);
                for e in offsets.elements() {
                    if let (Ok(()), Offset::Offset(o)) = (e.error(), e.offset()) {
                        let key = (Arc::from(e.topic()), e.partition());
                        if s.tracker.confirm(&key, o) {
                            s.figures.set_committed(&key, o);
                        }
                    }
                }
            }
            Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
            Err(e) => {
                s.figures.commit_failures.fetch_add(1, Ordering::Relaxed);
                if let Some(held) = s.may_log() {
                    tracing::warn!(pipeline = %s.pipeline, input = %s.id, error = %e, held_back = held,
                        "kafka input could not commit offsets; trying again at the next commit_interval");
                }
            }
        }
    }
}

/// The partition epochs as the thread last read them, by topic then partition.
struct Epochs {
    version: u64,
    by_topic: HashMap<Arc<str>, HashMap<i32, u64>>,
}

impl Epochs {
    fn refresh(&mut self, tracker: &OffsetTracker) {
        let version = tracker.version();
        if version == self.version {
            return;
        }
        self.version = version;
        self.by_topic.clear();
        for ((topic, partition), epoch) in tracker.epochs() {
            self.by_topic.entry(topic).or_default().insert(partition, epoch);
        }
    }

    /// The topic's shared name and the partition's epoch (0, refused later, if not owned).
    fn of(&self, topic: &str, partition: i32) -> (Arc<str>, u64) {
        match self.by_topic.get_key_value(topic) {
            Some((name, partitions)) => (name.clone(), partitions.get(&partition).copied().unwrap_or(0)),
            None => (Arc::from(topic), 0),
        }
    }
}

/// Runs the consumer until `stop`, or until the input's task is gone. `Err` for a fatal
/// consumer error.
pub(super) fn run(
    consumer: BaseConsumer<Context>,
    topics: &[String],
    fields: &Fields,
    commit_interval: Duration,
    tx: mpsc::Sender<Chunk>,
    stop: &CancellationToken,
) -> Result<(), String> {
    let shared = consumer.context().0.clone();
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    consumer.subscribe(&names).map_err(|e| format!("cannot subscribe to {}: {e}", topics.join(", ")))?;
    let mut epochs = Epochs { version: u64::MAX, by_topic: HashMap::new() };
    let mut pending: VecDeque<Chunk> = VecDeque::new();
    // The tracker version the pause was made for (a rebalance adds partitions to pause).
    let mut paused: Option<u64> = None;
    let mut next_commit = Instant::now() + commit_interval;
    let queue = MainQueue::of(&consumer).ok_or_else(|| "librdkafka gave no main queue".to_string())?;
    let mut result = Ok(());
    'run: while !stop.is_cancelled() {
        while let Some(chunk) = pending.pop_front() {
            match tx.try_send(chunk) {
                Ok(()) => {}
                Err(TrySendError::Full(chunk)) => {
                    pending.push_front(chunk);
                    break;
                }
                Err(TrySendError::Closed(_)) => break 'run,
            }
        }
        // The hand-off is full: wait for room without polling (what is fetched ahead stays in
        // librdkafka), and pause only if the stall lasts.
        if !pending.is_empty() && paused.is_none() {
            let until = Instant::now() + PAUSE_AFTER;
            while let Some(chunk) = pending.pop_front() {
                match tx.try_send(chunk) {
                    Ok(()) => continue,
                    Err(TrySendError::Full(chunk)) => pending.push_front(chunk),
                    Err(TrySendError::Closed(_)) => break 'run,
                }
                if Instant::now() >= until || stop.is_cancelled() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let version = shared.tracker.version();
        match (pending.is_empty(), paused) {
            (false, Some(v)) if v == version => {}
            (false, was) => {
                if let Ok(assigned) = consumer.assignment()
                    && let Err(e) = consumer.pause(&assigned)
                {
                    tracing::warn!(pipeline = %shared.pipeline, input = %shared.id, error = %e, "kafka input cannot pause its partitions");
                }
                if was.is_none() {
                    shared.figures.pauses.fetch_add(1, Ordering::Relaxed);
                    shared.figures.paused.store(1, Ordering::Relaxed);
                    tracing::debug!(pipeline = %shared.pipeline, input = %shared.id, "kafka input paused: the pipeline is full");
                }
                paused = Some(version);
            }
            (true, Some(_)) => {
                if let Ok(assigned) = consumer.assignment()
                    && let Err(e) = consumer.resume(&assigned)
                {
                    tracing::warn!(pipeline = %shared.pipeline, input = %shared.id, error = %e, "kafka input cannot resume its partitions");
                }
                shared.figures.paused.store(0, Ordering::Relaxed);
                paused = None;
            }
            (true, None) => {}
        }
        let mut chunk = Chunk::default();
        let mut wait = if paused.is_some() { PAUSED_POLL_WAIT } else { POLL_WAIT };
        while let Some(polled) = consumer.poll(wait) {
            wait = Duration::ZERO;
            match polled {
                Ok(m) => {
                    epochs.refresh(&shared.tracker);
                    let (topic, epoch) = epochs.of(m.topic(), m.partition());
                    let record = fields.record(&m, topic, epoch);
                    chunk.bytes += record.value.len();
                    chunk.records.push(record);
                    if chunk.records.len() >= CHUNK_RECORDS || chunk.bytes >= CHUNK_BYTES {
                        break;
                    }
                }
                Err(e @ KafkaError::MessageConsumptionFatal(_)) => {
                    result = Err(format!("the kafka consumer failed for good: {e}"));
                    break 'run;
                }
                Err(e) => {
                    if let Some(held) = shared.may_log() {
                        tracing::warn!(pipeline = %shared.pipeline, input = %shared.id, error = %e, held_back = held,
                            "kafka input: consuming failed; librdkafka retries (logged at most once per 10 s)");
                    }
                    break;
                }
            }
        }
        if !chunk.records.is_empty() {
            shared.figures.consumed.fetch_add(chunk.records.len() as u64, Ordering::Relaxed);
            pending.push_back(chunk);
        }
        if Instant::now() >= next_commit {
            commit_async(&consumer, &queue, &shared);
            next_commit = Instant::now() + commit_interval;
        }
    }
    drop(tx);
    drop(pending);
    shared.figures.paused.store(0, Ordering::Relaxed);
    let owned = shared.tracker.owned();
    shared.give_up(&consumer, &owned, "shutdown");
    drop(queue);
    // Dropping the consumer closes it: it leaves the group (its revocation finds nothing left).
    drop(consumer);
    result
}

/// The client's main queue, to which the results of asynchronous commits are sent: librdkafka
/// forwards it to the consumer queue that `poll` serves, so they reach
/// [`ConsumerContext::commit_callback`]. (`rd_kafka_commit` without a queue reports the result
/// of a manual asynchronous commit nowhere when callbacks are events.)
struct MainQueue(*mut rdkafka::bindings::rd_kafka_queue_t);

impl MainQueue {
    fn of(consumer: &BaseConsumer<Context>) -> Option<MainQueue> {
        // SAFETY: the client pointer is valid while `consumer` lives; the queue handle returned
        // is ours to destroy (in `Drop`, before the consumer is dropped).
        let q = unsafe { rdkafka::bindings::rd_kafka_queue_get_main(consumer.client().native_ptr()) };
        (!q.is_null()).then_some(MainQueue(q))
    }
}

impl Drop for MainQueue {
    fn drop(&mut self) {
        // SAFETY: a handle from `rd_kafka_queue_get_main`, destroyed once.
        unsafe { rdkafka::bindings::rd_kafka_queue_destroy(self.0) }
    }
}

/// Commits, without waiting, what moved since the last confirmed commit; refreshes the lag.
fn commit_async(consumer: &BaseConsumer<Context>, queue: &MainQueue, shared: &Shared) {
    let offsets = shared.tracker.to_commit();
    if !offsets.is_empty() {
        let tpl = list(&offsets);
        // SAFETY: the client and the queue are valid while `consumer` and `queue` live; the
        // list is copied by librdkafka before the call returns; no callback or opaque is given.
        let err = unsafe {
            rdkafka::bindings::rd_kafka_commit_queue(
                consumer.client().native_ptr(),
                tpl.ptr(),
                queue.0,
                None,
                std::ptr::null_mut(),
            )
        };
        if err != rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
            shared.figures.commit_failures.fetch_add(1, Ordering::Relaxed);
            if let Some(held) = shared.may_log() {
                tracing::warn!(pipeline = %shared.pipeline, input = %shared.id, error = %RDKafkaErrorCode::from(err), held_back = held,
                    "kafka input could not commit offsets; trying again at the next commit_interval");
            }
        }
    }
    let mut highs = BTreeMap::new();
    for (topic, partition) in shared.tracker.owned() {
        if let Some(high) = high_watermark(consumer, &topic, partition) {
            highs.insert((topic.to_string(), partition), high);
        }
    }
    shared.figures.set_high_watermarks(highs);
}

/// Commits `tpl` and waits at most `timeout` for the answer: the request's error, or the
/// first partition's. (`rd_kafka_commit` in its synchronous form waits without a bound, which
/// a coordinator that is away would make forever.)
fn commit_and_wait(
    consumer: &BaseConsumer<Context>,
    tpl: &TopicPartitionList,
    timeout: Duration,
) -> Result<(), String> {
    use rdkafka::bindings as rd;
    use rdkafka::types::RDKafkaRespErr;
    let rk = consumer.client().native_ptr();
    // SAFETY: `rk` is valid while `consumer` lives. The queue is ours: created here, destroyed
    // before returning (a reply arriving after that is discarded by librdkafka). The list is
    // copied by librdkafka during the call. The event, when one comes, is read while it lives
    // and destroyed once; its partition list belongs to it.
    unsafe {
        let queue = rd::rd_kafka_queue_new(rk);
        if queue.is_null() {
            return Err("librdkafka gave no queue".into());
        }
        let err = rd::rd_kafka_commit_queue(rk, tpl.ptr(), queue, None, std::ptr::null_mut());
        let result = if err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
            Err(RDKafkaErrorCode::from(err).to_string())
        } else {
            let event = rd::rd_kafka_queue_poll(queue, timeout.as_millis().min(i32::MAX as u128) as i32);
            if event.is_null() {
                Err(format!("no answer from the group coordinator within {timeout:?}"))
            } else {
                let mut err = rd::rd_kafka_event_error(event);
                let list = rd::rd_kafka_event_topic_partition_list(event);
                if err == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR && !list.is_null() && !(*list).elems.is_null() {
                    let elems = std::slice::from_raw_parts((*list).elems, (*list).cnt.max(0) as usize);
                    if let Some(e) = elems.iter().find(|e| e.err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR) {
                        err = e.err;
                    }
                }
                rd::rd_kafka_event_destroy(event);
                if err == RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
                    Ok(())
                } else {
                    Err(RDKafkaErrorCode::from(err).to_string())
                }
            }
        };
        rd::rd_kafka_queue_destroy(queue);
        result
    }
}

/// The partition's end offset as librdkafka last learnt it from a fetch (no request is made).
fn high_watermark(consumer: &BaseConsumer<Context>, topic: &str, partition: i32) -> Option<i64> {
    let topic = CString::new(topic).ok()?;
    let (mut low, mut high) = (-1i64, -1i64);
    // SAFETY: the client pointer is valid while `consumer` lives; the topic is a valid C
    // string for the duration of the call; the out-pointers are to local integers.
    let err = unsafe {
        rdkafka::bindings::rd_kafka_get_watermark_offsets(
            consumer.client().native_ptr(),
            topic.as_ptr(),
            partition,
            &mut low,
            &mut high,
        )
    };
    (err == rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0).then_some(high)
}

fn keys(tpl: &TopicPartitionList) -> Vec<PartitionKey> {
    tpl.elements().iter().map(|e| (Arc::from(e.topic()), e.partition())).collect()
}

fn list(offsets: &[(PartitionKey, i64)]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::with_capacity(offsets.len());
    for ((topic, partition), offset) in offsets {
        // Only fails for a partition that is not in the list, which was just added.
        let _ = tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset));
    }
    tpl
}

fn names(keys: &[PartitionKey]) -> String {
    let mut v: Vec<String> = keys.iter().map(|(t, p)| format!("{t}/{p}")).collect();
    v.sort();
    v.join(",")
}

fn describe(offsets: &[(PartitionKey, i64)]) -> String {
    let mut v: Vec<String> = offsets.iter().map(|((t, p), o)| format!("{t}/{p}@{o}")).collect();
    v.sort();
    v.join(",")
}
