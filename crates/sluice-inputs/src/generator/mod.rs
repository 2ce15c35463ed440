//! `generator`: makes events, for benchmarks and tests — a fixed count or forever, at a rate or
//! as fast as the pipeline takes them, from one message, a list of lines, or a file's lines,
//! cycled.

mod config;

use std::time::{Duration, Instant};

use async_trait::async_trait;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::value::now_nanos;
use sluice_core::{Batch, Value};

use crate::admission;
use crate::codec::Decoded;
use crate::{Input, InputContext, InputError};
use config::GeneratorConfig;

struct Generator {
    config: GeneratorConfig,
}

pub(crate) fn build(spec: &ComponentSpec) -> Result<Box<dyn Input>, ConfigError> {
    Ok(Box::new(Generator { config: config::read(spec)? }))
}

#[async_trait]
impl Input for Generator {
    async fn run(self: Box<Self>, ctx: InputContext) -> Result<(), InputError> {
        let c = self.config;
        let lines: Vec<Vec<u8>> = if let Some(file) = &c.file {
            let text = tokio::fs::read(file).await.map_err(|e| InputError::io(file.display(), e))?;
            let lines: Vec<Vec<u8>> =
                text.split(|b| *b == b'\n').filter(|l| !l.is_empty()).map(<[u8]>::to_vec).collect();
            if lines.is_empty() {
                return Err(InputError(format!("{} has no lines to generate from", file.display())));
            }
            lines
        } else if let Some(lines) = c.lines {
            lines.into_iter().map(String::into_bytes).collect()
        } else {
            vec![c.message.unwrap_or_else(|| "Hello world!".to_string()).into_bytes()]
        };

        let batch_size = if c.rate > 0 { c.batch_size.min((c.rate as usize / 10).max(1)) } else { c.batch_size };
        let started = Instant::now();
        let longest_line = lines.iter().map(Vec::len).max().unwrap_or(0);
        let mut made: u64 = 0;
        let mut next_line = 0usize;
        while c.count == 0 || made < c.count {
            if ctx.shutdown.is_cancelled() {
                break;
            }
            if c.rate > 0 {
                let due = started + Duration::from_secs_f64(made as f64 / c.rate as f64);
                tokio::select! {
                    _ = tokio::time::sleep_until(due.into()) => {}
                    _ = ctx.shutdown.cancelled() => break,
                }
            }
            let n = if c.count == 0 { batch_size } else { batch_size.min((c.count - made) as usize) };
            // Room in the memory budget before making the events: their lines are copied into
            // them, so the estimate counts the lines' bytes and an event each.
            let Some(mut charge) = ctx.reserve(admission::estimate(c.codec, n * longest_line, n)).await else {
                break;
            };
            let ts = now_nanos();
            let mut events = Vec::with_capacity(n);
            let mut bytes = 0;
            let mut failed = 0;
            for i in 0..n {
                let line = &lines[next_line];
                next_line = if next_line + 1 == lines.len() { 0 } else { next_line + 1 };
                bytes += line.len();
                let (mut event, decoded) = c.codec.decode(line, false, ts);
                failed += usize::from(decoded == Decoded::Failed);
                if c.sequence {
                    event.fields.insert("sequence", Value::Int((made + i as u64) as i64));
                }
                events.push(event);
            }
            ctx.metrics.failed.add(failed as u64);
            // The lines' bytes (without line ends), as if they had been read.
            ctx.metrics.bytes_in.add(bytes as u64);
            charge.true_up(admission::measure_owned(c.codec, &events, bytes));
            if ctx.send(Batch::untracked(events, bytes).with_memory(charge)).await.is_err() {
                break;
            }
            made += n as u64;
        }
        tracing::info!(pipeline = %ctx.pipeline, input = %ctx.id, events = made, "generator finished");
        Ok(())
    }
}

#[cfg(test)]
mod tests;
