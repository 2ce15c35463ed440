//! Exponential backoff for outputs that retry, and the rate limit on what they log about it.
//!
//! Pauses come from `backon`'s exponential backoff: from `initial_backoff`, doubling up to
//! `max_backoff`, each with a random part added (up to the pause again), so that many outputs
//! failing together do not retry in step. A server's `Retry-After` (429, 503) replaces the next
//! pause, up to [`MAX_RETRY_AFTER`].
//!
//! A failure that is not the events' fault (a full disk, a peer down) is retried until it
//! clears, which holds the pipeline back. [`StallLog`] keeps that from flooding the log: one warn
//! line per [`STALL_LOG_INTERVAL`] per output (with the count of attempts held back since the
//! last one), and one info line when delivery resumes.
//!
//! An output's own [`StallLog`] ([`StallLog::for_output`]) also keeps the output's state and
//! last error on its metrics ([`sluice_core::metrics::OutputStatus`]): every retry loop already
//! reports its failures and recoveries here, so each output's state follows from them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use serde::Deserialize;
use sluice_config::HumanDuration;
use sluice_core::metrics::ComponentMetrics;
use tokio_util::sync::CancellationToken;

use crate::{Aborted, DEFAULT_RETRY_INITIAL, DEFAULT_RETRY_MAX};

/// `retry:` settings shared by network outputs.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Attempts after the first; absent means retry until it works (backpressure).
    pub max_retries: Option<u32>,
    pub initial_backoff: HumanDuration,
    pub max_backoff: HumanDuration,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_retries: None,
            initial_backoff: HumanDuration(DEFAULT_RETRY_INITIAL),
            max_backoff: HumanDuration(DEFAULT_RETRY_MAX),
        }
    }
}

/// The longest `Retry-After` honoured: a longer one is taken as this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// Counts attempts and sleeps between them.
#[derive(Debug)]
pub struct Backoff {
    config: RetryConfig,
    attempt: u32,
    pauses: backon::ExponentialBackoff,
    /// The server's `Retry-After` for the next pause.
    hint: Option<Duration>,
}

impl Backoff {
    pub fn new(config: RetryConfig) -> Backoff {
        use backon::BackoffBuilder;
        let initial = config.initial_backoff.0;
        let pauses = backon::ExponentialBuilder::default()
            .with_min_delay(initial)
            .with_max_delay(config.max_backoff.0.max(initial))
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .build();
        Backoff { config, attempt: 0, pauses, hint: None }
    }

    /// The server said when to come back (`Retry-After`): the next pause is that long.
    pub fn retry_after(&mut self, pause: Duration) {
        self.hint = Some(pause.min(MAX_RETRY_AFTER));
    }

    /// Attempts made so far that failed.
    pub fn failures(&self) -> u32 {
        self.attempt
    }

    /// True when the failure just seen is the last one allowed: [`Backoff::retry`] will give
    /// up instead of retrying.
    pub fn exhausted_after_this(&self) -> bool {
        self.config.max_retries.is_some_and(|max| self.attempt >= max)
    }

    /// After a failure: false when the retry limit is reached; otherwise sleeps the backoff
    /// (or fails with [`Aborted`] if shutdown comes first) and returns true.
    pub async fn retry(&mut self, abort: &CancellationToken) -> Result<bool, Aborted> {
        self.attempt += 1;
        if self.config.max_retries.is_some_and(|max| self.attempt > max) {
            return Ok(false);
        }
        let exponential = self.pauses.next().unwrap_or(self.config.max_backoff.0);
        let pause = self.hint.take().unwrap_or(exponential);
        tokio::select! {
            _ = tokio::time::sleep(pause) => Ok(true),
            _ = abort.cancelled() => Err(Aborted),
        }
    }
}

/// The shortest time between two warn lines about one output's failing attempts.
pub const STALL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Whether an output's failing attempts are due a log line, shared by its workers.
#[derive(Debug, Default)]
pub struct StallLog {
    state: Mutex<StallState>,
    /// The output whose state this log keeps, for an output's main retry loop.
    output: Option<Arc<ComponentMetrics>>,
}

#[derive(Debug, Default)]
struct StallState {
    last_logged: Option<Instant>,
    held_back: u64,
    /// Failed attempts since the last success.
    failures: u64,
}

impl StallLog {
    /// The log of an output's retry loop, which also keeps the output's state and last error.
    pub fn for_output(metrics: &Arc<ComponentMetrics>) -> StallLog {
        StallLog { state: Mutex::default(), output: Some(metrics.clone()) }
    }

    /// After a failed attempt that is retried: records the error (the output is `retrying`),
    /// then as [`StallLog::failed`].
    pub fn retrying(&self, error: &str) -> Option<u64> {
        if let Some(m) = &self.output {
            m.output.retrying(error);
        }
        self.failed()
    }

    /// After the retries ran out and the events were given up: the output is `down` until
    /// something is delivered.
    pub fn gave_up(&self, error: &str) {
        if let Some(m) = &self.output {
            m.output.gave_up(error);
        }
    }

    /// After a failed attempt: `Some(held back)` when a warn line is due (the first failure,
    /// then at most once per [`STALL_LOG_INTERVAL`]), with the failures not logged since the
    /// last line; `None` when this one should stay quiet.
    pub fn failed(&self) -> Option<u64> {
        let mut s = self.state.lock();
        s.failures += 1;
        let due = s.last_logged.is_none_or(|at| at.elapsed() >= STALL_LOG_INTERVAL);
        if due {
            s.last_logged = Some(Instant::now());
            Some(std::mem::take(&mut s.held_back))
        } else {
            s.held_back += 1;
            None
        }
    }

    /// After a successful attempt: the failures since the last success when there were any
    /// (delivery resumed: worth one info line), else `None`.
    pub fn succeeded(&self) -> Option<u64> {
        if let Some(m) = &self.output {
            m.output.delivered();
        }
        let mut s = self.state.lock();
        if s.failures == 0 {
            return None;
        }
        let failures = std::mem::take(&mut s.failures);
        s.held_back = 0;
        s.last_logged = None;
        Some(failures)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stall_log_speaks_first_then_holds_back_then_reports_the_recovery() {
        let log = StallLog::default();
        assert_eq!(log.succeeded(), None, "nothing failed");
        assert_eq!(log.failed(), Some(0));
        assert_eq!(log.failed(), None);
        assert_eq!(log.failed(), None);
        assert_eq!(log.succeeded(), Some(3));
        assert_eq!(log.succeeded(), None);
        // A new stall is logged at once again.
        assert_eq!(log.failed(), Some(0));
    }

    #[test]
    fn an_outputs_log_keeps_its_state() {
        use sluice_core::metrics::{ComponentKind, OutputState};
        let metrics = Arc::new(ComponentMetrics::new("out", ComponentKind::Output, "http"));
        let log = StallLog::for_output(&metrics);
        assert_eq!(log.retrying("connection refused"), Some(0));
        assert_eq!(metrics.output.state(), OutputState::Retrying);
        assert_eq!(metrics.output.last_error().unwrap().message, "connection refused");
        log.gave_up("connection refused");
        assert_eq!(metrics.output.state(), OutputState::Down);
        assert_eq!(log.succeeded(), Some(1));
        assert_eq!(metrics.output.state(), OutputState::Up);
    }

    /// Pauses double up to the cap, each with up to as much again at random, and the attempts
    /// stop at the limit.
    #[tokio::test(start_paused = true)]
    async fn doubles_up_to_the_cap_with_jitter_and_stops_at_the_limit() {
        let config = RetryConfig {
            max_retries: Some(3),
            initial_backoff: HumanDuration(Duration::from_millis(100)),
            max_backoff: HumanDuration(Duration::from_millis(250)),
        };
        let mut b = Backoff::new(config);
        let token = CancellationToken::new();
        for (low, high) in [(100, 200), (200, 400), (250, 500)] {
            assert!(!b.exhausted_after_this());
            let start = tokio::time::Instant::now();
            assert!(b.retry(&token).await.unwrap());
            let paused = start.elapsed();
            assert!(
                paused >= Duration::from_millis(low) && paused <= Duration::from_millis(high),
                "{paused:?} outside {low}..={high} ms"
            );
        }
        assert!(b.exhausted_after_this());
        assert!(!b.retry(&token).await.unwrap());
    }

    /// Jitter: two outputs failing together do not pause alike.
    #[test]
    fn pauses_differ_between_outputs() {
        // (backon's "std" feature seeds each one at random; without it every output has one seed.)
        let config = RetryConfig::default();
        let firsts: std::collections::BTreeSet<Duration> =
            (0..20).map(|_| Backoff::new(config).pauses.next().unwrap()).collect();
        assert!(firsts.len() > 1, "every output paused {firsts:?}");
    }

    /// A server's `Retry-After` replaces the next pause, up to the limit.
    #[tokio::test(start_paused = true)]
    async fn retry_after_replaces_the_next_pause() {
        let mut b = Backoff::new(RetryConfig::default());
        let token = CancellationToken::new();
        b.retry_after(Duration::from_secs(7));
        let start = tokio::time::Instant::now();
        assert!(b.retry(&token).await.unwrap());
        assert_eq!(start.elapsed(), Duration::from_secs(7));
        b.retry_after(Duration::from_secs(86_400));
        let start = tokio::time::Instant::now();
        assert!(b.retry(&token).await.unwrap());
        assert_eq!(start.elapsed(), MAX_RETRY_AFTER);
    }

    #[tokio::test]
    async fn abort_interrupts_the_pause() {
        let mut b = Backoff::new(RetryConfig::default());
        let token = CancellationToken::new();
        token.cancel();
        assert_eq!(b.retry(&token).await, Err(Aborted));
    }
}
