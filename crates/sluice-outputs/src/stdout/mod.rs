//! `stdout`: events on standard output, as JSON lines or as their `message` text.
//!
//! Each batch is written and flushed before `send` returns, so a write error is seen by the
//! batch it belongs to. Every error is the environment's — no event's content can make a write
//! fail — and is handled by what it means:
//! - `EPIPE` (the reader of a pipe went away): it cannot come back, so the batch is given up at
//!   once (counted as failed, logged), rather than holding the pipeline until shutdown.
//! - Anything else (`ENOSPC` or `EIO` when stdout is redirected to a file, ...): retried with
//!   backoff as `retry` says, which holds the pipeline back, counted in `retries`, logged at
//!   warn at most once per interval, with an info line when writing resumes.
//!
//! A batch that failed part-way is written again in full: its first lines can appear twice
//! (at-least-once), as with the `tcp` output. The output's `bytes_out` counts each batch once,
//! when its write and flush succeed.

mod config;

use std::sync::Arc;

use async_trait::async_trait;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::Event;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::retry::{Backoff, RetryConfig, StallLog};
use crate::{Aborted, Delivery, Output, OutputContext, encode_json_lines};
use config::StdoutCodec;

type Sink = Box<dyn AsyncWrite + Send + Unpin>;

struct Stdout {
    codec: StdoutCodec,
    retry: RetryConfig,
    out: tokio::sync::Mutex<Sink>,
    stall: StallLog,
    ctx: OutputContext,
}

pub(crate) fn build(spec: &ComponentSpec, ctx: OutputContext) -> Result<Arc<dyn Output>, ConfigError> {
    Ok(Arc::new(build_with(spec, ctx, Box::new(tokio::io::stdout()))?))
}

fn build_with(spec: &ComponentSpec, ctx: OutputContext, sink: Sink) -> Result<Stdout, ConfigError> {
    let c = config::read(spec)?;
    Ok(Stdout {
        codec: c.codec,
        retry: c.retry,
        out: tokio::sync::Mutex::new(sink),
        stall: StallLog::for_output(&ctx.metrics),
        ctx,
    })
}

impl Stdout {
    fn encode(&self, events: &[&Event]) -> Vec<u8> {
        let mut buf = Vec::with_capacity(events.len() * 256);
        match self.codec {
            StdoutCodec::Json => encode_json_lines(events, &mut buf),
            StdoutCodec::Text => {
                for e in events {
                    match e.message() {
                        Some(m) => buf.extend_from_slice(m.as_bytes()),
                        None => e.write_json(&mut buf),
                    }
                    buf.push(b'\n');
                }
            }
        }
        buf
    }
}

#[async_trait]
impl Output for Stdout {
    async fn send(&self, events: &[&Event]) -> Result<Delivery, Aborted> {
        let buf = self.encode(events);
        let mut backoff = Backoff::new(self.retry);
        let mut out = tokio::select! {
            o = self.out.lock() => o,
            _ = self.ctx.abort.cancelled() => return Err(Aborted),
        };
        loop {
            let written = tokio::select! {
                r = async { out.write_all(&buf).await?; out.flush().await } => r,
                _ = self.ctx.abort.cancelled() => return Err(Aborted),
            };
            let e = match written {
                Ok(()) => {
                    self.ctx.metrics.bytes_out.add(buf.len() as u64);
                    if let Some(failures) = self.stall.succeeded() {
                        tracing::info!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, failed_attempts = failures,
                            "stdout output writes again");
                    }
                    return Ok(Delivery::all_delivered());
                }
                Err(e) => e,
            };
            let reason = format!("cannot write to stdout: {e}");
            let gone = e.kind() == std::io::ErrorKind::BrokenPipe;
            if gone || backoff.exhausted_after_this() {
                self.stall.gave_up(&reason);
                tracing::error!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, events = events.len(), error = %e,
                    "cannot write to stdout; the events are given up");
                return Ok(Delivery::all_gave_up(events.len(), &reason, backoff.failures() + 1));
            }
            self.ctx.metrics.retries.add(1);
            if let Some(held_back) = self.stall.retrying(&reason) {
                tracing::warn!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, error = %e,
                    attempt = backoff.failures() + 1, also_failed_since_last_log = held_back,
                    "cannot write to stdout; retrying (the pipeline waits)");
            }
            backoff.retry(&self.ctx.abort).await?;
        }
    }

    async fn close(&self) {
        let _ = self.out.lock().await.flush().await;
    }
}

#[cfg(test)]
mod tests;
