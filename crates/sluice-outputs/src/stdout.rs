//! `stdout`: events on standard output, as JSON lines or as their `message` text.

use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::Event;
use tokio::io::AsyncWriteExt;

use crate::{Aborted, Delivery, Output, OutputContext, encode_json_lines};

#[derive(Debug, Clone, Copy, Deserialize, Default, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StdoutCodec {
    /// One JSON object per line.
    #[default]
    Json,
    /// The `message` field (or the event as JSON when it has none), one per line.
    Text,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StdoutConfig {
    #[serde(default)]
    codec: StdoutCodec,
}

struct Stdout {
    codec: StdoutCodec,
    out: tokio::sync::Mutex<tokio::io::Stdout>,
    ctx: OutputContext,
}

pub(crate) fn build(spec: &ComponentSpec, ctx: OutputContext) -> Result<Arc<dyn Output>, ConfigError> {
    let c: StdoutConfig = spec.settings()?;
    Ok(Arc::new(Stdout { codec: c.codec, out: tokio::sync::Mutex::new(tokio::io::stdout()), ctx }))
}

#[async_trait]
impl Output for Stdout {
    async fn send(&self, events: &[&Event]) -> Result<Delivery, Aborted> {
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
        let mut out = self.out.lock().await;
        match out.write_all(&buf).await {
            Ok(()) => Ok(Delivery::all_delivered()),
            Err(e) => {
                // A closed stdout (a pipe whose reader left) will not come back.
                tracing::error!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, error = %e, "cannot write to stdout");
                Ok(Delivery::all_gave_up(events.len(), &format!("cannot write to stdout: {e}"), 1))
            }
        }
    }

    async fn close(&self) {
        let _ = self.out.lock().await.flush().await;
    }
}
