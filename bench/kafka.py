#!/usr/bin/env python3
"""Kafka, as ratios taken in one run: the `kafka` output against Kafka's own ProducerPerformance,
and the `kafka` input against Kafka's own ConsumerPerformance, on one real broker.

The broker is Kafka 4.3.1 from Maven Central jars (servers/kafka/run: one node, KRaft, on
127.0.0.1), started in a temp dir and stopped at the end; the two tools come from
`servers/kafka/run fetch-tools`. Every topic has 3 partitions. Records are ~250-byte JSON log
lines (`--record-bytes`): 10,000 distinct lines with a message of words, so that they compress
like logs rather than like padding.

- **Output.** `sluice`: a `generator` input (the lines from a file, cycled, no `sequence`) or,
  with `--source tcp`, a `tcp` input fed by `LineSender` -> memory queue -> 2 workers (`--workers`)
  -> `kafka` output with `codec: text` (the record is the line, `--record-bytes` bytes) and the
  output's defaults, which are the settings given to the tool: `acks: all`, idempotence,
  `linger: 5ms`, `batch_max_bytes: 1MiB`. Its rate is measured from /metrics
  (`sluice_component_records_produced_total`, the records the broker acknowledged) polled every
  10 ms: from the first sample showing a record produced to the first showing `--records`
  more, so neither start-up nor the producer's first metadata round trip counts. Against
  `ProducerPerformance --num-records N --record-size R --throughput -1 --producer-props
  bootstrap.servers=... acks=all enable.idempotence=true compression.type=C linger.ms=5
  batch.size=1048576`, whose figure (its summary line) runs from its first send to the close of
  the producer, after the last acknowledgement. Both with `--compression` (none and zstd). Each
  run writes into a topic of its own. The tool's records are random capital letters (its
  `--record-size` payload), which compress worse than log lines: the table shows the bytes per
  record each side left on the broker's disk.
  `source` is the same sluice source into a `blackhole` output, measured the same way: it must
  be well above the kafka figures, or the source is what is measured.
- **Input.** A topic filled once with `--input-records` lines by `sluice` (compression none).
  `sluice`: `kafka` input (a fresh `group_id` per run, `auto_offset_reset: earliest`, `codec:
  text`, the default metadata fields) -> memory queue -> `blackhole`; its rate is events out of
  the pipeline (/stats, polled every 10 ms) from the first sample showing an event to the first
  showing all N. Against `ConsumerPerformance --topic T --num-records N --bootstrap-server ...
  --group <fresh>` on the same topic; its figure is `fetch.nMsg.sec` (from the group's
  assignment to the last record; `nMsg.sec`, which includes joining the group, is shown too).

Before the rounds, one warm-up run of each side (not counted). Then `--repeat` rounds, every
other round in reverse order; the table shows each median and every round, and each ratio is
the median of the per-round ratios. CPU: `sluice`'s own over its measured span (from
/proc/PID/stat), per million records; the broker's over each run, per million records.

`--tuned-batch-size N` and `--tuned-output-option KEY=VALUE` add rows of the output with the
pipeline's `batch.size: N` and those keys of the `kafka` output (settings the user has), in
every round: each worker hands librdkafka up to the output's `batches_in_flight` batches
before it waits for their acknowledgements, so the records in flight are `workers` x
`batches_in_flight` x `batch.size` (`--tuned-output-option batches_in_flight=1` shows what one
batch per worker does).

Usage: bench/kafka.py [--build] [--quick] [--repeat 5] [--records 2000000] [--input-records 500000]
       [--compression none zstd] [--only output input] [--source generator|tcp] [--workers 2]
       [--batch-size 1000] [--tuned-batch-size 5000] [--tuned-output-option linger=1ms]
       [--output-option KEY=VALUE ...] [--input-option KEY=VALUE ...] [--timeout 300] [--keep] [--json]
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
import subprocess
import tempfile
import threading
import time
import urllib.request

from harness import (ROOT, BenchError, LineSender, Sluice, build_release, die, free_port, load_average,
                     on_signals_exit, sluice_binary, stats, stop_all, write_config)

PIPELINE = "bench"
KAFKA_RUN = os.path.join(ROOT, "servers", "kafka", "run")
PARTITIONS = 3
CLK_TCK = os.sysconf("SC_CLK_TCK")
POLL = 0.01
# What kafka-run-class.sh gives the tools by default.
JAVA_OPTS = ["-Xmx512M", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
             "-XX:+ExplicitGCInvokesConcurrent", "-Djava.awt.headless=true"]
WORDS = ("user request order payment session cache timeout retry connection upstream downstream service "
         "handler worker queue backend frontend token invalid expired accepted rejected completed started "
         "failed latency checkout inventory shipping account login logout refresh update delete create").split()


def log_lines(n, size):
    """`n` distinct JSON lines of exactly `size` bytes (without a newline), the message made of
    words, so that they compress like log lines."""
    rng = random.Random(22)
    out = []
    for i in range(n):
        head = ('{"ts":"2026-11-21T07:%02d:%02d.%03dZ","level":"%s","host":"web-%d","service":"checkout",'
                '"trace_id":"%016x","status":%d,"method":"GET","path":"/api/v1/items/%d","latency_ms":%d,"msg":"'
                % ((i // 60) % 60, i % 60, i % 1000, ["info", "warn", "error", "debug"][i % 4], i % 16,
                   rng.getrandbits(64), [200, 201, 404, 500, 503][i % 5], rng.randrange(10000), rng.randrange(300)))
        room = size - len(head) - 2
        if room < 8:
            raise BenchError(f"--record-bytes {size} is too small for the lines (at least {len(head) + 10})")
        msg = ""
        while len(msg) < room:
            msg += ("" if not msg else " ") + (rng.choice(WORDS) if rng.random() < 0.8 else str(rng.randrange(100000)))
        line = head + msg[:room] + '"}'
        assert len(line) == size
        out.append(line)
    return out


def cpu_seconds(pid):
    """User plus system CPU seconds of a process (all its threads) so far; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def metric(api, name):
    """The sum of every series of one /metrics figure."""
    with urllib.request.urlopen(f"http://{api}/metrics", timeout=5) as r:
        text = r.read().decode()
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(name) and line[len(name):len(name) + 1] in (" ", "{"):
            total += float(line.rsplit(" ", 1)[1])
            seen = True
    return total if seen else None


def out_events(api):
    return stats(api)["pipelines"][PIPELINE]["events"]["out"]


def parse_option(text):
    """KEY=VALUE; VALUE as JSON when it parses (numbers, true), else text. `librdkafka_options.X=V`
    goes into that map."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    key, value = text.split("=", 1)
    try:
        value = json.loads(value)
    except ValueError:
        pass
    return key, value


def apply_options(component, options):
    for key, value in options:
        if key.startswith("librdkafka_options."):
            component.setdefault("librdkafka_options", {})[key.split(".", 1)[1]] = str(value)
        else:
            component[key] = value
    return component


class Broker:
    """One Kafka broker from servers/kafka/run, in a directory of its own; stopped by `stop`."""

    def __init__(self, directory):
        self.dir = directory
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.pid = None

    def start(self):
        settings = ["num.partitions=3", "auto.create.topics.enable=false",
                    # Old segments of the output runs' topics go soon (their topics set retention.ms).
                    "log.retention.check.interval.ms=5000", "file.delete.delay.ms=1000"]
        cmd = [KAFKA_RUN, "start", "--dir", self.dir, "--port", str(self.port), "--owner-pid", str(os.getpid())]
        for s in settings:
            cmd += ["--setting", s]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise BenchError("the Kafka broker did not start:\n" + r.stderr[-3000:])
        with open(os.path.join(self.dir, "pid")) as f:
            self.pid = int(f.read().strip())

    def create_topic(self, name, **configs):
        cmd = [KAFKA_RUN, "admin", "--dir", self.dir, "create-topic", name, str(PARTITIONS)]
        cmd += [f"{k.replace('_', '.')}={v}" for k, v in configs.items()]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise BenchError(f"cannot create topic {name}:\n{r.stdout}{r.stderr}")

    def topic_bytes(self, name):
        """Bytes of the topic's log segments on disk (what the records took on the broker)."""
        total = 0
        data = os.path.join(self.dir, "data")
        for d in os.listdir(data):
            if d.rsplit("-", 1)[0] == name:
                for f in os.listdir(os.path.join(data, d)):
                    if f.endswith(".log"):
                        total += os.path.getsize(os.path.join(data, d, f))
        return total

    def cpu(self):
        return cpu_seconds(self.pid) if self.pid else None

    def stop(self):
        if self.pid is None:
            return
        subprocess.run([KAFKA_RUN, "stop", "--dir", self.dir], capture_output=True, text=True, timeout=120)
        self.pid = None


class Bench:
    def __init__(self, args, binary, tmp, broker, tools_cp, lines_file, block):
        self.args, self.binary, self.tmp, self.broker = args, binary, tmp, broker
        self.tools_cp, self.lines_file, self.block = tools_cp, lines_file, block
        self.serial = 0

    def name(self, what):
        self.serial += 1
        return f"{what}-{self.serial}"

    def doc(self, d, api, inputs, outputs, batch_size=None):
        pipeline = {"workers": self.args.workers, "batch": {"size": batch_size or self.args.batch_size},
                    "inputs": inputs, "outputs": outputs}
        return {"data_dir": os.path.join(d, "data"), "api": {"address": api}, "log": {"level": "info"},
                "pipelines": {PIPELINE: pipeline}}

    def source(self, port, count=0):
        if self.args.source == "tcp":
            return {"type": "tcp", "address": f"127.0.0.1:{port}", "codec": "lines"}
        return {"type": "generator", "file": self.lines_file, "codec": "lines", "sequence": False, "count": count}

    def kafka_output(self, topic, compression, tuned=False):
        out = {"type": "kafka", "bootstrap_servers": self.broker.address, "topic": topic, "codec": "text",
               "compression": compression}
        return apply_options(out, self.args.output_option + (self.args.tuned_output_option if tuned else []))

    # ---- sluice, producing ----

    def sluice_out(self, compression, records, blackhole=False, tuned=False):
        """`sluice` from its source into a new topic (or a blackhole) until `records` more than at
        the first sample are out; a row. `tuned`: with --tuned-batch-size and --tuned-output-option."""
        topic = self.name(f"out-{compression}") if not blackhole else None
        if topic:
            # Its closed segments are deleted soon after the run: the disk does not fill up.
            self.broker.create_topic(topic, retention_ms=60000, segment_bytes=32 << 20)
        return self._produce(topic, compression, records, blackhole, tuned)

    def fill(self, topic, records):
        """Fills `topic` with exactly `records` lines through sluice's generator (compression none)."""
        d = os.path.join(self.tmp, self.name("fill"))
        os.makedirs(d)
        api = f"127.0.0.1:{free_port()}"
        gen = {"type": "generator", "file": self.lines_file, "codec": "lines", "sequence": False, "count": records}
        out = {"type": "kafka", "bootstrap_servers": self.broker.address, "topic": topic, "codec": "text"}
        cfg = write_config(os.path.join(d, "sluice.yml"), self.doc(d, api, [gen], [out]))
        node = Sluice(self.binary, cfg, os.path.join(d, "sluice.log"), api)
        try:
            deadline = time.monotonic() + 600
            while node.alive() and time.monotonic() < deadline:
                time.sleep(0.2)
            if node.alive():
                raise BenchError(f"filling {topic} took more than 600 s")
            if node.proc.returncode != 0:
                raise BenchError(f"filling {topic}: sluice exited {node.proc.returncode}; its log ends:\n"
                                 + node.log_tail())
        finally:
            node.close()

    def _produce(self, topic, compression, records, blackhole, tuned):
        d = os.path.join(self.tmp, self.name("sluice-out"))
        os.makedirs(d)
        api = f"127.0.0.1:{free_port()}"
        port = free_port()
        outputs = [{"type": "blackhole"}] if blackhole else [self.kafka_output(topic, compression, tuned)]
        batch_size = self.args.tuned_batch_size if tuned else None
        cfg = write_config(os.path.join(d, "sluice.yml"), self.doc(d, api, [self.source(port)], outputs, batch_size))
        node = Sluice(self.binary, cfg, os.path.join(d, "sluice.log"), api)
        stop = threading.Event()
        sender = None
        try:
            node.wait_api()
            if self.args.source == "tcp":
                node.wait_port(port)
                sender = LineSender(f"127.0.0.1:{port}", self.block, self.args.record_bytes + 1, stop=stop)
                sender.start()
            if blackhole:
                def count():
                    return out_events(api)
            else:
                def count():
                    return metric(api, "sluice_component_records_produced_total") or 0
            row = self._measure(node, count, records, f"sluice -> {topic or 'blackhole'}", sender)
            row.update({"side": "source" if blackhole else "sluice", "compression": None if blackhole else compression})
            if topic:
                # What the records took on the broker: the topic's bytes over the records the
                # broker acknowledged so far (a few batches more may be in flight).
                row["disk_bytes_per_record"] = self.broker.topic_bytes(topic) / count()
            return row
        finally:
            stop.set()
            node.close()
            if sender is not None:
                sender.join(30)

    def _measure(self, node, count, records, what, sender=None, total=False):
        """Polls `count()` until it has grown by `records` since the first sample above zero (with
        `total`, until it reaches `records`); the rate over the span from that first sample, and
        sluice's and the broker's CPU."""
        load = load_average()[0]
        deadline = time.monotonic() + self.args.timeout
        b0 = self.broker.cpu()
        first = None
        while True:
            now = time.monotonic()
            n = count()
            if first is None and n > 0:
                first = (now, n, cpu_seconds(node.pid))
            if first is not None and n - (0 if total else first[1]) >= records:
                last = (now, n, cpu_seconds(node.pid))
                break
            if now > deadline:
                raise BenchError(f"{what}: {n:,.0f} after {self.args.timeout} s, not {records:,}; the log ends:\n"
                                 + node.log_tail())
            if not node.alive():
                raise BenchError(f"{what}: sluice exited; its log ends:\n" + node.log_tail())
            if sender is not None and sender.error:
                raise BenchError(f"{what}: the sender failed: {sender.error}")
            time.sleep(POLL)
        b1 = self.broker.cpu()
        secs = last[0] - first[0]
        done = last[1] - first[1]
        return {"events_per_s": done / secs, "records": int(done), "seconds": secs,
                "sluice_cpu_s_per_m": (last[2] - first[2]) / (done / 1e6),
                "sluice_cores": (last[2] - first[2]) / secs,
                "broker_cpu_s_per_m": (b1 - b0) / (done / 1e6) if b0 is not None and b1 is not None else None,
                "load": round(load, 2)}

    # ---- Kafka's tools ----

    def java(self, main, argv, timeout):
        cmd = ["java"] + JAVA_OPTS + ["-cp", self.tools_cp, main] + argv
        b0 = self.broker.cpu()
        load = load_average()[0]
        t0 = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        wall = time.monotonic() - t0
        b1 = self.broker.cpu()
        if r.returncode != 0:
            raise BenchError(f"{main.rsplit('.', 1)[1]} failed (exit {r.returncode}):\n"
                             f"{r.stdout[-2000:]}{r.stderr[-3000:]}")
        return r.stdout, load, wall, (b1 - b0) if b0 is not None and b1 is not None else None

    def producer_perf(self, compression, records):
        topic = self.name(f"pp-{compression}")
        self.broker.create_topic(topic, retention_ms=60000, segment_bytes=32 << 20)
        props = [f"bootstrap.servers={self.broker.address}", "acks=all", "enable.idempotence=true",
                 f"compression.type={compression}", "linger.ms=5", "batch.size=1048576"]
        out, load, wall, broker_cpu = self.java(
            "org.apache.kafka.tools.ProducerPerformance",
            ["--topic", topic, "--num-records", str(records), "--record-size", str(self.args.record_bytes),
             "--throughput", "-1", "--producer-props"] + props, self.args.timeout)
        # "2000000 records sent, 412371.1 records/sec (98.32 MB/sec), 3.1 ms avg latency, ..."
        m = None
        for line in out.splitlines():
            m = re.match(r"\s*(\d+) records sent, ([\d.]+) records/sec .*?([\d.]+) ms avg latency, ([\d.]+) ms max",
                         line) or m
        if not m or int(m.group(1)) != records:
            raise BenchError("no summary line from ProducerPerformance:\n" + out[-2000:])
        rate = float(m.group(2))
        return {"side": "producer-perf", "compression": compression, "events_per_s": rate, "records": records,
                "seconds": records / rate, "avg_latency_ms": float(m.group(3)), "wall_s": wall,
                "broker_cpu_s_per_m": broker_cpu / (records / 1e6) if broker_cpu is not None else None,
                "disk_bytes_per_record": self.broker.topic_bytes(topic) / records, "load": round(load, 2)}

    def consumer_perf(self, topic, records):
        out, load, wall, broker_cpu = self.java(
            "org.apache.kafka.tools.ConsumerPerformance",
            ["--topic", topic, "--num-records", str(records), "--bootstrap-server", self.broker.address,
             "--group", self.name("cp-group"), "--timeout", "30000"], self.args.timeout)
        lines = [l for l in out.splitlines() if l.strip()]
        header = next((i for i, l in enumerate(lines) if l.startswith("start.time")), None)
        if header is None or header + 1 >= len(lines):
            raise BenchError("no figures from ConsumerPerformance:\n" + out[-2000:])
        names = [x.strip() for x in lines[header].split(",")]
        values = [x.strip() for x in lines[header + 1].split(",")]
        row = dict(zip(names, values))
        consumed = int(row["data.consumed.in.nMsg"])
        if consumed < records:
            raise BenchError(f"ConsumerPerformance consumed {consumed} records, not {records}:\n{out[-2000:]}")
        fetch_rate = float(row["fetch.nMsg.sec"])
        return {"side": "consumer-perf", "events_per_s": fetch_rate, "with_join_per_s": float(row["nMsg.sec"]),
                "records": consumed, "seconds": float(row["fetch.time.ms"]) / 1000,
                "rebalance_ms": float(row["rebalance.time.ms"]), "wall_s": wall,
                "broker_cpu_s_per_m": broker_cpu / (consumed / 1e6) if broker_cpu is not None else None,
                "load": round(load, 2)}

    # ---- sluice, consuming ----

    def sluice_in(self, topic, records):
        d = os.path.join(self.tmp, self.name("sluice-in"))
        os.makedirs(d)
        api = f"127.0.0.1:{free_port()}"
        inp = {"type": "kafka", "bootstrap_servers": self.broker.address, "topics": [topic],
               "group_id": self.name("sluice-group"), "auto_offset_reset": "earliest", "codec": "text"}
        apply_options(inp, self.args.input_option)
        cfg = write_config(os.path.join(d, "sluice.yml"), self.doc(d, api, [inp], [{"type": "blackhole"}]))
        node = Sluice(self.binary, cfg, os.path.join(d, "sluice.log"), api)
        try:
            node.wait_api()
            # From the first sample with an event out until all N are: those out at the first
            # sample are not in the figure.
            row = self._measure(node, lambda: out_events(api), records, f"sluice <- {topic}", total=True)
            row.update({"side": "sluice", "compression": None,
                        "pauses": int(metric(api, "sluice_component_pauses_total") or 0)})
            return row
        finally:
            node.terminate(30)
            node.close()


def median_ratio(rows, num, den, key):
    """Per-round ratios of the rows matching `num` and `den` (dicts of field -> value), by `key`."""
    per = []
    for rep in sorted({r["rep"] for r in rows if r["rep"] is not None}):
        a = [r for r in rows if r["rep"] == rep and all(r.get(k) == v for k, v in num.items())]
        b = [r for r in rows if r["rep"] == rep and all(r.get(k) == v for k, v in den.items())]
        if a and b:
            per.append(a[0][key] / b[0][key])
    return (statistics.median(per) if per else None), per


def fmt(v, spec=",.0f"):
    return "-" if v is None else format(v, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sluice", help="the sluice binary (default: $CARGO_TARGET_DIR or target, release/sluice)")
    ap.add_argument("--build", action="store_true", help="cargo build --release -p sluice first")
    ap.add_argument("--quick", action="store_true", help="a short run: 2 rounds, 300,000 records per output "
                                                         "run, 200,000 per input run")
    ap.add_argument("--only", nargs="*", choices=["output", "input"], help="what to measure (default: both)")
    ap.add_argument("--repeat", type=int, help="rounds (5; --quick: 2)")
    ap.add_argument("--records", type=int, help="records per output run (2,000,000; --quick: 300,000)")
    ap.add_argument("--input-records", type=int, help="records per input run (500,000; --quick: 200,000)")
    ap.add_argument("--warmup-records", type=int, help="records of the output's warm-up runs (default: a quarter; "
                                                       "the input's: a quarter of --input-records)")
    ap.add_argument("--record-bytes", type=int, default=250, help="bytes per record")
    ap.add_argument("--compression", nargs="*", default=["none", "zstd"],
                    choices=["none", "gzip", "snappy", "lz4", "zstd"], help="the output's compressions")
    ap.add_argument("--source", choices=["generator", "tcp"], default="generator",
                    help="sluice's source for the output runs")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=1000, help="the pipeline's batch.size")
    ap.add_argument("--tuned-batch-size", type=int, default=0,
                    help="also measure the output with this pipeline batch.size (`tuned` rows)")
    ap.add_argument("--tuned-output-option", type=parse_option, action="append", default=[], metavar="KEY=VALUE",
                    help="also measure the output with this key set (`tuned` rows), e.g. linger=1ms")
    ap.add_argument("--output-option", type=parse_option, action="append", default=[], metavar="KEY=VALUE",
                    help="a key of the kafka output (`linger=20ms`, "
                         "`librdkafka_options.queue.buffering.max.kbytes=...`)")
    ap.add_argument("--input-option", type=parse_option, action="append", default=[], metavar="KEY=VALUE",
                    help="a key of the kafka input (`librdkafka_options.fetch.min.bytes=...`, `offset_field=null`)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds one run may take")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (broker log, sluice logs)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON too")
    args = ap.parse_args()
    defaults = ({"repeat": 2, "records": 300_000, "input_records": 200_000} if args.quick else
                {"repeat": 5, "records": 2_000_000, "input_records": 500_000})
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.warmup_records is None:
        args.warmup_records = max(50_000, args.records // 4)
    only = args.only or ["output", "input"]
    tuned = ", ".join(([f"batch.size {args.tuned_batch_size}"] if args.tuned_batch_size else [])
                      + [f"{k} {v}" for k, v in args.tuned_output_option])
    on_signals_exit()
    if args.build:
        build_release()
    binary = sluice_binary(args.sluice)
    if shutil.which("java") is None:
        die("`java` (17) is needed and not on PATH")

    r = subprocess.run([KAFKA_RUN, "fetch-tools"], capture_output=True, text=True)
    if r.returncode != 0:
        die("servers/kafka/run fetch-tools failed:\n" + r.stderr[-3000:])
    tools_cp = r.stdout.strip().splitlines()[-1]

    tmp = tempfile.mkdtemp(prefix="sluice-kafka-")
    broker = Broker(os.path.join(tmp, "broker"))
    rows = []
    try:
        lines = log_lines(10_000, args.record_bytes)
        lines_file = os.path.join(tmp, "lines.txt")
        with open(lines_file, "w") as f:
            f.write("\n".join(lines) + "\n")
        block = ("\n".join(lines) + "\n").encode()
        broker.start()
        bench = Bench(args, binary, tmp, broker, tools_cp, lines_file, block)
        print(f"{binary}; {os.cpu_count()} CPUs; Kafka 4.3.1 at {broker.address}; {args.record_bytes}-byte records, "
              f"{PARTITIONS} partitions; source {args.source}; {args.repeat} rounds; load average {load_average()}",
              flush=True)

        def show(row, label):
            extra = ""
            if row.get("sluice_cpu_s_per_m") is not None:
                extra += f", sluice {row['sluice_cpu_s_per_m']:.2f} CPU s/M ({row['sluice_cores']:.2f} cores)"
            if row.get("broker_cpu_s_per_m") is not None:
                extra += f", broker {row['broker_cpu_s_per_m']:.2f} CPU s/M"
            if row.get("disk_bytes_per_record") is not None:
                extra += f", {row['disk_bytes_per_record']:.0f} B/record on disk"
            if row.get("pauses") is not None:
                extra += f", {row['pauses']} pauses"
            if row.get("with_join_per_s") is not None:
                extra += f", {row['with_join_per_s']:,.0f}/s with the group join ({row['rebalance_ms']:.0f} ms)"
            print(f"  {label:<48} {row['events_per_s']:>11,.0f} records/s{extra}, load {row['load']}", flush=True)

        def keep(row, rep, label):
            row["rep"] = rep
            rows.append(row)
            show(row, label)

        if "output" in only:
            w = args.warmup_records
            keep(bench.sluice_out("none", w), None, "warm-up sluice -> kafka none")
            keep(bench.producer_perf("none", w), None, "warm-up ProducerPerformance none")
            for rep in range(args.repeat):
                plan = [("source", None)]
                for c in args.compression:
                    plan += [("sluice", c), ("producer-perf", c)]
                    if tuned:
                        plan.append(("sluice-tuned", c))
                if rep % 2:
                    plan.reverse()
                for side, c in plan:
                    if side == "source":
                        row = bench.sluice_out(None, args.records, blackhole=True)
                        keep(row, rep, f"round {rep + 1} {args.source} -> blackhole")
                    elif side == "sluice":
                        keep(bench.sluice_out(c, args.records), rep, f"round {rep + 1} sluice -> kafka {c}")
                    elif side == "sluice-tuned":
                        row = bench.sluice_out(c, args.records, tuned=True)
                        row["side"] = "sluice-tuned"
                        keep(row, rep, f"round {rep + 1} sluice -> kafka {c}, {tuned}")
                    else:
                        keep(bench.producer_perf(c, args.records), rep, f"round {rep + 1} ProducerPerformance {c}")
        if "input" in only:
            topic = "input"
            broker.create_topic(topic)
            t0 = time.monotonic()
            bench.fill(topic, args.input_records)
            print(f"  filled {topic} with {args.input_records:,} records in {time.monotonic() - t0:.1f} s "
                  f"({broker.topic_bytes(topic) / args.input_records:.0f} bytes per record on disk)", flush=True)
            w = max(10_000, args.input_records // 4)
            keep(bench.sluice_in(topic, w), None, "warm-up sluice <- kafka")
            keep(bench.consumer_perf(topic, w), None, "warm-up ConsumerPerformance")
            for rep in range(args.repeat):
                plan = ["sluice-in", "consumer-perf"]
                if rep % 2:
                    plan.reverse()
                for side in plan:
                    if side == "sluice-in":
                        row = bench.sluice_in(topic, args.input_records)
                        row["side"] = "sluice-in"
                        keep(row, rep, f"round {rep + 1} sluice <- kafka")
                    else:
                        row = bench.consumer_perf(topic, args.input_records)
                        keep(row, rep, f"round {rep + 1} ConsumerPerformance")
    finally:
        stop_all()
        broker.stop()
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    # ---- the tables ----
    print()
    print(f"load average at the end: {load_average()}")
    counted = [r for r in rows if r["rep"] is not None]
    print(f"{'side':<40} {'median records/s':>16}  {'sluice CPU s/M':>14}  {'broker CPU s/M':>14}  "
          f"{'B/record on disk':>16}   rounds")
    groups = []
    if "output" in only:
        groups.append(("source", None, f"{args.source} -> blackhole"))
        for c in args.compression:
            groups += [("sluice", c, f"sluice -> kafka {c}"), ("producer-perf", c, f"ProducerPerformance {c}")]
            if tuned:
                groups.append(("sluice-tuned", c, f"  same, {tuned}"))
    if "input" in only:
        groups += [("sluice-in", None, "sluice <- kafka"), ("consumer-perf", None, "ConsumerPerformance")]
    for side, c, label in groups:
        rs = [r for r in counted if r["side"] == side and r.get("compression") == c]
        if not rs:
            continue
        med = lambda k: statistics.median(v for v in (r.get(k) for r in rs) if v is not None) \
            if any(r.get(k) is not None for r in rs) else None
        print(f"{label:<40} {med('events_per_s'):>16,.0f}  {fmt(med('sluice_cpu_s_per_m'), '.2f'):>14}  "
              f"{fmt(med('broker_cpu_s_per_m'), '.2f'):>14}  {fmt(med('disk_bytes_per_record'), '.0f'):>16}   "
              + ", ".join(f"{r['events_per_s']:,.0f}" for r in rs))
    if "output" in only:
        for c in args.compression:
            med, per = median_ratio(counted, {"side": "sluice", "compression": c},
                                    {"side": "producer-perf", "compression": c}, "events_per_s")
            if med is not None:
                print(f"output, {c}: sluice / ProducerPerformance {med:.3f} (goal >= 1.0: "
                      f"{'met' if med >= 1.0 else 'MISSED'}); rounds " + ", ".join(f"{v:.3f}" for v in per))
            med, per = median_ratio(counted, {"side": "sluice-tuned", "compression": c},
                                    {"side": "producer-perf", "compression": c}, "events_per_s")
            if med is not None:
                print(f"output, {c}, tuned ({tuned}): sluice / ProducerPerformance "
                      f"{med:.3f}; rounds " + ", ".join(f"{v:.3f}" for v in per))
        for c in args.compression:
            med, _ = median_ratio(counted, {"side": "source"}, {"side": "sluice", "compression": c}, "events_per_s")
            if med is not None:
                print(f"source / sluice -> kafka {c}: {med:.2f} (well above 1: the source is not what limits it)")
    if "input" in only:
        med, per = median_ratio(counted, {"side": "sluice-in"}, {"side": "consumer-perf"}, "events_per_s")
        if med is not None:
            print(f"input: sluice / ConsumerPerformance (fetch.nMsg.sec) {med:.3f} (goal >= 1.0: "
                  f"{'met' if med >= 1.0 else 'MISSED'}); rounds " + ", ".join(f"{v:.3f}" for v in per))
            pauses = [r["pauses"] for r in counted if r.get("pauses") is not None]
            if pauses:
                print(f"  the kafka input paused its partitions {statistics.median(pauses):.0f} times per run "
                      f"(median; each pause drops what librdkafka had fetched ahead)")
    if args.json:
        print(json.dumps({"rows": rows, "load_average": load_average()}, indent=1))


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        stop_all()
        die(str(e), 1)
