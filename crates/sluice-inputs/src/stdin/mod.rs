//! `stdin`: lines from standard input, until it ends.
//!
//! Reads of up to 64 KiB go into buffers from a pool; with `codec: lines` a line's `message`
//! points into its read's buffer (see [`SharedText`]), which is reused once every event made
//! from it is finished. Everything from one read is one batch; each read counts in the input's
//! `bytes_in`.

mod config;

use async_trait::async_trait;
use bytes::BufMut;
use sluice_config::model::ComponentSpec;
use sluice_config::{ConfigError, Link};
use sluice_core::value::now_nanos;
use sluice_core::{Batch, SharedText, TextPool};
use tokio::io::AsyncReadExt;

use crate::admission;
use crate::codec::Decoded;
use crate::framing::LineFramer;
use crate::{Input, InputContext, InputError};
use config::StdinConfig;

/// Bytes asked of standard input at once.
const READ_BYTES: usize = 64 << 10;

struct Stdin {
    config: StdinConfig,
}

/// The process has one standard input, which this input takes.
pub(crate) fn links(_: &ComponentSpec) -> Vec<Link> {
    vec![Link::TakesStdin]
}

pub(crate) fn build(spec: &ComponentSpec) -> Result<Box<dyn Input>, ConfigError> {
    Ok(Box::new(Stdin { config: config::read(spec)? }))
}

#[async_trait]
impl Input for Stdin {
    async fn run(self: Box<Self>, ctx: InputContext) -> Result<(), InputError> {
        let codec = self.config.codec;
        let mut framer = LineFramer::new(self.config.max_line_bytes.as_usize());
        let mut stdin = tokio::io::stdin();
        let texts = TextPool::new(32, 2 * READ_BYTES);
        let mut truncated = 0u64;
        loop {
            let mut buf = texts.take(READ_BYTES);
            let mut room = (&mut buf).limit(READ_BYTES);
            let n = tokio::select! {
                r = stdin.read_buf(&mut room) => r.map_err(|e| InputError::io("reading stdin", e))?,
                _ = ctx.shutdown.cancelled() => 0,
            };
            ctx.metrics.bytes_in.add(n as u64);
            // Room in the memory budget before decoding, as the tcp input does.
            let estimate = admission::estimate(codec, n, admission::count_lines(&buf[..n]));
            let Some(mut charge) = ctx.reserve(estimate).await else {
                break;
            };
            let text = SharedText::pooled(buf, &texts);
            let ts = now_nanos();
            let mut events = Vec::new();
            let mut bytes = 0;
            let mut failed = 0u64;
            let mut take = |line: crate::framing::Line<'_>| {
                bytes += line.bytes.len() + 1;
                truncated += u64::from(line.truncated);
                let (e, d) = codec.decode_in(&text, line.bytes, line.truncated, ts);
                failed += u64::from(d == Decoded::Failed);
                events.push(e);
            };
            if n == 0 {
                framer.finish(&mut take);
            } else {
                framer.feed(&text.as_bytes()[..n], &mut take);
            }
            ctx.metrics.failed.add(failed);
            charge.true_up(admission::measure(codec, &events, n));
            if !events.is_empty() && ctx.send(Batch::untracked(events, bytes).with_memory(charge)).await.is_err() {
                break;
            }
            if n == 0 {
                break;
            }
        }
        if truncated > 0 {
            tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, lines = truncated,
                max_line_bytes = self.config.max_line_bytes.0, "stdin lines were longer than max_line_bytes and were cut (tagged _line_truncated)");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
