//! Limits every network input shares: how many connections it holds, and how long a client may
//! take.
//!
//! - [`ConnectionSlots`]: at most `max_connections` open at once. When all are taken, the
//!   connection that has waited on its client the longest (idle, or sending one head or one
//!   body) is closed to make room ([`ConnectionSlots::take_or_evict`]), so clients that open
//!   connections and then stall cannot lock out one that sends a request at once; a connection
//!   waiting on the pipeline for its answer is never chosen. A connection read through
//!   [`WatchedIo`] is chosen only once its reader has found its socket empty (it has been read
//!   at least once, and nothing it sent waits unread), so no eviction throws away bytes already
//!   received; for `tcp` and `syslog` only once it has sent nothing for [`EVICTION_QUIET`]
//!   ([`FIRST_BYTES_GRACE`] before its first bytes). Evictions are counted in
//!   [`ConnectionFigures`]. At most `max_connections` more
//!   may still be closing (see [`StreamReader`]); beyond that nobody is evicted. When nothing can
//!   be evicted, the new one is refused (the input decides how: closed, or answered "busy"
//!   first), or, for the inputs that ask for it, waited for a while ([`serve_connections`]).
//! - [`Activity`]: what a connection is doing — idle between requests, receiving a request's
//!   head, or busy with a request — and when it entered that state, fed by [`WatchedIo`] (any
//!   byte received, and the socket found empty) and by the input (a request started or
//!   finished). [`Activity::expired`] tells when the connection has been idle longer than
//!   `idle_timeout` or has been sending one head for longer than `header_timeout`, so that a
//!   client that sends half a request and then nothing is closed, while one waiting for its
//!   answer is not. A body's own timeout belongs to whoever reads the body.
//! - [`listen`]: the listening socket, with a backlog of [`LISTEN_BACKLOG`] (the kernel
//!   caps it at `net.core.somaxconn`) instead of tokio's (128 measured here): a burst of
//!   connections larger than the backlog loses the surplus's handshakes and their clients'
//!   first lines wait out SYN retries.
//! - [`accept_connections`] and [`serve_connections`]: the accept loop of the stream inputs
//!   (`tcp`, `syslog`, `beats`): each connection in a task of its own holding a slot, accept
//!   errors (out of file descriptors) logged and retried without spinning, and the tasks waited
//!   for at shutdown.
//! - [`StreamReader`]: the reads of an input without acknowledgements (`tcp`, `syslog`), each
//!   counted in the input's `bytes_in` (what TLS decrypted, before framing). An evicted
//!   connection is not dropped with what its client is still sending: it keeps reading (and
//!   queueing) until the client closes, pauses for [`EVICTION_QUIET`], or [`EVICTION_LINGER`]
//!   has passed; only what is then still unread is discarded, and counted.
//!   A connection reset by its client (what it sent and the input had not read is lost in the
//!   kernel) is logged at warn and counted. Every line a peer can trigger per connection is
//!   rate-limited ([`LogEvery`]).
//! - [`tls_handshake`]: the TLS handshake of an accepted connection, bounded by
//!   [`TLS_HANDSHAKE_TIMEOUT`] and by the connection's own timeouts, so that a client that
//!   connects and never finishes its handshake holds its slot no longer than an idle one; one
//!   evicted while its client is still handshaking gets [`EVICTION_QUIET`] to finish, so that
//!   what it sends right after is read.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::BufMut;
use parking_lot::Mutex;
use sluice_core::figures::{Figure, Publish, Spec, Unit};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// What the stream inputs count about their connections, at `/metrics` and `/stats` with the
/// input's other figures.
#[derive(Debug, Default)]
pub struct ConnectionFigures {
    /// Connections holding a slot now, those being closed after an eviction included: the
    /// count [`ConnectionSlots`] keeps, read here as a gauge.
    open: AtomicUsize,
    evicted: AtomicU64,
    evicted_bytes_discarded: AtomicU64,
    reset: AtomicU64,
    /// Lines a peer can cause once per connection, each logged at most once per [`LOG_EVERY`].
    pub evicted_log: LogEvery,
    pub discarded_log: LogEvery,
    pub reset_log: LogEvery,
    pub expired_log: LogEvery,
}

impl ConnectionFigures {
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    pub fn evicted_bytes_discarded(&self) -> u64 {
        self.evicted_bytes_discarded.load(Ordering::Relaxed)
    }

    pub fn reset(&self) -> u64 {
        self.reset.load(Ordering::Relaxed)
    }
}

impl Publish for ConnectionFigures {
    fn figures(&self) -> Vec<Figure> {
        vec![
            Spec::gauge(
                "connections_open",
                "Client connections open now (those being closed after an eviction included).",
            )
            .value(self.open.load(Ordering::Relaxed) as u64),
            Spec::counter(
                "connections_evicted_total",
                "Connections closed to make room for a new one when max_connections were open.",
            )
            .value(self.evicted()),
            Spec::counter(
                "evicted_bytes_discarded_total",
                "Bytes an evicted connection's client sent that were still unread when it was closed.",
            )
            .in_unit(Unit::Bytes)
            .value(self.evicted_bytes_discarded()),
            Spec::counter(
                "connections_reset_total",
                "Connections reset by their client: what it sent that was not yet read is lost.",
            )
            .value(self.reset()),
        ]
    }
}

/// How often at most a line that peers can cause per connection is logged.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// Lets a log line through at most once per [`LOG_EVERY`], saying how many were held back.
#[derive(Debug, Default)]
pub struct LogEvery {
    last: Mutex<Option<Instant>>,
    held_back: AtomicU64,
}

impl LogEvery {
    /// `Some(lines held back since the last one)` when this one is to be logged.
    pub fn check(&self) -> Option<u64> {
        let mut last = self.last.lock();
        if last.is_some_and(|t| t.elapsed() < LOG_EVERY) {
            self.held_back.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        *last = Some(Instant::now());
        Some(self.held_back.swap(0, Ordering::Relaxed))
    }
}

/// The TLS handshake refusals of one input: each reason logged at most once per
/// [`LOG_EVERY`], saying how many were held back, since anyone who reaches the port can cause
/// one per connection. Reasons are kept apart, so a second kind of refusal is not hidden
/// behind the first; at most [`HandshakeLog::REASONS`] of them are remembered.
#[derive(Debug, Default)]
pub struct HandshakeLog {
    by_reason: Mutex<HashMap<String, Arc<LogEvery>>>,
}

impl HandshakeLog {
    pub const REASONS: usize = 64;

    /// Logs `why` for the connection from `peer` to `input` (its type) if it is due.
    pub fn refused(&self, ctx: &crate::InputContext, input: &str, peer: SocketAddr, why: &str) {
        if let Some(held_back) = self.due(why) {
            tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %peer, also_since_last_log = held_back,
                "{input} input closed a connection: {why} (logged at most once per 10 s per reason)");
        }
    }

    /// `Some(refusals held back since)` when a refusal for `why` is to be logged now.
    fn due(&self, why: &str) -> Option<u64> {
        let log = {
            let mut by_reason = self.by_reason.lock();
            if by_reason.len() >= Self::REASONS && !by_reason.contains_key(why) {
                by_reason.clear();
            }
            by_reason.entry(why.to_string()).or_default().clone()
        };
        log.check()
    }
}

/// Counts open connections against `max_connections`, and knows each one's activity.
#[derive(Debug)]
pub struct ConnectionSlots {
    max: usize,
    live: Mutex<HashMap<u64, Arc<Activity>>>,
    next_id: AtomicU64,
    figures: Arc<ConnectionFigures>,
    /// Told when a slot is given back.
    freed: Notify,
    /// How long a connection must have waited on its client before it may be evicted.
    min_idle: Duration,
    /// The same for a connection whose client has sent nothing yet.
    min_idle_before_first_bytes: Duration,
}

impl ConnectionSlots {
    pub fn new(max: usize) -> Arc<ConnectionSlots> {
        ConnectionSlots::with(max, Arc::new(ConnectionFigures::default()), Duration::ZERO, Duration::ZERO)
    }

    /// Slots for an input without acknowledgements, whose evictions are counted in `figures`:
    /// only a connection that has sent nothing for [`EVICTION_QUIET`] may be evicted, so that a
    /// client pausing between two writes is not cut off in the middle, and one that has sent
    /// nothing at all only after [`FIRST_BYTES_GRACE`], so that a client slow to write after
    /// connecting is not taken for one that stalls (a newcomer waits instead, see
    /// [`serve_connections`]).
    pub fn counted_in(max: usize, figures: Arc<ConnectionFigures>) -> Arc<ConnectionSlots> {
        ConnectionSlots::with(max, figures, EVICTION_QUIET, FIRST_BYTES_GRACE)
    }

    fn with(
        max: usize,
        figures: Arc<ConnectionFigures>,
        min_idle: Duration,
        min_idle_before_first_bytes: Duration,
    ) -> Arc<ConnectionSlots> {
        Arc::new(ConnectionSlots {
            max: max.max(1),
            live: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            figures,
            freed: Notify::new(),
            min_idle,
            min_idle_before_first_bytes,
        })
    }

    pub fn figures(&self) -> &Arc<ConnectionFigures> {
        &self.figures
    }

    /// A slot, if fewer than `max` are taken; it is given back when dropped.
    fn try_take(self: &Arc<Self>) -> Option<ConnectionSlot> {
        let mut open = self.figures.open.load(Ordering::Relaxed);
        loop {
            if open >= self.max {
                return None;
            }
            match self.figures.open.compare_exchange_weak(open, open + 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Some(self.slot()),
                Err(now) => open = now,
            }
        }
    }

    /// A slot for a new connection whose activity is `activity`: a free one, or the one of the
    /// connection idle (or in one head) the longest, which is told to close. `None` when no
    /// open connection can be evicted (each busy with a request, not yet read, or with bytes
    /// unread), or when `max_connections` evicted ones are still closing.
    pub fn take_or_evict(self: &Arc<Self>, activity: &Arc<Activity>) -> Option<ConnectionSlot> {
        let slot = match self.try_take() {
            Some(slot) => slot,
            None => {
                // An evicted connection keeps its slot while it reads its client's last bytes:
                // the slots beyond `max` are those, and there are at most `max` of them.
                if self.figures.open.load(Ordering::Acquire) >= self.max * 2 {
                    return None;
                }
                let victim = {
                    let live = self.live.lock();
                    live.values()
                        .filter_map(|a| a.evictable_since().map(|since| (since, a.clone())))
                        .filter(|(since, a)| {
                            let needed = if a.received_any.load(Ordering::Acquire) {
                                self.min_idle
                            } else {
                                self.min_idle_before_first_bytes
                            };
                            since.elapsed() >= needed
                        })
                        .min_by_key(|(since, _)| *since)
                };
                let (_, victim) = victim?;
                victim.evict();
                self.figures.evicted.fetch_add(1, Ordering::Relaxed);
                // The evicted connection gives its slot back as it closes, a moment later.
                self.figures.open.fetch_add(1, Ordering::AcqRel);
                self.slot()
            }
        };
        self.live.lock().insert(slot.id, activity.clone());
        Some(slot)
    }

    /// Like [`ConnectionSlots::take_or_evict`], but when nothing can be evicted, waits up to
    /// `wait` for a slot to be given back or a connection to become evictable.
    pub async fn take_or_evict_within(
        self: &Arc<Self>,
        activity: &Arc<Activity>,
        wait: Duration,
    ) -> Option<ConnectionSlot> {
        let deadline = Instant::now() + wait;
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(slot) = self.take_or_evict(activity) {
                return Some(slot);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            // A connection becomes evictable without telling anyone (its reader finds its socket
            // empty), so look again now and then as well.
            let look_again = deadline.min(now + Duration::from_millis(20));
            tokio::select! {
                _ = &mut freed => {}
                _ = tokio::time::sleep_until(look_again) => {}
            }
        }
    }

    fn slot(self: &Arc<Self>) -> ConnectionSlot {
        ConnectionSlot { slots: self.clone(), id: self.next_id.fetch_add(1, Ordering::Relaxed) }
    }

    /// Connections holding a slot now.
    pub fn open(&self) -> usize {
        self.figures.open.load(Ordering::Relaxed)
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
        self.slots.figures.open.fetch_sub(1, Ordering::AcqRel);
        self.slots.freed.notify_waiters();
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
    /// Read through a [`WatchedIo`], which keeps `drained` up to date.
    watched: AtomicBool,
    /// The last read found the socket empty: nothing the client sent waits unread.
    drained: AtomicBool,
    /// The client has sent something.
    received_any: AtomicBool,
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
            watched: AtomicBool::new(false),
            drained: AtomicBool::new(false),
            received_any: AtomicBool::new(false),
        })
    }

    /// Since when the connection waits on its client (idle, in a head or in a body); `None`
    /// while it waits on the pipeline (or was evicted), and for a watched connection until its
    /// reader has found the socket empty, so that no eviction drops bytes already received.
    fn evictable_since(&self) -> Option<Instant> {
        if self.evicted.load(Ordering::Relaxed) {
            return None;
        }
        if self.watched.load(Ordering::Acquire) && !self.drained.load(Ordering::Acquire) {
            return None;
        }
        match *self.phase.lock() {
            Phase::Idle(since) | Phase::Head(since) | Phase::Body(since) => Some(since),
            Phase::Busy => None,
        }
    }

    /// Whether the connection was asked to close to make room.
    pub fn was_evicted(&self) -> bool {
        self.evicted.load(Ordering::Acquire)
    }

    /// Asks the connection to close (see [`Activity::expired`]).
    fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        self.changed.notify_one();
    }

    /// Bytes arrived: an idle connection starts a request's head.
    fn received(&self) {
        self.drained.store(false, Ordering::Release);
        self.received_any.store(true, Ordering::Release);
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
    /// From now on the connection can be evicted only while its reader finds `inner` empty.
    pub fn new(inner: S, activity: Arc<Activity>) -> WatchedIo<S> {
        activity.watched.store(true, Ordering::Release);
        WatchedIo { inner, activity }
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WatchedIo<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        match &r {
            Poll::Ready(Ok(())) if buf.filled().len() > before => self.activity.received(),
            Poll::Pending => self.activity.drained.store(true, Ordering::Release),
            _ => {}
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
/// [`ConnectionSlots::take_or_evict`]); when none can, the new one is closed at once, counted
/// in `refused` and logged with the peer. `kind` names the input in logs (`tcp`, `beats`).
pub async fn accept_connections<F, Fut>(
    listener: tokio::net::TcpListener,
    max_connections: usize,
    idle_timeout: Duration,
    ctx: &crate::InputContext,
    kind: &'static str,
    handle: F,
) where
    F: FnMut(tokio::net::TcpStream, std::net::SocketAddr, Arc<Activity>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let slots = ConnectionSlots::new(max_connections);
    accept_loop(listener, &slots, idle_timeout, Duration::ZERO, false, ctx, kind, handle).await;
}

/// [`accept_connections`] for an input that reads each connection through a [`WatchedIo`]
/// (and a [`StreamReader`]), over `slots`, which count its evictions. A connection can be
/// evicted only once its reader has found its socket empty. When nothing can be evicted, a new
/// connection waits unread, up to `wait_for_room`, for a slot before it is refused: up to
/// `max_connections` of them in tasks of their own, so the listen queue keeps being emptied,
/// and beyond that in the accept loop, the others then waiting in the listen queue.
pub async fn serve_connections<F, Fut>(
    listener: tokio::net::TcpListener,
    slots: &Arc<ConnectionSlots>,
    idle_timeout: Duration,
    wait_for_room: Duration,
    ctx: &crate::InputContext,
    kind: &'static str,
    handle: F,
) where
    F: FnMut(tokio::net::TcpStream, std::net::SocketAddr, Arc<Activity>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    accept_loop(listener, slots, idle_timeout, wait_for_room, true, ctx, kind, handle).await;
}

#[allow(clippy::too_many_arguments)]
async fn accept_loop<F, Fut>(
    listener: tokio::net::TcpListener,
    slots: &Arc<ConnectionSlots>,
    idle_timeout: Duration,
    wait_for_room: Duration,
    watched: bool,
    ctx: &crate::InputContext,
    kind: &'static str,
    mut handle: F,
) where
    F: FnMut(tokio::net::TcpStream, std::net::SocketAddr, Arc<Activity>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut tasks = tokio::task::JoinSet::new();
    let refused_log = Arc::new(LogEvery::default());
    // Accepted connections waiting for a place, at most `max_connections`.
    let waiting = Arc::new(AtomicUsize::new(0));
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
        // Not evictable before its task has read it once: that task may not have run yet.
        activity.watched.store(watched, Ordering::Release);
        let slot = slots.take_or_evict(&activity);
        if slot.is_none() && !wait_for_room.is_zero() && waiting.load(Ordering::Acquire) < slots.max() {
            // Accepted, and waiting for a place unread: a listen queue left to overflow loses
            // connections whose clients believe them open (with SYN cookies, their bytes too).
            waiting.fetch_add(1, Ordering::AcqRel);
            let connection = handle(stream, peer, activity.clone());
            let (slots, waiting, refused_log) = (slots.clone(), waiting.clone(), refused_log.clone());
            let (metrics, shutdown) = (ctx.metrics.clone(), ctx.shutdown.clone());
            let (pipeline, input) = (ctx.pipeline.clone(), ctx.id.clone());
            tasks.spawn(async move {
                let slot = tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => None,
                    slot = slots.take_or_evict_within(&activity, wait_for_room) => slot,
                };
                waiting.fetch_sub(1, Ordering::AcqRel);
                match slot {
                    Some(slot) => {
                        connection.await;
                        drop(slot);
                    }
                    None if shutdown.is_cancelled() => {}
                    None => {
                        metrics.refused.add(1);
                        if let Some(held_back) = refused_log.check() {
                            tracing::warn!(pipeline = %pipeline, input = %input, peer = %peer, max_connections = slots.max(),
                                waited = ?wait_for_room, not_logged_since = held_back,
                                "{kind} input refused a connection: max_connections reached and none of them could make \
                                 room (logged once per 10 s)");
                        }
                    }
                }
            });
            continue;
        }
        let slot = match slot {
            Some(slot) => Some(slot),
            None if wait_for_room.is_zero() => None,
            // As many waiting as there are places: these wait in the listen queue.
            None => tokio::select! {
                biased;
                _ = ctx.shutdown.cancelled() => break,
                slot = slots.take_or_evict_within(&activity, wait_for_room) => slot,
            },
        };
        let Some(slot) = slot else {
            ctx.metrics.refused.add(1);
            if let Some(held_back) = refused_log.check() {
                tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %peer, max_connections = slots.max(),
                    waited = ?wait_for_room, not_logged_since = held_back,
                    "{kind} input refused a connection: max_connections reached and none of them could make room \
                     (logged once per 10 s)");
            }
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

/// How long an evicted connection of an input without acknowledgements keeps reading once its
/// client pauses: what a client that just connected, or is in the middle of a write, sends
/// arrives well within it.
pub const EVICTION_QUIET: Duration = Duration::from_millis(500);

/// How long a connection of an input without acknowledgements whose client has sent nothing
/// yet is safe from eviction: a client slow to write after connecting is not taken for one
/// that stalls. Well under [`serve_connections`]' wait for room, so that connections that
/// never send cannot make a newcomer wait long enough to be refused.
pub const FIRST_BYTES_GRACE: Duration = Duration::from_secs(2);

/// The longest an evicted connection keeps reading, however much its client still sends.
pub const EVICTION_LINGER: Duration = Duration::from_secs(5);

/// The most counted of what is left unread when an evicted connection closes (more is not
/// worth reading only to count it).
const DISCARD_COUNT_LIMIT: usize = 4 << 20;

/// What [`StreamReader::read`] got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// This many bytes were added to the buffer.
    Read(usize),
    /// The connection is over: the client closed it, it failed, ran out of a timeout, finished
    /// closing after an eviction, or the input is shutting down. Logged and counted already.
    End,
}

/// Reads one connection of an input without acknowledgements (`tcp`, `syslog`): idle and
/// eviction handling, the bytes read (the input's `bytes_in`: after TLS, before framing; what
/// is discarded at an eviction is counted apart), and the logging and counting of how a
/// connection ends.
pub struct StreamReader<'a> {
    ctx: &'a crate::InputContext,
    kind: &'static str,
    peer: SocketAddr,
    activity: &'a Activity,
    figures: &'a ConnectionFigures,
    /// Set once evicted: when to stop reading.
    closing: Option<Closing>,
}

#[derive(Debug, Clone, Copy)]
struct Closing {
    /// Reads end when nothing arrives before this.
    quiet_until: Instant,
    /// Reads end at this, whatever arrives.
    until: Instant,
}

impl<'a> StreamReader<'a> {
    pub fn new(
        ctx: &'a crate::InputContext,
        kind: &'static str,
        peer: SocketAddr,
        activity: &'a Activity,
        figures: &'a ConnectionFigures,
    ) -> StreamReader<'a> {
        StreamReader { ctx, kind, peer, activity, figures, closing: None }
    }

    /// Reads what the client sends next into `buf` (at least one byte unless it is the end).
    /// While it waits, the connection counts as idle (its timeout runs, and it may be evicted).
    pub async fn read<S, B>(&mut self, stream: &mut S, buf: &mut B) -> Step
    where
        S: AsyncRead + Unpin,
        B: BufMut,
    {
        let (ctx, kind, peer) = (self.ctx, self.kind, self.peer);
        self.activity.request_finished();
        loop {
            let r = match self.closing {
                None => tokio::select! {
                    biased;
                    // Shutdown first: a client that never pauses must not keep the input running.
                    _ = ctx.shutdown.cancelled() => return Step::End,
                    // Reads before the timeouts: what has arrived is taken before any closing.
                    r = stream.read_buf(buf) => r,
                    why = self.activity.expired() => {
                        if why == Expired::Evicted {
                            self.start_closing();
                            continue;
                        }
                        ctx.metrics.refused.add(1);
                        if let Some(held_back) = self.figures.expired_log.check() {
                            tracing::info!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %peer, not_logged_since = held_back,
                                "{kind} input closed a connection that {why} (logged once per 10 s)");
                        }
                        return Step::End;
                    }
                },
                Some(closing) => tokio::select! {
                    biased;
                    _ = ctx.shutdown.cancelled() => return Step::End,
                    r = stream.read_buf(buf) => r,
                    _ = tokio::time::sleep_until(closing.quiet_until.min(closing.until)) => {
                        if Instant::now() >= closing.until {
                            self.discard_unread(stream).await;
                            return Step::End;
                        }
                        // Bytes that arrived as the pause ran out may not have been reported
                        // yet: let the runtime look, then read what is there, if anything.
                        tokio::task::yield_now().await;
                        match tokio::time::timeout(Duration::ZERO, stream.read_buf(buf)).await {
                            Ok(r) => r,
                            Err(_) => return Step::End,
                        }
                    }
                },
            };
            return match r {
                Ok(0) => Step::End,
                Ok(n) => {
                    ctx.metrics.bytes_in.add(n as u64);
                    if let Some(closing) = &mut self.closing {
                        closing.quiet_until = Instant::now() + EVICTION_QUIET;
                    }
                    self.activity.body_received();
                    Step::Read(n)
                }
                Err(e) => {
                    self.failed(&e);
                    Step::End
                }
            };
        }
    }

    fn start_closing(&mut self) {
        let (ctx, kind, peer) = (self.ctx, self.kind, self.peer);
        ctx.metrics.refused.add(1);
        let now = Instant::now();
        self.closing = Some(Closing { quiet_until: now + EVICTION_QUIET, until: now + EVICTION_LINGER });
        if let Some(held_back) = self.figures.evicted_log.check() {
            tracing::info!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %peer, evicted_total = self.figures.evicted(),
                not_logged_since = held_back,
                "{kind} input is closing a connection that {}; it reads what the client still sends until it \
                 pauses for {EVICTION_QUIET:?} (at most {EVICTION_LINGER:?}) (logged once per 10 s)",
                Expired::Evicted);
        }
    }

    /// Counts what the client sent that is still unread as the evicted connection closes.
    async fn discard_unread<S: AsyncRead + Unpin>(&mut self, stream: &mut S) {
        let mut scratch = vec![0u8; 64 << 10];
        let mut discarded = 0usize;
        while discarded < DISCARD_COUNT_LIMIT {
            // Only what is there now: a zero timeout polls the read once.
            match tokio::time::timeout(Duration::ZERO, stream.read(&mut scratch)).await {
                Ok(Ok(n)) if n > 0 => discarded += n,
                _ => break,
            }
        }
        if discarded == 0 {
            return;
        }
        self.figures.evicted_bytes_discarded.fetch_add(discarded as u64, Ordering::Relaxed);
        let (ctx, kind, peer) = (self.ctx, self.kind, self.peer);
        if let Some(held_back) = self.figures.discarded_log.check() {
            tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %peer, bytes = discarded,
                discarded_total = self.figures.evicted_bytes_discarded(), not_logged_since = held_back,
                "{kind} input closed an evicted connection whose client kept sending for {EVICTION_LINGER:?}; \
                 what it had sent and was not read is discarded (logged once per 10 s)");
        }
    }

    fn failed(&self, e: &io::Error) {
        let (ctx, kind, peer) = (self.ctx, self.kind, self.peer);
        if matches!(e.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted) {
            self.figures.reset.fetch_add(1, Ordering::Relaxed);
            if let Some(held_back) = self.figures.reset_log.check() {
                tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %peer, error = %e,
                    reset_total = self.figures.reset(), not_logged_since = held_back,
                    "{kind} connection reset by the client: what it sent that was not yet read is lost \
                     (logged once per 10 s)");
            }
        } else {
            tracing::debug!(pipeline = %ctx.pipeline, input = %ctx.id, peer = %peer, error = %e, "{kind} connection read failed");
        }
    }
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
    let handshake = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, sluice_tls::ServerStream::accept(tls, stream));
    tokio::pin!(handshake);
    let done = |r: Result<io::Result<sluice_tls::ServerStream<S>>, tokio::time::error::Elapsed>| match r {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => Err(format!("TLS handshake failed: {}", sluice_tls::describe_handshake_error(&e))),
        Err(_) => Err(format!("TLS handshake not completed within {}s", TLS_HANDSHAKE_TIMEOUT.as_secs())),
    };
    let why = tokio::select! {
        biased;
        _ = shutdown.cancelled() => return Err("the input is shutting down".to_string()),
        why = activity.expired() => why,
        r = &mut handshake => return done(r),
    };
    if why != Expired::Evicted {
        return Err(format!("closed during the TLS handshake: the connection {why}"));
    }
    // A client in the middle of its handshake sends its first data right after it: let it
    // finish, and the input read that before the connection closes.
    tokio::select! {
        biased;
        _ = shutdown.cancelled() => Err("the input is shutting down".to_string()),
        _ = tokio::time::sleep(EVICTION_QUIET) => Err(format!("closed during the TLS handshake: the connection {why}")),
        r = &mut handshake => done(r),
    }
}

/// The listen backlog asked for; the kernel takes the smaller of it and `net.core.somaxconn`
/// (4096 by default since Linux 5.4).
pub const LISTEN_BACKLOG: i32 = 4096;

/// Binds a listening TCP socket on `address` (the first of its addresses that binds), with
/// `SO_REUSEADDR` as tokio's own bind sets it and a backlog of [`LISTEN_BACKLOG`].
pub async fn listen(address: &str) -> std::io::Result<tokio::net::TcpListener> {
    let mut last = None;
    for addr in tokio::net::lookup_host(address).await? {
        match listen_on(addr) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address to listen on")))
}

fn listen_on(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(LISTEN_BACKLOG)?;
    tokio::net::TcpListener::from_std(socket.into())
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;
    use sluice_core::figures::FigureKind;

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

    #[test]
    fn the_open_connections_show_in_the_inputs_figures() {
        let figures = Arc::new(ConnectionFigures::default());
        let slots = ConnectionSlots::counted_in(4, figures.clone());
        let open = || {
            figures
                .figures()
                .iter()
                .find(|f| f.name == "connections_open")
                .map(|f| (f.count(), f.kind == FigureKind::Counter))
        };
        assert_eq!(open(), Some((0, false)), "a gauge");
        let a = slots.try_take().unwrap();
        let b = slots.try_take().unwrap();
        assert_eq!(open(), Some((2, false)));
        drop(a);
        drop(b);
        assert_eq!(open(), Some((0, false)));
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
    async fn a_watched_connection_is_evicted_only_once_read_with_nothing_unread() {
        use tokio::io::AsyncWriteExt;
        let slots = ConnectionSlots::new(1);
        let (mut client, server) = tokio::io::duplex(64);
        let first = Activity::new(Duration::ZERO, Duration::ZERO);
        let mut watched = WatchedIo::new(server, first.clone());
        let _first_slot = slots.take_or_evict(&first).unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
        // Its reader has not run: whatever the client sent may be waiting unread.
        let newcomer = || Activity::new(Duration::ZERO, Duration::ZERO);
        assert!(slots.take_or_evict(&newcomer()).is_none());
        client.write_all(b"line\n").await.unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(watched.read(&mut buf).await.unwrap(), 5);
        first.request_finished();
        assert!(slots.take_or_evict(&newcomer()).is_none(), "read, but not yet found empty");
        // The reader finds the socket empty: now it may make room.
        assert!(tokio::time::timeout(Duration::from_millis(10), watched.read(&mut buf)).await.is_err());
        let _second_slot = slots.take_or_evict(&newcomer()).expect("the drained connection makes room");
        assert!(first.was_evicted());
        assert_eq!(slots.figures().evicted(), 1);
        // The evicted one still holds its slot while it closes, and with `max` of them closing
        // nobody else is evicted, however idle.
        assert_eq!(slots.open(), 2);
        let idle = Activity::new(Duration::ZERO, Duration::ZERO);
        assert!(slots.take_or_evict(&idle).is_none());
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

    /// The backlog of a listener, as the kernel keeps it (`tcpi_sacked` of a listening
    /// socket's `TCP_INFO` is its maximum accept queue).
    fn backlog(listener: &tokio::net::TcpListener) -> u32 {
        use std::os::fd::AsRawFd;
        // SAFETY: `tcp_info` is a C struct of integers, for which all zeroes is a valid value.
        let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
        let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
        // SAFETY: `info` is a writable `tcp_info` of `len` bytes and the descriptor is open for
        // the call's duration.
        let r = unsafe {
            libc::getsockopt(listener.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_INFO, (&raw mut info).cast(), &mut len)
        };
        assert_eq!(r, 0, "getsockopt(TCP_INFO): {}", std::io::Error::last_os_error());
        info.tcpi_sacked
    }

    #[test]
    fn handshake_refusals_are_logged_once_per_reason_and_period() {
        let log = HandshakeLog::default();
        assert_eq!(log.due("TLS handshake failed: the client sent no client certificate"), Some(0));
        for _ in 0..1000 {
            assert_eq!(log.due("TLS handshake failed: the client sent no client certificate"), None);
        }
        // Another reason is not hidden behind the first.
        assert_eq!(log.due("the client does not speak TLS"), Some(0));
        // Reasons past the bound start the memory over rather than grow it.
        for i in 0..HandshakeLog::REASONS * 2 {
            assert!(log.due(&format!("reason {i}")).is_some());
        }
        assert!(log.by_reason.lock().len() <= HandshakeLog::REASONS);
    }

    #[tokio::test]
    async fn listeners_ask_for_the_largest_backlog_the_kernel_allows() {
        let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn").unwrap().trim().parse().unwrap();
        assert!(
            somaxconn > 128,
            "net.core.somaxconn is {somaxconn}: this test needs a kernel that allows more than 128"
        );
        let listener = listen("127.0.0.1:0").await.unwrap();
        assert_eq!(backlog(&listener), somaxconn.min(LISTEN_BACKLOG as u32));
        // What tokio's own bind asks for (128 here): the figure this test tells apart.
        let default = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        assert!(backlog(&default) < backlog(&listener), "tokio's bind: {}", backlog(&default));
        // A taken address fails as a bind does, naming the cause.
        let taken = listener.local_addr().unwrap().to_string();
        let e = listen(&taken).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
        assert!(listen("no-such-host.invalid:1").await.is_err());
    }
}
