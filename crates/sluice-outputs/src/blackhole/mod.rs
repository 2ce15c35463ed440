//! `blackhole`: accepts and discards everything, counting it; optionally logs the rate.

mod config;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::Event;

use crate::{Aborted, Delivery, Output, OutputContext};

struct Blackhole {
    ctx: OutputContext,
    print_interval: Option<Duration>,
    total: AtomicU64,
    last_print: Mutex<(Instant, u64)>,
}

pub(crate) fn build(spec: &ComponentSpec, ctx: OutputContext) -> Result<Arc<dyn Output>, ConfigError> {
    let c = config::read(spec)?;
    Ok(Arc::new(Blackhole {
        ctx,
        print_interval: c.print_interval.map(|d| d.0).filter(|d| !d.is_zero()),
        total: AtomicU64::new(0),
        last_print: Mutex::new((Instant::now(), 0)),
    }))
}

#[async_trait]
impl Output for Blackhole {
    async fn send(&self, events: &[&Event]) -> Result<Delivery, Aborted> {
        let total = self.total.fetch_add(events.len() as u64, Ordering::Relaxed) + events.len() as u64;
        if let Some(every) = self.print_interval {
            let mut last = self.last_print.lock();
            let elapsed = last.0.elapsed();
            if elapsed >= every {
                let rate = (total - last.1) as f64 / elapsed.as_secs_f64();
                *last = (Instant::now(), total);
                drop(last);
                tracing::info!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, total, rate = format!("{rate:.0}/s"), "blackhole");
            }
        }
        Ok(Delivery::all_delivered())
    }

    async fn close(&self) {
        tracing::info!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, total = self.total.load(Ordering::Relaxed), "blackhole closed");
    }
}

#[cfg(test)]
mod tests;
