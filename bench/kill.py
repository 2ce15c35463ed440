#!/usr/bin/env python3
"""Kill harness: SIGKILL cycles under load into a persisted queue and a `file` output.

Several http clients post small NDJSON requests whose events carry a unique id (client,
sequence) and record which ids were acknowledged (a 200). A request that gets a connection
error, a timeout, a 503 or a 429 is sent again, unchanged (at-least-once). Each cycle starts
`sluice run`, lets it run a random 0.3-2 s under that load, and SIGKILLs it. After the last
cycle the clients stop, sluice starts once more and drains the queue, and every output line is
read back. It prints acknowledged, delivered, missing (acknowledged but never written: must be
0, the exit code is 1 otherwise), duplicates, and the duplicates each kill caused. A kill's
duplicates are the lines the next run wrote whose id the output already held (or that the
same run wrote twice). Loopback only; the data dir lives in a temp dir that is removed.

Usage: bench/kill.py [--cycles 100] [--clients 4] [--events-per-request 50] [--sluice PATH] [--json]
"""
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the scripts

import argparse
import http.client
import json
import os
import random
import re
import tempfile
import threading
import time

from harness import (BenchError, Sluice, free_port, load_average, on_signals_exit, sluice_binary, stats, stop_all,
                     write_config)

PIPELINE = "kill"


class Client(threading.Thread):
    """Posts requests of `per_request` events, ids (client, sequence), each sent until a 200."""

    def __init__(self, index, port, path, per_request, pad, stop, deadline, rate=0.0):
        super().__init__(name=f"client-{index}", daemon=True)
        self.index, self.port, self.path = index, port, path
        self.per_request, self.pad = per_request, pad
        self.stop, self.deadline = stop, deadline
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.acked = []            # (first sequence, count) of each request answered 200
        self.sent_seq = 0          # sequences below this were sent at least once
        self.requests = self.resends = 0
        self.errors = {}           # kind -> count (connection errors, statuses other than 200)
        self.unexpected = []       # statuses that are neither 200 nor retriable
        self.failure = None

    def body(self, first):
        return "".join(json.dumps({"c": self.index, "s": first + k, "pad": self.pad}, separators=(",", ":")) + "\n"
                       for k in range(self.per_request)).encode()

    def note(self, kind):
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def run(self):
        conn = None
        seq = 0
        try:
            while not self.stop.is_set() and time.monotonic() < self.deadline:
                began = time.monotonic()
                body = self.body(seq)
                self.sent_seq = seq + self.per_request
                tries = 0
                while not self.stop.is_set() and time.monotonic() < self.deadline:
                    if tries:
                        self.resends += 1
                    tries += 1
                    self.requests += 1
                    try:
                        if conn is None:
                            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
                        conn.request("POST", self.path, body, {"Content-Type": "application/x-ndjson"})
                        resp = conn.getresponse()
                        resp.read()
                        status = resp.status
                    except (OSError, http.client.HTTPException) as e:
                        self.note(type(e).__name__)
                        if conn is not None:
                            conn.close()
                        conn = None
                        self.stop.wait(0.02)  # sluice is down or restarting
                        continue
                    if status == 200:
                        self.acked.append((seq, self.per_request))
                        break
                    self.note(f"HTTP {status}")
                    if status in (429, 503):
                        retry = resp.getheader("Retry-After")
                        wait = min(1.0, float(retry)) if retry and retry.isdigit() else 0.05
                        self.stop.wait(wait)
                        continue
                    self.unexpected.append(status)
                    raise BenchError(f"client {self.index}: unexpected HTTP {status} for sequence {seq}")
                seq += self.per_request
                if self.interval:
                    self.stop.wait(max(0.0, began + self.interval - time.monotonic()))
        except Exception as e:  # noqa: BLE001 - reported by main
            self.failure = e
        finally:
            if conn is not None:
                conn.close()


def config(tmp, api, port, out_path, checkpoint_interval=None):
    queue = {"type": "persisted"}  # sync: commit, checkpoint_interval: 1s (the defaults)
    if checkpoint_interval:
        queue["checkpoint_interval"] = checkpoint_interval
    doc = {
        "data_dir": os.path.join(tmp, "data"),
        "api": {"address": api},
        "log": {"level": "warn"},
        "shutdown_timeout": "60s",
        "pipelines": {PIPELINE: {
            "workers": 2,
            "queue": queue,
            "inputs": [{"type": "http", "address": f"127.0.0.1:{port}", "path": "/ingest"}],
            "outputs": [{"type": "file", "path": out_path, "codec": "json"}],
        }},
    }
    return write_config(os.path.join(tmp, "kill.yml"), doc)


def drain(binary, cfg, log, api, timeout):
    """Starts sluice with no load, waits until its queue is empty and `out` has stopped moving,
    then SIGTERM. Returns (seconds, exit status, the summary line)."""
    s = Sluice(binary, cfg, log, api)
    try:
        started = time.monotonic()
        s.wait_api()
        deadline = started + timeout
        last_out, still = None, 0
        while True:
            st = stats(api)["pipelines"][PIPELINE]
            queued, out = st["queue"]["events"], st["events"]["out"]
            still = still + 1 if (queued == 0 and out == last_out) else 0
            last_out = out
            if still >= 5:  # empty and quiet for 5 samples (0.5 s)
                break
            if time.monotonic() > deadline:
                raise BenchError(f"the queue did not drain within {timeout}s ({queued} events left)")
            if not s.alive():
                raise BenchError("sluice exited during the drain; its log ends:\n" + s.log_tail())
            time.sleep(0.1)
        secs = time.monotonic() - started
        status = s.terminate(90)
        summary = next((line for line in s.log_tail(20000).splitlines() if f"pipeline {PIPELINE}:" in line), "")
        return secs, status, summary
    finally:
        s.close()


LINE = re.compile(rb'^\{"c":(\d+),"s":(\d+),"pad":"x*","@timestamp":"[^"\n]*"\}$', re.M)


class Ledger:
    """What the output holds, per client: a count per sequence number (saturating at 255), so
    that millions of ids cost a byte each rather than a Python object."""

    def __init__(self, sent):
        self.counts = {c: bytearray(n) for c, n in sent.items()}
        self.unknown = 0

    def add(self, c, s):
        """Counts one line; True if its id was there already (a duplicate)."""
        counts = self.counts.get(c)
        if counts is None or s >= len(counts):
            self.unknown += 1  # an id no client sent: must never happen
            return False
        n = counts[s]
        if n < 255:
            counts[s] = n + 1
        return n > 0


def read_output(path, boundaries, ledger):
    """Reads the output file run by run (`boundaries` are its sizes at each kill) into `ledger`.
    Returns (lines, duplicates per run, broken lines, events recovered from them). A line that is
    not one whole event is a write cut by a kill (the next run ends it with a newline); it is
    counted as broken and searched for whole objects, in case a build glues the next line to it."""
    decoder = json.JSONDecoder()
    per_run, broken, recovered, lines = [], [], 0, 0
    start = 0
    f = open(path, "rb")
    size = os.fstat(f.fileno()).st_size
    for end in boundaries + [size]:
        f.seek(start)
        chunk = f.read(max(0, end - start))  # one run's lines at a time
        start = end
        dup = 0
        matched = 0
        for m in LINE.finditer(chunk):
            matched += 1
            dup += ledger.add(int(m.group(1)), int(m.group(2)))
        lines += matched
        if matched != sum(1 for raw in chunk.split(b"\n") if raw.strip()):
            for raw in chunk.split(b"\n"):
                if not raw.strip() or LINE.fullmatch(raw):
                    continue
                text = raw.decode(errors="replace")
                try:
                    ev = json.loads(text)
                    dup += ledger.add(ev["c"], ev["s"])
                    lines += 1
                    continue
                except (ValueError, KeyError, TypeError):
                    pass
                broken.append(text[:200])
                i = text.find("{", 1)
                while i != -1:
                    try:
                        ev, n = decoder.raw_decode(text, i)
                        if isinstance(ev, dict) and "c" in ev and "s" in ev:
                            dup += ledger.add(ev["c"], ev["s"])
                            recovered += 1
                            lines += 1
                            i = text.find("{", n)
                            continue
                    except ValueError:
                        pass
                    i = text.find("{", i + 1)
        per_run.append(dup)
    f.close()
    return lines, per_run, broken, recovered


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=100, help="SIGKILL cycles (default 100)")
    ap.add_argument("--clients", type=int, default=4, help="concurrent http clients (default 4)")
    ap.add_argument("--events-per-request", type=int, default=50)
    ap.add_argument("--rate", type=float, default=0,
                    help="requests per second per client (default 0: each as soon as the last is answered)")
    ap.add_argument("--checkpoint-interval", help="the queue's checkpoint_interval, e.g. 200ms (default: the "
                                                   "queue's own, 1s)")
    ap.add_argument("--pad", type=int, default=64, help="bytes of padding per event (default 64)")
    ap.add_argument("--min-run", type=float, default=0.3, help="shortest run before a kill, seconds")
    ap.add_argument("--max-run", type=float, default=2.0, help="longest run before a kill, seconds")
    ap.add_argument("--drain-timeout", type=float, default=300)
    ap.add_argument("--seed", type=int, help="random seed for the run lengths (printed)")
    ap.add_argument("--sluice", help="the sluice binary (default: target/release/sluice)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (printed) for inspection")
    ap.add_argument("--json", action="store_true", help="print the result as JSON too")
    args = ap.parse_args()
    if args.cycles < 1 or args.clients < 1 or args.events_per_request < 1 or not 0 < args.min_run <= args.max_run:
        ap.error("--cycles, --clients and --events-per-request must be >= 1, and 0 < --min-run <= --max-run")
    binary = sluice_binary(args.sluice)
    on_signals_exit()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)

    tmp_obj = tempfile.TemporaryDirectory(prefix="sluice-kill-")
    tmp = tmp_obj.name
    clients, current = [], None
    stop = threading.Event()
    try:
        api = f"127.0.0.1:{free_port()}"
        port = free_port()
        os.makedirs(os.path.join(tmp, "out"))
        out_path = os.path.join(tmp, "out", "events.log")
        cfg = config(tmp, api, port, out_path, args.checkpoint_interval)
        logs = os.path.join(tmp, "logs")
        os.makedirs(logs)
        # Every loop ends: the clients by `stop` or this deadline, the cycles by their count.
        budget = args.cycles * (args.max_run + 35) + args.drain_timeout + 120
        deadline = time.monotonic() + budget
        clients = [Client(i, port, "/ingest", args.events_per_request, "x" * args.pad, stop, deadline,
                          args.rate)
                   for i in range(args.clients)]
        for c in clients:
            c.start()
        boundaries, run_secs = [], []
        started = time.monotonic()
        for cycle in range(args.cycles):
            current = Sluice(binary, cfg, os.path.join(logs, f"run-{cycle}.log"), api)
            current.wait_api()
            current.wait_port(port)
            hold = rng.uniform(args.min_run, args.max_run)
            time.sleep(hold)
            if not current.alive():
                raise BenchError(f"cycle {cycle}: sluice exited by itself (status {current.proc.returncode}); "
                                 "its log ends:\n" + current.log_tail())
            current.kill()
            run_secs.append(time.monotonic() - current.started)
            current = None
            boundaries.append(os.path.getsize(out_path) if os.path.exists(out_path) else 0)
            failed = [c for c in clients if c.failure]
            if failed:
                raise BenchError(f"client failed: {failed[0].failure}")
            print(f"\rcycle {cycle + 1}/{args.cycles}: ran {run_secs[-1]:.2f}s, acked so far "
                  f"{sum(n for c in clients for _, n in c.acked)}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        load_cycles = os.getloadavg()[0]
        under_load = time.monotonic() - started
        stop.set()
        for c in clients:
            c.join(30)
            if c.is_alive():
                raise BenchError(f"{c.name} did not stop within 30 s")
        failed = [c for c in clients if c.failure]
        if failed:
            raise BenchError(f"client failed: {failed[0].failure}")

        drain_secs, drain_status, summary = drain(binary, cfg, os.path.join(logs, "drain.log"), api,
                                                  args.drain_timeout)
        ledger = Ledger({c.index: c.sent_seq for c in clients})
        lines, per_run, broken, recovered = (read_output(out_path, boundaries, ledger) if os.path.exists(out_path)
                                             else (0, [0] * (len(boundaries) + 1), [], 0))
        dup_first = per_run[0]  # no kill before the first run: client resends only
        per_kill = per_run[1:]  # run i's duplicates are the doing of kill i-1 (the last: of the final drain)
        acked_n, missing, first_missing = 0, 0, []
        for c in clients:
            counts = ledger.counts[c.index]
            for first, n in c.acked:
                acked_n += n
                for sq in range(first, first + n):
                    if not counts[sq]:
                        missing += 1
                        if len(first_missing) < 20:
                            first_missing.append([c.index, sq])
        delivered = sum(len(v) - v.count(0) for v in ledger.counts.values())
        duplicates = lines - delivered - ledger.unknown
        result = {
            "cycles": args.cycles,
            "clients": args.clients,
            "events_per_request": args.events_per_request,
            "rate_per_client": args.rate or "unlimited",
            "checkpoint_interval": args.checkpoint_interval or "1s (default)",
            "seed": seed,
            "seconds_under_load": round(under_load, 2),
            "mean_run_seconds": round(sum(run_secs) / len(run_secs), 3),
            "acknowledged": acked_n,
            "acked_per_second": round(acked_n / under_load, 1),
            "delivered": delivered,
            "delivered_unacknowledged": delivered - (acked_n - missing),
            "output_lines": lines,
            "missing": missing,
            "first_missing": first_missing,
            "unknown_ids": ledger.unknown,
            "duplicates": duplicates,
            "duplicates_first_run": dup_first,
            "duplicates_per_kill_mean": round(sum(per_kill) / len(per_kill), 1) if per_kill else 0,
            "duplicates_per_kill_max": max(per_kill) if per_kill else 0,
            # A kill's duplicates in seconds of acknowledged traffic: comparable across loads.
            "duplicates_per_kill_in_seconds_of_traffic": round(sum(per_kill) / len(per_kill) / (acked_n / under_load), 3)
            if per_kill and acked_n else None,
            "duplicates_per_kill": per_kill,
            "run_seconds": [round(v, 2) for v in run_secs],
            "broken_lines": len(broken),
            "events_recovered_from_broken_lines": recovered,
            "requests": sum(c.requests for c in clients),
            "resends": sum(c.resends for c in clients),
            "client_errors": {k: sum(c.errors.get(k, 0) for c in clients)
                              for k in sorted({k for c in clients for k in c.errors})},
            "drain_seconds": round(drain_secs, 2),
            "drain_exit_status": drain_status,
            "drain_summary": summary.strip(),
            "load_average_during_cycles": round(load_cycles, 2),
            "load_average_end": round(load_average()[0], 2),
        }
        print_table(result, broken)
        if args.json:
            print(json.dumps(result))
        if args.keep:
            print(f"kept: {tmp}", file=sys.stderr)
        return 1 if (missing or ledger.unknown or drain_status != 0) else 0
    except BenchError as e:
        print(f"\nerror: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: stopping sluice and the clients, removing the temp dir", file=sys.stderr)
        return 130
    finally:
        stop.set()
        if current is not None:
            current.close()
        stop_all()
        for c in clients:
            c.join(30)
        if args.keep:
            tmp_obj._finalizer.detach()  # noqa: SLF001 - keep the directory on request
        else:
            tmp_obj.cleanup()


def print_table(r, broken):
    print(f"kill harness: {r['cycles']} SIGKILL cycles, {r['clients']} http clients x {r['events_per_request']} "
          f"events per request ({r['rate_per_client']} requests/s each), persisted queue (sync: commit, "
          f"checkpoint_interval {r['checkpoint_interval']}) -> file output; "
          f"seed {r['seed']}")
    rows = [
        ("acknowledged (200)", r["acknowledged"]),
        ("delivered (distinct ids in the output)", r["delivered"]),
        ("  of them never acknowledged", r["delivered_unacknowledged"]),
        ("output lines", r["output_lines"]),
        ("MISSING (acked, not in the output)", r["missing"]),
        ("duplicates", r["duplicates"]),
        ("  in the first run (no kill before it)", r["duplicates_first_run"]),
        ("duplicates per kill, mean", r["duplicates_per_kill_mean"]),
        ("duplicates per kill, max", r["duplicates_per_kill_max"]),
        ("  mean, in seconds of acknowledged traffic", r["duplicates_per_kill_in_seconds_of_traffic"]),
        ("broken output lines (cut by a kill)", r["broken_lines"]),
        ("requests sent / of them resends", f"{r['requests']} / {r['resends']}"),
        ("client errors", ", ".join(f"{k} {v}" for k, v in r["client_errors"].items()) or "none"),
        ("seconds under load / mean run", f"{r['seconds_under_load']} / {r['mean_run_seconds']}"),
        ("acknowledged events per second", r["acked_per_second"]),
        ("final drain: seconds / exit status", f"{r['drain_seconds']} / {r['drain_exit_status']}"),
        ("load average (cycles end / end)", f"{r['load_average_during_cycles']} / {r['load_average_end']}"),
    ]
    for name, value in rows:
        print(f"  {name:42} {value}")
    if r["drain_summary"]:
        print(f"  drain summary: {r['drain_summary']}")
    if r["missing"]:
        print(f"  FAIL: {r['missing']} acknowledged events are missing; first: {r['first_missing']}")
    if r["unknown_ids"]:
        print(f"  FAIL: {r['unknown_ids']} ids in the output were never sent")
    for line in broken[:3]:
        print(f"  broken line: {line!r}")


if __name__ == "__main__":
    sys.exit(main())
