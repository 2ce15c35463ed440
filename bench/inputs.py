#!/usr/bin/env python3
"""Network inputs, as ratios taken in one run: `beats` against `tcp`, TLS against plain `tcp`, and
how fast `syslog` over UDP can be sent to before the kernel drops datagrams.

Every scenario runs the release `sluice` with one input, no processors, a memory queue, 2 workers
and a `blackhole` output, fed the same ~250-byte JSON events (10,000 distinct ones):

- `tcp`: `tcp` input, `codec: json_lines`; one connection written by `LineSender` (a prebuilt
  block of lines, sent with `sendall` as fast as it is taken).
- `beats`: `beats` input; the go-lumber client of bench/beats-load (built here with `go build`),
  one connection, windows of 2,048 events (`--beats-window`), 8 windows in flight
  (`--beats-inflight`), uncompressed JSON frames; the documents are the tcp lines without their
  newline, sent as they are (the client encodes nothing per event).
- `beats-2`: the same with 2 windows in flight, Filebeat's default (`pipelining: 2`). A window is
  ACKed once its last events are through the workers: with few windows in flight the client
  has nothing more to send while it waits, so this one measures the acknowledgement latency
  (its p50/p99 are printed per run, from /metrics) as much as the input.
- `tcp-tls`: the `tcp` input with `tls: {cert, key}` (a self-signed certificate made with
  `openssl req -x509` in a temp dir); one connection written by a Python `ssl` sender thread
  (`sendall` of 256 KiB pieces of the same block). Before the TLS rounds, the script measures
  that sender alone against a TLS sink of its own (`tls-sender-alone`), so that the TLS figure
  can be read against the sender's own ceiling on this machine.

Each rate is events out of the pipeline per second, from /stats samples every 0.25 s over a
window of `--window` seconds that starts `--warmup` seconds after the sender started; each
scenario runs `--repeat` times (every other round in reverse order), the table shows the median
and every round, and each ratio is the median of the per-round ratios. CPU is the processes' own
(from /proc/PID/stat) over the window: `sluice` per million events, and the sender's share of one
core.

- `syslog-udp`: the `syslog` input with `mode: udp` and the default `receive_buffer_bytes` (the
  kernel's `net.core.rmem_default`; the size it granted is read from /metrics). A paced sender
  (one process, or several when one cannot reach the rate) sends ~200-byte RFC 5424 messages
  at a stepped rate for `--step` seconds per step, after a warm-up at 10,000/s: from 20,000/s up
  by half each step until the first drop (down by half while the first steps drop), then halving
  the gap between the highest clean step and the lowest dropping one. A step is
  clean when /metrics shows `sluice_component_datagrams_dropped_total` unchanged and
  `sluice_component_datagrams_received_total` up by every datagram sent. Reported per round:
  the highest clean rate and the lowest rate with drops (achieved send rates); median over the
  rounds. The script also measures how many such datagrams a socket with that buffer holds
  (each is charged its whole socket buffer, about 1.3 KB on loopback, not its 200 bytes).

Usage: bench/inputs.py [--build] [--quick] [--repeat 5] [--only tcp beats beats-2 tcp-tls syslog-udp]
       [--beats-inflight 8] [--batch-delay 5ms] [--receive-buffer 4MiB] [--verbose] [--json]
"""
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the scripts

import argparse
import json
import math
import multiprocessing
import os
import shutil
import socket
import ssl
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request

from harness import (ROOT, BenchError, LineSender, Sluice, build_release, die, free_port, load_average,
                     on_signals_exit, sluice_binary, stats, stop_all, write_config)

PIPELINE = "bench"
RATE_SCENARIOS = ["tcp", "beats", "beats-2", "tcp-tls"]
ALL = RATE_SCENARIOS + ["syslog-udp"]
RATIOS = [("beats / tcp", "beats", "tcp", 0.8), ("beats-2 / tcp", "beats-2", "tcp", 0.8),
          ("beats-2 / beats", "beats-2", "beats", None), ("tcp-tls / tcp", "tcp-tls", "tcp", 0.8)]
FILEBEAT_PIPELINING = 2  # Filebeat's default `pipelining` for output.logstash
LINE_BYTES = 250  # with the newline; the beats documents are the 249 bytes before it
CLIENT_DIR = os.path.join(ROOT, "bench", "beats-load")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def json_lines(n, size=LINE_BYTES):
    """`n` distinct JSON lines of exactly `size` bytes with the newline, shaped like e2e.py's."""
    out = []
    for i in range(n):
        head = ('{"ts":"2026-11-21T07:%02d:%02d.%03dZ","level":"%s","host":"web-%d","service":"checkout",'
                '"trace_id":"%016x","status":%d,"method":"GET","path":"/api/v1/items/%d","latency_ms":%d,"msg":"'
                % ((i // 60) % 60, i % 60, i % 1000, ["info", "warn", "error", "debug"][i % 4], i % 16,
                   (i * 0x9E3779B97F4A7C15) % (1 << 64), [200, 201, 404, 500, 503][i % 5], i % 10000, i % 300))
        line = head + "x" * (size - len(head) - 3) + '"}\n'
        assert len(line) == size
        out.append(line.encode())
    return b"".join(out)


def syslog_datagrams(n, size=200):
    """`n` distinct RFC 5424 messages of exactly `size` bytes."""
    out = []
    for i in range(n):
        head = ("<%d>1 2026-11-26T08:%02d:%02d.%06dZ web-%d.example.com checkout %d ID%d "
                '[req@32473 id="%08x" status="%d"] '
                % (8 * (16 + i % 8) + i % 8, (i // 60) % 60, i % 60, i % 1000000, i % 16, 1000 + i % 5000, i % 100,
                   i * 2654435761 % (1 << 32), [200, 404, 500][i % 3]))
        msg = head + "GET /api/v1/items/%d took %d ms " % (i % 10000, i % 300)
        out.append((msg + "x" * (size - len(msg))).encode())
        assert len(out[-1]) == size
    return out


def cpu_seconds(pid):
    """User plus system CPU seconds of a process (all its threads) so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def metrics(api):
    """The /metrics figures, as {name: summed value}."""
    with urllib.request.urlopen(f"http://{api}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            pass
    return out


def ack_buckets(api):
    """The pipeline's `sluice_pipeline_ack_latency_seconds` buckets at /metrics, as sorted
    [(upper bound, cumulative count)]; empty from a build without it."""
    with urllib.request.urlopen(f"http://{api}/metrics", timeout=5) as r:
        text = r.read().decode()
    prefix = "sluice_pipeline_ack_latency_seconds_bucket{"
    out = []
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        labels, _, value = line[len(prefix):].rpartition("} ")
        fields = dict(kv.split("=", 1) for kv in labels.split(","))
        if fields.get("pipeline") != f'"{PIPELINE}"':
            continue
        le = fields["le"].strip('"')
        out.append((math.inf if le == "+Inf" else float(le), float(value)))
    return sorted(out)


def ack_quantiles(before, after, qs=(0.5, 0.99)):
    """The acknowledgements between two `ack_buckets` readings: (count, {q: seconds}), each
    quantile interpolated within its bucket as Prometheus' histogram_quantile does (one in the
    +Inf bucket is given as the highest finite bound)."""
    if not after:
        return 0, {}
    prev = dict(before)
    counts = [(le, c - prev.get(le, 0.0)) for le, c in after]
    total = counts[-1][1]
    if total <= 0:
        return 0, {}
    res = {}
    for q in qs:
        rank = q * total
        lower, below = 0.0, 0.0
        for le, c in counts:
            if c >= rank:
                if math.isinf(le):
                    res[q] = lower
                else:
                    within = c - below
                    res[q] = lower + (le - lower) * ((rank - below) / within if within > 0 else 1.0)
                break
            lower, below = le, c
    return int(total), res


def fmt_ms(seconds):
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def out_events(api):
    return stats(api)["pipelines"][PIPELINE]["events"]["out"]


def pipeline_doc(tmp, api, inputs, workers, batch_delay=None):
    pipeline = {"workers": workers, "inputs": inputs, "processors": [], "outputs": [{"type": "blackhole"}]}
    if batch_delay:
        pipeline["batch"] = {"delay": batch_delay}
    return {
        "data_dir": os.path.join(tmp, "data"),
        "api": {"address": api},
        "log": {"level": "info"},
        "pipelines": {PIPELINE: pipeline},
    }


def make_cert(tmp):
    cert, key = os.path.join(tmp, "server.crt"), os.path.join(tmp, "server.key")
    r = subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                        "-nodes", "-keyout", key, "-out", cert, "-days", "2", "-subj", "/CN=localhost",
                        "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"], capture_output=True, text=True)
    if r.returncode != 0:
        raise BenchError("openssl req -x509 failed:\n" + r.stderr)
    return cert, key


def build_client(tmp):
    """`go build` of bench/beats-load into the temp dir; its path."""
    exe = os.path.join(tmp, "beats-load")
    r = subprocess.run(["go", "build", "-o", exe, "."], cwd=CLIENT_DIR, capture_output=True, text=True)
    if r.returncode != 0:
        raise BenchError("go build of bench/beats-load failed:\n" + r.stdout + r.stderr)
    return exe


class TlsLineSender(threading.Thread):
    """LineSender over TLS: the block, sent again and again in `piece`-byte slices with `sendall` on
    an `ssl` socket (the encryption runs with the GIL released), until `stop`. `sent` counts whole
    lines; `cipher` is what was negotiated."""

    def __init__(self, address, block, line_bytes, stop, piece=256 << 10):
        super().__init__(name=f"tls-sender-{address}", daemon=True)
        self.address = address
        self.block = memoryview(block)
        self.line_bytes = line_bytes
        self.piece = max(line_bytes, piece - piece % line_bytes)
        self.stop = stop
        self.sent = 0
        self.error = None
        self.cipher = None
        self.cpu = 0.0

    def run(self):
        host, port = self.address.rsplit(":", 1)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        try:
            with socket.create_connection((host, int(port)), timeout=30) as raw, \
                    ctx.wrap_socket(raw, server_hostname="localhost") as s:
                s.settimeout(None)
                self.cipher = s.cipher()
                cpu0 = time.thread_time()
                offset, size = 0, len(self.block)
                while not self.stop.is_set():
                    end = min(size, offset + self.piece)
                    s.sendall(self.block[offset:end])
                    self.sent += (end - offset) // self.line_bytes
                    offset = 0 if end == size else end
                self.cpu = time.thread_time() - cpu0
                try:
                    s.unwrap()
                except (OSError, ValueError):
                    pass
        except OSError as e:
            self.error = e


class TlsSink(threading.Thread):
    """A TLS server that reads and discards what one client sends; counts the bytes."""

    def __init__(self, cert, key):
        super().__init__(name="tls-sink", daemon=True)
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(4)
        self.address = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.received = 0
        self.error = None

    def run(self):
        buf = bytearray(1 << 20)
        try:
            conn, _ = self.listener.accept()
            with self.ctx.wrap_socket(conn, server_side=True) as s:
                while True:
                    n = s.recv_into(buf)
                    if not n:
                        break
                    self.received += n
        except (OSError, ssl.SSLError) as e:
            self.error = e
        finally:
            self.listener.close()


def tls_sender_alone(args, block, cert, key):
    """The Python TLS sender against `TlsSink` (both in this process, on the same 2 cores): a floor
    on what the sender alone can push, in lines per second, over the same warm-up and window."""
    sink = TlsSink(cert, key)
    sink.start()
    stop = threading.Event()
    sender = TlsLineSender(sink.address, block, LINE_BYTES, stop)
    load = load_average()[0]
    sender.start()
    time.sleep(args.warmup)
    b0, t0, c0 = sink.received, time.monotonic(), cpu_seconds(os.getpid())
    time.sleep(args.window)
    b1, t1, c1 = sink.received, time.monotonic(), cpu_seconds(os.getpid())
    stop.set()
    sender.join(30)
    sink.join(30)
    if sender.error:
        raise BenchError(f"the TLS sender failed against its sink: {sender.error}")
    rate = (b1 - b0) / LINE_BYTES / (t1 - t0)
    return {"scenario": "tls-sender-alone", "events_per_s": rate, "cipher": sender.cipher and sender.cipher[0],
            "sender_core": (c1 - c0) / (t1 - t0), "load": round(load, 2)}


def run_rate(args, binary, tmp, scenario, block, lines_file, client, cert, key):
    """One round of one rate scenario; a row."""
    api = f"127.0.0.1:{free_port()}"
    port = free_port()
    address = f"127.0.0.1:{port}"
    if scenario.startswith("beats"):
        inp = {"type": "beats", "address": address}
    else:
        inp = {"type": "tcp", "address": address, "codec": "json_lines"}
        if scenario == "tcp-tls":
            inp["tls"] = {"cert": cert, "key": key}
    d = os.path.join(tmp, scenario)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    cfg = write_config(os.path.join(d, "sluice.yml"), pipeline_doc(d, api, [inp], args.workers, args.batch_delay))
    node = Sluice(binary, cfg, os.path.join(d, "sluice.log"), api)
    proc = None
    stop = threading.Event()
    sender = None
    try:
        node.wait_api()
        node.wait_port(port)
        if scenario.startswith("beats"):
            inflight = FILEBEAT_PIPELINING if scenario == "beats-2" else args.beats_inflight
            proc = subprocess.Popen([client, "-addr", address, "-events", lines_file, "-window",
                                     str(args.beats_window), "-inflight", str(inflight), "-n", "0"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            sender_pid = proc.pid
        else:
            sender_pid = os.getpid()
            if scenario == "tcp-tls":
                sender = TlsLineSender(address, block, LINE_BYTES, stop)
            else:
                sender = LineSender(address, block, LINE_BYTES, stop=stop)
            sender.start()
        load_before = load_average()[0]
        t0 = time.monotonic()
        samples = []  # (time, out, sluice CPU, sender CPU)
        acks_before = None
        end = t0 + args.warmup + args.window
        while True:
            now = time.monotonic()
            if now >= t0 + args.warmup:
                if acks_before is None:
                    acks_before = ack_buckets(api)
                samples.append((now, out_events(api), cpu_seconds(node.pid), cpu_seconds(sender_pid)))
            if now >= end:
                break
            if not node.alive():
                raise BenchError(f"sluice exited during {scenario}; its log ends:\n" + node.log_tail())
            if proc is not None and proc.poll() is not None:
                raise BenchError(f"beats-load exited during the run: {proc.stderr.read()}")
            if sender is not None and sender.error:
                raise BenchError(f"the {scenario} sender failed: {sender.error}")
            time.sleep(min(0.25, max(0.0, end - time.monotonic())))
        acked, quantiles = ack_quantiles(acks_before, ack_buckets(api))
        first, last = samples[0], samples[-1]
        secs = last[0] - first[0]
        events = last[1] - first[1]
        row = {"scenario": scenario, "events_per_s": events / secs,
               "sluice_cpu_s_per_m": (last[2] - first[2]) / (events / 1e6) if events else None,
               "sluice_cores": (last[2] - first[2]) / secs,
               "sender_cores": (last[3] - first[3]) / secs,
               "load": round(load_before, 2),
               "acked_batches": acked, "ack_p50_s": quantiles.get(0.5), "ack_p99_s": quantiles.get(0.99)}
        if proc is not None:
            proc.terminate()
            try:
                output, err = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                output, err = proc.communicate()
            if proc.returncode != 0:
                raise BenchError(f"beats-load failed (exit {proc.returncode}): {err.strip()}")
            fields = dict(kv.split("=", 1) for kv in output.split())
            row["client"] = {k: float(v) for k, v in fields.items()}
            st = stats(api)["pipelines"][PIPELINE]["events"]
            if int(fields["events"]) > st["out"]:
                raise BenchError(f"beats-load counts {fields['events']} events ACKed, but only {st['out']} are out")
        else:
            stop.set()
            sender.join(60)
            if sender.is_alive() or sender.error:
                raise BenchError(f"the {scenario} sender failed: {sender.error or 'still sending after 60 s'}")
            if scenario == "tcp-tls":
                row["cipher"] = sender.cipher and sender.cipher[0]
                row["tls_version"] = sender.cipher and sender.cipher[1]
        return row
    finally:
        stop.set()
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        node.close()


# ---- syslog over UDP ----

def paced_sender(address, datagrams, rate, seconds, result):
    """A sender process: `rate` datagrams/s to `address` for `seconds`, paced in slices of 1/2000 s
    (so that no burst is more than about half a millisecond of traffic); puts (sent, elapsed, errors)."""
    host, port = address.rsplit(":", 1)
    target = (host, int(port))
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    send = s.sendto
    n = len(datagrams)
    sent = errors = 0
    t0 = time.monotonic()
    deadline = t0 + seconds
    total = int(rate * seconds)
    slice_s = 1 / 2000
    i = 0
    while sent < total:
        now = time.monotonic()
        if now >= deadline + 1.0:  # far behind: give up, the achieved rate says so
            break
        due = min(total, int((now - t0) * rate) + 1)
        if due <= sent:
            time.sleep(min(slice_s, (sent - due + 1) / rate))
            continue
        for _ in range(due - sent):
            try:
                send(datagrams[i], target)
            except OSError:
                errors += 1
            i = i + 1 if i + 1 < n else 0
        sent = due
    result.put((sent, time.monotonic() - t0, errors))
    s.close()


def send_step(address, datagrams, rate, seconds, processes):
    """`rate` datagrams/s for `seconds`, split over `processes` paced sender processes; returns
    (datagrams sent, achieved rate, send errors)."""
    ctx = multiprocessing.get_context("fork")
    result = ctx.Queue()
    procs = [ctx.Process(target=paced_sender, args=(address, datagrams[k::processes] or datagrams,
                                                    rate / processes, seconds, result), daemon=True)
             for k in range(processes)]
    for p in procs:
        p.start()
    outs = [result.get(timeout=seconds + 30) for _ in procs]
    for p in procs:
        p.join(10)
        if p.is_alive():
            p.kill()
    sent = sum(o[0] for o in outs)
    elapsed = max(o[1] for o in outs)
    return sent, sent / elapsed, sum(o[2] for o in outs)


def settle_counters(api, expect_received, timeout=5.0):
    """Reads /metrics until received + dropped reach `expect_received` or stop moving."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        m = metrics(api)
        got = m.get("sluice_component_datagrams_received_total", 0) + m.get("sluice_component_datagrams_dropped_total", 0)
        if got >= expect_received or time.monotonic() > deadline or (last is not None and got == last):
            return m
        last = got
        time.sleep(0.2)


def datagrams_held(size, rcvbuf=None):
    """How many datagrams of `size` bytes a UDP socket with the kernel's default receive buffer (or
    `rcvbuf`) holds before the kernel drops: each is charged its whole socket buffer, not its
    payload."""
    r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        if rcvbuf:
            r.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        r.bind(("127.0.0.1", 0))
        payload = b"x" * size
        for _ in range(max(5000, (rcvbuf or 0) // 100)):
            s.sendto(payload, r.getsockname())
        r.setblocking(False)
        n = 0
        try:
            while True:
                r.recv(65536)
                n += 1
        except BlockingIOError:
            pass
        return n, r.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
    finally:
        r.close()
        s.close()


def run_syslog_round(args, binary, tmp, rnd, datagrams):
    api = f"127.0.0.1:{free_port()}"
    port = free_port()
    address = f"127.0.0.1:{port}"
    d = os.path.join(tmp, f"syslog-{rnd}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    inp = {"type": "syslog", "mode": "udp", "address": address}  # default receive_buffer_bytes
    if args.receive_buffer:
        inp["receive_buffer_bytes"] = args.receive_buffer
    cfg = write_config(os.path.join(d, "sluice.yml"), pipeline_doc(d, api, [inp], args.workers, args.batch_delay))
    node = Sluice(binary, cfg, os.path.join(d, "sluice.log"), api)
    steps = []
    try:
        node.wait_api()
        m0 = metrics(api)
        if "sluice_component_datagrams_received_total" not in m0:
            raise BenchError("/metrics has no sluice_component_datagrams_received_total: is the input up?")
        granted = int(m0.get("sluice_component_receive_buffer_bytes", 0))
        # Warm-up: a second at a low rate.
        send_step(address, datagrams, 10_000, args.warmup_udp, 1)
        settle_counters(api, float("inf"), timeout=1.0)
        capacity = None  # datagrams/s one sender process managed, when it could not reach its rate

        def step(rate):
            nonlocal capacity
            processes = min(args.udp_max_processes, math.ceil(rate / (0.85 * capacity)) if capacity else 1)
            before = settle_counters(api, float("inf"), timeout=0.5)
            load = load_average()[0]
            c0 = cpu_seconds(node.pid)
            sent, achieved, errors = send_step(address, datagrams, rate, args.step, processes)
            c1 = cpu_seconds(node.pid)
            r0 = before.get("sluice_component_datagrams_received_total", 0)
            d0 = before.get("sluice_component_datagrams_dropped_total", 0)
            after = settle_counters(api, r0 + d0 + sent)
            received = after.get("sluice_component_datagrams_received_total", 0) - r0
            dropped = after.get("sluice_component_datagrams_dropped_total", 0) - d0
            reached = achieved >= 0.97 * rate
            if not reached:
                capacity = min(capacity or float("inf"), achieved / processes)
            s = {"target": rate, "achieved": achieved, "processes": processes, "sent": sent,
                 "received": int(received), "dropped": int(dropped), "send_errors": errors,
                 "clean": dropped == 0 and received == sent and errors == 0, "reached": reached,
                 "sluice_cores": (c1 - c0) / args.step, "load": round(load, 2)}
            steps.append(s)
            if args.verbose:
                print(f"    step {rate:>9,.0f}/s: achieved {achieved:>9,.0f} with {processes} process(es), "
                      f"received {received:,.0f} of {sent:,}, dropped {dropped:,.0f}, sluice {s['sluice_cores']:.2f} "
                      f"cores", flush=True)
            return s

        # Up by half each step until drops (or until the senders, given every chance, cannot reach
        # the rate); then bisect.
        rate = args.udp_start
        clean, dropping = None, None
        while rate <= args.udp_max:
            s = step(rate)
            if not s["clean"]:
                dropping = s
                break
            clean = s
            if not s["reached"] and s["processes"] >= args.udp_max_processes:
                break  # the senders cannot go faster
            rate *= 1.5
        # Drops at the first step already (a busy machine): down by half until a step is clean.
        rate = args.udp_start / 2
        while clean is None and dropping is not None and rate >= 1_000:
            s = step(rate)
            if s["clean"]:
                clean = s
            else:
                dropping = s if s["achieved"] < dropping["achieved"] else dropping
            rate /= 2
        if clean is not None and dropping is not None:
            lo, hi = clean["achieved"], dropping["achieved"]
            for _ in range(args.bisect):
                if hi - lo < 0.03 * hi:
                    break
                s = step((lo + hi) / 2)
                if s["clean"]:
                    lo = max(lo, s["achieved"])
                else:
                    hi = min(hi, s["achieved"])
        # The lowest rate that dropped, and the highest clean rate below it.
        drops = [s for s in steps if not s["clean"]]
        first_drop = min(drops, key=lambda s: s["achieved"]) if drops else None
        cleans = [s for s in steps if s["clean"] and (first_drop is None or s["achieved"] < first_drop["achieved"])]
        best = max(cleans, key=lambda s: s["achieved"]) if cleans else None
        return {"round": rnd, "receive_buffer_bytes": granted, "highest_clean": best, "first_drop": first_drop,
                "steps": steps}
    finally:
        node.close()


def parse_size(text):
    """`4MiB`, `512KiB`, `1000000` as bytes (None stays None)."""
    if not text:
        return None
    units = {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3,
             "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    t = text.strip().lower()
    for u in sorted(units, key=len, reverse=True):
        if t.endswith(u):
            return int(float(t[:-len(u)]) * units[u])
    return int(t)


def fmt_rate(v):
    return "-" if v is None else f"{v:,.0f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sluice", help="the sluice binary (default: $CARGO_TARGET_DIR or target, release/sluice)")
    ap.add_argument("--build", action="store_true", help="cargo build --release -p sluice first")
    ap.add_argument("--quick", action="store_true", help="a short run: 2 rounds, 1 s warm-up, 3 s windows, "
                                                         "1 s UDP steps")
    ap.add_argument("--only", nargs="*", choices=ALL, help="scenarios to run (default: all)")
    ap.add_argument("--repeat", type=int, help="rounds of every scenario (5; --quick: 2)")
    ap.add_argument("--warmup", type=float, help="seconds of sending before the window (3; --quick: 1)")
    ap.add_argument("--window", type=float, help="seconds of the measured window (10; --quick: 3)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-delay", help="the pipeline's batch.delay (default: not set, 50ms)")
    ap.add_argument("--beats-window", type=int, default=2048, help="events per Lumberjack window")
    ap.add_argument("--beats-inflight", type=int, default=8, help="windows in flight in `beats` (`beats-2`: 2)")
    ap.add_argument("--step", type=float, help="seconds per UDP rate step (3; --quick: 1)")
    ap.add_argument("--warmup-udp", type=float, help="seconds at 10,000 datagrams/s first")
    ap.add_argument("--udp-start", type=float, default=20_000, help="the first UDP rate step, datagrams/s")
    ap.add_argument("--udp-max", type=float, default=3_000_000, help="no UDP step above this")
    ap.add_argument("--udp-max-processes", type=int, default=4, help="sender processes at most")
    ap.add_argument("--bisect", type=int, help="steps between the highest clean and first dropping rate")
    ap.add_argument("--receive-buffer", help="the syslog input's receive_buffer_bytes (default: not set, the "
                                             "kernel's default)")
    ap.add_argument("--verbose", action="store_true", help="print every UDP step")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON too")
    args = ap.parse_args()
    quick = {"repeat": 2, "warmup": 1.0, "window": 3.0, "step": 1.0, "bisect": 2, "warmup_udp": 0.5}
    full = {"repeat": 5, "warmup": 3.0, "window": 10.0, "step": 3.0, "bisect": 4, "warmup_udp": 1.0}
    for k, v in (quick if args.quick else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    only = args.only or ALL
    on_signals_exit()
    if args.build:
        build_release()
    binary = sluice_binary(args.sluice)
    for tool in ["openssl"] + (["go"] if any(s.startswith("beats") for s in only) else []):
        if shutil.which(tool) is None:
            die(f"`{tool}` is needed and not on PATH")

    tmp = tempfile.mkdtemp(prefix="sluice-inputs-")
    rows, udp_rounds = [], []
    try:
        block = json_lines(10_000)
        lines_file = os.path.join(tmp, "events.jsonl")
        with open(lines_file, "wb") as f:
            f.write(block)
        client = build_client(tmp) if any(s.startswith("beats") for s in only) else None
        cert, key = make_cert(tmp)
        print(f"{binary}; {os.cpu_count()} CPUs; {LINE_BYTES}-byte JSON events, warm-up {args.warmup} s, "
              f"window {args.window} s, {args.repeat} rounds; load average {load_average()}", flush=True)
        scenarios = [s for s in RATE_SCENARIOS if s in only]
        if "tcp-tls" in scenarios:
            alone = [tls_sender_alone(args, block, cert, key) for _ in range(max(1, min(3, args.repeat)))]
            for a in alone:
                a["rep"] = None
                print(f"  tls-sender-alone: {a['events_per_s']:>11,.0f} lines/s ({a['cipher']}), this process "
                      f"{a['sender_core']:.2f} cores, load {a['load']}", flush=True)
            rows.extend(alone)
        for rep in range(args.repeat):
            order = scenarios if rep % 2 == 0 else list(reversed(scenarios))
            for sc in order:
                row = run_rate(args, binary, tmp, sc, block, lines_file, client, cert, key)
                row["rep"] = rep
                rows.append(row)
                print(f"  round {rep + 1} {sc:<8} {row['events_per_s']:>11,.0f} events/s   sluice "
                      f"{row['sluice_cpu_s_per_m']:.2f} CPU s/M ({row['sluice_cores']:.2f} cores), sender "
                      f"{row['sender_cores']:.2f} cores, ack p50/p99 {fmt_ms(row['ack_p50_s'])}/"
                      f"{fmt_ms(row['ack_p99_s'])} ms of {row['acked_batches']:,}, load {row['load']}", flush=True)
        if "syslog-udp" in only:
            datagrams = syslog_datagrams(5_000)
            held = datagrams_held(len(datagrams[0]), parse_size(args.receive_buffer))
            print(f"  a UDP socket with {'the default' if not args.receive_buffer else args.receive_buffer} receive "
                  f"buffer ({held[1]:,} B reported) holds {held[0]:,} datagrams of {len(datagrams[0])} bytes before "
                  f"the kernel drops", flush=True)
            for rep in range(args.repeat):
                r = run_syslog_round(args, binary, tmp, rep, datagrams)
                udp_rounds.append(r)
                print(f"  round {rep + 1} syslog-udp: highest clean {fmt_rate(r['highest_clean'] and r['highest_clean']['achieved'])}"
                      f"/s, first drops at {fmt_rate(r['first_drop'] and r['first_drop']['achieved'])}/s "
                      f"({r['first_drop']['dropped'] if r['first_drop'] else 0:,} dropped of "
                      f"{r['first_drop']['sent'] if r['first_drop'] else 0:,}), receive buffer "
                      f"{r['receive_buffer_bytes']:,} B, {len(r['steps'])} steps", flush=True)
    finally:
        stop_all()
        shutil.rmtree(tmp, ignore_errors=True)

    # ---- the tables ----
    print()
    print(f"load average at the end: {load_average()}")
    if scenarios:
        print(f"{'scenario':<18} {'median events/s':>15}   {'sluice CPU s/M':>14}   {'sender cores':>12}   "
              f"{'ack p50 ms':>10}   {'ack p99 ms':>10}   rounds")
        medians = {}
        for sc in (["tls-sender-alone"] if "tcp-tls" in scenarios else []) + scenarios:
            rs = [r for r in rows if r["scenario"] == sc]
            med = statistics.median(r["events_per_s"] for r in rs)
            medians[sc] = med
            cpu = [r["sluice_cpu_s_per_m"] for r in rs if r.get("sluice_cpu_s_per_m")]
            snd = [r.get("sender_cores", r.get("sender_core")) for r in rs]
            p50 = [r["ack_p50_s"] for r in rs if r.get("ack_p50_s") is not None]
            p99 = [r["ack_p99_s"] for r in rs if r.get("ack_p99_s") is not None]
            print(f"{sc:<18} {med:>15,.0f}   {statistics.median(cpu) if cpu else float('nan'):>14.2f}   "
                  f"{statistics.median(snd):>12.2f}   {fmt_ms(statistics.median(p50) if p50 else None):>10}   "
                  f"{fmt_ms(statistics.median(p99) if p99 else None):>10}   "
                  + ", ".join(f"{r['events_per_s']:,.0f}" for r in rs))
        for label, num, den, goal in RATIOS:
            if num in scenarios and den in scenarios:
                per = []
                for rep in range(args.repeat):
                    by = {r["scenario"]: r for r in rows if r["rep"] == rep}
                    per.append(by[num]["events_per_s"] / by[den]["events_per_s"])
                med = statistics.median(per)
                verdict = f" (goal >= {goal}: {'met' if med >= goal else 'MISSED'})" if goal else ""
                print(f"{label}: {med:.3f}{verdict}; rounds " + ", ".join(f"{v:.3f}" for v in per))
        if "tcp-tls" in medians and "tls-sender-alone" in medians:
            print(f"tls-sender-alone / tcp-tls: {medians['tls-sender-alone'] / medians['tcp-tls']:.2f} "
                  f"(well above 1: the Python TLS sender is not what limits tcp-tls)")
        cipher = next((r.get("cipher") for r in rows if r["scenario"] == "tcp-tls"), None)
        if cipher:
            print(f"TLS: {next(r.get('tls_version') for r in rows if r['scenario'] == 'tcp-tls')}, {cipher}")
    if udp_rounds:
        hc = [r["highest_clean"]["achieved"] for r in udp_rounds if r["highest_clean"]]
        fd = [r["first_drop"]["achieved"] for r in udp_rounds if r["first_drop"]]
        print(f"syslog-udp (~200-byte RFC 5424, receive_buffer_bytes {args.receive_buffer or 'not set'}; /metrics "
              f"receive_buffer_bytes {udp_rounds[0]['receive_buffer_bytes']:,}, which holds about {held[0]:,} such "
              f"datagrams):")
        print(f"  highest rate with no drop: median {fmt_rate(statistics.median(hc) if hc else None)} datagrams/s; rounds "
              + ", ".join(fmt_rate(v) for v in hc))
        print(f"  first drops at:            median {fmt_rate(statistics.median(fd) if fd else None)} datagrams/s; rounds "
              + ", ".join(fmt_rate(v) for v in fd))
        if len(fd) < len(udp_rounds):
            print("  (in some rounds no step dropped: the senders could not go faster)")
    if args.json:
        print(json.dumps({"rates": rows, "syslog_udp": udp_rounds, "load_average": load_average()}, indent=1))


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        stop_all()
        die(str(e), 1)
