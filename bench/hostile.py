#!/usr/bin/env python3
"""Hostile clients against the network inputs: memory amplification, slow clients, and the memory
budget under every input at once.

--memory  8 clients each post 10 MiB bodies of tiny JSON values (`1 1 1 ...`, then the variant
          `[1,1,1,...]`) continuously for --seconds into http -> memory queue -> blackhole, with
          `memory: {budget: 256MiB}`, while one normal client posts small NDJSON requests every
          100 ms. The process's VmRSS and VmHWM are sampled every 100 ms. It prints peak RSS
          and its ratio to the budget, the answers by status, the slowest answer, and whether
          every request was answered within request_timeout + --margin. A run whose RSS passes
          --rss-cap (4 GiB) is stopped there (SIGKILL) and reported as such.
--slow    5,000 slow clients: each opens a connection to the http input and sends half a request
          (the request line and one header, or all headers and part of the body) and then
          nothing, while a normal client sends a request every 100 ms on a new connection. It
          prints the normal client's latency percentiles, when the server closed the slow
          connections (connect to close, against header_timeout / body_timeout) and how many
          were refused at once (beyond max_connections). Then the same against the tcp input
          with connections that send nothing (closed after idle_timeout, set short here: 5s),
          the normal client's lines timed from its send to their arrival at a `tcp` output.

--budget-suite
          One node with an http, a tcp, a syslog (tcp) and a beats input -> memory queue -> blackhole,
          `memory: {budget: 128MiB}` (--budget), attacked at once for --seconds (60):
            http        8 clients post 10 MiB bodies of `1 1 1 ...` (as --memory) and 2 post the same
                        body gzipped (10 KB inflating to 10 MiB); every one is a 413 (too many events);
            http-bomb   1 client posts a gzip body of 1 GiB of spaces (1 MB), refused 413 at
                        max_body_bytes;
            tcp         4 connections stream `1\n` as fast as the node takes them;
            syslog      4 connections stream octet-counted `1 1` (3 bytes a message; a line that
                        starts with a digit is octet counting to this input);
            beats       8 Lumberjack v2 connections, each sending windows of 65,536 events of about
                        900 bytes in one compressed frame (576 KB on the wire, 60 MB inflated) and
                        waiting for the window's ACK before the next;
            beats-bomb  1 connection sending a window whose one compressed frame inflates to 1 GiB of
                        16 KiB data frames (1.2 MB on the wire), closed by the node at max_frame_bytes.
          The bombs are built without compressing a GiB: one compressed block repeated after a full
          flush. VmRSS/VmHWM are sampled every 100 ms, `/stats` (memory used and waiting) every
          100 ms, GET /health every 200 ms. It prints the idle RSS (started, before any client), peak
          RSS and peak / budget, the budget's own peak, the RSS --settle (3) s after the clients
          stopped, per input the events in and refusals, the clients' answers (http statuses, beats
          windows ACKed and connections closed by the node, lines sent), and whether every /health
          was answered within 1 s. --only picks attacks (run together); --each runs every chosen
          attack alone first, then all together. Exit 1 when a run's peak RSS / budget is above
          --max-ratio (1.25), or sluice died or passed --rss-cap.

The new limits (`memory.budget`, the http input's timeouts, `max_connections` and
`max_events_per_request`, the tcp input's `idle_timeout`) are set only if `sluice validate`
accepts them; the run says which ones this build refused and runs without them.
Loopback only; every loop is bounded in time; the processes and temp dirs are cleaned up.

Usage: bench/hostile.py --memory [--seconds 60] [--shape both|spaces|array] [--json]
       bench/hostile.py --slow [--slow-clients 5000] [--json]
       bench/hostile.py --budget-suite [--budget 128MiB] [--seconds 60] [--only ATTACK...] [--each]
"""
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the scripts

import argparse
import errno
import json
import os
import resource
import selectors
import signal
import socket
import struct
import tempfile
import threading
import time
import urllib.request
import zlib

from harness import (GIB, MIB, BenchError, LineSender, Sluice, accepted_keys, fmt_s, free_port, load_average,
                     on_signals_exit, percentile, sluice_binary, stats, stop_all, write_config)

PIPELINE = "hostile"
PATH = "/ingest"


def parse_duration(text):
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for suffix in ("ms", "s", "m", "h"):
        if text.endswith(suffix) and text[:-len(suffix)].replace(".", "", 1).isdigit():
            return float(text[:-len(suffix)]) * units[suffix]
    raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 500ms, 10s, 5m)")


def parse_size(text):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "B": 1}
    for suffix, mult in units.items():
        if text.endswith(suffix) and text[:-len(suffix)].isdigit():
            return int(text[:-len(suffix)]) * mult
    if text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 256MiB)")


# ---------------------------------------------------------------- config and its optional keys

def base_config(tmp, api, inputs, outputs):
    return {
        "data_dir": os.path.join(tmp, "data"),
        "api": {"address": api},
        "log": {"level": "warn"},
        "shutdown_timeout": "5s",
        "pipelines": {PIPELINE: {"workers": 2, "inputs": inputs, "outputs": outputs}},
    }


def with_optional(binary, tmp, doc, optional):
    """`optional` is a list of (label, setter) where setter(doc) adds one new key. Each is kept
    only if `sluice validate` accepts it; returns (doc, used labels, refused labels)."""
    ok, _ = accepted_keys(binary, tmp, doc)
    if not ok:
        raise BenchError("this build refuses even the base config")
    used, refused = [], []
    for label, setter in optional:
        trial = json.loads(json.dumps(doc))
        setter(trial)
        ok, _ = accepted_keys(binary, tmp, trial)
        if ok:
            setter(doc)
            used.append(label)
        else:
            refused.append(label)
    if refused:
        print(f"note: this build does not know {', '.join(refused)}: running without "
              f"{'it' if len(refused) == 1 else 'them'}", file=sys.stderr)
    return doc, used, refused


def first_input(doc):
    return doc["pipelines"][PIPELINE]["inputs"][0]


# ---------------------------------------------------------------- a raw HTTP/1.1 exchange

class Answer:
    __slots__ = ("status", "error", "latency", "retry_after", "unanswered", "start")

    def __init__(self, status=None, error=None, latency=0.0, retry_after=None, unanswered=False):
        self.status, self.error, self.latency = status, error, latency
        self.retry_after, self.unanswered = retry_after, unanswered
        self.start = None

    def kind(self):
        if self.unanswered:
            return "unanswered"
        if self.status is not None:
            return str(self.status)
        return self.error


def parse_response(buf, closed):
    """(status, headers) once `buf` holds a whole response (or the peer closed after the head)."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
    try:
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        return (-1, {})
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    body = len(buf) - end - 4
    if "content-length" in headers:
        if body >= int(headers["content-length"]) or closed:
            return status, headers
        return None
    if headers.get("transfer-encoding", "").lower() == "chunked":
        return (status, headers) if (buf.endswith(b"0\r\n\r\n") or closed) else None
    return (status, headers) if closed else None


def http_post(port, body, deadline, abort, connect_timeout=5.0, headers=""):
    """Posts `body` on a new connection and reads the answer, with non-blocking I/O so that an
    early answer (a 413 before the body is read) is seen even if the send then fails. Returns an
    Answer; `unanswered` when `deadline` passed or `abort` was set first. `headers`: more header
    lines, each ending in CRLF."""
    start = time.monotonic()
    head = (f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n{headers}"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=max(0.01, min(connect_timeout,
                                                                                     deadline - start)))
    except OSError as e:
        return Answer(error=f"connect: {errno.errorcode.get(e.errno, type(e).__name__)}",
                      latency=time.monotonic() - start)
    out = memoryview(head + body) if len(body) < (1 << 16) else None
    parts = [memoryview(head), memoryview(body)] if out is None else [out]
    sel = selectors.DefaultSelector()
    try:
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
        part, offset, writing = 0, 0, True
        buf = bytearray()
        while True:
            now = time.monotonic()
            if now >= deadline or abort.is_set():
                return Answer(latency=now - start, unanswered=True)
            for _key, mask in sel.select(min(0.2, deadline - now)):
                if mask & selectors.EVENT_WRITE and writing:
                    try:
                        n = sock.send(parts[part][offset:offset + (256 << 10)])
                        offset += n
                        if offset == len(parts[part]):
                            part, offset = part + 1, 0
                    except BlockingIOError:
                        pass
                    except OSError:
                        part = len(parts)  # the server stopped reading: its answer may be there
                    if part == len(parts):
                        writing = False
                        sel.modify(sock, selectors.EVENT_READ)
                if mask & selectors.EVENT_READ:
                    try:
                        data = sock.recv(1 << 16)
                    except BlockingIOError:
                        continue
                    except OSError as e:
                        got = parse_response(buf, True)
                        if got:
                            return answer_of(got, start)
                        return Answer(error=f"recv: {errno.errorcode.get(e.errno, type(e).__name__)}",
                                      latency=time.monotonic() - start)
                    buf += data
                    got = parse_response(buf, not data)
                    if got:
                        return answer_of(got, start)
                    if not data:
                        return Answer(error="closed without an answer", latency=time.monotonic() - start)
    finally:
        sel.close()
        sock.close()


def answer_of(got, start):
    status, headers = got
    return Answer(status=status, latency=time.monotonic() - start, retry_after=headers.get("retry-after"))


# ---------------------------------------------------------------- RSS sampling

class RssSampler(threading.Thread):
    """VmRSS and VmHWM of `pid` every `interval`; SIGKILLs the process past `cap` bytes."""

    def __init__(self, pid, cap, stop, interval=0.1):
        super().__init__(name="rss", daemon=True)
        self.pid, self.cap, self.stop, self.interval = pid, cap, stop, interval
        self.peak_rss = self.hwm = 0
        self.samples = 0
        self.capped_at = None  # seconds after start when the cap was passed
        self.start_time = time.monotonic()

    def read(self):
        rss = hwm = None
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) * 1024
        return rss, hwm

    def run(self):
        while not self.stop.is_set():
            try:
                rss, hwm = self.read()
            except (OSError, ValueError, TypeError):
                return  # the process is gone
            if rss is None:
                return  # a zombie has no VmRSS
            self.samples += 1
            self.peak_rss = max(self.peak_rss, rss)
            self.hwm = max(self.hwm, hwm or 0)
            if self.cap and rss > self.cap and self.capped_at is None:
                self.capped_at = time.monotonic() - self.start_time
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                return
            self.stop.wait(self.interval)

    def peak(self):
        return max(self.peak_rss, self.hwm)


# ---------------------------------------------------------------- --memory

def memory_body(shape, limit):
    """The largest body of tiny values that fits `limit` bytes."""
    if shape == "spaces":
        return b"1 " * (limit // 2)
    n = (limit - 1) // 2  # "[" + "1," * (n-1) + "1]" is 2n + 1 bytes
    return b"[" + b"1," * (n - 1) + b"1]"


def ndjson(n, tag, seq):
    return "".join(json.dumps({"normal": tag, "seq": seq, "k": k, "msg": "a normal request"}) + "\n"
                   for k in range(n)).encode()


def memory_run(binary, tmp, args, shape):
    api, port = f"127.0.0.1:{free_port()}", free_port()
    doc = base_config(tmp, api, [{"type": "http", "address": f"127.0.0.1:{port}", "path": PATH,
                                  "max_body_bytes": f"{args.body_bytes}B"}], [{"type": "blackhole"}])
    optional = [
        (f"memory.budget ({args.budget // MIB}MiB)", lambda d: d.__setitem__("memory", {"budget": f"{args.budget}B"})),
        (f"http request_timeout ({args.request_timeout:g}s)",
         lambda d: first_input(d).__setitem__("request_timeout", f"{int(args.request_timeout * 1000)}ms")),
    ]
    if args.max_events_per_request:
        optional.append((f"http max_events_per_request ({args.max_events_per_request})",
                         lambda d: first_input(d).__setitem__("max_events_per_request", args.max_events_per_request)))
    doc, used, refused = with_optional(binary, tmp, doc, optional)
    cfg = write_config(os.path.join(tmp, f"memory-{shape}.yml"), doc)
    body = memory_body(shape, args.body_bytes)
    limit_s = args.request_timeout + args.margin

    s = Sluice(binary, cfg, os.path.join(tmp, f"memory-{shape}.log"), api)
    stop_sampling, abort, stop_sending = threading.Event(), threading.Event(), threading.Event()
    answers = {"hostile": [], "normal": []}
    pending = {}  # thread name -> start of its request in flight
    lock = threading.Lock()
    try:
        s.wait_api()
        s.wait_port(port)
        sampler = RssSampler(s.pid, args.rss_cap, stop_sampling)
        sampler.start()
        started = time.monotonic()
        send_until = started + args.seconds
        hard_end = send_until + limit_s  # requests in flight at the end get this long for an answer

        def client(kind, index):
            name = f"{kind}-{index}"
            seq = 0
            while not stop_sending.is_set() and time.monotonic() < send_until and not abort.is_set():
                t0 = time.monotonic()
                with lock:
                    pending[name] = t0
                payload = body if kind == "hostile" else ndjson(args.normal_events, index, seq)
                a = http_post(port, payload, hard_end, abort)
                a.start = t0
                with lock:
                    pending.pop(name, None)
                    answers[kind].append(a)
                seq += 1
                if kind == "normal":
                    stop_sending.wait(max(0.0, 0.1 - (time.monotonic() - t0)))
                elif a.error and a.error.startswith("connect"):
                    stop_sending.wait(0.1)  # no server: do not spin

        threads = [threading.Thread(target=client, args=("hostile", i), daemon=True) for i in range(args.clients)]
        threads.append(threading.Thread(target=client, args=("normal", 0), daemon=True))
        for t in threads:
            t.start()
        while time.monotonic() < send_until and sampler.capped_at is None and s.alive():
            time.sleep(0.1)
        stop_sending.set()
        if sampler.capped_at is not None or not s.alive():
            abort.set()  # the process is gone: nothing in flight will be answered
        for t in threads:
            t.join(max(0.0, hard_end - time.monotonic()) + 5)
        abort.set()
        for t in threads:
            t.join(10)
        elapsed = time.monotonic() - started
        died = not s.alive() and sampler.capped_at is None
        status = s.terminate(10)
        stop_sampling.set()
        sampler.join(2)
    finally:
        stop_sending.set()
        abort.set()
        stop_sampling.set()
        s.close()

    hostile, normal = answers["hostile"], answers["normal"]
    if sampler.capped_at is not None:
        # Requests cut off by the SIGKILL at the cap were not answered: they waited until then.
        cut = sampler.start_time + sampler.capped_at - 0.2
        for a in hostile + normal:
            if a.status is None and a.start + a.latency >= cut:
                a.unanswered = True
    counts = {}
    for a in hostile:
        k = a.kind()
        key = k if k in ("200", "413", "429", "unanswered") else "other"
        counts[key] = counts.get(key, 0) + 1
    others = sorted({a.kind() for a in hostile if a.kind() not in ("200", "413", "429", "unanswered")})
    slowest = max((a.latency for a in hostile), default=None)
    within = all(not a.unanswered and a.status in (200, 413, 429) and a.latency <= limit_s for a in hostile + normal)
    nlat = [a.latency for a in normal if a.status == 200]
    peak = sampler.peak()
    # The answers that took over a second, by when their request started: where a stall was.
    slow_ones = sorted(((kind, a) for kind in ("hostile", "normal") for a in answers[kind] if a.latency > 1.0),
                       key=lambda ka: ka[1].start)
    slow_list = [{"client": kind, "started_s": round(a.start - started, 2), "seconds": round(a.latency, 3),
                  "answer": a.kind()} for kind, a in slow_ones[:12]]
    return {
        "mode": "memory",
        "shape": shape,
        "body_bytes": len(body),
        "clients": args.clients,
        "seconds": round(elapsed, 1),
        "keys_used": used,
        "keys_refused": refused,
        "budget_bytes": args.budget,
        "peak_rss_mib": round(peak / MIB, 1),
        "peak_rss_over_budget": round(peak / args.budget, 2),
        "rss_samples": sampler.samples,
        "stopped_at_rss_cap_after_s": None if sampler.capped_at is None else round(sampler.capped_at, 1),
        "rss_cap_mib": args.rss_cap // MIB,
        "sluice_died": died,
        "exit_status": status,
        "hostile_requests": len(hostile),
        "hostile_answers": counts,
        "hostile_other_kinds": others,
        "hostile_slowest_s": None if slowest is None else round(slowest, 3),
        "limit_s": limit_s,
        "every_request_answered_within_limit": within,
        "normal_requests": len(normal),
        "normal_answers": count_kinds(normal),
        "normal_p50_s": rnd(percentile(nlat, 50)),
        "normal_p99_s": rnd(percentile(nlat, 99)),
        "normal_max_s": rnd(max((a.latency for a in normal), default=None)),
        "answers_over_1s": len(slow_ones),
        "answers_over_1s_first": slow_list,
        "load_average": round(load_average()[0], 2),
    }


def count_kinds(answers):
    out = {}
    for a in answers:
        out[a.kind()] = out.get(a.kind(), 0) + 1
    return dict(sorted(out.items()))


def rnd(v, digits=3):
    return None if v is None else round(v, digits)


def print_memory(rows):
    print("hostile --memory: http -> memory queue -> blackhole; bodies of tiny JSON values, "
          "a normal client posting small NDJSON every 100 ms")
    for r in rows:
        print(f"\nshape {r['shape']!r}: {r['clients']} clients x {r['body_bytes']:,}-byte bodies for {r['seconds']} s; "
              f"new keys used: {', '.join(r['keys_used']) or 'none'}"
              + (f"; refused by this build: {', '.join(r['keys_refused'])}" if r["keys_refused"] else ""))
        capped = r["stopped_at_rss_cap_after_s"]
        items = [
            ("peak RSS MiB (max of VmRSS samples, VmHWM)", r["peak_rss_mib"]),
            (f"peak RSS / budget ({r['budget_bytes'] // MIB} MiB)", f"{r['peak_rss_over_budget']:.2f}"
             + ("" if "memory.budget" in " ".join(r["keys_used"]) else "  (budget not configured: this build)")),
            ("stopped at the RSS cap", f"yes, {capped} s in (cap {r['rss_cap_mib']} MiB)" if capped is not None else "no"),
            ("sluice died by itself", "yes" if r["sluice_died"] else "no"),
            ("hostile requests", r["hostile_requests"]),
            ("  answers 200 / 413 / 429 / other / unanswered",
             " / ".join(str(r["hostile_answers"].get(k, 0)) for k in ("200", "413", "429", "other", "unanswered"))),
            ("  other kinds", ", ".join(r["hostile_other_kinds"]) or "none"),
            ("  slowest answer or wait, s", fmt_s(r["hostile_slowest_s"])),
            (f"every request answered 200/413/429 within {r['limit_s']:g} s", "yes" if
             r["every_request_answered_within_limit"] else "NO"),
            ("normal requests", r["normal_requests"]),
            ("  answers", ", ".join(f"{k} {v}" for k, v in r["normal_answers"].items()) or "none"),
            ("  latency of 200s p50 / p99, max of all, s",
             f"{fmt_s(r['normal_p50_s'])} / {fmt_s(r['normal_p99_s'])}, {fmt_s(r['normal_max_s'])}"),
            ("answers (or waits) over 1 s, either client", r["answers_over_1s"]),
            ("load average (1 min) at the end", r["load_average"]),
        ]
        for name, value in items:
            print(f"  {name:52} {value}")
        for x in r["answers_over_1s_first"]:
            print(f"    {x['client']:8} request started at {x['started_s']:7.2f} s: {x['answer']} after {x['seconds']:.3f} s")


# ---------------------------------------------------------------- --slow

def raise_nofile(wanted):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0], hard


class SlowConns:
    """Many non-blocking connections that send `partial(i)` once connected and then nothing;
    records when each connected, when the server closed it, and what it answered."""

    def __init__(self, port, count, partial):
        self.port, self.count, self.partial = port, count, partial
        self.sel = selectors.DefaultSelector()
        self.socks = {}  # fd -> index
        self.opened = 0
        self.t_start = [None] * count
        self.t_conn = [None] * count
        self.t_close = [None] * count
        self.reply = [b""] * count
        self.connect_error = [None] * count
        self.closed = False

    def open_some(self, n, now):
        while n > 0 and self.opened < self.count:
            i = self.opened
            self.opened += 1
            n -= 1
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            self.t_start[i] = now
            rc = s.connect_ex(("127.0.0.1", self.port))
            if rc not in (0, errno.EINPROGRESS):
                self.connect_error[i] = errno.errorcode.get(rc, str(rc))
                s.close()
                continue
            self.socks[s.fileno()] = (i, s)
            self.sel.register(s, selectors.EVENT_WRITE, i)

    def poll(self, timeout):
        now = time.monotonic()
        for key, mask in self.sel.select(timeout):
            i, s = self.socks[key.fd]
            if self.t_conn[i] is None:  # connect finished
                err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    self.connect_error[i] = errno.errorcode.get(err, str(err))
                    self.drop(key.fd)
                    continue
                self.t_conn[i] = now
                data = self.partial(i)
                try:
                    if data:
                        s.send(data)
                except OSError:
                    self.t_close[i] = now
                    self.drop(key.fd)
                    continue
                self.sel.modify(s, selectors.EVENT_READ, i)
                continue
            try:
                data = s.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data:
                if len(self.reply[i]) < 64:
                    self.reply[i] += data[:64]
                continue
            self.t_close[i] = now
            self.drop(key.fd)
        # connections still waiting to connect after 10 s: given up
        for fd, (i, s) in list(self.socks.items()):
            if self.t_conn[i] is None and now - self.t_start[i] > 10:
                self.connect_error[i] = "connect timed out (10 s)"
                self.drop(fd)

    def drop(self, fd):
        _, s = self.socks.pop(fd)
        self.sel.unregister(s)
        s.close()

    def close_all(self):
        for fd in list(self.socks):
            self.drop(fd)
        if not self.closed:
            self.closed = True
            self.sel.close()

    def open_count(self):
        return len(self.socks)


def slow_phase(binary, tmp, args, proto):
    api, port = f"127.0.0.1:{free_port()}", free_port()
    sink = None
    if proto == "http":
        inp = {"type": "http", "address": f"127.0.0.1:{port}", "path": PATH}
        doc = base_config(tmp, api, [inp], [{"type": "blackhole"}])
        optional = [
            (f"http header_timeout ({args.header_timeout:g}s)",
             lambda d: first_input(d).__setitem__("header_timeout", f"{int(args.header_timeout * 1000)}ms")),
            (f"http body_timeout ({args.body_timeout:g}s)",
             lambda d: first_input(d).__setitem__("body_timeout", f"{int(args.body_timeout * 1000)}ms")),
            (f"http max_connections ({args.max_connections})",
             lambda d: first_input(d).__setitem__("max_connections", args.max_connections)),
        ]
    else:
        sink = LineSink()
        inp = {"type": "tcp", "address": f"127.0.0.1:{port}", "codec": "json_lines",
               "max_connections": args.max_connections}
        doc = base_config(tmp, api, [inp], [{"type": "tcp", "address": f"127.0.0.1:{sink.port}"}])
        doc["pipelines"][PIPELINE]["batch"] = {"size": 1000, "delay": "10ms"}
        optional = [
            (f"tcp idle_timeout ({args.tcp_idle_timeout:g}s)",
             lambda d: first_input(d).__setitem__("idle_timeout", f"{int(args.tcp_idle_timeout * 1000)}ms")),
        ]
    try:
        doc, used, refused = with_optional(binary, tmp, doc, optional)
    except BaseException:
        if sink:
            sink.close()
        raise
    cfg = write_config(os.path.join(tmp, f"slow-{proto}.yml"), doc)
    hold = args.hold or ((max(args.header_timeout, args.body_timeout) if proto == "http" else args.tcp_idle_timeout)
                         + 10)

    if proto == "http":
        def partial(i):
            if i % 2 == 0:  # the request line and one header, never the blank line
                return f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode()
            return (f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: 100000\r\n\r\n" + '{"slow": "' + "x" * 1000).encode()
    else:
        def partial(_i):
            return b""

    s = Sluice(binary, cfg, os.path.join(tmp, f"slow-{proto}.log"), api)
    stop = threading.Event()
    conns = SlowConns(port, args.slow_clients, partial)
    probes = []  # (sent at, answer latency or None, kind)
    try:
        s.wait_api()
        s.wait_port(port)
        if sink:
            sink.start()
        sampler = RssSampler(s.pid, 0, stop)
        sampler.start()
        started = time.monotonic()
        end = started + hold

        def normal_http():
            seq = 0
            while not stop.is_set() and time.monotonic() < end:
                t0 = time.monotonic()
                a = http_post(port, ndjson(3, "probe", seq), t0 + args.normal_timeout, stop)
                probes.append((t0 - started, a.latency if a.status == 200 else None, a.kind()))
                seq += 1
                stop.wait(max(0.0, 0.1 - (time.monotonic() - t0)))

        def normal_tcp():
            seq = 0
            while not stop.is_set() and time.monotonic() < end:
                t0 = time.monotonic()
                kind = "sent"
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=args.normal_timeout) as c:
                        c.sendall(json.dumps({"probe": seq}).encode() + b"\n")
                except OSError as e:
                    kind = f"send: {errno.errorcode.get(e.errno, type(e).__name__)}"
                sink.sent[seq] = t0
                probes.append((t0 - started, seq, kind))
                seq += 1
                stop.wait(max(0.0, 0.1 - (time.monotonic() - t0)))

        prober = threading.Thread(target=normal_http if proto == "http" else normal_tcp, daemon=True)
        prober.start()
        # Open the slow connections in waves (200 per 20 ms: 0.5 s for 5,000), then watch them.
        last_wave = 0.0
        while time.monotonic() < end:
            now = time.monotonic()
            if now - last_wave >= 0.02:
                conns.open_some(200, now)
                last_wave = now
            conns.poll(0.02)
            if not s.alive():
                raise BenchError(f"sluice exited during the {proto} slow run; its log ends:\n" + s.log_tail())
        stop.set()
        prober.join(args.normal_timeout + 5)
        still_open = conns.open_count()
        conns.close_all()
        stop.set()
        sampler.join(2)
        if sink:
            time.sleep(0.3)  # lines sent in the last moment
        status = s.terminate(10)
    finally:
        stop.set()
        conns.close_all()
        s.close()
        if sink:
            sink.close()

    n = args.slow_clients
    connected = [i for i in range(n) if conns.t_conn[i] is not None]
    connect_failed = {}
    for e in conns.connect_error:
        if e:
            connect_failed[e] = connect_failed.get(e, 0) + 1
    closed = [i for i in connected if conns.t_close[i] is not None]
    lifetimes = {i: conns.t_close[i] - conns.t_conn[i] for i in closed}
    refused_now = [i for i in closed if lifetimes[i] < args.refused_within]
    timed_out = [i for i in closed if lifetimes[i] >= args.refused_within]
    replies = {}
    for i in closed:
        line = conns.reply[i].split(b"\r\n", 1)[0].decode("latin-1") or "(nothing)"
        if proto == "http" and lifetimes[i] >= args.refused_within:
            line = f"{'half header' if i % 2 == 0 else 'part body'}: {line}"
        replies[line] = replies.get(line, 0) + 1

    def life_stats(idx):
        v = [lifetimes[i] for i in idx]
        return {"count": len(v), "p50_s": rnd(percentile(v, 50)), "p99_s": rnd(percentile(v, 99)),
                "max_s": rnd(max(v, default=None))}

    row = {
        "mode": "slow",
        "input": proto,
        "slow_clients": n,
        "hold_seconds": hold,
        "keys_used": used,
        "keys_refused": refused,
        "max_connections": args.max_connections if (proto == "tcp" or any("max_connections" in u for u in used))
        else None,
        "connected": len(connected),
        "connect_failed": connect_failed,
        "closed_by_server": len(closed),
        "refused_at_once": len(refused_now),
        "refused_within_s": args.refused_within,
        "closed_later": len(timed_out),
        "still_open_at_end": still_open,
        "first_reply_lines": replies,
        "peak_rss_mib": round(sampler.peak() / MIB, 1),
        "margin_s": args.margin,
        "exit_status": status,
        "load_average": round(load_average()[0], 2),
    }
    if proto == "http":
        row["header_timeout_s"] = args.header_timeout
        row["body_timeout_s"] = args.body_timeout
        row["closed_later_half_header"] = life_stats([i for i in timed_out if i % 2 == 0])
        row["closed_later_part_body"] = life_stats([i for i in timed_out if i % 2 == 1])
        lat = [p[1] for p in probes if p[1] is not None]
        kinds = {}
        for p in probes:
            kinds[p[2]] = kinds.get(p[2], 0) + 1
        row["normal_requests"] = len(probes)
        row["normal_answers"] = dict(sorted(kinds.items()))
        row["normal_under_1s"] = sum(1 for v in lat if v < 1.0)
        first_ok = next((p[0] for p in probes if p[1] is not None), None)
        row["normal_first_answer_at_s"] = rnd(first_ok, 2)
        failed_at = [p[0] for p in probes if p[1] is None or p[1] >= 1.0]
    else:
        row["idle_timeout_s"] = args.tcp_idle_timeout
        row["closed_later_idle"] = life_stats(timed_out)
        lat = []
        lost = 0
        kinds = {}
        for at, seq, kind in probes:
            arrived = sink.arrived.get(seq)
            if arrived is None:
                lost += 1
                kinds["not delivered" if kind == "sent" else kind] = kinds.get(
                    "not delivered" if kind == "sent" else kind, 0) + 1
            else:
                lat.append(arrived - sink.sent[seq])
                kinds["delivered"] = kinds.get("delivered", 0) + 1
        row["normal_requests"] = len(probes)
        row["normal_answers"] = dict(sorted(kinds.items()))
        row["normal_under_1s"] = sum(1 for v in lat if v < 1.0)
        first_ok = next((at for at, seq, _ in probes if seq in sink.arrived), None)
        row["normal_first_answer_at_s"] = rnd(first_ok, 2)
        failed_at = [at for at, seq, _ in probes if seq not in sink.arrived or sink.arrived[seq] - sink.sent[seq] >= 1.0]
    row["normal_failed_between_s"] = [rnd(min(failed_at), 2), rnd(max(failed_at), 2)] if failed_at else None
    if proto == "http":
        late = [i for i in timed_out if lifetimes[i] > (args.header_timeout if i % 2 == 0 else args.body_timeout)
                + args.margin]
    else:
        late = [i for i in timed_out if lifetimes[i] > args.tcp_idle_timeout + args.margin]
    row["closed_late"] = len(late)
    row["goal_slow_closed_in_time"] = still_open == 0 and not late and not connect_failed
    row["goal_normal_under_1s"] = bool(probes) and row["normal_under_1s"] == len(probes)
    row["normal_p50_s"] = rnd(percentile(lat, 50))
    row["normal_p99_s"] = rnd(percentile(lat, 99))
    row["normal_max_s"] = rnd(max(lat, default=None))
    return row


class LineSink(threading.Thread):
    """A TCP server on loopback for the tcp output: records when each probe line arrived."""

    def __init__(self):
        super().__init__(name="sink", daemon=True)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.sent, self.arrived = {}, {}
        self.stop = threading.Event()

    def run(self):
        sel = selectors.DefaultSelector()
        self.listener.setblocking(False)
        sel.register(self.listener, selectors.EVENT_READ, None)
        bufs = {}
        try:
            while not self.stop.is_set():
                for key, _ in sel.select(0.1):
                    if key.data is None:
                        try:
                            c, _ = self.listener.accept()
                        except BlockingIOError:
                            continue
                        c.setblocking(False)
                        sel.register(c, selectors.EVENT_READ, "conn")
                        bufs[c.fileno()] = b""
                        continue
                    c = key.fileobj
                    try:
                        data = c.recv(1 << 16)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(c)
                        bufs.pop(c.fileno(), None)
                        c.close()
                        continue
                    now = time.monotonic()
                    buf = bufs[c.fileno()] + data
                    *lines, rest = buf.split(b"\n")
                    bufs[c.fileno()] = rest
                    for line in lines:
                        try:
                            seq = json.loads(line)["probe"]
                        except (ValueError, KeyError, TypeError):
                            continue
                        self.arrived.setdefault(seq, now)
        finally:
            for key in list(sel.get_map().values()):
                key.fileobj.close()
            sel.close()

    def close(self):
        self.stop.set()
        if self.is_alive():
            self.join(2)
        else:
            self.listener.close()


def print_slow(rows):
    for r in rows:
        print(f"\nhostile --slow, {r['input']} input: {r['slow_clients']} slow connections held for "
              f"{r['hold_seconds']:g} s; a normal client every 100 ms on new connections; "
              f"new keys used: {', '.join(r['keys_used']) or 'none'}"
              + (f"; refused by this build: {', '.join(r['keys_refused'])}" if r["keys_refused"] else ""))
        items = [
            ("slow connections connected", r["connected"]),
            ("  connect failed", ", ".join(f"{k} {v}" for k, v in r["connect_failed"].items()) or "none"),
            ("  max_connections", r["max_connections"] if r["max_connections"] is not None else "none (this build)"),
            (f"  closed by the server within {r['refused_within_s']:g} s (refused)", r["refused_at_once"]),
            ("  closed later (timeouts)", r["closed_later"]),
            ("  still open at the end", r["still_open_at_end"]),
            ("  first reply line", ", ".join(f"{k!r} {v}" for k, v in r["first_reply_lines"].items()) or "none"),
        ]
        if r["input"] == "http":
            for label, key, limit in (("half header", "closed_later_half_header", r["header_timeout_s"]),
                                      ("part of the body", "closed_later_part_body", r["body_timeout_s"])):
                st = r[key]
                items.append((f"  {label}: closed, connect->close p50/p99/max s (vs {limit:g})",
                              f"{st['count']}: {fmt_s(st['p50_s'])} / {fmt_s(st['p99_s'])} / {fmt_s(st['max_s'])}"))
        else:
            st = r["closed_later_idle"]
            items.append((f"  idle: closed, connect->close p50/p99/max s (vs {r['idle_timeout_s']:g})",
                          f"{st['count']}: {fmt_s(st['p50_s'])} / {fmt_s(st['p99_s'])} / {fmt_s(st['max_s'])}"))
        what = "answered" if r["input"] == "http" else "delivered to the tcp output"
        items += [
            ("normal requests", r["normal_requests"]),
            ("  outcomes", ", ".join(f"{k} {v}" for k, v in r["normal_answers"].items())),
            (f"  {what} under 1 s", r["normal_under_1s"]),
            ("  first one at, s after start", fmt_s(r["normal_first_answer_at_s"])),
            ("  the others (failed or >= 1 s) sent between, s after start",
             "none" if not r["normal_failed_between_s"] else
             f"{r['normal_failed_between_s'][0]:.2f} and {r['normal_failed_between_s'][1]:.2f}"),
            ("  latency p50 / p99 / max, s", f"{fmt_s(r['normal_p50_s'])} / {fmt_s(r['normal_p99_s'])} / "
                                             f"{fmt_s(r['normal_max_s'])}"),
            (f"goal: every slow one refused or closed within its timeout + {r['margin_s']:g} s",
             "yes" if r["goal_slow_closed_in_time"] else f"NO ({r['closed_late']} late, "
                                                         f"{r['still_open_at_end']} still open)"),
            (f"goal: every normal request {what} under 1 s", "yes" if r["goal_normal_under_1s"] else "NO"),
            ("sluice peak RSS MiB", r["peak_rss_mib"]),
            ("load average (1 min) at the end", r["load_average"]),
        ]
        for name, value in items:
            print(f"  {name:58} {value}")


# ---------------------------------------------------------------- --budget-suite

ATTACKS = ("http", "http-bomb", "tcp", "syslog", "beats", "beats-bomb")
ZLIB_WBITS, GZIP_WBITS = 15, 31


def repeated_deflate(block, count, wbits, level=9):
    """A zlib (wbits 15) or gzip (31) stream of `block` repeated `count` times, made without
    compressing it all: the block is compressed once after a full flush (which resets the
    compressor's history, so its bytes are the same every time) and repeated, then the stream is
    ended with an empty final block and the checksum of the whole. Returns (stream, inflated)."""
    c = zlib.compressobj(level, zlib.DEFLATED, wbits)
    first = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)
    again = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)
    total = len(block) * count
    if wbits == GZIP_WBITS:
        crc = 0
        for _ in range(count):
            crc = zlib.crc32(block, crc)
        trailer = struct.pack("<II", crc, total & 0xFFFFFFFF)
    else:
        adler = 1
        for _ in range(count):
            adler = zlib.adler32(block, adler)
        trailer = struct.pack(">I", adler)
    # b"\x03\x00": a final fixed-Huffman block holding only its end code.
    return first + again * (count - 1) + b"\x03\x00" + trailer, total


def lj_window(n):
    return b"2W" + struct.pack(">I", n)


def lj_json(seq, payload):
    return b"2J" + struct.pack(">II", seq, len(payload)) + payload


def lj_compressed(block):
    return b"2C" + struct.pack(">I", len(block)) + block


def beats_window(events, event_bytes):
    """One window as a Beat sends it with compression: `2W`, then one `2C` frame whose zlib block
    holds `events` JSON data frames (sequence 1..events) of about `event_bytes` each. The same
    bytes are sent for every window. Returns (bytes, inflated size of the block)."""
    def doc(i):
        d = {"@timestamp": "2026-11-29T05:00:00.000Z", "@metadata": {"beat": "filebeat", "type": "_doc"},
             "host": {"name": "bench"}, "log": {"offset": i}, "message": ""}
        pad = max(1, event_bytes - len(json.dumps(d, separators=(",", ":"))))
        d["message"] = "1" * pad
        return json.dumps(d, separators=(",", ":")).encode()
    frames = b"".join(lj_json(i + 1, doc(i)) for i in range(events))
    return lj_window(events) + lj_compressed(zlib.compress(frames, 6)), len(frames)


def beats_bomb(total, frame_bytes):
    """A zlib bomb as one window: `2W`, then one `2C` frame that inflates to about `total` bytes
    of JSON data frames of `frame_bytes` each (a document `{"m":"000..."}`). Returns (bytes,
    inflated size, events)."""
    payload_len = max(8, frame_bytes - 10)
    doc = b'{"m":"' + b"0" * (payload_len - 8) + b'"}'
    frame = lj_json(1, doc)
    per_block = max(1, MIB // len(frame))
    block = frame * per_block
    count = max(1, total // len(block))
    stream, inflated = repeated_deflate(block, count, ZLIB_WBITS)
    return lj_window(per_block * count) + lj_compressed(stream), inflated, per_block * count


def send_all(sock, data, stop):
    """sendall in pieces, giving up when `stop` is set (the socket has a short timeout). True
    when everything was written."""
    view, off = memoryview(data), 0
    while off < len(view):
        if stop.is_set():
            return False
        try:
            off += sock.send(view[off:off + (256 << 10)])
        except socket.timeout:
            continue
    return True


class BeatsClient(threading.Thread):
    """A Lumberjack v2 client on loopback: sends `window` (made by beats_window or beats_bomb) on
    one connection, waits for the ACK of `last_seq`, and again; when the server closes the
    connection it opens a new one after 0.1 s. Counts windows ACKed, events ACKed (partial ACKs
    included), and connections the server closed (with how long after the window's first byte)."""

    def __init__(self, port, window, last_seq, stop, name):
        super().__init__(name=name, daemon=True)
        self.port, self.window, self.last_seq, self.stop = port, window, last_seq, stop
        self.windows_acked = self.events_acked = self.closed_by_server = 0
        self.close_after = []  # seconds from a window's start to the server's close
        self.connect_errors = 0
        self.errors = {}

    def run(self):
        while not self.stop.is_set():
            try:
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=2)
            except OSError:
                self.connect_errors += 1
                self.stop.wait(0.1)
                continue
            try:
                sock.settimeout(0.5)
                self.serve(sock)
            except OSError as e:
                kind = errno.errorcode.get(e.errno, type(e).__name__) if e.errno else type(e).__name__
                self.errors[kind] = self.errors.get(kind, 0) + 1
                self.closed_by_server += 1
            finally:
                sock.close()
            self.stop.wait(0.1)

    def serve(self, sock):
        """Windows on one connection until the server closes it or `stop`."""
        while not self.stop.is_set():
            t0 = time.monotonic()
            if not send_all(sock, self.window, self.stop):
                return
            buf, acked = b"", 0
            while acked < self.last_seq:
                try:
                    data = sock.recv(4096)
                except socket.timeout:
                    if self.stop.is_set():
                        self.events_acked += acked
                        return
                    continue
                except ConnectionResetError:
                    data = b""
                if not data:
                    self.closed_by_server += 1
                    self.close_after.append(time.monotonic() - t0)
                    self.events_acked += acked
                    return
                buf += data
                while len(buf) >= 6:
                    if buf[:2] != b"2A":
                        raise OSError(0, "not an ACK frame")
                    acked = max(acked, struct.unpack(">I", buf[2:6])[0])
                    buf = buf[6:]
            self.windows_acked += 1
            self.events_acked += acked


class HealthProbe(threading.Thread):
    """GET /health every `interval`: each answer's latency and whether it said ok."""

    def __init__(self, api, stop, interval=0.2, timeout=5.0):
        super().__init__(name="health", daemon=True)
        self.api, self.stop, self.interval, self.timeout = api, stop, interval, timeout
        self.latencies, self.failures, self.not_ok = [], [], 0
        self.t0 = time.monotonic()

    def run(self):
        while not self.stop.is_set():
            t = time.monotonic()
            try:
                with urllib.request.urlopen(f"http://{self.api}/health", timeout=self.timeout) as r:
                    body = json.load(r)
                self.latencies.append((t - self.t0, time.monotonic() - t))
                if body.get("status") != "ok":
                    self.not_ok += 1
            except (OSError, ValueError) as e:
                self.failures.append((t - self.t0, type(e).__name__))
            self.stop.wait(max(0.0, self.interval - (time.monotonic() - t)))


class MemoryPoller(threading.Thread):
    """/stats every `interval`: the memory budget's used bytes and waiters (peaks)."""

    def __init__(self, api, stop, interval=0.1):
        super().__init__(name="memory", daemon=True)
        self.api, self.stop, self.interval = api, stop, interval
        self.used_peak = self.waiting_peak = 0
        self.samples = 0

    def run(self):
        while not self.stop.is_set():
            t = time.monotonic()
            try:
                m = stats(self.api, timeout=2).get("memory", {})
                self.used_peak = max(self.used_peak, m.get("used_bytes", 0))
                self.waiting_peak = max(self.waiting_peak, m.get("waiting", 0))
                self.samples += 1
            except (OSError, ValueError):
                pass
            self.stop.wait(max(0.0, self.interval - (time.monotonic() - t)))


def suite_payloads(args):
    """Every body and window the attacks send, made once."""
    spaces = memory_body("spaces", args.body_bytes)
    gz = zlib.compressobj(9, zlib.DEFLATED, GZIP_WBITS)
    gz_body = gz.compress(spaces) + gz.flush()
    bomb, bomb_inflated = repeated_deflate(b" " * MIB, max(1, args.bomb_bytes // MIB), GZIP_WBITS)
    window, window_inflated = beats_window(args.beats_window, args.beats_event_bytes)
    lj_bomb, lj_bomb_inflated, lj_bomb_events = beats_bomb(args.bomb_bytes, args.beats_bomb_frame_bytes)
    return {"spaces": spaces, "gzip": gz_body, "http_bomb": bomb, "http_bomb_inflated": bomb_inflated,
            "window": window, "window_inflated": window_inflated,
            "beats_bomb": lj_bomb, "beats_bomb_inflated": lj_bomb_inflated, "beats_bomb_events": lj_bomb_events}


def suite_run(binary, tmp, args, attacks, payloads):
    """One node with http, tcp, syslog (tcp) and beats inputs, attacked by `attacks` at once."""
    name = "+".join(attacks)
    api = f"127.0.0.1:{free_port()}"
    ports = {p: free_port() for p in ("http", "tcp", "syslog", "beats")}
    inputs = [
        {"type": "http", "address": f"127.0.0.1:{ports['http']}", "path": PATH, "max_body_bytes": f"{args.body_bytes}B"},
        {"type": "tcp", "address": f"127.0.0.1:{ports['tcp']}"},
        {"type": "syslog", "mode": "tcp", "address": f"127.0.0.1:{ports['syslog']}"},
        {"type": "beats", "address": f"127.0.0.1:{ports['beats']}"},
    ]
    doc = base_config(tmp, api, inputs, [{"type": "blackhole"}])
    doc, used, refused = with_optional(binary, tmp, doc, [
        (f"memory.budget ({args.budget // MIB}MiB)", lambda d: d.__setitem__("memory", {"budget": f"{args.budget}B"}))])
    cfg = write_config(os.path.join(tmp, f"suite-{name}.yml"), doc)
    s = Sluice(binary, cfg, os.path.join(tmp, f"suite-{name}.log"), api)
    stop_sampling, stop, abort = threading.Event(), threading.Event(), threading.Event()
    stop_probes = threading.Event()  # set before the SIGTERM: /health is not probed during the drain
    answers = {"http": [], "http-gzip": [], "http-bomb": []}
    lock = threading.Lock()
    threads, senders, beats = [], {}, {}
    try:
        s.wait_api()
        for p in ports.values():
            s.wait_port(p)
        time.sleep(1.0)
        sampler = RssSampler(s.pid, args.rss_cap, stop_sampling)
        idle_rss = sampler.read()[0]
        health = HealthProbe(api, stop_probes)
        memory = MemoryPoller(api, stop_probes)
        for t in (sampler, health, memory):
            t.start()
        load_start = load_average()[0]
        started = time.monotonic()
        send_until = started + args.seconds
        hard_end = send_until + args.request_timeout + args.margin

        def poster(kind, body, headers):
            while not stop.is_set() and time.monotonic() < send_until:
                a = http_post(ports["http"], body, hard_end, abort, headers=headers)
                with lock:
                    answers[kind].append(a)
                if a.error and a.error.startswith("connect"):
                    stop.wait(0.1)

        gzip_header = "Content-Encoding: gzip\r\n"
        if "http" in attacks:
            threads += [threading.Thread(target=poster, args=("http", payloads["spaces"], ""), daemon=True)
                        for _ in range(args.clients)]
            threads += [threading.Thread(target=poster, args=("http-gzip", payloads["gzip"], gzip_header), daemon=True)
                        for _ in range(args.gzip_clients)]
        if "http-bomb" in attacks:
            threads += [threading.Thread(target=poster, args=("http-bomb", payloads["http_bomb"], gzip_header),
                                         daemon=True) for _ in range(args.bomb_clients)]
        for proto, line in (("tcp", b"1\n"), ("syslog", b"1 1")):
            if proto in attacks:
                block = line * ((64 << 10) // len(line))
                senders[proto] = [LineSender(f"127.0.0.1:{ports[proto]}", block, len(line), stop=stop)
                                  for _ in range(args.line_connections)]
                threads += senders[proto]
        if "beats" in attacks:
            beats["beats"] = [BeatsClient(ports["beats"], payloads["window"], args.beats_window, stop, f"beats-{i}")
                              for i in range(args.beats_connections)]
            threads += beats["beats"]
        if "beats-bomb" in attacks:
            beats["beats-bomb"] = [BeatsClient(ports["beats"], payloads["beats_bomb"], payloads["beats_bomb_events"],
                                               stop, f"beats-bomb-{i}") for i in range(args.bomb_clients)]
            threads += beats["beats-bomb"]
        for t in threads:
            t.start()
        while time.monotonic() < send_until and sampler.capped_at is None and s.alive():
            time.sleep(0.1)
        stop.set()
        if sampler.capped_at is not None or not s.alive():
            abort.set()
        for t in threads:
            t.join(max(0.0, hard_end - time.monotonic()) + 5)
        abort.set()
        for t in threads:
            t.join(5)
        elapsed = time.monotonic() - started
        # What stays resident once the clients are gone: memory still allocated (pools, the
        # allocator's free pages) rather than events in flight.
        after_rss = after_used = None
        if s.alive() and sampler.capped_at is None:
            time.sleep(args.settle)
            try:
                after_rss = sampler.read()[0]
                after_used = stats(api).get("memory", {}).get("used_bytes")
            except (OSError, ValueError, TypeError):
                pass
        died = not s.alive() and sampler.capped_at is None
        try:
            final = stats(api) if s.alive() else {}
        except OSError:
            final = {}
        load_end = load_average()[0]
        stop_probes.set()
        for t in (health, memory):
            t.join(6)
        status = s.terminate(10)
        stop_sampling.set()
        for t in (sampler, health, memory):
            t.join(6)
    finally:
        stop.set()
        abort.set()
        stop_probes.set()
        stop_sampling.set()
        s.close()

    per_input = {}
    for pipe in final.get("pipelines", {}).values():
        for c in pipe.get("components", []):
            if c.get("kind") == "input":
                per_input[c["type"]] = {"in": c["events"]["in"], "failed": c["events"]["failed"],
                                        "refused": c.get("refused", 0)}
    mem_final = final.get("memory", {})
    peak = sampler.peak()
    hlat = [lat for _, lat in health.latencies]
    slow_health = [(round(at, 1), round(lat, 3)) for at, lat in health.latencies if lat >= 1.0]
    row = {
        "mode": "budget-suite",
        "attacks": list(attacks),
        "seconds": round(elapsed, 1),
        "keys_used": used,
        "keys_refused": refused,
        "budget_bytes": args.budget,
        "idle_rss_mib": round(idle_rss / MIB, 1),
        "peak_rss_mib": round(peak / MIB, 1),
        "peak_rss_over_budget": round(peak / args.budget, 3),
        "max_ratio": args.max_ratio,
        "rss_samples": sampler.samples,
        "stopped_at_rss_cap_after_s": None if sampler.capped_at is None else round(sampler.capped_at, 1),
        "sluice_died": died,
        "exit_status": status,
        "cpu_s": None if s.usage is None else round(s.usage.ru_utime + s.usage.ru_stime, 1),
        "memory_used_peak_mib": round(memory.used_peak / MIB, 1),
        "settle_s": args.settle,
        "rss_after_mib": None if after_rss is None else round(after_rss / MIB, 1),
        "memory_used_after_mib": None if after_used is None else round(after_used / MIB, 1),
        "memory_waiting_peak": memory.waiting_peak,
        "memory_refused": mem_final.get("refused"),
        "memory_samples": memory.samples,
        "inputs": per_input,
        "http_answers": {k: count_kinds(v) for k, v in answers.items() if v},
        "lines_sent": {p: sum(x.sent for x in v) for p, v in senders.items()},
        "line_errors": {p: sorted({type(x.error).__name__ for x in v if x.error}) for p, v in senders.items()},
        "beats": {k: {"windows_acked": sum(c.windows_acked for c in v), "events_acked": sum(c.events_acked for c in v),
                      "closed_by_server": sum(c.closed_by_server for c in v),
                      "close_after_p50_s": rnd(percentile([x for c in v for x in c.close_after], 50)),
                      "connect_errors": sum(c.connect_errors for c in v),
                      "errors": {e: sum(c.errors.get(e, 0) for c in v) for e in {e for c in v for e in c.errors}}}
                  for k, v in beats.items()},
        "health_probes": len(health.latencies) + len(health.failures),
        "health_max_s": rnd(max(hlat, default=None)),
        "health_p99_s": rnd(percentile(hlat, 99)),
        "health_over_1s_count": len(slow_health),
        "health_over_1s": slow_health[:10],
        "health_failed": health.failures[:10],
        "health_not_ok": health.not_ok,
        "responsive": bool(hlat) and not slow_health and not health.failures,
        "load_average": [round(load_start, 2), round(load_end, 2)],
    }
    return row


def print_suite(rows, args, payloads):
    print(f"hostile --budget-suite: one node, inputs http, tcp, syslog (tcp) and beats -> memory queue -> blackhole, "
          f"memory.budget {args.budget // MIB} MiB")
    print(f"  http: {args.clients} x {len(payloads['spaces']):,}-byte bodies of `1 1 1 ...` and {args.gzip_clients} x "
          f"the same gzipped ({len(payloads['gzip']):,} bytes); http-bomb: {args.bomb_clients} x gzip of "
          f"{payloads['http_bomb_inflated']:,} spaces ({len(payloads['http_bomb']):,} bytes)")
    print(f"  tcp: {args.line_connections} connections of `1\\n`; syslog: {args.line_connections} connections of "
          f"octet-counted `1 1`")
    print(f"  beats: {args.beats_connections} connections, windows of {args.beats_window:,} events in one compressed "
          f"frame ({len(payloads['window']):,} bytes, inflating to {payloads['window_inflated']:,}); beats-bomb: "
          f"{args.bomb_clients} x a window of {payloads['beats_bomb_events']:,} events of "
          f"{args.beats_bomb_frame_bytes:,}-byte frames in one "
          f"compressed frame ({len(payloads['beats_bomb']):,} bytes, inflating to {payloads['beats_bomb_inflated']:,})")
    for r in rows:
        capped = r["stopped_at_rss_cap_after_s"]
        print(f"\n{' + '.join(r['attacks'])}: {r['seconds']} s; new keys used: {', '.join(r['keys_used']) or 'none'}"
              + (f"; refused by this build: {', '.join(r['keys_refused'])}" if r["keys_refused"] else ""))
        items = [
            ("idle RSS MiB (started, before the attack)", r["idle_rss_mib"]),
            ("peak RSS MiB (max of VmRSS samples, VmHWM)", r["peak_rss_mib"]),
            (f"peak RSS / budget ({r['budget_bytes'] // MIB} MiB)", f"{r['peak_rss_over_budget']:.2f}"
             + ("" if r["peak_rss_over_budget"] <= r["max_ratio"] else f"  (over {r['max_ratio']:g})")),
            ("sluice_memory_used_bytes peak MiB (/stats, every 100 ms)", r["memory_used_peak_mib"]),
            ("  waiting peak; memory refusals", f"{r['memory_waiting_peak']}; {r['memory_refused']}"),
            (f"RSS MiB {r['settle_s']:g} s after the clients stopped (used MiB then)",
             f"{r['rss_after_mib']} ({r['memory_used_after_mib']})"),
            ("stopped at the RSS cap", f"yes, {capped} s in" if capped is not None else "no"),
            ("sluice died by itself", "yes" if r["sluice_died"] else "no"),
            ("sluice CPU s", r["cpu_s"]),
        ]
        for kind, inp in sorted(r["inputs"].items()):
            items.append((f"input {kind}: events in / failed / refused", f"{inp['in']:,} / {inp['failed']:,} / "
                                                                        f"{inp['refused']:,}"))
        for kind, a in r["http_answers"].items():
            items.append((f"  {kind} answers", ", ".join(f"{k} {v}" for k, v in a.items())))
        for proto, n in r["lines_sent"].items():
            errs = r["line_errors"][proto]
            items.append((f"  {proto} lines sent", f"{n:,}" + (f" (ended by {', '.join(errs)})" if errs else "")))
        for kind, b in r["beats"].items():
            items.append((f"  {kind}: windows ACKed, events ACKed",
                          f"{b['windows_acked']:,}, {b['events_acked']:,}"))
            items.append((f"  {kind}: closed by the server (p50 s after send)",
                          f"{b['closed_by_server']:,} ({fmt_s(b['close_after_p50_s'])})"
                          + (f"; errors {b['errors']}" if b["errors"] else "")))
        items += [
            ("GET /health: probes, p99 / max s", f"{r['health_probes']}, {fmt_s(r['health_p99_s'])} / "
                                                f"{fmt_s(r['health_max_s'])}"),
            ("responsive (every /health answered within 1 s)", "yes" if r["responsive"] else
             f"NO: {r['health_over_1s_count']} over 1 s (the first at, s: took) {r['health_over_1s']}, "
             f"failed {r['health_failed']}"),
            ("load average (1 min) at start, end", f"{r['load_average'][0]}, {r['load_average'][1]}"),
        ]
        for name, value in items:
            print(f"  {name:58} {value}")
    print(f"\n{'attacks':24} {'idle MiB':>8} {'peak MiB':>8} {'/budget':>7} {'used MiB':>8} {'after MiB':>9} "
          f"{'health max s':>12}")
    for r in rows:
        name = "all" if len(r["attacks"]) == len(ATTACKS) else " + ".join(r["attacks"])
        print(f"{name:24} {r['idle_rss_mib']:8.1f} {r['peak_rss_mib']:8.1f} {r['peak_rss_over_budget']:7.2f} "
              f"{r['memory_used_peak_mib']:8.1f} {r['rss_after_mib'] if r['rss_after_mib'] is not None else '-':>9} "
              f"{fmt_s(r['health_max_s']):>12}")


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--memory", action="store_true", help="10 MiB bodies of tiny values against a memory budget")
    mode.add_argument("--slow", action="store_true", help="thousands of half-sent requests and idle connections")
    mode.add_argument("--budget-suite", action="store_true",
                      help="one node, http + tcp + syslog + beats attacked at once: peak RSS against memory.budget")
    ap.add_argument("--sluice", help="the sluice binary (default: target/release/sluice)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON too")
    m = ap.add_argument_group("--memory (--seconds, --clients, --body-bytes, --budget, --request-timeout and "
                              "--rss-cap also for --budget-suite)")
    m.add_argument("--seconds", type=float, default=60, help="how long the clients post (default 60)")
    m.add_argument("--clients", type=int, default=8, help="clients posting 10 MiB bodies (default 8)")
    m.add_argument("--shape", choices=("both", "spaces", "array"), default="both",
                   help="`1 1 1 ...`, `[1,1,1,...]`, or one run of each (default)")
    m.add_argument("--body-bytes", type=parse_size, default=10 * MIB, help="body size, also max_body_bytes")
    m.add_argument("--budget", type=parse_size,
                   help="memory.budget (default 256MiB; 128MiB with --budget-suite)")
    m.add_argument("--request-timeout", type=parse_duration, default=30.0, help="http request_timeout (30s)")
    m.add_argument("--max-events-per-request", type=int, help="set max_events_per_request (default: leave it)")
    ap.add_argument("--margin", type=float, default=2.0,
                    help="seconds allowed past request_timeout, or past a slow connection's timeout (default 2)")
    m.add_argument("--rss-cap", type=parse_size, default=4 * GIB,
                   help="SIGKILL sluice and report when its RSS passes this (default 4GiB)")
    m.add_argument("--normal-events", type=int, default=10, help="events per normal request (default 10)")
    sl = ap.add_argument_group("--slow")
    sl.add_argument("--slow-clients", type=int, default=5000)
    sl.add_argument("--inputs", default="http,tcp", help="which inputs to try (default http,tcp)")
    sl.add_argument("--header-timeout", type=parse_duration, default=10.0, help="http header_timeout (10s)")
    sl.add_argument("--body-timeout", type=parse_duration, default=30.0, help="http body_timeout (30s)")
    sl.add_argument("--max-connections", type=int, default=1024, help="max_connections of both inputs (1024)")
    sl.add_argument("--tcp-idle-timeout", type=parse_duration, default=5.0,
                    help="tcp idle_timeout, short so the run stays short (default 5s; the input's default is 5m)")
    sl.add_argument("--hold", type=float, help="seconds to hold the slow connections (default: the longest "
                                               "timeout + 10)")
    sl.add_argument("--normal-timeout", type=float, default=5.0, help="a normal request's own timeout (5 s)")
    sl.add_argument("--refused-within", type=float, default=1.0,
                    help="a connection the server closes this soon counts as refused (default 1 s)")
    bs = ap.add_argument_group("--budget-suite")
    bs.add_argument("--only", nargs="+", choices=ATTACKS, default=list(ATTACKS),
                    help="the attacks to run together (default: all)")
    bs.add_argument("--each", action="store_true",
                    help="first run each chosen attack alone, then all of them together")
    bs.add_argument("--max-ratio", type=float, default=1.25,
                    help="exit 1 when a run's peak RSS / budget is above this (default 1.25)")
    bs.add_argument("--gzip-clients", type=int, default=2,
                    help="http clients posting the 10 MiB body gzipped (default 2)")
    bs.add_argument("--bomb-clients", type=int, default=1,
                    help="clients sending each bomb, one bomb at a time (default 1)")
    bs.add_argument("--bomb-bytes", type=parse_size, default=GIB, help="what each bomb inflates to (default 1GiB)")
    bs.add_argument("--line-connections", type=int, default=4,
                    help="tcp and syslog connections streaming tiny lines, each (default 4)")
    bs.add_argument("--beats-connections", type=int, default=8, help="beats connections sending windows (default 8)")
    bs.add_argument("--beats-window", type=int, default=65536, help="events per beats window (default 65536)")
    bs.add_argument("--beats-event-bytes", type=int, default=900,
                    help="JSON bytes per beats event (default 900: 59 MB per window inflated)")
    bs.add_argument("--settle", type=float, default=3.0,
                    help="seconds after the clients stop before the resident size is read again (default 3)")
    bs.add_argument("--beats-bomb-frame-bytes", type=parse_size, default=16 << 10,
                    help="size of each data frame inside the beats bomb (default 16KiB)")
    args = ap.parse_args()
    if args.budget is None:
        args.budget = 128 * MIB if args.budget_suite else 256 * MIB
    binary = sluice_binary(args.sluice)
    on_signals_exit()
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="sluice-hostile-") as tmp:
            if args.budget_suite:
                if args.seconds <= 0 or min(args.clients, args.gzip_clients, args.bomb_clients,
                                            args.line_connections, args.beats_connections) < 0:
                    ap.error("--seconds must be > 0 and the client counts >= 0")
                if not 1 <= args.beats_window <= 65536:
                    ap.error("--beats-window must be 1 to 65536 (the input's max_window_size)")
                payloads = suite_payloads(args)
                only = [a for a in ATTACKS if a in args.only]
                runs = ([[a] for a in only] if args.each and len(only) > 1 else []) + [only]
                for attacks in runs:
                    rows.append(suite_run(binary, tmp, args, attacks, payloads))
                    print(f"done: {' + '.join(attacks)}: peak RSS {rows[-1]['peak_rss_mib']} MiB, "
                          f"{rows[-1]['peak_rss_over_budget']:.2f} x budget", file=sys.stderr, flush=True)
                print_suite(rows, args, payloads)
            elif args.memory:
                if args.clients < 1 or args.seconds <= 0:
                    ap.error("--clients must be >= 1 and --seconds > 0")
                shapes = ("spaces", "array") if args.shape == "both" else (args.shape,)
                for shape in shapes:
                    rows.append(memory_run(binary, tmp, args, shape))
                print_memory(rows)
            else:
                inputs = [p.strip() for p in args.inputs.split(",") if p.strip()]
                if not inputs or any(p not in ("http", "tcp") for p in inputs):
                    ap.error("--inputs takes http, tcp or both")
                timeouts = []
                if "http" in inputs:
                    timeouts += [args.header_timeout, args.body_timeout]
                if "tcp" in inputs:
                    timeouts.append(args.tcp_idle_timeout)
                shortest = min(timeouts)
                if args.refused_within >= shortest:
                    ap.error(f"--refused-within ({args.refused_within:g} s) must be shorter than the shortest "
                             f"timeout ({shortest:g} s), or timed-out connections count as refused")
                want = args.slow_clients + 512
                soft, hard = raise_nofile(want)
                if soft < want:
                    fit = max(1, soft - 512)
                    print(f"note: RLIMIT_NOFILE reaches only {soft} (hard limit {hard}): {fit} slow clients, not "
                          f"{args.slow_clients}", file=sys.stderr)
                    args.slow_clients = fit
                for proto in inputs:
                    rows.append(slow_phase(binary, tmp, args, proto))
                print_slow(rows)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: sluice stopped, temp dir removed", file=sys.stderr)
        return 130
    finally:
        stop_all()
    print(f"(load average {'/'.join(f'{v:.2f}' for v in load_average())}; {os.cpu_count()} CPUs)")
    if args.json:
        print(json.dumps(rows))
    if args.budget_suite:
        return 0 if all(r["peak_rss_over_budget"] <= args.max_ratio and not r["sluice_died"]
                        and r["stopped_at_rss_cap_after_s"] is None for r in rows) else 1
    if args.memory:
        return 0 if all(r["every_request_answered_within_limit"] and r["peak_rss_over_budget"] <= 2 for r in rows) else 1
    return 0 if all(r["goal_slow_closed_in_time"] and (r["input"] == "tcp" or r["goal_normal_under_1s"])
                    for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
