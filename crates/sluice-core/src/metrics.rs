//! Counters, gauges and histograms for pipelines and their components.
//!
//! Everything here is updated once per batch, read or write (an atomic add), never once per
//! event. The monitoring API reads these into a [`NodeSnapshot`](crate::snapshot::NodeSnapshot)
//! to render `/metrics` (OpenMetrics text) and `/stats` (JSON); the dead letter queue's and the
//! registry's snapshots are kept here with their figures, as those stores live in crates of
//! their own.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::RwLock;

use crate::exposition::{DescriptorEncoder, Labels, counter, gauge};
use crate::queue::Queue;

#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Upper bounds (seconds) of the latency histogram buckets; the last bucket is +Inf. They span
/// an in-memory hand-off (tens of microseconds) to an output retrying for seconds.
pub const LATENCY_BUCKETS: [f64; 14] =
    [0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.5, 10.0];

#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
    count: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = LATENCY_BUCKETS.iter().position(|&b| secs <= b).unwrap_or(LATENCY_BUCKETS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_nanos.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot_struct(&self) -> crate::queue::HistogramSnapshot {
        let (buckets, sum, count) = self.snapshot();
        crate::queue::HistogramSnapshot { buckets, sum, count }
    }

    /// Cumulative counts per bucket (Prometheus `le` semantics), the sum in seconds, the count.
    pub fn snapshot(&self) -> (Vec<u64>, f64, u64) {
        let mut acc = 0;
        let cumulative = self
            .buckets
            .iter()
            .map(|b| {
                acc += b.load(Ordering::Relaxed);
                acc
            })
            .collect();
        (cumulative, self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9, self.count.load(Ordering::Relaxed))
    }

    /// The `q` quantile (0 to 1) of everything observed, estimated as Prometheus'
    /// `histogram_quantile` does: linear within the bucket it falls in, the lowest bucket
    /// starting at 0. `None` before the first observation; a quantile in the +Inf bucket is
    /// given as the highest finite bound.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        quantile_of(&self.snapshot().0, q)
    }
}

/// The `q` quantile of cumulative bucket counts over [`LATENCY_BUCKETS`] (then +Inf); see
/// [`Histogram::quantile`].
pub fn quantile_of(cumulative: &[u64], q: f64) -> Option<f64> {
    let total = *cumulative.last()?;
    if total == 0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total as f64;
    let i = cumulative.iter().position(|&c| c as f64 >= rank).unwrap_or(cumulative.len() - 1);
    let Some(&upper) = LATENCY_BUCKETS.get(i) else {
        return LATENCY_BUCKETS.last().copied();
    };
    let lower = if i == 0 { 0.0 } else { LATENCY_BUCKETS[i - 1] };
    let below = if i == 0 { 0 } else { cumulative[i - 1] };
    let within = (cumulative[i] - below) as f64;
    let fraction = if within > 0.0 { (rank - below as f64) / within } else { 1.0 };
    Some(lower + (upper - lower) * fraction.clamp(0.0, 1.0))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ComponentKind {
    Input,
    Processor,
    Output,
}

impl ComponentKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ComponentKind::Input => "input",
            ComponentKind::Processor => "processor",
            ComponentKind::Output => "output",
        }
    }
}

/// Counts for one input, processor or output.
#[derive(Debug)]
pub struct ComponentMetrics {
    pub id: String,
    pub kind: ComponentKind,
    pub type_name: String,
    pub events_in: Counter,
    pub events_out: Counter,
    /// Dropped on purpose (a `drop` processor, a condition).
    pub dropped: Counter,
    /// Failed: rejected for good by an output, unparsable at an input, given up after retries.
    pub failed: Counter,
    /// Outputs: attempts that failed for a reason outside the events (a full disk, a peer
    /// down) and are tried again; rising while an output holds its pipeline back.
    pub retries: Counter,
    /// Inputs: requests and connections refused by a limit (too large, too many events, no room
    /// in the memory budget in time, `max_connections`, a client too slow for a timeout).
    pub refused: Counter,
    /// Inputs: bytes taken in from the wire, a file or stdin as read, before framing, decoding
    /// and decompression (after TLS). Added once per read, never per event; each input's
    /// module says what it counts.
    pub bytes_in: Counter,
    /// Outputs: bytes the destination accepted as delivered (written to a file, a request body
    /// answered 2xx, a record acknowledged); a failed attempt counts nothing, its successful
    /// retry counts once. Added once per write or request, never per event.
    pub bytes_out: Counter,
    /// Time spent per batch in this component.
    pub duration: Histogram,
    /// Inputs: the pipeline's [`PipelineMetrics::ack_latency`], where the acknowledgements of
    /// the batches this input sends are timed (set by [`PipelineMetrics::component`]).
    pub ack_latency: OnceLock<Arc<Histogram>>,
    /// Figures of the component's own (a stateful processor's groups, an output's requests).
    pub state: OnceLock<Arc<dyn crate::figures::Publish>>,
    /// Starting, running, stopped or failed (with the reason): what `/health` reports.
    pub health: crate::health::Health,
    /// Outputs: whether delivery works, is being retried or is down, and the last error.
    pub output: OutputStatus,
}

/// Where an output stands, from the last outcome of its attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputState {
    /// The last attempt succeeded, or nothing has failed yet.
    Up,
    /// Attempts fail for a reason outside the events and are being retried (the pipeline waits).
    Retrying,
    /// Failing for [`OUTPUT_DOWN_AFTER`] or longer, or the last batch was given up.
    Down,
}

impl OutputState {
    pub const ALL: [OutputState; 3] = [OutputState::Up, OutputState::Retrying, OutputState::Down];

    pub fn as_str(self) -> &'static str {
        match self {
            OutputState::Up => "up",
            OutputState::Retrying => "retrying",
            OutputState::Down => "down",
        }
    }
}

/// How long an output retries before it counts as `down`.
pub const OUTPUT_DOWN_AFTER: Duration = Duration::from_secs(60);

/// The longest error message kept: a peer's answer can be long, and it is shown as is.
pub const MAX_ERROR_MESSAGE: usize = 512;

/// An output's last error: what it said and when (seconds since the Unix epoch).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LastError {
    pub message: String,
    pub at: f64,
}

/// An output's state and last error, kept by its retry loop: a failed attempt that is retried
/// makes it `retrying`, one that is given up `down`, a delivered batch `up` again. `down` also
/// comes by itself once failures have lasted [`OUTPUT_DOWN_AFTER`] with no success between,
/// whatever the retry loop is doing. The last error stays after recovery, with its time.
#[derive(Debug, Default)]
pub struct OutputStatus {
    /// False while up: a delivered batch then costs one load, not a lock.
    failing: std::sync::atomic::AtomicBool,
    inner: parking_lot::Mutex<OutputStatusInner>,
}

#[derive(Debug, Default)]
struct OutputStatusInner {
    /// The first failure since the last success.
    failing_since: Option<Instant>,
    gave_up: bool,
    last_error: Option<LastError>,
}

impl OutputStatus {
    /// An attempt failed for a reason outside the events and will be tried again.
    pub fn retrying(&self, message: &str) {
        self.failed(message, false, Instant::now());
    }

    /// An attempt failed and its events were given up (the retry limit was spent).
    pub fn gave_up(&self, message: &str) {
        self.failed(message, true, Instant::now());
    }

    /// An error worth showing that does not by itself change the state (a client library's
    /// report while nothing is being sent).
    pub fn note_error(&self, message: &str) {
        self.inner.lock().last_error = Some(last_error(message));
    }

    /// A batch (or part of one) was delivered: up again.
    pub fn delivered(&self) {
        if !self.failing.load(Ordering::Relaxed) {
            return;
        }
        let mut s = self.inner.lock();
        s.failing_since = None;
        s.gave_up = false;
        self.failing.store(false, Ordering::Relaxed);
    }

    pub fn state(&self) -> OutputState {
        self.state_at(Instant::now())
    }

    pub fn last_error(&self) -> Option<LastError> {
        self.inner.lock().last_error.clone()
    }

    fn failed(&self, message: &str, gave_up: bool, now: Instant) {
        let mut s = self.inner.lock();
        s.failing_since.get_or_insert(now);
        s.gave_up = gave_up;
        s.last_error = Some(last_error(message));
        self.failing.store(true, Ordering::Relaxed);
    }

    fn state_at(&self, now: Instant) -> OutputState {
        if !self.failing.load(Ordering::Relaxed) {
            return OutputState::Up;
        }
        let s = self.inner.lock();
        match s.failing_since {
            None => OutputState::Up,
            Some(_) if s.gave_up => OutputState::Down,
            Some(since) if now.saturating_duration_since(since) >= OUTPUT_DOWN_AFTER => OutputState::Down,
            Some(_) => OutputState::Retrying,
        }
    }
}

fn last_error(message: &str) -> LastError {
    let mut end = message.len().min(MAX_ERROR_MESSAGE);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs_f64();
    LastError { message: message[..end].to_string(), at }
}

impl ComponentMetrics {
    pub fn new(id: &str, kind: ComponentKind, type_name: &str) -> ComponentMetrics {
        ComponentMetrics {
            id: id.to_string(),
            kind,
            type_name: type_name.to_string(),
            events_in: Counter::default(),
            events_out: Counter::default(),
            dropped: Counter::default(),
            failed: Counter::default(),
            retries: Counter::default(),
            refused: Counter::default(),
            bytes_in: Counter::default(),
            bytes_out: Counter::default(),
            duration: Histogram::default(),
            ack_latency: OnceLock::new(),
            state: OnceLock::new(),
            health: crate::health::Health::default(),
            output: OutputStatus::default(),
        }
    }
}

/// Counts for one pipeline and the components in it.
pub struct PipelineMetrics {
    pub name: String,
    pub started: Instant,
    pub workers: usize,
    /// Events workers took from the queue (and from the forwarded-events queue). What the
    /// inputs put in is [`PipelineMetrics::events_in`].
    pub events_taken: Counter,
    pub events_out: Counter,
    pub dropped: Counter,
    pub failed: Counter,
    /// Wall time of a worker's whole pass over one batch (processors and outputs).
    pub batch_duration: Histogram,
    /// From an input batch's first push towards the queue to its acknowledgement: once per
    /// acknowledged input batch, however the queue split it (see [`crate::Acker::time_into`]).
    pub ack_latency: Arc<Histogram>,
    /// Summed time workers spent with at least one batch in hand (batches one worker has in
    /// flight together count once); divided by wall time and workers, utilisation.
    pub worker_busy_nanos: Counter,
    pub components: RwLock<Vec<Arc<ComponentMetrics>>>,
    pub queue: OnceLock<Arc<dyn Queue>>,
    /// Cluster mode: the queue of events peers forwarded to this pipeline.
    pub forwarded_queue: OnceLock<Arc<dyn Queue>>,
    /// Events written to the dead letter queue (from processors and outputs).
    pub dead_lettered: Counter,
    /// Events processors took out of batches for the dead letter queue (stored or lost): they
    /// are handled without reaching the outputs.
    pub diverted_to_dead_letter_queue: Counter,
    /// Events that came from a dead letter queue and failed again: not written back (no loop).
    pub dead_letter_loop_rejected: Counter,
    /// Events meant for the dead letter queue that it did not store (write error, or dropped by
    /// its storage policy); they are lost, on purpose.
    pub dead_letter_lost: Counter,
    /// Dead letter writes the queue failed (a full disk, an I/O error) and that were retried,
    /// holding their batch back.
    pub dead_letter_write_retries: Counter,
    /// The pipeline's dead letter queue, when it has one.
    pub dead_letter_queue: OnceLock<Arc<dyn DeadLetterStatsSource>>,
    /// Events stateful processors took into their groups (handled once what the group emits is).
    pub consumed: Counter,
    /// Events stateful processors emitted (counted in `events_out` once delivered).
    pub emitted: Counter,
    /// Cluster mode: events handed to the peers that own them (handled there).
    pub forwarded: Counter,
    /// Cluster mode: events peers forwarded to this node (or links handed back), taken into
    /// this pipeline's forwarded-events queue.
    pub received: Counter,
}

/// A point-in-time view of a pipeline's dead letter queue, for metrics: where it is, its
/// limit, and the store's own counters (flattened into the same JSON object).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct DeadLetterStats {
    pub path: String,
    pub max_bytes: u64,
    #[serde(flatten)]
    pub store: DlqStats,
}

/// A dead letter queue's counters and its index's totals (kept by the `sluice-dlq` crate,
/// defined here so that metrics can carry them without depending on it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct DlqStats {
    /// Segment files, the open one included.
    pub segments: u64,
    /// Bytes of all segment files.
    pub bytes: u64,
    /// Entries stored.
    pub entries: u64,
    /// Entries written since the queue was opened.
    pub written: u64,
    /// New entries rejected because the DLQ was full (`drop_newer`) or because an entry alone
    /// is larger than `max_bytes`.
    pub dropped_newer: u64,
    /// Stored entries deleted to make room (`drop_older`).
    pub dropped_older: u64,
    /// Stored entries deleted by `retain_age`.
    pub expired: u64,
    /// Entries whose event could not be encoded (e.g. nested too deep); not stored.
    pub unencodable: u64,
    /// Damaged frames found while recovering at start-up.
    pub corrupt_frames: u64,
    /// Segments deleted by readers as consumed.
    pub consumed_segments: u64,
    /// Time of the oldest stored entry (nanoseconds since the Unix epoch).
    pub oldest_entry_time: Option<i64>,
    /// Time of the newest stored entry.
    pub newest_entry_time: Option<i64>,
}

/// Whatever can report a [`DeadLetterStats`] (the dead letter queue lives in its own crate).
pub trait DeadLetterStatsSource: Send + Sync {
    fn dead_letter_stats(&self) -> DeadLetterStats;
}

/// A pipeline's dead letter queue at one moment: the store's figures and the pipeline's counts
/// of what did not reach it, flattened into one `/stats` object.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct DeadLetterSnapshot {
    #[serde(flatten)]
    pub stats: DeadLetterStats,
    /// Events replayed from a dead letter queue that failed again (not written back).
    pub loop_rejected: u64,
    /// Events meant for the queue that it did not store.
    pub lost: u64,
    /// Writes that failed and were retried, holding their batch back.
    pub write_retries: u64,
}

impl DeadLetterSnapshot {
    /// The `sluice_dlq_*` families, one series per pipeline; none without a dead letter queue.
    pub fn encode(out: &mut DescriptorEncoder<'_>, dlqs: &[(Labels, &DeadLetterSnapshot)]) -> std::fmt::Result {
        if dlqs.is_empty() {
            return Ok(());
        }
        type PickD = fn(&DeadLetterSnapshot) -> u64;
        let dlq_counters: [(&str, &str, PickD); 8] = [
            (
                "sluice_dlq_entries_written_total",
                "Entries written to the dead letter queue since it was opened.",
                |d| d.stats.store.written,
            ),
            (
                "sluice_dlq_dropped_newer_total",
                "New entries the full dead letter queue refused (drop_newer, or larger than max_bytes).",
                |d| d.stats.store.dropped_newer,
            ),
            ("sluice_dlq_dropped_older_total", "Stored entries deleted to make room (drop_older).", |d| {
                d.stats.store.dropped_older
            }),
            ("sluice_dlq_expired_total", "Stored entries deleted by retain_age.", |d| d.stats.store.expired),
            ("sluice_dlq_corrupt_frames_total", "Damaged dead letter entries found at start-up.", |d| {
                d.stats.store.corrupt_frames
            }),
            (
                "sluice_dlq_loop_rejected_total",
                "Events replayed from a dead letter queue that failed again and were not written back.",
                |d| d.loop_rejected,
            ),
            (
                "sluice_dlq_lost_total",
                "Events meant for the dead letter queue that its storage policy refused (full, or too large).",
                |d| d.lost,
            ),
            (
                "sluice_dlq_write_retries_total",
                "Dead letter writes that failed (disk full, I/O error) and were retried, holding their batch back.",
                |d| d.write_retries,
            ),
        ];
        for (name, help, pick) in dlq_counters {
            counter(out, name, help, dlqs.iter().map(|(l, d)| (l.clone(), pick(d))))?;
        }
        let dlq_gauges: [(&str, &str, PickD); 4] = [
            ("sluice_dlq_entries", "Entries stored in the dead letter queue.", |d| d.stats.store.entries),
            ("sluice_dlq_bytes", "Bytes of the dead letter queue's segment files.", |d| d.stats.store.bytes),
            ("sluice_dlq_segments", "Segment files of the dead letter queue.", |d| d.stats.store.segments),
            ("sluice_dlq_max_bytes", "The dead letter queue's max_bytes.", |d| d.stats.max_bytes),
        ];
        for (name, help, pick) in dlq_gauges {
            gauge(out, name, help, dlqs.iter().map(|(l, d)| (l.clone(), pick(d))))?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for PipelineMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PipelineMetrics").field("name", &self.name).finish()
    }
}

impl PipelineMetrics {
    pub fn new(name: &str, workers: usize) -> PipelineMetrics {
        PipelineMetrics {
            name: name.to_string(),
            started: Instant::now(),
            workers,
            events_taken: Counter::default(),
            events_out: Counter::default(),
            dropped: Counter::default(),
            failed: Counter::default(),
            batch_duration: Histogram::default(),
            ack_latency: Arc::new(Histogram::default()),
            worker_busy_nanos: Counter::default(),
            components: RwLock::new(Vec::new()),
            queue: OnceLock::new(),
            forwarded_queue: OnceLock::new(),
            dead_lettered: Counter::default(),
            diverted_to_dead_letter_queue: Counter::default(),
            dead_letter_loop_rejected: Counter::default(),
            dead_letter_lost: Counter::default(),
            dead_letter_write_retries: Counter::default(),
            dead_letter_queue: OnceLock::new(),
            consumed: Counter::default(),
            emitted: Counter::default(),
            forwarded: Counter::default(),
            received: Counter::default(),
        }
    }

    /// Events the pipeline's inputs put in: what its input components handed on. An input
    /// counts its `out` once per batch, after its queue took the batch, so the sum is exact and
    /// the hand-off needs no second counter; this costs a walk over the components per read.
    pub fn events_in(&self) -> u64 {
        self.components.read().iter().filter(|c| c.kind == ComponentKind::Input).map(|c| c.events_out.get()).sum()
    }

    pub fn component(&self, id: &str, kind: ComponentKind, type_name: &str) -> Arc<ComponentMetrics> {
        let m = Arc::new(ComponentMetrics::new(id, kind, type_name));
        if kind == ComponentKind::Input {
            let _ = m.ack_latency.set(self.ack_latency.clone());
        }
        self.components.write().push(m.clone());
        m
    }
}

/// Figures of the registry of input positions (`data_dir/registry`), kept by its writer.
#[derive(Debug, Default)]
pub struct RegistryMetrics {
    /// Batches of updates appended to the op log.
    pub flushes: Counter,
    pub fsyncs: Counter,
    pub records_written: Counter,
    pub bytes_written: Counter,
    pub compactions: Counter,
    pub write_errors: Counter,
    /// Keys held, as of the last flush.
    pub keys: AtomicU64,
    /// Keys the last flush took from the acknowledgement path (many acks of a key count once).
    pub flushed_keys: AtomicU64,
    pub log_bytes: AtomicU64,
    /// When everything handed to the writer was last durable (ms since the Unix epoch; 0: never).
    pub durable_unix_ms: AtomicU64,
}

impl RegistryMetrics {
    /// The figures now.
    pub fn snapshot(&self) -> RegistrySnapshot {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let durable = load(&self.durable_unix_ms);
        let now =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        RegistrySnapshot {
            keys: load(&self.keys),
            lag_seconds: now.saturating_sub(durable) as f64 / 1000.0,
            flushes: self.flushes.get(),
            fsyncs: self.fsyncs.get(),
            records_written: self.records_written.get(),
            compactions: self.compactions.get(),
            write_errors: self.write_errors.get(),
            log_bytes: load(&self.log_bytes),
            bytes_written: self.bytes_written.get(),
            flushed_keys: load(&self.flushed_keys),
        }
    }
}

/// The registry's figures at one moment (`/stats`' `registry`, `sluice_registry_*`).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RegistrySnapshot {
    pub keys: u64,
    /// Time since everything handed to the writer was last durable.
    pub lag_seconds: f64,
    pub flushes: u64,
    pub fsyncs: u64,
    pub records_written: u64,
    pub compactions: u64,
    pub write_errors: u64,
    pub log_bytes: u64,
    /// At `/metrics` only.
    #[serde(skip)]
    pub bytes_written: u64,
    /// At `/metrics` only.
    #[serde(skip)]
    pub flushed_keys: u64,
}

impl RegistrySnapshot {
    pub fn encode(&self, out: &mut DescriptorEncoder<'_>) -> std::fmt::Result {
        let counters: [(&str, &str, u64); 6] = [
            (
                "sluice_registry_flushes_total",
                "Batches of position updates the registry appended to its op log.",
                self.flushes,
            ),
            ("sluice_registry_fsyncs_total", "fsync calls of the registry's op log.", self.fsyncs),
            (
                "sluice_registry_records_written_total",
                "Records the registry appended (one per changed key per flush).",
                self.records_written,
            ),
            ("sluice_registry_bytes_written_total", "Bytes the registry appended to its op log.", self.bytes_written),
            ("sluice_registry_compactions_total", "Op log compactions into the snapshot.", self.compactions),
            ("sluice_registry_write_errors_total", "Failed registry writes (retried).", self.write_errors),
        ];
        for (name, help, v) in counters {
            counter(out, name, help, [(Labels::new(), v)])?;
        }
        let gauges: [(&str, &str, u64); 3] = [
            ("sluice_registry_keys", "Keys the registry holds.", self.keys),
            ("sluice_registry_flushed_keys", "Keys the last flush wrote.", self.flushed_keys),
            ("sluice_registry_log_bytes", "Size of the registry's op log.", self.log_bytes),
        ];
        for (name, help, v) in gauges {
            gauge(out, name, help, [(Labels::new(), v)])?;
        }
        gauge(
            out,
            "sluice_registry_lag_seconds",
            "Time since everything handed to the registry writer was last durable.",
            [(Labels::new(), self.lag_seconds)],
        )
    }
}

/// All pipelines of the process. Reloading a pipeline replaces its entry.
#[derive(Debug, Default)]
pub struct MetricsRegistry {
    /// Config reloads (SIGHUP) and whether the node is draining: the node's own state.
    pub node: NodeFigures,
    pipelines: RwLock<Vec<Arc<PipelineMetrics>>>,
    registry: RwLock<Option<Arc<RegistryMetrics>>>,
    memory: RwLock<Option<Arc<crate::MemoryBudget>>>,
    sections: RwLock<Vec<Arc<dyn MetricsSection>>>,
}

/// The node's own state: its config reloads, and whether it is draining (stopping).
#[derive(Debug, Default)]
pub struct NodeFigures {
    pub reloads_succeeded: Counter,
    /// Reloads whose config was invalid or could not start (the running config stayed).
    pub reloads_failed: Counter,
    /// When the last reload ended, in seconds since the Unix epoch (0: none yet).
    last_reload_unix_seconds: AtomicU64,
    draining: std::sync::atomic::AtomicBool,
    /// The version and commit the binary was built from.
    pub build: OnceLock<BuildInfo>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct BuildInfo {
    pub version: String,
    pub commit: String,
}

impl NodeFigures {
    /// Counts a reload that ended now.
    pub fn reloaded(&self, succeeded: bool) {
        if succeeded { &self.reloads_succeeded } else { &self.reloads_failed }.add(1);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        self.last_reload_unix_seconds.store(now.as_secs(), Ordering::Relaxed);
    }

    pub fn last_reload_unix_seconds(&self) -> u64 {
        self.last_reload_unix_seconds.load(Ordering::Relaxed)
    }

    /// The node stops: from now on `/health` says so.
    pub fn begin_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }
}

/// A part of the node that renders its own figures (the cluster): its families are added to
/// `/metrics`, its JSON goes under its key in `/stats`.
pub trait MetricsSection: Send + Sync + std::fmt::Debug {
    /// Unique among sections; the key in `/stats` (sections with one key are merged under it).
    fn key(&self) -> String;
    /// Writes the section's families (with the helpers of [`crate::exposition`]).
    fn encode(&self, encoder: &mut crate::exposition::DescriptorEncoder<'_>) -> std::fmt::Result;
    fn stats(&self) -> serde_json::Value;

    /// Why this part of the node is wedged (waiting on something that has not moved for
    /// `after` or longer), for `/health`; `None` when it is not.
    fn wedged(&self, _after: std::time::Duration) -> Option<String> {
        None
    }
}

impl MetricsRegistry {
    pub fn register(&self, p: Arc<PipelineMetrics>) {
        let mut all = self.pipelines.write();
        all.retain(|q| q.name != p.name);
        all.push(p);
    }

    pub fn unregister(&self, name: &str) {
        self.pipelines.write().retain(|q| q.name != name);
    }

    pub fn pipelines(&self) -> Vec<Arc<PipelineMetrics>> {
        self.pipelines.read().clone()
    }

    /// Publishes the registry's figures (once it is durable).
    pub fn set_registry(&self, m: Arc<RegistryMetrics>) {
        *self.registry.write() = Some(m);
    }

    pub fn registry(&self) -> Option<Arc<RegistryMetrics>> {
        self.registry.read().clone()
    }

    /// Publishes the node's memory budget.
    pub fn set_memory(&self, budget: Arc<crate::MemoryBudget>) {
        *self.memory.write() = Some(budget);
    }

    pub fn memory(&self) -> Option<Arc<crate::MemoryBudget>> {
        self.memory.read().clone()
    }

    /// Adds a section, replacing the one with the same key.
    pub fn add_section(&self, section: Arc<dyn MetricsSection>) {
        let mut all = self.sections.write();
        let key = section.key();
        all.retain(|s| s.key() != key);
        all.push(section);
    }

    pub fn remove_section(&self, key: &str) {
        self.sections.write().retain(|s| s.key() != key);
    }

    pub fn sections(&self) -> Vec<Arc<dyn MetricsSection>> {
        self.sections.read().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(10));
        h.observe(Duration::from_millis(3));
        h.observe(Duration::from_secs(10));
        let (b, sum, n) = h.snapshot();
        assert_eq!(n, 3);
        assert_eq!(b[0], 1);
        assert_eq!(b[6], 2);
        assert_eq!(*b.last().unwrap(), 3);
        assert!((sum - 10.00301).abs() < 1e-6);
    }

    #[test]
    fn output_state_goes_retrying_then_down_and_back_up() {
        let s = OutputStatus::default();
        assert_eq!(s.state(), OutputState::Up, "nothing failed yet");
        assert_eq!(s.last_error(), None);
        s.delivered();
        assert_eq!(s.state(), OutputState::Up);

        let t0 = Instant::now();
        s.failed("connection refused", false, t0);
        assert_eq!(s.state_at(t0), OutputState::Retrying);
        assert_eq!(s.last_error().unwrap().message, "connection refused");
        // Later failures keep the time of the first: failing long enough is down.
        s.failed("timed out", false, t0 + Duration::from_secs(30));
        assert_eq!(s.state_at(t0 + Duration::from_secs(59)), OutputState::Retrying);
        assert_eq!(s.state_at(t0 + OUTPUT_DOWN_AFTER), OutputState::Down);
        assert_eq!(s.last_error().unwrap().message, "timed out");

        s.delivered();
        assert_eq!(s.state_at(t0 + Duration::from_secs(120)), OutputState::Up);
        assert_eq!(s.last_error().unwrap().message, "timed out", "the last error stays after recovery");

        // A new stall starts its own clock.
        let t1 = t0 + Duration::from_secs(200);
        s.failed("HTTP 503", false, t1);
        assert_eq!(s.state_at(t1 + Duration::from_secs(1)), OutputState::Retrying);
    }

    #[test]
    fn giving_up_is_down_until_a_delivery() {
        let s = OutputStatus::default();
        let t0 = Instant::now();
        s.failed("HTTP 500", true, t0);
        assert_eq!(s.state_at(t0), OutputState::Down);
        // The next batch failing again is retried: retrying, on the first failure's clock.
        s.failed("HTTP 500", false, t0 + Duration::from_secs(1));
        assert_eq!(s.state_at(t0 + Duration::from_secs(2)), OutputState::Retrying);
        assert_eq!(s.state_at(t0 + OUTPUT_DOWN_AFTER), OutputState::Down);
        s.delivered();
        assert_eq!(s.state(), OutputState::Up);
    }

    #[test]
    fn a_noted_error_leaves_the_state_and_long_messages_are_cut() {
        let s = OutputStatus::default();
        s.note_error("all brokers down");
        assert_eq!(s.state(), OutputState::Up);
        assert_eq!(s.last_error().unwrap().message, "all brokers down");
        let long = "é".repeat(MAX_ERROR_MESSAGE);
        s.retrying(&long);
        let kept = s.last_error().unwrap().message;
        assert!(kept.len() <= MAX_ERROR_MESSAGE && long.starts_with(&kept), "{} bytes kept", kept.len());
        assert!(s.last_error().unwrap().at > 1.0e9, "a time since the epoch");
    }

    #[test]
    fn quantiles_interpolate_within_their_bucket() {
        let h = Histogram::default();
        assert_eq!(h.quantile(0.5), None);
        // 100 observations in (10 ms, 25 ms]: the median is half way through that bucket.
        for _ in 0..100 {
            h.observe(Duration::from_millis(15));
        }
        let p50 = h.quantile(0.5).unwrap();
        assert!((p50 - 0.0175).abs() < 1e-9, "{p50}");
        assert!((h.quantile(0.99).unwrap() - 0.02485).abs() < 1e-9);
        // One slow one past every bound: p99 stays in the 25 ms bucket, p100 is the top bound.
        h.observe(Duration::from_secs(60));
        assert!(h.quantile(0.99).unwrap() <= 0.025);
        assert_eq!(h.quantile(1.0), Some(10.0));
        // The lowest bucket starts at 0.
        let low = Histogram::default();
        low.observe(Duration::from_micros(20));
        assert!((low.quantile(0.5).unwrap() - 0.000_025).abs() < 1e-12);
    }
}
