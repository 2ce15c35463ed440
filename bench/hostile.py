#!/usr/bin/env python3
"""Hostile clients against the `http` and `tcp` inputs: memory amplification and slow clients.

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

The new limits (`memory.budget`, the http input's timeouts, `max_connections` and
`max_events_per_request`, the tcp input's `idle_timeout`) are set only if `sluice validate`
accepts them; the run says which ones this build refused and runs without them.
Loopback only; every loop is bounded in time; the processes and temp dirs are cleaned up.

Usage: bench/hostile.py --memory [--seconds 60] [--shape both|spaces|array] [--json]
       bench/hostile.py --slow [--slow-clients 5000] [--json]
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
import tempfile
import threading
import time

from harness import (GIB, MIB, BenchError, Sluice, accepted_keys, fmt_s, free_port, load_average, on_signals_exit,
                     percentile, sluice_binary, stop_all, write_config)

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


def http_post(port, body, deadline, abort, connect_timeout=5.0):
    """Posts `body` on a new connection and reads the answer, with non-blocking I/O so that an
    early answer (a 413 before the body is read) is seen even if the send then fails. Returns an
    Answer; `unanswered` when `deadline` passed or `abort` was set first."""
    start = time.monotonic()
    head = (f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
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


# ---------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--memory", action="store_true", help="10 MiB bodies of tiny values against a memory budget")
    mode.add_argument("--slow", action="store_true", help="thousands of half-sent requests and idle connections")
    ap.add_argument("--sluice", help="the sluice binary (default: target/release/sluice)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON too")
    m = ap.add_argument_group("--memory")
    m.add_argument("--seconds", type=float, default=60, help="how long the clients post (default 60)")
    m.add_argument("--clients", type=int, default=8)
    m.add_argument("--shape", choices=("both", "spaces", "array"), default="both",
                   help="`1 1 1 ...`, `[1,1,1,...]`, or one run of each (default)")
    m.add_argument("--body-bytes", type=parse_size, default=10 * MIB, help="body size, also max_body_bytes")
    m.add_argument("--budget", type=parse_size, default=256 * MIB, help="memory.budget (default 256MiB)")
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
    args = ap.parse_args()
    binary = sluice_binary(args.sluice)
    on_signals_exit()
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="sluice-hostile-") as tmp:
            if args.memory:
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
    if args.memory:
        return 0 if all(r["every_request_answered_within_limit"] and r["peak_rss_over_budget"] <= 2 for r in rows) else 1
    return 0 if all(r["goal_slow_closed_in_time"] and (r["input"] == "tcp" or r["goal_normal_under_1s"])
                    for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
