//! `pipeline` output: sends events to the `pipeline` inputs at `send_to` and waits until the
//! receiving pipelines have handled them, so the sender's acknowledgement covers the hop.
//!
//! Every failure is the environment's: while a receiver is not running (being reloaded), or
//! when it stopped before handling a batch, the output waits and sends again, holding its own
//! pipeline back; it never gives up. Each wait and each resend counts in the output's
//! `retries`; a warn line is logged at most once per interval, and an info line when sending
//! resumes.

mod config;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sluice_config::model::ComponentSpec;
use sluice_config::{ConfigError, Link};
use sluice_core::ack::AckOutcome;
use sluice_core::{AckSet, Acker, Batch, Event};

use crate::retry::StallLog;
use crate::{Aborted, Delivery, Output, OutputContext};
use config::{OneOrMany, PipelineOutputConfig};

struct PipelineOutput {
    send_to: Vec<String>,
    stall: StallLog,
    ctx: OutputContext,
}

/// The addresses it sends to (an unreadable section links nothing; building it reports why).
pub(crate) fn links(spec: &ComponentSpec) -> Vec<Link> {
    match spec.settings::<PipelineOutputConfig>().map(|c| c.send_to) {
        Ok(OneOrMany::One(address)) => vec![Link::SendsTo { address, key: "send_to" }],
        Ok(OneOrMany::Many(all)) => all.into_iter().map(|address| Link::SendsTo { address, key: "send_to" }).collect(),
        Err(_) => Vec::new(),
    }
}

pub(crate) fn build(spec: &ComponentSpec, ctx: OutputContext) -> Result<Arc<dyn Output>, ConfigError> {
    let send_to = config::read(spec)?;
    Ok(Arc::new(PipelineOutput { send_to, stall: StallLog::for_output(&ctx.metrics), ctx }))
}

impl PipelineOutput {
    async fn send_one(&self, address: &str, events: &[&Event]) -> Result<(), Aborted> {
        let mut waited = false;
        loop {
            let Some(target) = self.ctx.bus.get(address) else {
                if !waited {
                    waited = true;
                    self.ctx.metrics.retries.add(1);
                    let error = format!("no running pipeline serves the address `{address}`");
                    if let Some(held_back) = self.stall.retrying(&error) {
                        tracing::warn!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, address,
                            also_failed_since_last_log = held_back,
                            "no running pipeline serves this address; waiting for it (the pipeline waits)");
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(50)) => continue,
                    _ = self.ctx.abort.cancelled() => return Err(Aborted),
                }
            };
            let copies: Vec<Event> = events.iter().map(|e| (*e).clone()).collect();
            let n = copies.len();
            let bytes = copies.iter().map(Event::estimated_bytes).sum();
            let (acker, done) = Acker::with_notify(n);
            let batch = Batch::new(copies, AckSet::single(acker, n), bytes);
            let pushed = tokio::select! {
                r = target.queue.push(batch) => r.is_ok(),
                _ = self.ctx.abort.cancelled() => return Err(Aborted),
            };
            if pushed {
                target.metrics.events_in.add(n as u64);
                target.metrics.events_out.add(n as u64);
                let outcome = tokio::select! {
                    r = done => r.unwrap_or(AckOutcome::Abandoned),
                    _ = self.ctx.abort.cancelled() => return Err(Aborted),
                };
                if outcome == AckOutcome::Handled {
                    if let Some(failures) = self.stall.succeeded() {
                        tracing::info!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, address,
                            failed_attempts = failures, "pipeline output sends again");
                    }
                    return Ok(());
                }
            }
            // The receiver stopped before handling the batch (reload): send it again.
            self.ctx.metrics.retries.add(1);
            self.stall.retrying(&format!("the pipeline at `{address}` stopped before handling the batch"));
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                _ = self.ctx.abort.cancelled() => return Err(Aborted),
            }
        }
    }
}

#[async_trait]
impl Output for PipelineOutput {
    async fn send(&self, events: &[&Event]) -> Result<Delivery, Aborted> {
        for address in &self.send_to {
            self.send_one(address, events).await?;
        }
        Ok(Delivery::all_delivered())
    }
}

#[cfg(test)]
mod tests;
