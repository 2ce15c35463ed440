#!/usr/bin/env python3
"""End-to-end benchmarks of the release `sluice` binary.

Each scenario starts sluice with a generated config, pushes a known number of events through
it, and reports events/s, MiB/s, CPU seconds per million events and peak RSS, taken from the
process's own rusage (wait4). Usage: bench/e2e.py [--events N] [--only NAME ...] [--repeat N]
Run through bench/run.sh, which builds the release binaries first.
"""
import argparse
import json
import mmap
import shutil
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target")
SLUICE = os.path.join(TARGET, "release", "sluice")
LOADGEN = os.path.join(TARGET, "release", "sluice-loadgen")
LOGHUB = os.path.join(ROOT, "tests", "data", "loghub")
LINE_BYTES = 250


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def json_lines_file(path, n, size=LINE_BYTES):
    """Distinct JSON lines shaped like the load generator's, for the generator input."""
    with open(path, "w") as f:
        for i in range(n):
            head = ('{"ts":"2026-11-21T07:%02d:%02d.%03dZ","level":"%s","host":"web-%d","service":"checkout",'
                    '"trace_id":"%016x","status":%d,"method":"GET","path":"/api/v1/items/%d","latency_ms":%d,"msg":"'
                    % ((i // 60) % 60, i % 60, i % 1000, ["info", "warn", "error", "debug"][i % 4], i % 16,
                       (i * 0x9E3779B97F4A7C15) % (1 << 64), [200, 201, 404, 500, 503][i % 5], i % 10000, i % 300))
            f.write(head + "x" * max(0, size - len(head) - 3) + '"}\n')
        settle(f)


def settle(f):
    """Flushes a just-written input file to disk, so that the kernel writing it back does not
    compete with the run for the CPUs (it made file scenarios vary by a fifth)."""
    f.flush()
    os.fsync(f.fileno())


def stats(api):
    with urllib.request.urlopen(f"http://{api}/stats", timeout=5) as r:
        return json.load(r)


def wait_api(api, proc, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("sluice exited early: " + proc.stderr.read().decode(errors="replace")[-2000:])
        try:
            return stats(api)
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("monitoring API did not come up")


def finish(proc):
    """Waits for the process and returns (exit status, rusage)."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage


def row(name, events, secs, usage, total_bytes=None):
    cpu = usage.ru_utime + usage.ru_stime
    return {
        "scenario": name,
        "events": events,
        "seconds": secs,
        "events_per_s": events / secs,
        "mib_per_s": (total_bytes if total_bytes is not None else events * LINE_BYTES) / secs / (1 << 20),
        "cpu_s_per_m": cpu / (events / 1e6),
        "peak_rss_mib": usage.ru_maxrss / 1024,
    }


def config(tmp, api, inputs, processors, workers=2, queue=None, data_dir=None):
    pipeline = {"workers": workers, "inputs": inputs, "processors": processors, "outputs": [{"type": "blackhole"}]}
    if queue:
        pipeline["queue"] = queue
    text = {
        "data_dir": data_dir or os.path.join(tmp, "data"),
        "api": {"address": api},
        "log": {"level": "warn"},
        "pipelines": {"bench": pipeline},
    }
    path = os.path.join(tmp, "bench.yml")
    with open(path, "w") as f:
        json.dump(text, f)  # JSON is YAML
    return path


# What the last persisted run (direct I/O) wrote to the disk, and in how long: the
# `gen-json-beside` scenario writes as much at the same pace.
LAST_PQ_WRITES = {}


def generator_blackhole(tmp, events, processors=(), name="generator -> blackhole", queue=None, beside=None):
    """The generator's pipeline; `beside`, if given, is (bytes, seconds): that many bytes are
    written to a file at that pace while the pipeline runs (see `write_beside`)."""
    lines = os.path.join(tmp, "lines.json")
    json_lines_file(lines, 10_000)
    api = f"127.0.0.1:{free_port()}"
    cfg = config(tmp, api, [{"type": "generator", "count": events, "file": lines, "sequence": False}], list(processors),
                 queue=queue)
    shutil.rmtree(os.path.join(tmp, "data"), ignore_errors=True)
    stop = threading.Event()
    writer = None
    if beside:
        writer = threading.Thread(target=write_beside, args=(os.path.join(tmp, "beside.dat"), *beside, lines, stop))
    started = time.perf_counter()
    proc = subprocess.Popen([SLUICE, "run", "-c", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if writer:
        writer.start()
    usage = finish(proc)
    secs = time.perf_counter() - started
    stop.set()
    if writer:
        writer.join()
    err = proc.stderr.read().decode(errors="replace")
    if proc.returncode != 0 or f"out={events}" not in err:
        raise RuntimeError(f"{name}: unexpected end (exit {proc.returncode}):\n{err[-2000:]}")
    if queue and queue.get("direct_io", True):
        # Blocks written by the process, in 512-byte units (its write_bytes I/O accounting).
        LAST_PQ_WRITES.update(bytes=usage.ru_oublock * 512, seconds=secs)
    return row(name, events, secs, usage)


def write_beside(path, total, seconds, text_from, stop, piece=2 << 20, region=256 << 20):
    """Writes `total` bytes to `path` evenly over `seconds` (or until `stop`), as the persisted
    queue writes its segments: direct I/O pieces of 2 MiB, each followed by fdatasync, over a
    new 256 MiB file that is then rewritten from its start (the queue starts 4 new 64 MiB
    segment files and then reuses them). The bytes are JSON text, like the queue's frames."""
    buf = mmap.mmap(-1, piece)  # page-aligned, as O_DIRECT needs
    with open(text_from, "rb") as f:
        text = f.read(piece)
    buf.write((text * (piece // max(1, len(text)) + 1))[:piece])
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC  # truncated: its blocks are new, as the queue's first files
    try:
        fd = os.open(path, flags | os.O_DIRECT, 0o644)
    except OSError:  # a filesystem without direct I/O (tmpfs): the queue falls back the same way
        fd = os.open(path, flags, 0o644)
    try:
        start, done = time.perf_counter(), 0
        while done < total and not stop.is_set():
            os.pwrite(fd, buf, done % region)
            os.fdatasync(fd)
            done += piece
            ahead = start + seconds * done / total - time.perf_counter()
            if ahead > 0:
                stop.wait(ahead)
    finally:
        os.close(fd)
        os.unlink(path)


def tcp_blackhole(tmp, events, processors=(), name="tcp -> blackhole"):
    api = f"127.0.0.1:{free_port()}"
    port = free_port()
    cfg = config(tmp, api, [{"type": "tcp", "address": f"127.0.0.1:{port}"}], list(processors))
    proc = subprocess.Popen([SLUICE, "run", "-c", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_api(api, proc)
    started = time.perf_counter()
    gen = subprocess.run([LOADGEN, "--address", f"127.0.0.1:{port}", "--lines", str(events),
                          "--line-bytes", str(LINE_BYTES)], capture_output=True, text=True)
    if gen.returncode != 0:
        proc.kill()
        raise RuntimeError("loadgen failed: " + gen.stderr)
    while True:
        out = stats(api)["pipelines"]["bench"]["events"]["out"]
        if out >= events:
            break
        if proc.poll() is not None:
            raise RuntimeError("sluice exited during the run")
        time.sleep(0.01)
    secs = time.perf_counter() - started
    proc.send_signal(signal.SIGTERM)
    usage = finish(proc)
    return row(name, events, secs, usage)


def loghub_file(path, size):
    """A file of about `size` bytes made of the loghub sample lines, cycled; returns (lines, bytes)."""
    parts = []
    for name in sorted(os.listdir(LOGHUB)):
        if name.endswith(".log"):
            with open(os.path.join(LOGHUB, name), "rb") as f:
                text = f.read()
            parts.append(text if text.endswith(b"\n") else text + b"\n")
    blob = b"".join(parts)
    repeats = max(1, size // len(blob))
    with open(path, "wb") as f:
        for _ in range(repeats):
            f.write(blob)
        settle(f)
    return blob.count(b"\n") * repeats, len(blob) * repeats


def wait_out(api, proc, events, timeout=300):
    deadline = time.time() + timeout
    while True:
        out = stats(api)["pipelines"]["bench"]["events"]["out"]
        if out >= events:
            return
        if proc.poll() is not None:
            raise RuntimeError("sluice exited during the run: " + proc.stderr.read().decode(errors="replace")[-2000:])
        if time.time() > deadline:
            raise RuntimeError(f"only {out} of {events} events arrived")
        time.sleep(0.01)


def file_blackhole(tmp, events, processors=(), name="file(loghub) -> blackhole", json_lines=False):
    """One big file read from its start: loghub-shaped lines (1 GiB), or `events` JSON lines."""
    path = os.path.join(tmp, "input.log")
    if json_lines:
        json_lines_file(path, events)
        total_bytes = os.path.getsize(path)
    else:
        events, total_bytes = loghub_file(path, 1 << 30)
    api = f"127.0.0.1:{free_port()}"
    data = os.path.join(tmp, "data-file")
    shutil.rmtree(data, ignore_errors=True)
    cfg = config(tmp, api, [{"type": "file", "include": [path]}], list(processors), data_dir=data)
    started = time.perf_counter()
    proc = subprocess.Popen([SLUICE, "run", "-c", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_api(api, proc)
    wait_out(api, proc, events)
    secs = time.perf_counter() - started
    proc.send_signal(signal.SIGTERM)
    usage = finish(proc)
    os.unlink(path)
    return row(name, events, secs, usage, total_bytes)


def many_files(tmp, events, registry=True, files=10_000, lines_per_round=20):
    """`files` files appended to round-robin, `lines_per_round` lines each per round, while
    sluice reads them; with the registry, or with its commits switched off."""
    rounds = max(1, events // (files * lines_per_round))
    total = rounds * files * lines_per_round
    logs = os.path.join(tmp, "many")
    shutil.rmtree(logs, ignore_errors=True)
    os.makedirs(logs)
    api = f"127.0.0.1:{free_port()}"
    data = os.path.join(tmp, "data-many")
    shutil.rmtree(data, ignore_errors=True)
    cfg = config(tmp, api, [{"type": "file", "include": [os.path.join(logs, "*.log")], "max_open_files": files + 100,
                             "scan_interval": "1s"}], [], data_dir=data)
    env = dict(os.environ)
    if not registry:
        env["SLUICE_REGISTRY_DISABLED"] = "1"
    handles = [open(os.path.join(logs, f"{i}.log"), "ab", buffering=0) for i in range(files)]
    proc = subprocess.Popen([SLUICE, "run", "-c", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    wait_api(api, proc)
    started = time.perf_counter()
    size = 0
    for r in range(rounds):
        for i, h in enumerate(handles):
            chunk = b"".join(b"%d round %d line %d of a file appended to round-robin by the benchmark\n" % (i, r, k)
                             for k in range(lines_per_round))
            h.write(chunk)
            size += len(chunk)
    for h in handles:
        h.close()
    wait_out(api, proc, total)
    secs = time.perf_counter() - started
    proc.send_signal(signal.SIGTERM)
    usage = finish(proc)
    name = f"{files} files round-robin, registry {'on' if registry else 'off'}"
    return row(name, total, secs, usage, size)


SCENARIOS = {
    "gen": lambda tmp, n: generator_blackhole(tmp, n),
    "gen-json": lambda tmp, n: generator_blackhole(tmp, n, [{"type": "json"}], "generator -> json -> blackhole"),
    "gen-json-pq": lambda tmp, n: generator_blackhole(tmp, n, [{"type": "json"}], "generator -> persisted -> json -> bh",
                                                      queue={"type": "persisted", "sync": "commit"}),
    "gen-json-pq-buffered": lambda tmp, n: generator_blackhole(tmp, n, [{"type": "json"}],
                                                               "generator -> persisted (page cache) -> json -> bh",
                                                               queue={"type": "persisted", "sync": "commit",
                                                                      "direct_io": False}),
    "gen-json-beside": lambda tmp, n: beside_scenario(tmp, n),
    "tcp": lambda tmp, n: tcp_blackhole(tmp, n),
    "tcp-json": lambda tmp, n: tcp_blackhole(tmp, n, [{"type": "json"}], "tcp -> json -> blackhole"),
    "file": lambda tmp, n: file_blackhole(tmp, n),
    "file-json": lambda tmp, n: file_blackhole(tmp, n, [{"type": "json"}], "file(JSON) -> json -> blackhole",
                                               json_lines=True),
    "files-10k": lambda tmp, n: many_files(tmp, min(n, 2_000_000)),
    "files-10k-noreg": lambda tmp, n: many_files(tmp, min(n, 2_000_000), registry=False),
}


def beside_scenario(tmp, events):
    """`gen-json` with the bytes of the last `gen-json-pq` run written beside it, by another
    thread, at that run's pace: what writing the queue's bytes costs the memory pipeline on this
    machine, whoever writes them. `main` makes sure a `gen-json-pq` run came first."""
    return generator_blackhole(tmp, events, [{"type": "json"}], "generator -> json -> bh, pq's bytes beside",
                               beside=(LAST_PQ_WRITES["bytes"], LAST_PQ_WRITES["seconds"]))


def ratio(rows, num, den, key):
    """`num`'s `key` over `den`'s, for each repetition that ran both, in order."""
    out = []
    for rep in sorted({r["rep"] for r in rows}):
        by = {r["scenario"]: r for r in rows if r["rep"] == rep}
        if num in by and den in by:
            out.append(by[num][key] / by[den][key])
    return out


def show_ratio(label, values):
    if not values:
        return
    if len(values) == 1:
        print(f"{label}: {values[0]:.3f}")
    else:
        listed = ", ".join(f"{v:.3f}" for v in values)
        print(f"{label}: median {statistics.median(values):.3f} of {len(values)} ({listed})")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=4_294_967)  # 1 GiB of 250-byte lines
    ap.add_argument("--only", nargs="*", choices=sorted(SCENARIOS))
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the scenarios this many times, every other time in reverse order, and report "
                         "each ratio's median: on a shared machine one pair is within the noise")
    ap.add_argument("--json", action="store_true", help="print rows as JSON too")
    args = ap.parse_args()
    rows = []
    keys = list(args.only or SCENARIOS)
    if "gen-json-beside" in keys and ("gen-json-pq" not in keys
                                      or keys.index("gen-json-pq") > keys.index("gen-json-beside")):
        ap.error("gen-json-beside writes what a gen-json-pq run wrote: list gen-json-pq before it")
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(max(1, args.repeat)):
            for key in (keys if rep % 2 == 0 else keys[::-1]):
                row = SCENARIOS[key](tmp, args.events)
                row["rep"] = rep
                rows.append(row)
    load = os.getloadavg()[0]
    print(f"{'scenario':34} {'events':>10} {'seconds':>8} {'events/s':>11} {'MiB/s':>7} {'CPU s/M':>8} {'RSS MiB':>8}")
    for r in rows:
        print(f"{r['scenario']:34} {r['events']:>10} {r['seconds']:>8.2f} {r['events_per_s']:>11,.0f} "
              f"{r['mib_per_s']:>7.0f} {r['cpu_s_per_m']:>8.2f} {r['peak_rss_mib']:>8.1f}")
    mem = "generator -> json -> blackhole"
    show_ratio("persisted / memory throughput, generator -> json -> blackhole",
               ratio(rows, "generator -> persisted -> json -> bh", mem, "events_per_s"))
    show_ratio("persisted (page cache) / memory throughput",
               ratio(rows, "generator -> persisted (page cache) -> json -> bh", mem, "events_per_s"))
    show_ratio("memory with the persisted run's bytes written beside it / memory throughput",
               ratio(rows, "generator -> json -> bh, pq's bytes beside", mem, "events_per_s"))
    on, off = "10000 files round-robin, registry on", "10000 files round-robin, registry off"
    show_ratio("10,000 files, registry on / off: throughput", ratio(rows, on, off, "events_per_s"))
    show_ratio("10,000 files, registry on / off: CPU per event", ratio(rows, on, off, "cpu_s_per_m"))
    print(f"(load average at the end: {load:.2f}; {os.cpu_count()} CPUs)")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    sys.exit(main())
