"""Shared pieces of the fault, hostile-input and cluster benchmarks (bench/kill.py, bench/hostile.py,
bench/cluster.py).

Standard library only. It finds the release binary, writes configs (JSON, which is YAML),
starts `sluice run` with its log in a file, waits for the monitoring API, reads /stats, asks
`sluice validate` whether config keys are known, and makes sure that every process a script
started is gone when it ends, also on Ctrl-C, SIGTERM or an exception. It also builds the release
binary and sends prebuilt lines over TCP as fast as they are taken (`LineSender`).
"""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
DEFAULT_SLUICE = os.path.join(TARGET, "release", "sluice")

MIB = 1 << 20
GIB = 1 << 30


class BenchError(Exception):
    """A run that cannot go on: the message says why."""


def die(message, code=2):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(code)


def sluice_binary(path):
    """The binary to run, checked: a clear message rather than a traceback when it is missing."""
    path = os.path.abspath(path or DEFAULT_SLUICE)
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        die(f"no sluice binary at {path}: build it with `cargo build --release -p sluice`, "
            f"or pass --sluice PATH")
    return path


def on_signals_exit():
    """SIGTERM (and SIGHUP) raise SystemExit, so that `finally` blocks stop the processes and remove
    the temp dirs as Ctrl-C (KeyboardInterrupt) does. SIGINT gets Python's own handler even when the
    script was started with it ignored (a background job of a non-interactive shell)."""
    def handler(signum, _frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)


# Every `sluice` this script started and has not reaped: `stop_all` kills what is left.
LIVE = []


def stop_all():
    for s in list(LIVE):
        s.close()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(path, doc):
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)  # JSON is YAML
    return path


def stats(api, timeout=5):
    with urllib.request.urlopen(f"http://{api}/stats", timeout=timeout) as r:
        return json.load(r)


def load_average():
    return os.getloadavg()


class Sluice:
    """One `sluice run` process, its stderr in a log file."""

    def __init__(self, binary, config, log_path, api, env=None):
        self.api = api
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.started = time.monotonic()
        self.proc = subprocess.Popen([binary, "run", "-c", config], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=self.log, env=env)
        self.pid = self.proc.pid
        LIVE.append(self)
        self.usage = None

    def log_tail(self, chars=3000):
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - chars))
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def alive(self):
        return self.proc.poll() is None

    def wait_api(self, timeout=30):
        """Waits until /stats answers; fails loudly if the process exits first or it never does."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise BenchError(f"sluice exited early (status {self.proc.returncode}); its log ends:\n"
                                 + self.log_tail())
            try:
                return stats(self.api)
            except OSError:
                time.sleep(0.05)
        raise BenchError(f"the monitoring API at {self.api} did not answer within {timeout}s; the log ends:\n"
                         + self.log_tail())

    def wait_port(self, port, timeout=30):
        """Waits until something accepts connections on 127.0.0.1:port (an input came up)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise BenchError(f"sluice exited early (status {self.proc.returncode}); its log ends:\n"
                                 + self.log_tail())
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise BenchError(f"nothing listens on 127.0.0.1:{port} after {timeout}s; the log ends:\n" + self.log_tail())

    def _reap(self, timeout):
        """Waits up to `timeout` for the process to exit and keeps its rusage; True if it did."""
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(self.pid, os.WNOHANG)
            if pid == self.pid:
                self.proc.returncode = os.waitstatus_to_exitcode(status)
                self.usage = usage
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def kill(self):
        """SIGKILL and reap."""
        if self.proc.returncode is None:
            try:
                self.proc.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._reap(30)
        self.log.close()

    def terminate(self, timeout):
        """SIGTERM, wait up to `timeout` (a drain), then SIGKILL. Returns the exit status, or None
        if it had to be killed."""
        if self.proc.returncode is not None:
            self.log.close()
            return self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        if self._reap(timeout):
            self.log.close()
            return self.proc.returncode
        self.kill()
        return None

    def close(self):
        """Whatever happened, the process is gone afterwards."""
        if self.proc.returncode is None:
            self.kill()
        elif not self.log.closed:
            self.log.close()
        if self in LIVE:
            LIVE.remove(self)


def accepted_keys(binary, tmp, doc):
    """Runs `sluice validate` on `doc`. Returns (True, "") if it is accepted, (False, reasons) if
    the only complaints are unknown keys, and raises for any other refusal."""
    path = write_config(os.path.join(tmp, "probe.yml"), doc)
    r = subprocess.run([binary, "validate", "-c", path], capture_output=True, text=True, timeout=60)
    if r.returncode == 0:
        return True, ""
    text = (r.stdout + r.stderr).strip()
    if r.returncode == 2 and "unknown" in text.lower():
        return False, text
    raise BenchError(f"`sluice validate` refused the bench config (exit {r.returncode}):\n{text}")


def percentile(values, p):
    """Nearest-rank percentile of a list (None when empty)."""
    if not values:
        return None
    s = sorted(values)
    k = max(0, min(len(s) - 1, int(round(p / 100 * len(s) + 0.5)) - 1))
    return s[k]


def fmt_s(v):
    return "-" if v is None else f"{v:.3f}"


def build_release(packages=("sluice",)):
    """`cargo build --release -p PACKAGE...` into the target dir (`CARGO_TARGET_DIR` when set);
    exits with a message if the build fails. Returns the path of the `sluice` binary."""
    cmd = ["cargo", "build", "--release"]
    for p in packages:
        cmd += ["-p", p]
    if subprocess.run(cmd, cwd=ROOT).returncode != 0:
        die("the release build failed: " + " ".join(cmd))
    return DEFAULT_SLUICE


class LineSender(threading.Thread):
    """Sends whole lines of one size to a TCP address as fast as the receiver takes them: a
    block of lines made beforehand (`block`, `per_block` lines of `line_bytes` each), sent over
    and over with `sendall`, so that Python costs next to nothing per line. Stops after `lines`
    lines (None: no limit) or when `stop` is set, between two blocks, so `sent` is exact: the
    lines written to the socket in full. `error` keeps what ended it otherwise."""

    def __init__(self, address, block, line_bytes, lines=None, stop=None, chunk_lines=None):
        super().__init__(name=f"sender-{address}", daemon=True)
        if len(block) % line_bytes:
            raise ValueError("the block must hold whole lines of line_bytes")
        self.address = address
        self.block = memoryview(block)
        self.line_bytes = line_bytes
        self.per_block = len(block) // line_bytes
        self.chunk = min(self.per_block, chunk_lines or self.per_block)
        self.lines = lines
        self.stop = stop or threading.Event()
        self.sent = 0
        self.error = None
        self.started_at = self.ended_at = None

    def run(self):
        host, port = self.address.rsplit(":", 1)
        try:
            with socket.create_connection((host, int(port)), timeout=30) as s:
                s.settimeout(None)
                self.started_at = time.monotonic()
                offset = 0  # in lines, within the block
                while not self.stop.is_set() and (self.lines is None or self.sent < self.lines):
                    n = min(self.chunk, self.per_block - offset)
                    if self.lines is not None:
                        n = min(n, self.lines - self.sent)
                    s.sendall(self.block[offset * self.line_bytes:(offset + n) * self.line_bytes])
                    self.sent += n
                    offset = (offset + n) % self.per_block
                self.ended_at = time.monotonic()
        except OSError as e:
            self.error = e
            self.ended_at = time.monotonic()


def terminate_together(nodes, timeout):
    """SIGTERM to every node at once (so that peers drain together), then waits for each up to
    `timeout` from now and SIGKILLs what is left. Returns the exit statuses (None: killed)."""
    for n in nodes:
        if n.proc.returncode is None:
            n.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    statuses = []
    for n in nodes:
        if n.proc.returncode is None and not n._reap(max(0.0, deadline - time.monotonic())):
            n.kill()
            statuses.append(None)
        else:
            statuses.append(n.proc.returncode)
        n.close()
    return statuses
