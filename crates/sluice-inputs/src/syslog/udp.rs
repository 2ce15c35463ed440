//! `syslog` over UDP (RFC 5426): one datagram is one message.
//!
//! The socket is made with `socket2`, so that `receive_buffer_bytes` (SO_RCVBUF) is set before
//! it is bound; the size the kernel granted is logged, with a warning when it is less than
//! asked (Linux caps it at `net.core.rmem_max`). The input waits until the socket is
//! readable, then drains every datagram ready (up to [`MAX_BATCH_DATAGRAMS`] or
//! [`MAX_BATCH_BYTES`]) with `recvmsg` straight into one buffer, and pushes them as one batch.
//!
//! Guarantees and limits:
//! - A datagram longer than `max_message_bytes` is cut to it and tagged `_line_truncated`.
//! - UDP has no flow control: while the queue is full or the memory budget spent, datagrams
//!   wait in the socket's receive buffer, and once it is full the kernel drops them. Those
//!   drops are counted: the kernel reports its running count on each datagram
//!   (`SO_RXQ_OVFL`), and the `drops` column of `/proc/net/udp` (or `udp6`) is read when the
//!   figures are asked for; the larger is exported as `datagrams_dropped_total` at `/metrics`
//!   and `datagrams_dropped` in `/stats`. A rising count is also logged, at most every 10 s.
//! - On shutdown the input stops reading; datagrams still in the socket's buffer are lost.

use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_core::figures::{Figure, Publish, Spec, Unit};
use sluice_core::value::now_nanos;
use sluice_core::{Batch, Event, Str};
use socket2::{Domain, MaybeUninitSlice, MsgHdrMut, Protocol, SockAddr, SockRef, Socket, Type};
use tokio::io::Interest;
use tokio::net::UdpSocket;

use super::{Sender, Settings};
use crate::{InputContext, InputError};

/// Datagrams drained into one batch at most.
pub(super) const MAX_BATCH_DATAGRAMS: usize = 1024;
/// Bytes drained into one batch at most (at least one datagram).
pub(super) const MAX_BATCH_BYTES: usize = 4 << 20;
/// The largest UDP payload.
const MAX_DATAGRAM: usize = 65_535;
/// The least time between two warnings about dropped datagrams.
const DROP_WARNING_EVERY: Duration = Duration::from_secs(10);

/// Binds the socket, with `receive_buffer_bytes` and drop counting set first.
pub(super) async fn bind(settings: &Settings, ctx: &InputContext) -> Result<UdpSocket, InputError> {
    let address = &settings.address;
    let fail = |e: io::Error| InputError(format!("syslog input cannot listen on udp {address}: {e}"));
    let addr = tokio::net::lookup_host(address.as_str())
        .await
        .map_err(fail)?
        .next()
        .ok_or_else(|| fail(io::Error::new(io::ErrorKind::NotFound, "the host resolves to no address")))?;
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP)).map_err(fail)?;
    if let Some(wanted) = settings.receive_buffer_bytes {
        if let Err(e) = socket.set_recv_buffer_size(wanted) {
            tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, error = %e, receive_buffer_bytes = wanted,
                "syslog input could not set its receive buffer size; the kernel's default stays");
        }
        let granted = socket.recv_buffer_size().unwrap_or(0);
        // Linux reports twice the size asked for (it counts its own bookkeeping); half of it
        // is what datagrams get.
        let usable = if cfg!(target_os = "linux") { granted / 2 } else { granted };
        if usable < wanted {
            tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, receive_buffer_bytes = wanted, granted_bytes = granted,
                "the kernel granted the syslog input a smaller receive buffer than receive_buffer_bytes; \
                 raise net.core.rmem_max to allow more");
        } else {
            tracing::info!(pipeline = %ctx.pipeline, input = %ctx.id, receive_buffer_bytes = wanted, granted_bytes = granted,
                "syslog input receive buffer set (the kernel reports twice the size asked for on Linux)");
        }
    }
    count_drops(&socket);
    socket.bind(&addr.into()).map_err(fail)?;
    socket.set_nonblocking(true).map_err(fail)?;
    UdpSocket::from_std(socket.into()).map_err(fail)
}

/// Asks the kernel to report its count of dropped datagrams with each one received.
#[cfg(target_os = "linux")]
fn count_drops(socket: &Socket) {
    use std::os::fd::AsRawFd;
    let on: libc::c_int = 1;
    // SAFETY: a valid descriptor, and a pointer to an int with its size.
    let r = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RXQ_OVFL,
            (&on as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if r != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "SO_RXQ_OVFL is not available; drops are read from /proc only");
    }
}

#[cfg(not(target_os = "linux"))]
fn count_drops(_socket: &Socket) {}

/// The input's own figures, for `/metrics` and `/stats`.
pub(super) struct UdpFigures {
    received: AtomicU64,
    /// The kernel's running count of drops, as last reported with a datagram.
    dropped_reported: AtomicU64,
    /// The receive buffer size the kernel reports.
    buffer: u64,
    /// The socket's inode and family, to find it in `/proc/net/udp`.
    inode: Option<u64>,
    v6: bool,
}

impl UdpFigures {
    fn new(socket: &UdpSocket) -> UdpFigures {
        let sock = SockRef::from(socket);
        UdpFigures {
            received: AtomicU64::new(0),
            dropped_reported: AtomicU64::new(0),
            buffer: sock.recv_buffer_size().map_or(0, |b| b as u64),
            inode: socket_inode(socket),
            v6: socket.local_addr().is_ok_and(|a| a.is_ipv6()),
        }
    }

    /// Datagrams the kernel dropped for this socket, as best known now.
    pub(super) fn dropped(&self) -> u64 {
        let reported = self.dropped_reported.load(Ordering::Relaxed);
        let from_proc = self.inode.and_then(|inode| proc_drops(self.v6, inode)).unwrap_or(0);
        reported.max(from_proc)
    }

    pub(super) fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }
}

impl Publish for UdpFigures {
    fn figures(&self) -> Vec<Figure> {
        vec![
            Spec::counter("datagrams_received_total", "Datagrams a syslog UDP input received.").value(self.received()),
            Spec::counter(
                "datagrams_dropped_total",
                "Datagrams the kernel dropped for a syslog UDP input because its receive buffer was full.",
            )
            .value(self.dropped()),
            Spec::gauge(
                "receive_buffer_bytes",
                "The receive buffer size the kernel reports for a syslog UDP input's socket.",
            )
            .in_unit(Unit::Bytes)
            .value(self.buffer),
        ]
    }
}

#[cfg(unix)]
fn socket_inode(socket: &UdpSocket) -> Option<u64> {
    use std::os::fd::AsRawFd;
    let mut stat = MaybeUninit::<libc::stat>::uninit();
    // SAFETY: a valid descriptor and room for a `stat`; it is read only when fstat succeeded.
    let ok = unsafe { libc::fstat(socket.as_raw_fd(), stat.as_mut_ptr()) } == 0;
    #[allow(clippy::unnecessary_cast)] // `ino_t` is not `u64` everywhere.
    // SAFETY: only when fstat returned 0, that is, filled `stat` whole.
    ok.then(|| unsafe { stat.assume_init() }.st_ino as u64)
}

#[cfg(not(unix))]
fn socket_inode(_socket: &UdpSocket) -> Option<u64> {
    None
}

/// The `drops` column of the socket with `inode` in `/proc/net/udp` (or `udp6`).
fn proc_drops(v6: bool, inode: u64) -> Option<u64> {
    let table = std::fs::read_to_string(if v6 { "/proc/net/udp6" } else { "/proc/net/udp" }).ok()?;
    drops_in_table(&table, inode)
}

/// `sl local rem st tx:rx tr:when retrnsmt uid timeout inode ref pointer drops`
pub(super) fn drops_in_table(table: &str, inode: u64) -> Option<u64> {
    table.lines().skip(1).find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        (cols.len() >= 13 && cols[9].parse() == Ok(inode)).then(|| cols[12].parse().ok()).flatten()
    })
}

/// One datagram's place in the batch buffer.
struct Datagram {
    start: usize,
    len: usize,
    truncated: bool,
    peer: Option<SocketAddr>,
}

/// A control buffer aligned for `cmsghdr`.
#[repr(C, align(8))]
struct Control([MaybeUninit<u8>; 64]);

/// Reads datagrams until shutdown.
pub(super) async fn serve(settings: Settings, socket: UdpSocket, ctx: InputContext) -> Result<(), InputError> {
    let local = socket.local_addr().map_err(|e| InputError::io("syslog input udp socket", e))?;
    let figures = Arc::new(UdpFigures::new(&socket));
    let _ = ctx.metrics.state.set(figures.clone());
    tracing::info!(pipeline = %ctx.pipeline, input = %ctx.id, address = %local, receive_buffer_bytes = figures.buffer,
        "syslog input listening on udp");
    // A longer datagram is cut to this and flagged truncated (MSG_TRUNC).
    let room = settings.max_message_bytes.min(MAX_DATAGRAM);
    let mut arena: Vec<u8> = Vec::with_capacity(MAX_BATCH_BYTES.max(room));
    let mut datagrams: Vec<Datagram> = Vec::with_capacity(MAX_BATCH_DATAGRAMS);
    let mut control = Control([MaybeUninit::uninit(); 64]);
    let mut last_peer: Option<SocketAddr> = None;
    let mut sender = Sender::default();
    let mut drops_logged = (0u64, None::<Instant>);
    loop {
        tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => break,
            r = socket.readable() => if let Err(e) = r {
                return Err(InputError::io(format!("syslog input cannot read udp {local}"), e));
            },
        }
        arena.clear();
        datagrams.clear();
        while datagrams.len() < MAX_BATCH_DATAGRAMS && (arena.is_empty() || arena.len() + room <= MAX_BATCH_BYTES) {
            arena.reserve(room);
            let got = socket.try_io(Interest::READABLE, || receive(&socket, &mut arena, room, &mut control, local));
            match got {
                Ok((d, dropped)) => {
                    if let Some(dropped) = dropped {
                        figures.dropped_reported.fetch_max(dropped, Ordering::Relaxed);
                    }
                    datagrams.push(d);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, error = %e, "syslog input udp receive failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    break;
                }
            }
        }
        if datagrams.is_empty() {
            continue;
        }
        figures.received.fetch_add(datagrams.len() as u64, Ordering::Relaxed);
        // What the datagrams carried as far as they were kept: a datagram cut to
        // max_message_bytes counts what was read of it.
        ctx.metrics.bytes_in.add(arena.len() as u64);
        let Some(mut charge) = ctx.reserve(Settings::estimate(arena.len(), datagrams.len())).await else {
            break;
        };
        let received = now_nanos();
        let mut events: Vec<Event> = Vec::with_capacity(datagrams.len());
        let mut failed = 0;
        for d in &datagrams {
            if settings.peer_field.is_some() && last_peer != d.peer {
                last_peer = d.peer;
                sender.peer = d.peer.map(|a| Str::from(a.to_string()));
            }
            let bytes = &arena[d.start..d.start + d.len];
            failed += u64::from(settings.decode(bytes, d.truncated, &sender, received, &mut events));
        }
        if failed > 0 {
            ctx.metrics.failed.add(failed);
        }
        let dropped = figures.dropped_reported.load(Ordering::Relaxed);
        if dropped > drops_logged.0 && drops_logged.1.is_none_or(|t| t.elapsed() >= DROP_WARNING_EVERY) {
            tracing::warn!(pipeline = %ctx.pipeline, input = %ctx.id, dropped_total = dropped, receive_buffer_bytes = figures.buffer,
                "the kernel dropped syslog datagrams: the receive buffer was full (a burst, or the pipeline slower than \
                 the senders); a larger receive_buffer_bytes absorbs longer bursts");
            drops_logged = (dropped, Some(Instant::now()));
        }
        charge.true_up(crate::admission::measure_each(&events, 0));
        if ctx.send(Batch::untracked(events, arena.len()).with_memory(charge)).await.is_err() {
            break;
        }
    }
    Ok(())
}

/// One `recvmsg` into the spare room of `arena` (`room` bytes reserved); the datagram, and the
/// kernel's count of drops when it sent one.
fn receive(
    socket: &UdpSocket,
    arena: &mut Vec<u8>,
    room: usize,
    control: &mut Control,
    local: SocketAddr,
) -> io::Result<(Datagram, Option<u64>)> {
    let start = arena.len();
    // Any address of the socket's family, for the kernel to overwrite with the sender's.
    let mut addr = SockAddr::from(local);
    let (n, truncated, control_len) = {
        let spare = &mut arena.spare_capacity_mut()[..room];
        let mut bufs = [MaybeUninitSlice::new(spare)];
        let mut msg = MsgHdrMut::new().with_addr(&mut addr).with_buffers(&mut bufs).with_control(&mut control.0);
        let n = SockRef::from(socket).recvmsg(&mut msg, 0)?;
        (n, msg.flags().is_truncated(), msg.control_len())
    };
    // SAFETY: the kernel wrote `n` bytes (at most `room`, which `reserve` made spare) there.
    unsafe { arena.set_len(start + n.min(room)) };
    let dropped = overflow_count(&control.0[..control_len.min(control.0.len())]);
    Ok((Datagram { start, len: n.min(room), truncated, peer: addr.as_socket() }, dropped))
}

/// The `SO_RXQ_OVFL` count in a control buffer `recvmsg` filled, if it holds one.
#[cfg(target_os = "linux")]
fn overflow_count(control: &[MaybeUninit<u8>]) -> Option<u64> {
    if control.is_empty() {
        return None;
    }
    // SAFETY: `control` is the part of an 8-aligned buffer the kernel filled with control
    // messages; the libc macros walk it within `msg_controllen`, and the count is read
    // unaligned.
    unsafe {
        let mut hdr: libc::msghdr = std::mem::zeroed();
        hdr.msg_control = control.as_ptr() as *mut libc::c_void;
        hdr.msg_controllen = control.len() as _;
        let mut c = libc::CMSG_FIRSTHDR(&hdr);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SO_RXQ_OVFL {
                return Some(u64::from(std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const u32)));
            }
            c = libc::CMSG_NXTHDR(&hdr, c);
        }
    }
    None
}

#[cfg(not(target_os = "linux"))]
fn overflow_count(_control: &[MaybeUninit<u8>]) -> Option<u64> {
    None
}
