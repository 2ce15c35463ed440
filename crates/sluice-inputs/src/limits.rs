//! Limits every network input shares: how many connections it holds, and how long a client may
//! take.
//!
//! - [`ConnectionSlots`]: at most `max_connections` open at once. When all are taken, the
//!   connection that has waited on its client the longest (idle, or sending one head or one
//!   body) is closed to make room ([`ConnectionSlots::take_or_evict`]), so clients that open
//!   connections and then stall cannot lock out one that sends a request at once; a connection
//!   waiting on the pipeline for its answer is never chosen. When every connection waits on the
//!   pipeline, the new one is refused at once (the input decides how: closed, or answered
//!   "busy" first).
//! - [`Activity`]: what a connection is doing — idle between requests, receiving a request's
//!   head, or busy with a request — and when it entered that state, fed by [`WatchedIo`] (any
//!   byte received) and by the input (a request started or finished).
//!   [`Activity::expired`] tells when the connection has been idle longer than `idle_timeout`
//!   or has been sending one head for longer than `header_timeout`, so that a client that
//!   sends half a request and then nothing is closed, while one waiting for its answer is not.
//!   A body's own timeout belongs to whoever reads the body.
//! - [`accept_connections`]: the accept loop of the stream inputs (`tcp`, `syslog`, `beats`):
//!   each connection in a task of its own holding a slot, accept errors (out of file
//!   descriptors) logged and retried without spinning, and the tasks waited for at shutdown.
//! - [`tls_handshake`]: the TLS handshake of an accepted connection, bounded by
//!   [`TLS_HANDSHAKE_TIMEOUT`] and by the connection's own timeouts, so that a client that
//!   connects and never finishes its handshake holds its slot no longer than an idle one.

use std::collections::HashMap;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// Counts open connections against `max_connections`, and knows each one's activity.
#[derive(Debug)]
pub struct ConnectionSlots {
    open: AtomicUsize,
    max: usize,
    live: Mutex<HashMap<u64, Arc<Activity>>>,
    next_id: AtomicU64,
}

impl ConnectionSlots {
    pub fn new(max: usize) -> Arc<ConnectionSlots> {
        Arc::new(ConnectionSlots {
            open: AtomicUsize::new(0),
            max: max.max(1),
            live: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
        })
    }

    /// A slot, if fewer than `max` are taken; it is given back when dropped.
    fn try_take(self: &Arc<Self>) -> Option<ConnectionSlot> {
        let mut open = self.open.load(Ordering::Relaxed);
        loop {
            if open >= self.max {
                return None;
            }
            match self.open.compare_exchange_weak(open, open + 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Some(self.slot()),
                Err(now) => open = now,
            }
        }
    }

    /// A slot for a new connection whose activity is `activity`: a free one, or the one of the
    /// connection idle (or in one head) the longest, which is told to close. `None` when every
    /// open connection is busy with a request.
    pub fn take_or_evict(self: &Arc<Self>, activity: &Arc<Activity>) -> Option<ConnectionSlot> {
        let slot = match self.try_take() {
            Some(slot) => slot,
            None => {
                let victim = {
                    let live = self.live.lock();
                    live.values()
                        .filter_map(|a| a.evictable_since().map(|since| (since, a.clone())))
                        .min_by_key(|(since, _)| *since)
                };
                let (_, victim) = victim?;
                victim.evict();
                // The evicted connection gives its slot back as it closes, a moment later.
                self.open.fetch_add(1, Ordering::AcqRel);
                self.slot()
            }
        };
        self.live.lock().insert(slot.id, activity.clone());
        Some(slot)
    }

    fn slot(self: &Arc<Self>) -> ConnectionSlot {
        ConnectionSlot { slots: self.clone(), id: self.next_id.fetch_add(1, Ordering::Relaxed) }
    }

    #[cfg(test)]
    fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    pub fn max(&self) -> usize {
        self.max
    }
}

/// One open connection's place; given back on drop.
#[derive(Debug)]
pub struct ConnectionSlot {
    slots: Arc<ConnectionSlots>,
    id: u64,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.slots.live.lock().remove(&self.id);
        self.slots.open.fetch_sub(1, Ordering::AcqRel);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Between requests (or before the first), since the instant given.
    Idle(Instant),
    /// Bytes of a request's head have arrived since the instant given; the head is not complete.
    Head(Instant),
    /// A request's head is complete and its body is being received, since the instant given.
    Body(Instant),
    /// A request is being handled: its body is in, its answer awaited from the pipeline (for a
    /// stream input: what it read is being decoded and queued).
    Busy,
}

/// Why a connection is closed by its timeouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    Idle(Duration),
    Head(Duration),
    /// Closed to make room for a new connection when `max_connections` were open.
    Evicted,
}

impl std::fmt::Display for Expired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Expired::Idle(d) => write!(f, "sent nothing for idle_timeout ({d:?})"),
            Expired::Head(d) => write!(f, "did not finish a request's headers within header_timeout ({d:?})"),
            Expired::Evicted => {
                write!(f, "was idle or slow the longest when max_connections were open, to make room for a new one")
            }
        }
    }
}

/// A connection's activity, shared by its reader, its request handler and its watchdog.
#[derive(Debug)]
pub struct Activity {
    phase: Mutex<Phase>,
    changed: Notify,
    idle_timeout: Duration,
    header_timeout: Duration,
    evicted: AtomicBool,
}

impl Activity {
    /// `Duration::ZERO` switches a timeout off.
    pub fn new(idle_timeout: Duration, header_timeout: Duration) -> Arc<Activity> {
        Arc::new(Activity {
            phase: Mutex::new(Phase::Idle(Instant::now())),
            changed: Notify::new(),
            idle_timeout,
            header_timeout,
            evicted: AtomicBool::new(false),
        })
    }

    /// Since when the connection waits on its client (idle, in a head or in a body); `None`
    /// while it waits on the pipeline (or was evicted).
    fn evictable_since(&self) -> Option<Instant> {
        if self.evicted.load(Ordering::Relaxed) {
            return None;
        }
        match *self.phase.lock() {
            Phase::Idle(since) | Phase::Head(since) | Phase::Body(since) => Some(since),
            Phase::Busy => None,
        }
    }

    /// Asks the connection to close (see [`Activity::expired`]).
    fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        self.changed.notify_one();
    }

    /// Bytes arrived: an idle connection starts a request's head.
    fn received(&self) {
        let mut phase = self.phase.lock();
        if let Phase::Idle(_) = *phase {
            *phase = Phase::Head(Instant::now());
            drop(phase);
            self.changed.notify_one();
        }
    }

    /// A request's head is complete; its body is being received.
    pub fn request_started(&self) {
        *self.phase.lock() = Phase::Body(Instant::now());
        self.changed.notify_one();
    }

    /// The request's body is in: the connection waits on the pipeline, not on its client.
    pub fn body_received(&self) {
        *self.phase.lock() = Phase::Busy;
        self.changed.notify_one();
    }

    /// The request was answered; the connection waits for the next one.
    pub fn request_finished(&self) {
        *self.phase.lock() = Phase::Idle(Instant::now());
        self.changed.notify_one();
    }

    /// When the current phase runs out, if it can.
    fn deadline(&self) -> Option<(Instant, Expired)> {
        match *self.phase.lock() {
            Phase::Idle(since) if !self.idle_timeout.is_zero() => {
                Some((since + self.idle_timeout, Expired::Idle(self.idle_timeout)))
            }
            Phase::Head(since) if !self.header_timeout.is_zero() => {
                Some((since + self.header_timeout, Expired::Head(self.header_timeout)))
            }
            _ => None,
        }
    }

    /// Resolves once the connection has been idle, or in one head, for too long.
    pub async fn expired(&self) -> Expired {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.evicted.load(Ordering::Acquire) {
                return Expired::Evicted;
            }
            match self.deadline() {
                Some((at, why)) => {
                    tokio::select! {
                        _ = tokio::time::sleep_until(at) => {
                            if self.deadline().is_some_and(|(now_at, _)| now_at <= Instant::now()) {
                                return why;
                            }
                        }
                        _ = &mut changed => {}
                    }
                }
                None => changed.await,
            }
        }
    }
}

/// A stream that tells its [`Activity`] when bytes arrive.
pub struct WatchedIo<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S> WatchedIo<S> {
    pub fn new(inner: S, activity: Arc<Activity>) -> WatchedIo<S> {
        WatchedIo { inner, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WatchedIo<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.received();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WatchedIo<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Accepts connections on `listener` until shutdown, each handled by `handle(stream, peer,
/// activity)` in a task of its own that holds one of `max_connections` slots; then waits for
/// those tasks. With every slot taken, the connection idle the longest makes room (see
/// [`ConnectionSlots::take_or_evict`]); when none is idle the new one is closed at once, counted
/// in `refused` and logged with the peer. `kind` names the input in logs (`tcp`, `beats`).
pub async fn accept_connections<F, Fut>(
    listener: tokio::net::TcpListener,
    max_connections: usize,
    idle_timeout: Duration,
    ctx: &crate::InputContext,
    kind: &'static str,
    mut handle: F,
) where
    F: FnMut(tokio::net::TcpStream, std::net::SocketAddr, Arc<Activity>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let slots = ConnectionSlots::new(max_connections);
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
            r = listener.accept() => r,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors, or a connection reset before it was accepted: keep
                // serving, but do not spin on a persistent error.
                tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, error = %e, "{kind} input cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let activity = Activity::new(idle_timeout, Duration::ZERO);
        let Some(slot) = slots.take_or_evict(&activity) else {
            ctx.metrics.refused.add(1);
            tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %peer, max_connections = slots.max(),
                "{kind} input refused a connection: max_connections reached and none of them idle");
            drop(stream);
            continue;
        };
        let connection = handle(stream, peer, activity);
        tasks.spawn(async move {
            connection.await;
            drop(slot);
        });
    }
    drop(listener);
    while tasks.join_next().await.is_some() {}
}

/// How long a client has to complete its TLS handshake once connected.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// `stream` as is without `tls`; with it, after the handshake. The error says why in one line
/// (a client that does not speak TLS, a certificate refused, too slow, closed to make room, or
/// shutdown), for the input to log with the peer's address.
pub async fn tls_handshake<S>(
    tls: Option<&Arc<sluice_tls::ServerTls>>,
    stream: S,
    activity: &Activity,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Result<sluice_tls::ServerStream<S>, String>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    if tls.is_none() {
        return Ok(sluice_tls::ServerStream::Plain(stream));
    }
    tokio::select! {
        biased;
        _ = shutdown.cancelled() => Err("the input is shutting down".to_string()),
        why = activity.expired() => Err(format!("closed during the TLS handshake: the connection {why}")),
        r = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, sluice_tls::ServerStream::accept(tls, stream)) => match r {
            Ok(Ok(stream)) => Ok(stream),
            Ok(Err(e)) => Err(format!("TLS handshake failed: {}", sluice_tls::describe_handshake_error(&e))),
            Err(_) => Err(format!(
                "TLS handshake not completed within {}s",
                TLS_HANDSHAKE_TIMEOUT.as_secs()
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_bounded_and_given_back() {
        let slots = ConnectionSlots::new(2);
        let a = slots.try_take().unwrap();
        let _b = slots.try_take().unwrap();
        assert!(slots.try_take().is_none());
        drop(a);
        assert_eq!(slots.open(), 1);
        assert!(slots.try_take().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_house_evicts_the_longest_idle_connection_never_a_busy_one() {
        let slots = ConnectionSlots::new(2);
        let busy = Activity::new(Duration::ZERO, Duration::ZERO);
        let _busy_slot = slots.take_or_evict(&busy).unwrap();
        busy.received();
        busy.request_started();
        busy.body_received();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let idle = Activity::new(Duration::ZERO, Duration::ZERO);
        let idle_slot = slots.take_or_evict(&idle).unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Full: the idle one makes room, although the busy one is older.
        let newcomer = Activity::new(Duration::ZERO, Duration::ZERO);
        let _new_slot = slots.take_or_evict(&newcomer).unwrap();
        assert_eq!(idle.expired().await, Expired::Evicted);
        drop(idle_slot);
        assert_eq!(slots.open(), 2);
        // Both open ones busy: nothing can be evicted.
        newcomer.received();
        newcomer.request_started();
        newcomer.body_received();
        assert!(slots.take_or_evict(&Activity::new(Duration::ZERO, Duration::ZERO)).is_none());
        assert_eq!(slots.open(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_and_head_timeouts_apply_to_their_phase_only() {
        let activity = Activity::new(Duration::from_secs(60), Duration::from_secs(10));
        // Idle from the start: closed after the idle timeout.
        let a = activity.clone();
        let started = Instant::now();
        assert_eq!(a.expired().await, Expired::Idle(Duration::from_secs(60)));
        assert_eq!(started.elapsed(), Duration::from_secs(60));

        // A head that starts 5 s into an idle stretch runs out 10 s later, not at the idle deadline.
        let activity = Activity::new(Duration::from_secs(60), Duration::from_secs(10));
        let a = activity.clone();
        let started = Instant::now();
        let watchdog = tokio::spawn(async move { a.expired().await });
        tokio::time::sleep(Duration::from_secs(5)).await;
        activity.received();
        assert_eq!(watchdog.await.unwrap(), Expired::Head(Duration::from_secs(10)));
        assert_eq!(started.elapsed(), Duration::from_secs(15));

        // A busy connection (waiting for its answer) never expires; once answered, idle counts again.
        let activity = Activity::new(Duration::from_secs(60), Duration::from_secs(10));
        activity.received();
        activity.request_started();
        activity.body_received();
        let a = activity.clone();
        let watchdog = tokio::spawn(async move { a.expired().await });
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(!watchdog.is_finished());
        let answered = Instant::now();
        activity.request_finished();
        assert_eq!(watchdog.await.unwrap(), Expired::Idle(Duration::from_secs(60)));
        assert_eq!(answered.elapsed(), Duration::from_secs(60));
    }
}
