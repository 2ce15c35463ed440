//! Exponential backoff for outputs that talk to servers.

use std::time::Duration;

use serde::Deserialize;
use sluice_config::HumanDuration;
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

/// Counts attempts and sleeps between them.
#[derive(Debug)]
pub struct Backoff {
    config: RetryConfig,
    attempt: u32,
    next: Duration,
}

impl Backoff {
    pub fn new(config: RetryConfig) -> Backoff {
        Backoff { config, attempt: 0, next: config.initial_backoff.0 }
    }

    /// Attempts made so far that failed.
    pub fn failures(&self) -> u32 {
        self.attempt
    }

    /// After a failure: false when the retry limit is reached; otherwise sleeps the backoff
    /// (or fails with [`Aborted`] if shutdown comes first) and returns true.
    pub async fn retry(&mut self, abort: &CancellationToken) -> Result<bool, Aborted> {
        self.attempt += 1;
        if self.config.max_retries.is_some_and(|max| self.attempt > max) {
            return Ok(false);
        }
        let pause = self.next;
        self.next = (self.next * 2).min(self.config.max_backoff.0.max(self.config.initial_backoff.0));
        tokio::select! {
            _ = tokio::time::sleep(pause) => Ok(true),
            _ = abort.cancelled() => Err(Aborted),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn doubles_up_to_the_cap_and_stops_at_the_limit() {
        let config = RetryConfig {
            max_retries: Some(3),
            initial_backoff: HumanDuration(Duration::from_millis(100)),
            max_backoff: HumanDuration(Duration::from_millis(250)),
        };
        let mut b = Backoff::new(config);
        let token = CancellationToken::new();
        let start = tokio::time::Instant::now();
        assert!(b.retry(&token).await.unwrap());
        assert!(b.retry(&token).await.unwrap());
        assert!(b.retry(&token).await.unwrap());
        assert_eq!(start.elapsed(), Duration::from_millis(100 + 200 + 250));
        assert!(!b.retry(&token).await.unwrap());
    }

    #[tokio::test]
    async fn abort_interrupts_the_pause() {
        let mut b = Backoff::new(RetryConfig::default());
        let token = CancellationToken::new();
        token.cancel();
        assert_eq!(b.retry(&token).await, Err(Aborted));
    }
}
