//! `tcp` output: events as lines (JSON or `message` text) over one kept-open TCP connection.
//!
//! The connection is made on the first send and kept. Workers take turns on it, each writing its
//! whole batch at once, so lines never interleave. Before each write the output checks whether
//! the server has closed the connection, and reconnects if so. When connecting or writing fails,
//! it reconnects with exponential backoff (`retry`) and writes the whole batch again; when
//! `retry.max_retries` is reached the batch is rejected with the last error.
//!
//! Every failure here is the environment's (the peer is down, refuses, resets or is slow to
//! accept): no event's content can make a write fail. So nothing is ever rejected as permanent;
//! failed attempts are counted in the output's `retries`, logged at warn at most once per
//! interval with the address and the error (and an info line when sending resumes), and hold
//! the pipeline back until the peer takes the batch or `max_retries` runs out.
//!
//! Delivery is at-least-once and no more: a batch that failed part-way is sent again in full, so
//! its first lines can arrive twice. TCP itself has no acknowledgement of what the server read,
//! so lines written just before a server dies can be lost without any error being seen.
//!
//! The output's `bytes_out` counts a batch's bytes once its whole write succeeded (before TLS);
//! a write that failed part-way counts nothing, and the batch counts once when sent again.

mod config;

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use async_trait::async_trait;
use sluice_config::ConfigError;
use sluice_config::model::ComponentSpec;
use sluice_core::Event;
use sluice_tls::ClientTls;
use tokio::io::{AsyncRead, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::retry::{Backoff, RetryConfig, StallLog};
use crate::{Aborted, Delivery, Output, OutputContext};
use config::TcpCodec;

/// The longest a TLS 1.3 connection watches for the server's verdict on our certificate (see
/// [`sluice_tls::confirm_accepted`]); it is a few handshake times, from 250 ms.
const SERVER_VERDICT_WAIT: Duration = Duration::from_secs(1);

struct TcpOutput {
    address: String,
    codec: TcpCodec,
    connect_timeout: Duration,
    retry: RetryConfig,
    tls: Option<Arc<ClientTls>>,
    conn: tokio::sync::Mutex<Option<Connection>>,
    stall: StallLog,
    ctx: OutputContext,
}

pub(crate) fn build(spec: &ComponentSpec, ctx: OutputContext) -> Result<Arc<dyn Output>, ConfigError> {
    let c = config::read(spec)?;
    let tls = ClientTls::for_component(spec, c.tls.as_ref())?;
    Ok(Arc::new(TcpOutput {
        address: c.address,
        codec: c.codec,
        connect_timeout: c.connect_timeout.0,
        retry: c.retry,
        tls,
        conn: tokio::sync::Mutex::new(None),
        stall: StallLog::for_output(&ctx.metrics),
        ctx,
    }))
}

/// The kept-open connection: plain, or a TLS session over it.
enum Connection {
    Plain(TcpStream),
    Tls(Box<sluice_tls::tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Connection {
    /// True when the server has closed its side (or the connection broke). Data the server sent
    /// is read and thrown away: this output does not expect any. Reads go through the TLS
    /// session, which takes its own records (session tickets, close_notify) in passing.
    fn peer_closed(&mut self) -> bool {
        let mut scratch = [0u8; 1024];
        let mut cx = Context::from_waker(Waker::noop());
        loop {
            let mut buf = ReadBuf::new(&mut scratch);
            let polled = match self {
                Connection::Plain(s) => Pin::new(s).poll_read(&mut cx, &mut buf),
                Connection::Tls(s) => Pin::new(s.as_mut()).poll_read(&mut cx, &mut buf),
            };
            match polled {
                Poll::Ready(Ok(())) if buf.filled().is_empty() => return true,
                Poll::Ready(Ok(())) => continue,
                Poll::Ready(Err(_)) => return true,
                Poll::Pending => return false,
            }
        }
    }

    async fn write_all(&mut self, data: &[u8]) -> std::io::Result<()> {
        match self {
            Connection::Plain(s) => s.write_all(data).await,
            Connection::Tls(s) => {
                s.write_all(data).await?;
                s.flush().await
            }
        }
    }

    async fn shutdown(&mut self) -> std::io::Result<()> {
        match self {
            Connection::Plain(s) => s.shutdown().await,
            Connection::Tls(s) => s.shutdown().await,
        }
    }
}

impl TcpOutput {
    fn encode(&self, events: &[&Event]) -> Vec<u8> {
        let mut buf = Vec::with_capacity(events.len() * 256);
        for e in events {
            match self.codec {
                TcpCodec::Json => e.write_json(&mut buf),
                TcpCodec::Text => match e.message() {
                    Some(m) => buf.extend_from_slice(m.as_bytes()),
                    None => e.write_json(&mut buf),
                },
            }
            buf.push(b'\n');
        }
        buf
    }

    async fn connect(&self) -> Result<Connection, String> {
        let started = tokio::time::Instant::now();
        let stream = match tokio::time::timeout(self.connect_timeout, TcpStream::connect(&self.address)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(format!("cannot connect to {}: {e}", self.address)),
            Err(_) => {
                return Err(format!("cannot connect to {}: timed out after {:?}", self.address, self.connect_timeout));
            }
        };
        let _ = stream.set_nodelay(true);
        let connection = match &self.tls {
            None => Connection::Plain(stream),
            Some(tls) => {
                let host = self.address.rsplit_once(':').map_or(self.address.as_str(), |(host, _)| host);
                // With TLS 1.3 the server checks our certificate after our side of the handshake
                // is over: wait for its verdict, or a refusal would pass for delivered batches.
                let handshake = async {
                    let mut s = tls.connect(host, stream).await?;
                    let window =
                        sluice_tls::verdict_window(started.elapsed(), self.connect_timeout.min(SERVER_VERDICT_WAIT));
                    sluice_tls::confirm_accepted(&mut s, window).await?;
                    Ok::<_, std::io::Error>(s)
                };
                match tokio::time::timeout(self.connect_timeout, handshake).await {
                    Ok(Ok(s)) => Connection::Tls(Box::new(s)),
                    Ok(Err(e)) => {
                        return Err(format!(
                            "TLS handshake with {} failed: {}",
                            self.address,
                            sluice_tls::describe_handshake_error(&e)
                        ));
                    }
                    Err(_) => return Err(format!("TLS handshake with {} timed out", self.address)),
                }
            }
        };
        tracing::info!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, address = %self.address,
            tls = self.tls.is_some(), "tcp output connected");
        Ok(connection)
    }

    /// One attempt: (re)connects when needed and writes everything.
    async fn write(&self, conn: &mut Option<Connection>, data: &[u8]) -> Result<(), String> {
        if conn.as_mut().is_some_and(Connection::peer_closed) {
            tracing::info!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, address = %self.address,
                "the server closed the connection; reconnecting");
            *conn = None;
        }
        if conn.is_none() {
            *conn = Some(self.connect().await?);
        }
        let stream = conn.as_mut().expect("connected above");
        match stream.write_all(data).await {
            Ok(()) => Ok(()),
            Err(e) => {
                *conn = None;
                Err(format!("cannot write to {}: {e}", self.address))
            }
        }
    }
}

#[async_trait]
impl Output for TcpOutput {
    async fn send(&self, events: &[&Event]) -> Result<Delivery, Aborted> {
        let data = self.encode(events);
        let mut backoff = Backoff::new(self.retry);
        let mut conn = tokio::select! {
            c = self.conn.lock() => c,
            _ = self.ctx.abort.cancelled() => return Err(Aborted),
        };
        loop {
            let attempt = tokio::select! {
                r = self.write(&mut conn, &data) => r,
                _ = self.ctx.abort.cancelled() => {
                    // Part of the batch may be on the wire: start the next one on a new line.
                    *conn = None;
                    return Err(Aborted);
                }
            };
            let reason = match attempt {
                Ok(()) => {
                    self.ctx.metrics.bytes_out.add(data.len() as u64);
                    if let Some(failures) = self.stall.succeeded() {
                        tracing::info!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, address = %self.address,
                            failed_attempts = failures, "tcp output sends again");
                    }
                    return Ok(Delivery::all_delivered());
                }
                Err(reason) => reason,
            };
            if !backoff.exhausted_after_this() {
                self.ctx.metrics.retries.add(1);
            }
            if let Some(held_back) = self.stall.retrying(&reason) {
                tracing::warn!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, address = %self.address,
                    attempt = backoff.failures() + 1, error = %reason, also_failed_since_last_log = held_back,
                    "tcp output failed; reconnecting and sending the batch again (the pipeline waits)");
            }
            if !backoff.retry(&self.ctx.abort).await? {
                self.stall.gave_up(&reason);
                tracing::error!(pipeline = %self.ctx.pipeline, output = %self.ctx.id, events = events.len(),
                    error = %reason, "tcp output gave up after max_retries; the events are rejected");
                return Ok(Delivery::all_gave_up(events.len(), &reason, backoff.failures()));
            }
        }
    }

    async fn close(&self) {
        if let Some(mut stream) = self.conn.lock().await.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), stream.shutdown()).await;
        }
    }
}

#[cfg(test)]
mod tests;
