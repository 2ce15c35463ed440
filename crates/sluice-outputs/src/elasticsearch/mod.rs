//! `elasticsearch` output (also `opensearch`): events indexed through the `_bulk` API, with
//! each document's result read from the answer.
//!
//! Guarantees:
//! - An event counts as delivered only once the engine said so for its own document (2xx, see
//!   [`response`]). A document the engine refuses for a fault of its own (400 mapping and
//!   parsing errors, 404 missing index, 409 conflicts, 413) is rejected with the engine's
//!   status, error type and reason, which sends it to the pipeline's dead letter queue when
//!   there is one; the rest of the request is delivered. Without a dead letter queue it is
//!   counted failed and logged (at most once per 10 s per output, with the count in between).
//! - Documents refused for the environment's reasons (429, 5xx, 401, 403, an index write block)
//!   are sent again, alone (the delivered ones are not sent twice), with exponential backoff
//!   and jitter, until they are in: a block lifted later loses nothing. They are counted by
//!   status and error type and logged at most once per 10 s per output.
//! - A request that fails as a whole (connection refused, timeout, 429, 5xx, 401/403) is sent
//!   again with backoff, without limit by default: an engine that is down holds the pipeline
//!   back and loses nothing. `retry.max_retries` sets a limit, after which the events are given
//!   up (counted failed, not dead-lettered: they were not at fault).
//! - A request the engine finds too large (413) or malformed as a whole (400) is split in
//!   halves, down to one document, so that only the document at fault is refused.
//! - With `document_id` set, a resend after a crash or a retry overwrites the same document: no
//!   duplicates.
//!
//! Requests are bounded by `batch_max_events` and `batch_max_bytes`; at most `max_in_flight`
//! are in flight at once across the pipeline's workers, over kept-alive connections to the
//! `hosts` taken in turn ([`hosts`]).
//!
//! The output's `bytes_out` counts the bodies of bulk requests the engine answered 2xx with a
//! bulk answer, as sent (after compression); documents of such an answer sent again count again.
//! `bulk_bytes_sent_total` counts every request sent, answered or not.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use base64::Engine;
use bytes::Bytes;
use reqwest::header::{self, HeaderValue};
use reqwest::{StatusCode, Url};
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::Event;
use sluice_expr::Template;
use sluice_tls::ClientTls;
use tokio::sync::Semaphore;

use crate::http_client::{HttpClient, configured_headers};
use crate::retry::{Backoff, RetryConfig, StallLog};
use crate::{Aborted, Delivery, Output, OutputContext, Rejected};

mod bulk;
mod config;
mod hosts;
mod metrics;
mod response;
mod template;
#[cfg(test)]
mod tests;

use bulk::{Action, Encoded, Targets};
use config::{Compression, ConflictPolicy, ElasticsearchConfig};
use hosts::Hosts;
use metrics::Figures;
use response::Outcome;

pub(crate) struct ElasticsearchOutput {
    targets: Targets,
    create_conflict_delivered: bool,
    hosts: Hosts,
    client: HttpClient,
    compression: Compression,
    batch_max_events: usize,
    batch_max_bytes: usize,
    in_flight: Semaphore,
    retry: RetryConfig,
    template: Option<template::Install>,
    template_installed: tokio::sync::OnceCell<()>,
    figures: Arc<Figures>,
    stall: StallLog,
    refused_log: StallLog,
    /// Documents sent again on their own: a rate limit only. Every answer of a request is a
    /// success as a whole, so the stall log (reset by each success) would log each round.
    retried_log: StallLog,
    ctx: OutputContext,
}

pub(crate) fn build(spec: &ComponentSpec, ctx: OutputContext) -> Result<Arc<dyn Output>, ConfigError> {
    Ok(Arc::new(build_output(spec, ctx)?))
}

pub(crate) fn build_output(spec: &ComponentSpec, ctx: OutputContext) -> Result<ElasticsearchOutput, ConfigError> {
    let c: ElasticsearchConfig = spec.settings()?;
    if c.hosts.is_empty() {
        return Err(spec.key_error("hosts", "needs at least one URL, such as http://127.0.0.1:9200"));
    }
    let mut urls = Vec::with_capacity(c.hosts.len());
    for host in &c.hosts {
        let url = Url::parse(host).map_err(|e| spec.key_error("hosts", format!("`{host}` is not a URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") || !url.has_host() {
            return Err(spec.key_error("hosts", format!("`{host}` must be an http:// or https:// URL with a host")));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(spec.key_error("hosts", format!("`{host}` must have no query or fragment")));
        }
        urls.push(url);
    }
    let template = |key: &str, src: &str| {
        Template::parse(src).map_err(|e| spec.key_error(key, format!("`{src}` is not a valid template: {e}")))
    };
    let index = template("index", &c.index)?;
    if c.index.is_empty() {
        return Err(spec.key_error("index", "must not be empty"));
    }
    let id = c.document_id.as_deref().map(|s| template("document_id", s)).transpose()?;
    if matches!(c.action, Action::Update | Action::Delete) && id.is_none() {
        return Err(spec.key_error(
            "action",
            format!("`action: {}` needs `document_id`: the document to change is named by its id", c.action.name()),
        ));
    }
    let routing = c.routing.as_deref().map(|s| template("routing", s)).transpose()?;
    let pipeline = c.pipeline.as_deref().map(|s| template("pipeline", s)).transpose()?;
    if c.batch_max_events == 0 {
        return Err(spec.key_error("batch_max_events", "must be at least 1"));
    }
    if c.batch_max_bytes.0 < 1024 {
        return Err(spec.key_error("batch_max_bytes", "must be at least 1KiB"));
    }
    if c.max_in_flight == 0 {
        return Err(spec.key_error("max_in_flight", "must be at least 1"));
    }
    if c.timeout.0.is_zero() {
        return Err(spec.key_error("timeout", "must be more than 0"));
    }
    let mut headers = configured_headers(spec, &c.headers)?;
    if let Some(auth) = &c.auth {
        let mut value = authorization(spec, auth)?;
        value.set_sensitive(true);
        headers.insert(header::AUTHORIZATION, value);
    }
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-ndjson"));
    headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
    if c.compression == Compression::Gzip {
        headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    }
    let tls = ClientTls::for_component(spec, c.tls.as_ref())?;
    if tls.is_some() && urls.iter().any(|u| u.scheme() != "https") {
        return Err(spec.key_error("tls", "`tls` is set but not every host is an https:// URL"));
    }
    let template = c.template.as_ref().map(|t| template::Install::read(spec, t)).transpose()?;
    let client = HttpClient::new(c.timeout.0, headers, tls)
        .map_err(|e| spec.error(format!("cannot build the HTTP client: {e}")))?;
    let figures = Arc::new(Figures::default());
    let _ = ctx.metrics.state.set(figures.clone());
    Ok(ElasticsearchOutput {
        targets: Targets { action: c.action, index, id, routing, pipeline },
        create_conflict_delivered: c.create_conflict == ConflictPolicy::Delivered,
        hosts: Hosts::new(&urls),
        client,
        compression: c.compression,
        batch_max_events: c.batch_max_events,
        batch_max_bytes: c.batch_max_bytes.as_usize(),
        in_flight: Semaphore::new(c.max_in_flight),
        retry: c.retry,
        template,
        template_installed: tokio::sync::OnceCell::new(),
        figures,
        stall: StallLog::for_output(&ctx.metrics),
        refused_log: StallLog::default(),
        retried_log: StallLog::default(),
        ctx,
    })
}

/// The `Authorization` header of `auth:`.
fn authorization(spec: &ComponentSpec, auth: &config::AuthConfig) -> Result<HeaderValue, ConfigError> {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let value = match (&auth.basic, &auth.api_key, &auth.bearer) {
        (Some(basic), None, None) => {
            if basic.user.is_empty() || basic.user.contains(':') {
                return Err(spec.nested_key_error(&["auth", "basic", "user"], "must be non-empty and hold no `:`"));
            }
            format!("Basic {}", b64(&format!("{}:{}", basic.user, basic.password)))
        }
        (None, Some(key), None) if !key.is_empty() => {
            // `id:key` is encoded; a value without `:` is taken as already encoded.
            if key.contains(':') { format!("ApiKey {}", b64(key)) } else { format!("ApiKey {key}") }
        }
        (None, None, Some(token)) if !token.is_empty() => format!("Bearer {token}"),
        (None, None, None) => {
            return Err(spec.key_error("auth", "needs one of `basic: {user, password}`, `api_key` or `bearer`"));
        }
        (None, Some(_), None) | (None, None, Some(_)) => {
            return Err(spec.key_error("auth", "the credential must not be empty"));
        }
        _ => return Err(spec.key_error("auth", "set one of `basic`, `api_key` and `bearer`, not several")),
    };
    HeaderValue::from_str(&value).map_err(|_| spec.key_error("auth", "holds characters a header cannot carry"))
}

/// What failed and is to be sent again: which log line says so.
#[derive(Clone, Copy)]
enum Failed {
    /// A whole request (connection, timeout, a non-2xx answer, an answer that is not a bulk one).
    Request,
    /// Some documents of an answered request.
    Documents,
}

/// What one bulk request came to as a whole.
enum Answer {
    /// 2xx: the body, to read per document.
    Ok(Bytes),
    /// Not the events' fault: send again later (`Retry-After` when the engine gave one).
    Retriable { reason: String, retry_after: Option<Duration>, host_at_fault: bool },
    /// The request was refused as a whole (400, 413): split it to find the document at fault.
    Split { reason: String },
}

impl ElasticsearchOutput {
    /// The request body of `items`: their lines, gzipped when configured.
    fn body(&self, encoded: &Encoded, items: &[usize]) -> Bytes {
        let size: usize = items.iter().map(|&i| encoded.items[i].len()).sum();
        let mut plain = Vec::with_capacity(size);
        for &i in items {
            let it = &encoded.items[i];
            plain.extend_from_slice(&encoded.bytes[it.start..it.end]);
        }
        self.figures.bytes_encoded.fetch_add(plain.len() as u64, Ordering::Relaxed);
        let body = match self.compression {
            Compression::None => plain,
            Compression::Gzip => {
                use std::io::Write;
                let mut gz = flate2::write::GzEncoder::new(
                    Vec::with_capacity(plain.len() / 5 + 64),
                    flate2::Compression::fast(),
                );
                // Writing into a Vec cannot fail.
                let _ = gz.write_all(&plain);
                gz.finish().unwrap_or_default()
            }
        };
        self.figures.bytes_sent.fetch_add(body.len() as u64, Ordering::Relaxed);
        Bytes::from(body)
    }

    /// One bulk request to the next host.
    async fn post(&self, body: Bytes) -> Answer {
        let host = self.hosts.pick();
        let url = self.hosts.bulk_url(host).clone();
        let started = Instant::now();
        self.figures.requests_in_flight.fetch_add(1, Ordering::Relaxed);
        let result = self.client.get(&self.ctx).post(url).body(body).send().await;
        let answer = match result {
            Err(e) => Answer::Retriable {
                reason: format!("{}: {}", self.hosts.name(host), crate::http::describe(&e)),
                retry_after: None,
                host_at_fault: true,
            },
            Ok(response) => {
                let status = response.status();
                let retry_after = response
                    .headers()
                    .get(header::RETRY_AFTER)
                    .and_then(|v| crate::http::retry_after(v.to_str().ok()?));
                match response.bytes().await {
                    Err(e) => Answer::Retriable {
                        reason: format!("{}: reading the answer: {}", self.hosts.name(host), crate::http::describe(&e)),
                        retry_after: None,
                        host_at_fault: true,
                    },
                    Ok(body) if status.is_success() => Answer::Ok(body),
                    Ok(body) => {
                        let reason = format!("{}: HTTP {}: {}", self.hosts.name(host), status.as_u16(), excerpt(&body));
                        match status {
                            StatusCode::BAD_REQUEST | StatusCode::PAYLOAD_TOO_LARGE => Answer::Split { reason },
                            s => Answer::Retriable { reason, retry_after, host_at_fault: s.is_server_error() },
                        }
                    }
                }
            }
        };
        self.figures.requests_in_flight.fetch_sub(1, Ordering::Relaxed);
        self.figures.latency.observe(started.elapsed());
        self.figures.requests.fetch_add(1, Ordering::Relaxed);
        match &answer {
            Answer::Retriable { host_at_fault: true, reason, .. } => {
                if self.hosts.failed(host) {
                    tracing::warn!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, host = %self.hosts.name(host),
                        error = %reason, hosts_up = self.hosts.up(), hosts = self.hosts.len(),
                        "elasticsearch host set aside; requests go to the other hosts until it answers again");
                }
            }
            _ => {
                if self.hosts.succeeded(host) && self.hosts.len() > 1 {
                    tracing::info!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, host = %self.hosts.name(host),
                        "elasticsearch host answers again");
                }
            }
        }
        answer
    }

    /// Sends `items` until each is delivered, refused or given up; the ones not delivered are
    /// added to `rejected`.
    async fn deliver(&self, encoded: &Encoded, items: Vec<usize>, rejected: &mut Vec<Rejected>) -> Result<(), Aborted> {
        // Parts still to send, with their backoff; a split pushes its halves.
        let mut parts = vec![(items, Backoff::new(self.retry))];
        while let Some((pending, backoff)) = parts.pop() {
            let body = self.body(encoded, &pending);
            let body_len = body.len() as u64;
            let answer = {
                let _permit = tokio::select! {
                    p = self.in_flight.acquire() => p.expect("the semaphore is never closed"),
                    _ = self.ctx.abort.cancelled() => return Err(Aborted),
                };
                tokio::select! {
                    a = self.post(body) => a,
                    _ = self.ctx.abort.cancelled() => return Err(Aborted),
                }
            };
            let attempts = backoff.failures() + 1;
            match answer {
                Answer::Ok(body) => {
                    let outcomes = match response::outcomes(
                        &body,
                        pending.len(),
                        self.targets.action,
                        self.create_conflict_delivered,
                    ) {
                        Ok(o) => o,
                        Err(reason) => {
                            // Not a bulk answer (a proxy's page?): the request's fate is unknown.
                            self.retry_or_give_up(
                                &mut parts,
                                (pending, backoff),
                                reason,
                                None,
                                Failed::Request,
                                encoded,
                                rejected,
                            )
                            .await?;
                            continue;
                        }
                    };
                    // The engine took the request; documents it refused or wants again are
                    // its answer, not a failed delivery of the bytes.
                    self.ctx.metrics.bytes_out.add(body_len);
                    let mut again = Vec::new();
                    let mut retry_reason = String::new();
                    let sent = pending.len();
                    for (item, outcome) in pending.into_iter().zip(outcomes) {
                        match outcome {
                            Outcome::Delivered => {
                                self.figures.indexed.fetch_add(1, Ordering::Relaxed);
                            }
                            Outcome::Refused { status, error_type, reason } => {
                                let it = &encoded.items[item];
                                self.figures.refused(status, &error_type);
                                let reason = format!(
                                    "{} refused the document: status {status}, index {}, {error_type}: {reason}",
                                    self.engine(),
                                    encoded.index_of(it)
                                );
                                self.log_refused(&reason);
                                rejected.push(Rejected::refused(it.event, reason, attempts));
                            }
                            Outcome::Retry { status, error_type, reason } => {
                                self.figures.retried(status, &error_type);
                                if retry_reason.is_empty() {
                                    retry_reason = format!("status {status}, {error_type}: {reason}");
                                }
                                again.push(item);
                            }
                        }
                    }
                    // Documents sent again keep the output retrying (and its clock running):
                    // only an answer with none of them clears the stall.
                    if again.is_empty() {
                        self.stall_cleared();
                    } else {
                        let reason = format!("{} of {} documents were answered {retry_reason}", again.len(), sent);
                        self.retry_or_give_up(
                            &mut parts,
                            (again, backoff),
                            reason,
                            None,
                            Failed::Documents,
                            encoded,
                            rejected,
                        )
                        .await?;
                    }
                }
                Answer::Split { reason } if pending.len() > 1 => {
                    tracing::debug!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, documents = pending.len(),
                        reason = %reason, "the engine refused a bulk request as a whole; sending its halves apart");
                    let mut first = pending;
                    let second = first.split_off(first.len() / 2);
                    parts.push((second, Backoff::new(self.retry)));
                    parts.push((first, Backoff::new(self.retry)));
                }
                Answer::Split { reason } => {
                    let it = &encoded.items[pending[0]];
                    self.figures.refused(if reason.contains("HTTP 413") { 413 } else { 400 }, "");
                    let reason =
                        format!("{} refused the document: index {}, {reason}", self.engine(), encoded.index_of(it));
                    self.log_refused(&reason);
                    rejected.push(Rejected::refused(it.event, reason, attempts));
                }
                Answer::Retriable { reason, retry_after, .. } => {
                    self.retry_or_give_up(
                        &mut parts,
                        (pending, backoff),
                        reason,
                        retry_after,
                        Failed::Request,
                        encoded,
                        rejected,
                    )
                    .await?;
                }
            }
        }
        Ok(())
    }

    /// After a failure that is not the documents' fault: waits the backoff and queues `pending`
    /// again, or gives them up once `retry.max_retries` is spent.
    #[allow(clippy::too_many_arguments)]
    async fn retry_or_give_up(
        &self,
        parts: &mut Vec<(Vec<usize>, Backoff)>,
        (pending, mut backoff): (Vec<usize>, Backoff),
        reason: String,
        retry_after: Option<Duration>,
        failed: Failed,
        encoded: &Encoded,
        rejected: &mut Vec<Rejected>,
    ) -> Result<(), Aborted> {
        let last = backoff.exhausted_after_this();
        if !last {
            self.ctx.metrics.retries.add(1);
        }
        if let Some(pause) = retry_after {
            backoff.retry_after(pause);
        }
        match failed {
            Failed::Request => {
                if let Some(held_back) = self.stall.retrying(&reason)
                    && !last
                {
                    tracing::warn!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, documents = pending.len(),
                        attempt = backoff.failures() + 1, error = %reason, also_failed_since_last_log = held_back,
                        "bulk request failed; sending again (the pipeline waits)");
                }
            }
            Failed::Documents => {
                self.ctx.metrics.output.retrying(&reason);
                if let Some(held_back) = self.retried_log.failed()
                    && !last
                {
                    tracing::warn!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, documents = pending.len(),
                        attempt = backoff.failures() + 1, error = %reason, also_retried_since_last_log = held_back,
                        "the engine refused documents for a reason that is not theirs (such as a write block); \
                         sending them again on their own until it is lifted (the pipeline waits; logged at most \
                         once per 10 s)");
                }
            }
        }
        if backoff.retry(&self.ctx.abort).await? {
            parts.push((pending, backoff));
        } else {
            self.stall.gave_up(&reason);
            tracing::error!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, documents = pending.len(),
                attempts = backoff.failures(), error = %reason,
                "elasticsearch output gave up after retry.max_retries; the events are rejected");
            let attempts = backoff.failures();
            rejected.extend(pending.iter().map(|&i| Rejected::gave_up(encoded.items[i].event, &reason, attempts)));
        }
        Ok(())
    }

    fn stall_cleared(&self) {
        if let Some(failures) = self.stall.succeeded() {
            tracing::info!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, failed_attempts = failures,
                "elasticsearch output delivers again");
        }
    }

    /// Logs a refused document: the first at once, then at most once per 10 s with the count.
    fn log_refused(&self, reason: &str) {
        if let Some(held_back) = self.refused_log.failed() {
            tracing::warn!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, refused_since_last_log = held_back,
                "{reason} (to the dead letter queue if the pipeline has one; logged at most once per 10 s)");
        }
    }

    fn engine(&self) -> &'static str {
        "the search engine"
    }

    /// Installs the index template once, before the first bulk request, retrying until it is in.
    async fn ensure_template(&self) -> Result<(), Aborted> {
        let Some(install) = &self.template else { return Ok(()) };
        let done = self
            .template_installed
            .get_or_try_init(|| async {
                let mut backoff = Backoff::new(RetryConfig { max_retries: None, ..self.retry });
                loop {
                    let host = self.hosts.pick();
                    let base = self.hosts.bulk_url(host).join("./").expect("the bulk URL has a base");
                    match install.run(&self.client.get(&self.ctx), &base).await {
                        Ok(what) => {
                            tracing::info!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, template = %install.name(),
                                host = %self.hosts.name(host), "index template {what}");
                            return Ok(());
                        }
                        Err(e) => {
                            let error = format!("cannot install the index template: {e}");
                            if let Some(held_back) = self.stall.retrying(&error) {
                                tracing::warn!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, template = %install.name(),
                                    error = %e, also_failed_since_last_log = held_back,
                                    "cannot install the index template; trying again before any event is sent");
                            }
                            if !backoff.retry(&self.ctx.abort).await? {
                                unreachable!("no retry limit here");
                            }
                        }
                    }
                }
            })
            .await;
        done.map(|_| ())
    }
}

#[async_trait]
impl Output for ElasticsearchOutput {
    async fn send(&self, events: &[&Event]) -> Result<Delivery, Aborted> {
        self.ensure_template().await?;
        let encoded = bulk::encode(&self.targets, events);
        let mut rejected: Vec<Rejected> = Vec::new();
        for (event, reason) in &encoded.refused {
            self.figures.refused(0, "missing_field");
            self.log_refused(reason);
            rejected.push(Rejected::refused(*event, reason.clone(), 1));
        }
        let all: Vec<usize> = (0..encoded.items.len()).collect();
        let requests = bulk::requests(&all, |i| encoded.items[i].len(), self.batch_max_events, self.batch_max_bytes);
        if requests.len() <= 1 {
            if let Some(items) = requests.into_iter().next() {
                self.deliver(&encoded, items, &mut rejected).await?;
            }
        } else {
            let sends = requests.into_iter().map(|items| {
                let encoded = &encoded;
                async move {
                    let mut rejected = Vec::new();
                    self.deliver(encoded, items, &mut rejected).await.map(|()| rejected)
                }
            });
            for part in futures_util::future::join_all(sends).await {
                rejected.extend(part?);
            }
        }
        rejected.sort_by_key(|r| r.index);
        Ok(Delivery { rejected })
    }
}

/// The first bytes of an answer's body, as text on one line.
fn excerpt(body: &[u8]) -> String {
    const MAX: usize = 300;
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX)]);
    let mut line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if body.len() > MAX {
        line.push_str(" ...");
    }
    line
}
