#!/usr/bin/env python3
"""End-to-end benchmarks of the release `sluice` binary.

Each scenario starts sluice with a generated config, pushes a known number of events through
it, and reports events/s, MiB/s, CPU seconds per million events and peak RSS, taken from the
process's own rusage (wait4). Usage: bench/e2e.py [--events N] [--only NAME ...]
Run through bench/run.sh, which builds the release binaries first.
"""
import argparse
import json
import shutil
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SLUICE = os.path.join(ROOT, "target", "release", "sluice")
LOADGEN = os.path.join(ROOT, "target", "release", "sluice-loadgen")
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


def row(name, events, secs, usage):
    cpu = usage.ru_utime + usage.ru_stime
    return {
        "scenario": name,
        "events": events,
        "seconds": secs,
        "events_per_s": events / secs,
        "mib_per_s": events * LINE_BYTES / secs / (1 << 20),
        "cpu_s_per_m": cpu / (events / 1e6),
        "peak_rss_mib": usage.ru_maxrss / 1024,
    }


def config(tmp, api, inputs, processors, workers=2, queue=None):
    pipeline = {"workers": workers, "inputs": inputs, "processors": processors, "outputs": [{"type": "blackhole"}]}
    if queue:
        pipeline["queue"] = queue
    text = {
        "data_dir": os.path.join(tmp, "data"),
        "api": {"address": api},
        "log": {"level": "warn"},
        "pipelines": {"bench": pipeline},
    }
    path = os.path.join(tmp, "bench.yml")
    with open(path, "w") as f:
        json.dump(text, f)  # JSON is YAML
    return path


def generator_blackhole(tmp, events, processors=(), name="generator -> blackhole", queue=None):
    lines = os.path.join(tmp, "lines.json")
    json_lines_file(lines, 10_000)
    api = f"127.0.0.1:{free_port()}"
    cfg = config(tmp, api, [{"type": "generator", "count": events, "file": lines, "sequence": False}], list(processors),
                 queue=queue)
    shutil.rmtree(os.path.join(tmp, "data"), ignore_errors=True)
    started = time.perf_counter()
    proc = subprocess.Popen([SLUICE, "run", "-c", cfg], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    usage = finish(proc)
    secs = time.perf_counter() - started
    err = proc.stderr.read().decode(errors="replace")
    if proc.returncode != 0 or f"out={events}" not in err:
        raise RuntimeError(f"{name}: unexpected end (exit {proc.returncode}):\n{err[-2000:]}")
    return row(name, events, secs, usage)


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


SCENARIOS = {
    "gen": lambda tmp, n: generator_blackhole(tmp, n),
    "gen-json": lambda tmp, n: generator_blackhole(tmp, n, [{"type": "json"}], "generator -> json -> blackhole"),
    "gen-json-pq": lambda tmp, n: generator_blackhole(tmp, n, [{"type": "json"}], "generator -> persisted -> json -> bh",
                                                      queue={"type": "persisted", "sync": "commit"}),
    "tcp": lambda tmp, n: tcp_blackhole(tmp, n),
    "tcp-json": lambda tmp, n: tcp_blackhole(tmp, n, [{"type": "json"}], "tcp -> json -> blackhole"),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=4_294_967)  # 1 GiB of 250-byte lines
    ap.add_argument("--only", nargs="*", choices=sorted(SCENARIOS))
    ap.add_argument("--json", action="store_true", help="print rows as JSON too")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for key in args.only or SCENARIOS:
            rows.append(SCENARIOS[key](tmp, args.events))
    load = os.getloadavg()[0]
    print(f"{'scenario':34} {'events':>10} {'seconds':>8} {'events/s':>11} {'MiB/s':>7} {'CPU s/M':>8} {'RSS MiB':>8}")
    for r in rows:
        print(f"{r['scenario']:34} {r['events']:>10} {r['seconds']:>8.2f} {r['events_per_s']:>11,.0f} "
              f"{r['mib_per_s']:>7.0f} {r['cpu_s_per_m']:>8.2f} {r['peak_rss_mib']:>8.1f}")
    by = {r["scenario"]: r for r in rows}
    mem, pq = by.get("generator -> json -> blackhole"), by.get("generator -> persisted -> json -> bh")
    if mem and pq:
        print(f"persisted / memory throughput, generator -> json -> blackhole: {pq['events_per_s'] / mem['events_per_s']:.2f}")
    print(f"(load average at the end: {load:.2f}; {os.cpu_count()} CPUs)")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    sys.exit(main())
