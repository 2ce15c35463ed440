//! `http` output: events POSTed (or PUT) to a URL as NDJSON or a JSON array, optionally gzipped.
//!
//! A worker's batch is sent in requests of at most `batch_max_events` events, one after the
//! other; each body is encoded (and compressed) once and reused for every attempt. The server's
//! answer decides each request's fate, split by whose fault it is:
//! - 2xx: delivered.
//! - The environment's fault — a timeout, a connection error, 5xx, 429, an answer about the
//!   endpoint or the credentials rather than the body (401, 403, 404, 405, 407, 408, 410, 421,
//!   425), or any other answer that is neither 2xx nor 4xx: retried with exponential backoff
//!   (`retry`), which holds the pipeline back, counted in the output's `retries`, logged at warn
//!   at most once per interval with the URL and the error, and an info line when it resumes. When
//!   `retry.max_retries` is reached every event of the request is given up with the last error
//!   (counted as failed, not to the dead letter queue).
//! - The events' fault — any other 4xx (400, 409, 413, 415, 422, ...): the server refused the
//!   body for good. With `isolate_refused` (the default) a request of several events is split
//!   in halves, each sent again, down to single events, so that only the events the server
//!   refuses on their own are rejected (one bad event among n costs about 2·log2(n) more
//!   requests; a server that refuses every event, 2n−1). The rejected events are permanent, with
//!   `HTTP <status>: <start of the response body>` and the attempts made on them, and one error
//!   is logged per refused request. With a dead letter queue they go there.
//!
//! Delivery is at-least-once: a request that timed out may have been processed and is sent
//! again. Shutdown's abort stops waiting for a request or a backoff at once.
//!
//! The output's `bytes_out` counts the bodies of requests answered 2xx, as sent (compressed
//! with `compression: gzip`); failed and refused attempts count nothing.

mod config;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use reqwest::header::{self, HeaderValue};
use reqwest::{Method, StatusCode, Url};
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::Event;
use sluice_tls::ClientTls;

use crate::http_client::{HttpClient, configured_headers};
use crate::retry::{Backoff, RetryConfig, StallLog};
use crate::{Aborted, Delivery, Output, OutputContext, Rejected, encode_json_lines};
use config::{Compression, Format, HttpMethod};

struct HttpOutput {
    client: HttpClient,
    url: Url,
    method: Method,
    format: Format,
    compression: Compression,
    batch_max_events: usize,
    retry: RetryConfig,
    isolate_refused: bool,
    stall: StallLog,
    ctx: OutputContext,
}

pub(crate) fn build(spec: &ComponentSpec, ctx: OutputContext) -> Result<Arc<dyn Output>, ConfigError> {
    let (url, c) = config::read(spec)?;
    let mut headers = configured_headers(spec, &c.headers)?;
    if let Some(token) = &c.auth_token {
        let mut v = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| spec.key_error("auth_token", "is not valid in a header"))?;
        v.set_sensitive(true);
        headers.insert(header::AUTHORIZATION, v);
    }
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(match c.format {
            Format::Ndjson => "application/x-ndjson",
            Format::JsonArray => "application/json",
        }),
    );
    if c.compression == Compression::Gzip {
        headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    let tls = ClientTls::for_component(spec, c.tls.as_ref())?;
    if tls.is_some() && url.scheme() != "https" {
        return Err(spec.key_error("tls", format!("`tls` is set but `{}` is not an https:// URL", c.url)));
    }
    let client = HttpClient::new(c.timeout.0, headers, tls)
        .map_err(|e| spec.error(format!("cannot build the HTTP client: {e}")))?;
    Ok(Arc::new(HttpOutput {
        client,
        url,
        method: match c.method {
            HttpMethod::Post => Method::POST,
            HttpMethod::Put => Method::PUT,
        },
        format: c.format,
        compression: c.compression,
        batch_max_events: c.batch_max_events,
        retry: c.retry,
        isolate_refused: c.isolate_refused,
        stall: StallLog::for_output(&ctx.metrics),
        ctx,
    }))
}

/// What one attempt came to.
enum Attempt {
    Delivered,
    /// With the server's `Retry-After`, if it gave one.
    Retriable(String, Option<Duration>),
    Refused(String),
}

/// How much of an error response's body goes into the reason.
const BODY_EXCERPT: usize = 200;

impl HttpOutput {
    fn encode(&self, events: &[&Event]) -> Bytes {
        let mut buf = Vec::with_capacity(events.len() * 256 + 2);
        match self.format {
            Format::Ndjson => encode_json_lines(events, &mut buf),
            Format::JsonArray => {
                buf.push(b'[');
                for (i, e) in events.iter().enumerate() {
                    if i > 0 {
                        buf.push(b',');
                    }
                    e.write_json(&mut buf);
                }
                buf.push(b']');
            }
        }
        match self.compression {
            Compression::None => Bytes::from(buf),
            Compression::Gzip => {
                use std::io::Write;
                let mut enc =
                    flate2::write::GzEncoder::new(Vec::with_capacity(buf.len() / 4 + 64), flate2::Compression::fast());
                // Writing into a Vec cannot fail.
                let _ = enc.write_all(&buf);
                Bytes::from(enc.finish().unwrap_or_default())
            }
        }
    }

    async fn attempt(&self, body: Bytes) -> Attempt {
        let response =
            match self.client.get(&self.ctx).request(self.method.clone(), self.url.clone()).body(body).send().await {
                Ok(r) => r,
                Err(e) if e.is_builder() => return Attempt::Refused(format!("cannot build the request: {e}")),
                Err(e) => return Attempt::Retriable(describe(&e), None),
            };
        let status = response.status();
        if status.is_success() {
            // Read the answer to the end so the connection can be used again.
            let _ = response.bytes().await;
            return Attempt::Delivered;
        }
        let retry_after = match status.as_u16() {
            429 | 503 => {
                response.headers().get(reqwest::header::RETRY_AFTER).and_then(|v| retry_after(v.to_str().ok()?))
            }
            _ => None,
        };
        let reason = format!("HTTP {}: {}", status.as_u16(), excerpt(response).await);
        if events_at_fault(status) { Attempt::Refused(reason) } else { Attempt::Retriable(reason, retry_after) }
    }

    /// Sends one request's events until delivered, refused, or out of retries. A refused
    /// request of several events is split in halves and each sent again (with
    /// `isolate_refused`), down to single events, so only the events the server refuses are
    /// rejected and the others are delivered.
    async fn send_request(
        &self,
        events: &[&Event],
        offset: usize,
        rejected: &mut Vec<Rejected>,
    ) -> Result<(), Aborted> {
        // Ranges of `events` still to send, last first, with the attempts already spent on them.
        let mut todo = vec![(0, events.len(), 0u32)];
        while let Some((start, end, spent)) = todo.pop() {
            let part = &events[start..end];
            match self.send_until_settled(part).await? {
                Settled::Delivered => {}
                Settled::Refused { reason, attempts } if self.isolate_refused && part.len() > 1 => {
                    tracing::debug!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, url = %self.url,
                        events = part.len(), reason = %reason, "the server refused a request; sending its halves apart");
                    let mid = start + part.len() / 2;
                    todo.push((mid, end, spent + attempts));
                    todo.push((start, mid, spent + attempts));
                }
                Settled::Refused { reason, attempts } => {
                    tracing::error!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, url = %self.url,
                        events = part.len(), reason = %reason, "the server refused the events; they are rejected");
                    let attempts = spent + attempts;
                    rejected.extend((offset + start..offset + end).map(|i| Rejected::refused(i, &reason, attempts)));
                }
                Settled::GaveUp { reason, attempts } => {
                    let attempts = spent + attempts;
                    rejected.extend((offset + start..offset + end).map(|i| Rejected::gave_up(i, &reason, attempts)));
                }
            }
        }
        Ok(())
    }

    /// Sends one body until it is delivered, refused, or out of retries.
    async fn send_until_settled(&self, events: &[&Event]) -> Result<Settled, Aborted> {
        let body = self.encode(events);
        let mut backoff = Backoff::new(self.retry);
        loop {
            let outcome = tokio::select! {
                a = self.attempt(body.clone()) => a,
                _ = self.ctx.abort.cancelled() => return Err(Aborted),
            };
            match outcome {
                Attempt::Delivered => {
                    self.ctx.metrics.bytes_out.add(body.len() as u64);
                    if let Some(failures) = self.stall.succeeded() {
                        tracing::info!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, url = %self.url,
                            failed_attempts = failures, "http output delivers again");
                    }
                    return Ok(Settled::Delivered);
                }
                Attempt::Refused(reason) => return Ok(Settled::Refused { reason, attempts: backoff.failures() + 1 }),
                Attempt::Retriable(reason, hint) => {
                    let last = backoff.exhausted_after_this();
                    if !last {
                        self.ctx.metrics.retries.add(1);
                    }
                    if let Some(pause) = hint {
                        backoff.retry_after(pause);
                    }
                    // The last attempt is not said to be retried: the give-up line follows.
                    if let Some(held_back) = self.stall.retrying(&reason)
                        && !last
                    {
                        tracing::warn!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, url = %self.url,
                            attempt = backoff.failures() + 1, error = %reason, also_failed_since_last_log = held_back,
                            "http request failed; retrying (the pipeline waits)");
                    }
                    if !backoff.retry(&self.ctx.abort).await? {
                        self.stall.gave_up(&reason);
                        tracing::error!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, url = %self.url,
                            events = events.len(), attempts = backoff.failures(), error = %reason,
                            "http output gave up after max_retries; the events are rejected");
                        return Ok(Settled::GaveUp { reason, attempts: backoff.failures() });
                    }
                }
            }
        }
    }
}

/// A `Retry-After` value: delay-seconds, or an HTTP date (the time until then).
pub(crate) fn retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(std::time::SystemTime::now()).unwrap_or(Duration::ZERO))
}

/// How one body's sending ended.
enum Settled {
    Delivered,
    Refused { reason: String, attempts: u32 },
    GaveUp { reason: String, attempts: u32 },
}

/// True when a non-2xx answer refuses the body itself, so sending the same events again would
/// fail again. Answers about the endpoint, the credentials or the server's state are not the
/// events' fault: the same request may succeed once the operator or the server fixes them.
fn events_at_fault(status: StatusCode) -> bool {
    status.is_client_error() && !matches!(status.as_u16(), 401 | 403 | 404 | 405 | 407 | 408 | 410 | 421 | 425 | 429)
}

/// A reqwest error with its causes, which name the actual problem (refused, reset, timeout).
pub(crate) fn describe(e: &reqwest::Error) -> String {
    let mut text = if e.is_timeout() { format!("timed out: {e}") } else { e.to_string() };
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let s_text = s.to_string();
        if !text.contains(&s_text) {
            text.push_str(": ");
            text.push_str(&s_text);
        }
        source = s.source();
    }
    text
}

/// The first bytes of an error response's body, as text.
async fn excerpt(mut response: reqwest::Response) -> String {
    let mut body = Vec::new();
    while body.len() < BODY_EXCERPT {
        match response.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    body.truncate(BODY_EXCERPT);
    String::from_utf8_lossy(&body).trim().to_string()
}

#[async_trait]
impl Output for HttpOutput {
    async fn send(&self, events: &[&Event]) -> Result<Delivery, Aborted> {
        let mut rejected = Vec::new();
        for (i, chunk) in events.chunks(self.batch_max_events).enumerate() {
            self.send_request(chunk, i * self.batch_max_events, &mut rejected).await?;
        }
        Ok(Delivery { rejected })
    }
}

#[cfg(test)]
mod tests;
