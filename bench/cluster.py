#!/usr/bin/env python3
"""Cluster mode, end to end: events/s of a keyed `aggregate` over two nodes on this machine.

Each scenario starts real `sluice run` processes and feeds them JSON lines over tcp, as fast as
they are taken, for `--warmup` + `--window` seconds. Every line has a `user` field drawn from
`--users` (10,000) distinct values; the pipeline is `json` then `aggregate` (`count` by /user,
`group_duration` 1 s) into a `file` output. In a two-node scenario each node gets half the
traffic (one connection each) and forwards the events it does not own to the other (about half
of them): their acknowledgements come back across the hop.

- `two-memory`, `two-persisted`, `two-memory-lz4`: two nodes (`cluster:` with static
  discovery), memory queues, persisted queues (default `sync: commit`), memory queues with
  `compression: lz4` on the links.
- `one-memory`: one node without `cluster:`, the same pipeline, the same two connections: the
  ceiling of this machine for this work; `one-persisted` the same with a persisted queue (the
  ceiling for `two-persisted`).
- `blackhole`: one node, tcp input -> `blackhole`, no processors, the same two connections: the
  ceiling of the sender (and of the tcp input) on this machine.

The figure, `events/s`, is events fully processed per second: consumed by `aggregate` on the node
that owns them (summed over the nodes; events `out` for `blackhole`), from the nodes' /stats
counters, over the window that starts `--warmup` seconds after the senders start and ends when
they stop. `whole run` is the events sent divided by the time from the first send until /stats
shows every one of them consumed. After the run the nodes are stopped (SIGTERM, drain) and the
`count` fields of every output file are summed: the sum must equal the events sent (the
script exits 1 otherwise).

Usage: bench/cluster.py [--build] [--only NAME ...] [--repeat N] [--warmup 3] [--window 10]
"""
import sys

sys.dont_write_bytecode = True  # no __pycache__ beside the scripts

import argparse
import json
import os
import random
import re
import shutil
import statistics
import tempfile
import threading
import time

from harness import (BenchError, LineSender, Sluice, build_release, free_port, load_average, on_signals_exit,
                     sluice_binary, stats, stop_all, terminate_together, write_config)

PIPELINE = "web"
SCENARIOS = ["two-memory", "two-persisted", "one-memory", "one-persisted", "two-memory-lz4", "blackhole"]
RATIOS = [  # (label, numerator, denominator)
    ("two-persisted / two-memory", "two-persisted", "two-memory"),
    ("two-memory / one-memory", "two-memory", "one-memory"),
    ("two-persisted / one-persisted", "two-persisted", "one-persisted"),
    ("two-memory-lz4 / two-memory", "two-memory-lz4", "two-memory"),
    ("one-memory / blackhole", "one-memory", "blackhole"),
]


def line_block(seed, users, line_bytes, block_bytes=4 << 20):
    """About `block_bytes` of JSON lines of exactly `line_bytes` each. The `user` values go
    through every one of `users` in a shuffled order, again and again, so that all of them
    occur about equally often."""
    rng = random.Random(seed)
    order = list(range(users))
    rng.shuffle(order)
    out = []
    for i in range(max(1, block_bytes // line_bytes)):
        head = ('{"ts":"2026-11-21T07:%02d:%02d.%03dZ","user":"user-%05d","level":"%s","host":"web-%d",'
                '"status":%d,"method":"GET","path":"/api/v1/items/%d","latency_ms":%d,"msg":"'
                % ((i // 60) % 60, i % 60, i % 1000, order[i % users], ["info", "warn", "error", "debug"][i % 4],
                   i % 16, [200, 201, 404, 500, 503][i % 5], rng.randrange(10_000), rng.randrange(300)))
        pad = line_bytes - len(head) - 3
        if pad < 0:
            raise BenchError(f"--line-bytes {line_bytes} is too small for the lines (at least {len(head) + 3})")
        out.append(head + "x" * pad + '"}\n')
    return "".join(out).encode()


def pipeline_doc(args, port, out_path, queue, aggregate=True):
    processors = [{"type": "json"},
                  {"type": "aggregate", "identification_keys": ["/user"], "group_duration": args.group_duration,
                   "action": "count"}] if aggregate else []
    return {
        "workers": args.workers,
        "queue": {"type": queue},  # persisted: the default `sync: commit`
        "inputs": [{"type": "tcp", "address": f"127.0.0.1:{port}"}],
        "processors": processors,
        "outputs": [{"type": "file", "path": out_path}] if aggregate else [{"type": "blackhole"}],
    }


class Node:
    def __init__(self, name, directory, api, port, doc):
        self.name, self.dir, self.api, self.port, self.doc = name, directory, api, port, doc
        self.out_path = os.path.join(directory, "agg.log")
        self.proc = None


def make_nodes(args, tmp, scenario):
    """The nodes of a scenario, their configs written (not started)."""
    two = scenario.startswith("two-")
    queue = "persisted" if scenario.endswith("-persisted") else "memory"
    count = 2 if two else 1
    cluster_ports = [free_port() for _ in range(count)]
    nodes = []
    for i in range(count):
        d = os.path.join(tmp, f"node{i}")
        os.makedirs(d)
        api, port = f"127.0.0.1:{free_port()}", free_port()
        doc = {
            "data_dir": os.path.join(d, "data"),
            "api": {"address": api},
            "log": {"level": "warn"},
            "pipelines": {PIPELINE: pipeline_doc(args, port, os.path.join(d, "agg.log"), queue,
                                                 aggregate=scenario != "blackhole")},
        }
        if args.memory_budget:
            doc["memory"] = {"budget": args.memory_budget}
        if two:
            doc["cluster"] = {
                "listen": f"127.0.0.1:{cluster_ports[i]}",
                "discovery": {"static": [f"127.0.0.1:{p}" for p in cluster_ports]},
                "forwarding": {"max_in_flight": args.max_in_flight, "batch_bytes": args.batch_bytes,
                               "batch_timeout": args.batch_timeout,
                               "compression": "lz4" if scenario.endswith("-lz4") else "none"},
            }
        nodes.append(Node(f"node{i}", d, api, port, doc))
    return nodes


def processed(doc, blackhole):
    """Events this node has fully processed: taken by `aggregate` (its component's events in,
    less any it dropped; every line has a `user`, so it consumes all of them, and the
    component's `out` counts the events its groups emitted), or delivered (`blackhole`)."""
    p = doc["pipelines"][PIPELINE]
    if blackhole:
        return p["events"]["out"]
    for c in p["components"]:
        if c["type"] == "aggregate":
            e = c["events"]
            return e["in"] - e["dropped"]
    raise BenchError("no aggregate component in /stats")


def where(doc, blackhole):
    """Where a node's events are, for the message of a run that does not finish."""
    p = doc["pipelines"][PIPELINE]
    c = doc.get("cluster") or {}
    return json.dumps({"processed": processed(doc, blackhole), "events": p["events"],
                       "queued": (p.get("queue") or {}).get("events"), "cluster": c.get("events"),
                       "peers": c.get("peers"), "memory_used": (doc.get("memory") or {}).get("used_bytes")})


SUMMARY = re.compile(r"pipeline " + PIPELINE + r": (in=\S+.*)")


def run_scenario(args, binary, scenario):
    blackhole = scenario == "blackhole"
    tmp = tempfile.mkdtemp(prefix="sluice-cluster-")
    procs = []
    try:
        nodes = make_nodes(args, tmp, scenario)
        for n in nodes:
            cfg = write_config(os.path.join(n.dir, "sluice.yml"), n.doc)
            n.proc = Sluice(binary, cfg, os.path.join(n.dir, "sluice.log"), n.api)
            procs.append(n.proc)
        for n in nodes:
            n.proc.wait_api()
            n.proc.wait_port(n.port)
        # Two connections in every scenario: one per node, or both into the one node.
        targets = [nodes[i % len(nodes)] for i in range(2)]
        stop = threading.Event()
        senders = [LineSender(f"127.0.0.1:{t.port}", line_block(1000 + i, args.users, args.line_bytes),
                              args.line_bytes, stop=stop) for i, t in enumerate(targets)]

        def sample():
            return time.monotonic(), sum(processed(stats(n.api), blackhole) for n in nodes)

        load_before = load_average()[0]
        t0 = time.monotonic()
        for s in senders:
            s.start()
        samples = []
        stop_at = t0 + args.warmup + args.window
        while time.monotonic() < stop_at:
            samples.append(sample())
            for n in nodes:
                if not n.proc.alive():
                    raise BenchError(f"{n.name} exited during the run; its log ends:\n" + n.proc.log_tail())
            time.sleep(0.25)
        stop.set()
        for s in senders:
            s.join(60)
            if s.is_alive() or s.error:
                raise BenchError(f"a sender failed: {s.error or 'still sending after 60 s'}")
        samples.append(sample())  # the senders' last blocks are in flight: counted in the whole-run figure only
        sent = sum(s.sent for s in senders)
        window = [x for x in samples[:-1] if x[0] >= t0 + args.warmup]
        if len(window) < 2:
            raise BenchError("too few samples in the window: make --window longer")
        rate = (window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0])
        # Every event sent, processed: the whole-run figure.
        deadline = time.monotonic() + args.drain_timeout
        while True:
            t, done = sample()
            if done >= sent:
                break
            if time.monotonic() > deadline:
                raise BenchError(f"{scenario}: {done} of {sent} events processed after {args.drain_timeout}s; "
                                 + "; ".join(f"{n.name}: {where(stats(n.api), blackhole)}" for n in nodes))
            time.sleep(0.02)
        whole = sent / (t - t0)
        final = [stats(n.api) for n in nodes]
        statuses = terminate_together([n.proc for n in nodes], args.drain_timeout)
        load_after = load_average()[0]
        row = {"scenario": scenario, "sent": sent, "events_per_s": rate, "whole_run_events_per_s": whole,
               "load": [round(load_before, 2), round(load_after, 2)], "exit": statuses, "nodes": []}
        for n, doc in zip(nodes, final):
            usage = n.proc.usage
            cpu = (usage.ru_utime + usage.ru_stime) if usage else None
            summary = SUMMARY.search(open(n.proc.log_path, errors="replace").read())
            node = {"name": n.name, "processed": processed(doc, blackhole),
                    "cpu_s": cpu, "summary": summary.group(1) if summary else None}
            c = doc.get("cluster")
            if c:
                peer = next(iter(c["peers"].values()), {})
                batches = peer.get("batches_forwarded", 0)
                node.update(forwarded=c["events"]["forwarded"], received=c["events"]["received"],
                            events_per_frame=(peer.get("events_forwarded", 0) / batches) if batches else None,
                            latency_mean_s=peer.get("latency_mean_seconds"),
                            worker_wait_s=c["worker_wait_seconds"], retried=peer.get("batches_retried"))
            row["nodes"].append(node)
        cpu_total = [x["cpu_s"] for x in row["nodes"]]
        row["cpu_s_per_m"] = None if None in cpu_total else sum(cpu_total) / (sent / 1e6)
        # Correctness: the counts the groups emitted add up to the events sent.
        if blackhole:
            row["count_sum"] = sum(x["processed"] for x in row["nodes"])
            row["groups"] = None
        else:
            total = groups = 0
            for n in nodes:
                if os.path.exists(n.out_path):
                    with open(n.out_path) as f:
                        for line in f:
                            total += json.loads(line)["count"]
                            groups += 1
            row["count_sum"], row["groups"] = total, groups
        row["ok"] = row["count_sum"] == sent and all(s == 0 for s in statuses)
        return row
    finally:
        for p in procs:
            p.close()
        shutil.rmtree(tmp, ignore_errors=True)


def show(row):
    fmt = lambda v: "-" if v is None else f"{v:,.0f}"
    print(f"{row['scenario']:<16} {fmt(row['events_per_s']):>11} events/s   whole run {fmt(row['whole_run_events_per_s'])}"
          f"   CPU {row['cpu_s_per_m']:.2f} s/M   sent {row['sent']:,}   count sum {row['count_sum']:,}"
          f" in {row['groups'] if row['groups'] is not None else '-'} groups:"
          f" {'OK' if row['ok'] else 'MISMATCH or bad exit ' + str(row['exit'])}   load {row['load']}")
    for n in row["nodes"]:
        extra = ""
        if "forwarded" in n:
            epf = n["events_per_frame"]
            extra = (f" forwarded {n['forwarded']:,} received {n['received']:,}"
                     f" events/frame {'-' if epf is None else f'{epf:,.0f}'}"
                     f" ack latency {1000 * (n['latency_mean_s'] or 0):.0f} ms"
                     f" worker wait {n['worker_wait_s']:.1f} s retried {n['retried']}")
        print(f"    {n['name']}: processed {n['processed']:,} CPU {n['cpu_s']:.1f} s{extra}")
        if n["summary"]:
            print(f"      {n['summary']}")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", choices=SCENARIOS, help="scenarios to run (default: all)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the scenarios N times, every other time in reverse order; ratios as medians")
    ap.add_argument("--warmup", type=float, default=3.0, help="seconds of sending before the window")
    ap.add_argument("--window", type=float, default=10.0, help="seconds of the measured window")
    ap.add_argument("--line-bytes", type=int, default=250)
    ap.add_argument("--users", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--group-duration", default="1s")
    ap.add_argument("--max-in-flight", default="128MiB", help="per peer (the default of `forwarding.max_in_flight`)")
    ap.add_argument("--batch-bytes", default="256KiB")
    ap.add_argument("--batch-timeout", default="5ms")
    ap.add_argument("--memory-budget", default=None, help="memory.budget of the nodes (default: sluice's)")
    ap.add_argument("--drain-timeout", type=float, default=120.0)
    ap.add_argument("--build", action="store_true", help="cargo build --release -p sluice first")
    ap.add_argument("--sluice", help="the binary (default: the release build in the target dir)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON too")
    args = ap.parse_args()
    on_signals_exit()
    if args.build:
        build_release(["sluice"])
    binary = sluice_binary(args.sluice)
    chosen = args.only or SCENARIOS
    print(f"{binary}; {os.cpu_count()} CPUs; {args.line_bytes}-byte lines, {args.users} users, warm-up "
          f"{args.warmup} s, window {args.window} s, group_duration {args.group_duration}, max_in_flight "
          f"{args.max_in_flight}, workers {args.workers}")
    rows = []
    try:
        for r in range(args.repeat):
            for scenario in (chosen if r % 2 == 0 else list(reversed(chosen))):
                row = run_scenario(args, binary, scenario)
                row["round"] = r
                rows.append(row)
                show(row)
    except BenchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        stop_all()
    print()
    for label, num, den in RATIOS:
        values = []
        for r in range(args.repeat):
            a = [x for x in rows if x["round"] == r and x["scenario"] == num]
            b = [x for x in rows if x["round"] == r and x["scenario"] == den]
            if a and b:
                values.append(a[0]["events_per_s"] / b[0]["events_per_s"])
        if values:
            print(f"{label:<30} {statistics.median(values):.3f}" +
                  (f"   (each round: {', '.join(f'{v:.3f}' for v in values)})" if len(values) > 1 else ""))
    for s in chosen:
        v = [x["events_per_s"] for x in rows if x["scenario"] == s]
        print(f"{s:<16} median {statistics.median(v):,.0f} events/s over {len(v)} run(s)")
    if args.json:
        print(json.dumps(rows, indent=1))
    bad = [x["scenario"] for x in rows if not x["ok"]]
    if bad:
        print(f"FAILED: count sum differs from events sent, or a node did not exit 0: {bad}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
