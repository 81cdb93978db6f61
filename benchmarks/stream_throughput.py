"""Stream worker throughput and event-to-action latency, side by side with a raw aiokafka pipe.

Run on demand (not part of the test suite); it starts its own local broker and stops it at the end:

    python benchmarks/stream_throughput.py [--quick] [--events 200000 --services 1000] [--shares 0.15 0.3 0.5 0.7]

One broker, one run:

1. **Throughput.** ``W`` warm-up ticks per service (``W`` = the model's predictor window) and then
   ``--events`` measured usage events (tick-major, keyed by service) go to ``<prefix>.usage`` before
   anything consumes them. Then, one after the other, three consumers drain that backlog: a raw
   aiokafka pipe (consume; per event send one message of an Action's size to an actions topic and one
   of a TransitionRecord's size to a replay topic; commit; compute nothing), the picrl worker with
   ``exactly_once`` and the picrl worker with ``at_least_once`` (``python -m picrl worker`` as a
   subprocess, each with its own app id). An event counts as processed once its offset is committed
   by the consumer group (with ``exactly_once`` that is the commit of the transaction holding its
   outputs; otherwise offsets are committed after the outputs are acknowledged). Measured window:
   from the moment every partition's committed offset has passed its warm-up events to the moment
   all events are committed; throughput = events committed in the window / its length. So every
   measured event is past its service's warm-up (full PIC-RL decision: one action and one transition).
2. **Latency.** For each ``--shares`` value (an offered load as a share of the raw pipe's events/s measured in
   step 1, since hosts differ by 3x; or each ``--rates`` value in events/s), a fresh worker
   (``--latency-guarantee``) on a fresh prefix: ``W`` warm-up ticks per service are produced and drained
   unmeasured, then events are offered at the fixed rate for ``--lead-in`` and then ``--duration`` seconds with
   ``UsageEvent.produced_at`` stamped at send. Per control action: ``decided_at - source_produced_at``
   (the worker's clock; same machine) and the time it became visible to a ``read_committed`` consumer
   minus ``produced_at``; the row's percentiles are those of the ``--duration`` part, at the offered rate,
   and ``lead_in`` holds the lead-in's: its first half second still pays for the warm-up backlog just
   decided (the broker writes the transaction markers of those large transactions late, and the next
   transactions wait for them: ``ConcurrentTransactions``), as any catch-up after a restart or take-over does.
3. **The peer.** At each offered load, right after the worker, the worker's Faust app with its decision stage taken
   out: the same topics, partitions, guarantee (``exactly_once``), batches, record batches and commits
   (benchmarks/faust_peer.py: it reads each usage event and writes an action-sized and a transition-sized record in
   the source partition's transaction, and decides nothing and keeps no state) on the same workload, measured the
   same way (``--no-peer`` skips it). Each row says whether the consumer fell behind (``backlog``: more than
   ``BACKLOG_SECONDS`` of the offered events not committed when the offer ended) and what the broker appended
   meanwhile, read from its log segments: transactions (commit markers on the actions topic, which every transaction
   writes) and record batches (one per partition a produce request carries) per event offered; ``worker_to_peer``
   gives the worker's numbers as multiples of the peer's.

Prints tables (the last: the worker against the peer) and writes ``stream_throughput.json`` (machine, command line,
settings, rows) and ``stream_throughput.png`` (events/s per consumer; latency percentiles against the offered load).
``--py-spy DIR`` attaches ``py-spy record`` (raw collapsed stacks) to each throughput worker during
its measured window, and to each latency worker while its load is offered. ``--workers N`` (default 2) adds
a row of N workers of one app id deciding the same workload (see :func:`scale_out`). Every row records the
host's steal and the CPU share that other processes of the machine took (``other_cpu_share``); a latency row also
records the cores that the worker, the broker and this process (the paced producer, the action watcher) took while
the load was offered, since all three share the host.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from glob import escape as glob_escape
from pathlib import Path
from typing import Any

import aiokafka
import faust
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import orjson
import torch
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.partitioner import murmur2
from host import describe, steal_seconds
from tqdm import tqdm

from picrl.datasets import load_dataset
from picrl.kafka import LocalKafka
from picrl.workloads import copies_of
from picrl_core.artifact import load_artifact
from picrl_core.simulator import censor
from producers.workload import Workload
from stream.decisions import DecisionEngine, Incoming
from stream.records import UsageEvent, decode_action
from stream.topics import TopicNames, committed_offsets, end_offsets, ensure_topics, topic_specs
from stream.worker import WorkerSettings

REPO = Path(__file__).resolve().parents[1]
POLL_SECONDS = 0.05  # committed-offset polling period (the resolution of the measured window's ends)
MIN_WINDOW = 1.0  # seconds: a shorter measured window is refused (too few events for the poll resolution)
STALL_SECONDS = 60.0  # a consumer group that commits nothing for this long has stalled: stop and say where
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
BATCH_HEADER = 61  # bytes of a Kafka record batch's header (magic 2)
BACKLOG_SECONDS = 1.0  # a consumer more than this many seconds of the offered load behind when the offer ends
Message = tuple[bytes, bytes]  # (key, value)


# ---------------------------------------------------------------- workload


def usage_messages(workload: Workload, capacity: np.ndarray, ticks: range, stamp: bool = False) -> list[Message]:
    """Usage events of ``ticks`` for every service, tick-major; each service runs on a static
    ``capacity`` and reports ``(min(d, a), 1[d > a])`` (``picrl_core.simulator.censor``).
    ``produced_at`` is the encoding time when ``stamp``, else 0."""
    messages = []
    for t in ticks:
        usage, censored = censor(workload.demand[t], capacity)
        for j, service in enumerate(workload.services):
            context = (
                None if workload.context is None else dict(zip(workload.context_names, workload.context[t, j].tolist()))
            )
            event = UsageEvent(
                service,
                t,
                float(usage[j]),
                bool(censored[j]),
                float(capacity[j]),
                context,
                time.time() if stamp else 0.0,
            )
            messages.append((service.encode(), event.to_bytes()))
    return messages


def output_sizes(engine: DecisionEngine, workload: Workload, capacity: np.ndarray) -> tuple[int, int]:
    """Bytes of a real control Action and TransitionRecord of the first service (W + 2 ticks through the engine)."""
    one = Workload(
        workload.services[:1],
        workload.demand[:, :1],
        None if workload.context is None else workload.context[:, :1],
        workload.context_names,
        workload.unit,
    )
    batch = [
        Incoming(UsageEvent.from_dict(orjson.loads(value)), 0, offset)
        for offset, (_, value) in enumerate(usage_messages(one, capacity[:1], range(engine.window + 2)))
    ]
    outcome = engine.process(batch, {})
    return len(outcome.actions[-1].to_bytes()), len(outcome.transitions[-1].to_bytes())


async def produce(bootstrap: str, topic: str, messages: list[Message], desc: str) -> None:
    """Send ``messages`` as fast as the producer goes (batched, delivery awaited every 5,000)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=10, max_batch_size=1 << 18)
    await producer.start()
    try:
        with tqdm(total=len(messages), desc=desc, unit="ev", dynamic_ncols=True, leave=False) as bar:
            for lo in range(0, len(messages), 5_000):
                chunk = messages[lo : lo + 5_000]
                await asyncio.gather(*[await producer.send(topic, value, key=key) for key, value in chunk])
                bar.update(len(chunk))
    finally:
        await producer.stop()


# ---------------------------------------------------------------- progress of a consumer group


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads), from /proc."""
    fields_ = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields_[11]) + int(fields_[12])) / CLOCK_TICKS


def busy_seconds() -> float:
    """CPU seconds every process of the machine used since boot (user, nice, system, irq, softirq), from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:8]]
    return (values[0] + values[1] + values[2] + values[5] + values[6]) / CLOCK_TICKS


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def log_batches(data: Path, topic: str, since: float, until: float) -> tuple[int, int]:
    """(data, control) record batches that the broker appended to ``topic`` (every partition, read from its log
    segments in ``data``) with a timestamp from ``since`` to ``until`` (seconds since the epoch). A produce request
    appends one data batch to each partition it carries; a transaction's end appends one control batch (its commit
    or abort marker) to each partition it wrote, so control batches on a topic that every transaction writes count
    the transactions."""
    counts = [0, 0]
    for segment in data.glob(f"{glob_escape(topic)}-*/*.log"):
        if not segment.parent.name[len(topic) + 1 :].isdigit():
            continue
        raw = segment.read_bytes()
        at = 0
        while at + BATCH_HEADER <= len(raw):  # baseOffset, length, epoch, magic, crc, attributes, delta, timestamps
            length = int.from_bytes(raw[at + 8 : at + 12], "big")
            attributes = int.from_bytes(raw[at + 21 : at + 23], "big")
            stamp = int.from_bytes(raw[at + 35 : at + 43], "big") / 1e3  # maxTimestamp (ms)
            if since <= stamp <= until:
                counts[bool(attributes & 0x20)] += 1  # bit 5: a control batch
            at += 12 + length
    return counts[0], counts[1]


@dataclass
class Window:
    """The measured window of one drain: committed events, wall-clock ends and CPU seconds within."""

    started: float = 0.0  # perf_counter
    ended: float = 0.0
    wall: tuple[float, float] = (0.0, 0.0)  # time.time() at both ends (to match the records' timestamps)
    committed_at_start: int = 0
    total: int = 0
    cpu: dict[str, float] = field(default_factory=dict)  # process name -> CPU seconds within the window

    @property
    def events(self) -> int:
        return self.total - self.committed_at_start

    @property
    def seconds(self) -> float:
        return self.ended - self.started


async def drain(
    bootstrap: str,
    group: str,
    topic: str,
    begin: dict[int, int],
    total: dict[int, int],
    desc: str,
    timeout: float,
    alive: Callable[[], None],
    cpu: dict[str, Callable[[], float]] | None = None,
    on_start: Callable[[], None] | None = None,
) -> Window:
    """Poll ``group``'s committed offsets on ``topic`` until they reach ``total``. The window opens at
    the first poll where every partition's committed offset has reached ``begin`` (the end of the
    warm-up) and closes when everything is committed; ``cpu`` readers are sampled at both ends; ``alive`` raises
    when the consumer died."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    window = Window(total=sum(total.values()), committed_at_start=sum(begin.values()))
    cpu = cpu or {}
    cpu_start: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    progressed, last = time.monotonic(), -1
    try:
        with tqdm(total=window.total, desc=desc, unit="ev", dynamic_ncols=True, leave=False) as bar:
            while True:
                alive()
                by_partition = await committed_offsets(admin, group, topic)
                committed = sum(by_partition.values())
                now, wall = time.perf_counter(), time.time()
                if committed != last:
                    progressed, last = time.monotonic(), committed
                elif time.monotonic() - progressed > STALL_SECONDS:
                    behind = {
                        p: f"{by_partition.get(p, 0)}/{end}" for p, end in total.items() if by_partition.get(p, 0) < end
                    }
                    raise TimeoutError(
                        f"{desc}: no offset committed for {STALL_SECONDS:.0f} s; partitions behind "
                        f"(committed/end): {behind}"
                    )
                bar.update(committed - bar.n)
                if not cpu_start and all(by_partition.get(p, 0) >= offset for p, offset in begin.items()):
                    window.started, window.wall, window.committed_at_start = now, (wall, wall), committed
                    cpu_start = {name: read() for name, read in cpu.items()}
                    if on_start is not None:
                        on_start()
                if committed >= window.total:
                    window.ended, window.wall = now, (window.wall[0], wall)
                    window.cpu = {name: read() - cpu_start[name] for name, read in cpu.items()}
                    if window.events and window.seconds < MIN_WINDOW:
                        raise ValueError(
                            f"{desc}: the measured window lasted {window.seconds:.2f} s "
                            f"({window.events} events), too short to time; raise --events"
                        )
                    return window
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{desc}: {committed} of {window.total} events committed after {timeout:.0f} s")
                await asyncio.sleep(POLL_SECONDS)
    finally:
        await admin.close()


# ---------------------------------------------------------------- the two consumers


async def measure_raw_pipe(
    bootstrap: str,
    source: str,
    begin: dict[int, int],
    total: dict[int, int],
    prefix: str,
    sizes: tuple[int, int],
    batch_max: int,
    commit_interval: float,
    timeout: float,
    cpu: dict[str, Callable[[], float]] | None = None,
) -> Window:
    """Run :func:`raw_pipe` (group and output topics ``prefix``) on ``source`` from ``begin`` until its committed
    offsets reach ``total``; the window of :func:`drain`."""
    stop = asyncio.Event()
    pipe = asyncio.create_task(
        raw_pipe(bootstrap, source, begin, TopicNames(prefix), prefix, sizes, batch_max, commit_interval, stop)
    )

    def pipe_alive() -> None:
        if pipe.done():
            pipe.result()
            raise RuntimeError("the raw pipe stopped")

    try:
        return await drain(bootstrap, prefix, source, begin, total, "raw aiokafka pipe", timeout, pipe_alive, cpu)
    finally:
        stop.set()
        await asyncio.gather(pipe, return_exceptions=True)


async def raw_pipe(
    bootstrap: str,
    source: str,
    begin: dict[int, int],
    out: TopicNames,
    group: str,
    sizes: tuple[int, int],
    batch_max: int,
    commit_interval: float,
    stop: asyncio.Event,
) -> None:
    """Consume ``source`` from the ``begin`` offsets; per event send an action-sized and a
    transition-sized message to the source's partition of ``out.actions`` / ``out.replay`` (acks=all,
    as Faust's producer); commit the offsets (as ``group``) once the sends are acknowledged, every
    ``commit_interval`` seconds. Computes nothing."""
    action, transition = b"a" * sizes[0], b"t" * sizes[1]
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False, max_poll_records=batch_max
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await consumer.start()
    await producer.start()
    try:
        consumer.assign([TopicPartition(source, p) for p in begin])
        for p, offset in begin.items():
            consumer.seek(TopicPartition(source, p), offset)
        last_commit, pending = time.monotonic(), False
        while not stop.is_set():
            batches = await consumer.getmany(timeout_ms=100, max_records=batch_max)
            sends = []
            for tp, messages in batches.items():
                for m in messages:
                    sends.append(await producer.send(out.actions, action, key=m.key, partition=tp.partition))
                    sends.append(await producer.send(out.replay, transition, key=m.key, partition=tp.partition))
            await asyncio.gather(*sends)
            pending = pending or bool(sends)
            if pending and (not sends or time.monotonic() - last_commit >= commit_interval):
                await consumer.commit()
                last_commit, pending = time.monotonic(), False
    finally:
        await producer.stop()
        await consumer.stop()


class WorkerProcess:
    """``python -m picrl worker`` as users run it (or ``command``: the Faust peer), in its own folder (Faust writes
    its data dir there)."""

    def __init__(self, args: list[str], folder: Path, command: list[str] | None = None) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.log = folder / "worker.log"
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)  # this checkout's code
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen(
                [*(command or [sys.executable, "-m", "picrl", "worker"]), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=folder,
                env=env,
            )
        self.spy: subprocess.Popen | None = None

    def alive(self) -> None:
        if self.process.poll() is not None:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"the worker exited with code {self.process.returncode}:\n{tail}")

    def pids(self) -> list[int]:
        """The command's process and the worker process it forked (``respawn``, on by default on Linux)."""
        pid = self.process.pid
        children = Path(f"/proc/{pid}/task/{pid}/children")
        return [pid, *(int(c) for c in (children.read_text().split() if children.exists() else []))]

    def cpu(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.pids())

    def start_py_spy(self, output: Path) -> None:
        """Sample the worker's Python stacks (100 Hz) into ``output`` until :meth:`stop_py_spy`."""
        search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        self.spy = subprocess.Popen(
            [
                str(shutil.which("py-spy", path=search)),
                "record",
                "--pid",
                str(self.process.pid),
                "--subprocesses",  # the worker process the command forks (respawn)
                "--rate",
                "100",
                "--format",
                "raw",
                "--output",
                str(output),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop_py_spy(self) -> None:
        if self.spy is not None and self.spy.poll() is None:
            self.spy.send_signal(signal.SIGINT)
            self.spy.wait(60)

    def stop(self) -> float:
        """Stop the worker (SIGTERM, SIGKILL after 30 s); its peak RSS in MiB."""
        self.stop_py_spy()
        peak = float("nan")
        if self.process.poll() is None:
            peak = max(peak_rss_mib(pid) for pid in self.pids())
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return peak


# ---------------------------------------------------------------- the benchmark


@dataclass
class Setup:
    """What every phase shares: the broker, the model, the workload and the settings."""

    args: argparse.Namespace
    bootstrap: str
    broker_pid: int
    folder: Path
    model: Path
    engine: DecisionEngine

    def worker_args(self, prefix: str, app_id: str, guarantee: str) -> list[str]:
        a = self.args
        return [
            "--model",
            str(self.model),
            "--bootstrap",
            self.bootstrap,
            "--prefix",
            prefix,
            "--partitions",
            str(a.partitions),
            "--app-id",
            app_id,
            "--guarantee",
            guarantee,
            "--batch-max",
            str(a.batch_max),
            "--batch-within",
            str(a.batch_within),
            "--commit-interval",
            str(a.commit_interval),
            "--log-level",
            "warning",
            "--web-port",  # no web server: workers of other sessions on this host may hold the ports it would try
            "0",
        ]

    def peer_args(self, prefix: str, app_id: str, sizes: tuple[int, int]) -> list[str]:
        """benchmarks/faust_peer.py's arguments: the worker's topics, partitions, batches and commits."""
        a = self.args
        return [
            *("--model", str(self.model), "--bootstrap", self.bootstrap, "--prefix", prefix, "--app-id", app_id),
            *("--partitions", str(a.partitions), "--batch-max", str(a.batch_max)),
            *("--batch-within", str(a.batch_within), "--commit-interval", str(a.commit_interval)),
            *("--action-bytes", str(sizes[0]), "--transition-bytes", str(sizes[1])),
        ]

    def workload(self, services: int, ticks: int) -> tuple[Workload, np.ndarray]:
        workload = copies_of(load_dataset(self.args.dataset), services, ticks, seed=0)
        return workload, workload.demand.max(axis=0) * self.args.capacity_headroom


def row(name: str, window: Window, main: str) -> dict[str, float | str | int]:
    return {
        "consumer": name,
        "events": window.events,
        "seconds": window.seconds,
        "events_per_second": window.events / window.seconds,
        "cpu_us_per_event": 1e6 * window.cpu[main] / window.events,
        "broker_cpu_us_per_event": 1e6 * window.cpu["broker"] / window.events,
        "cpu_steal_share": window.cpu["steal"] / (window.seconds * (os.cpu_count() or 1)),
        # the CPU that processes other than the benchmark's (this one, the consumers, the broker) took: the host
        # is shared, and on 2 cores another session's work slows every row down
        "other_cpu_share": max(
            0.0,
            window.cpu["busy"]
            - sum(v for k, v in window.cpu.items() if k not in ("busy", "steal", "pipe", "bench"))
            - window.cpu["bench"],
        )
        / (window.seconds * (os.cpu_count() or 1)),
    }


async def decision_batches(bootstrap: str, topic: str, partitions: int) -> list[float]:
    """``decided_at`` of every committed action of ``topic`` (the actions of one decision batch share it)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        max_poll_records=10_000,
    )
    await consumer.start()
    decided: list[float] = []
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        empty = 0
        while empty < 3:
            batch = await consumer.getmany(timeout_ms=300)
            empty = 0 if batch else empty + 1
            decided += [orjson.loads(m.value)["decided_at"] for messages in batch.values() for m in messages]
    finally:
        await consumer.stop()
    return decided


def events_per_batch(decided: np.ndarray, wall: tuple[float, float]) -> float:
    inside = decided[(decided >= wall[0] - 1.0) & (decided <= wall[1])]  # the window opens after a first commit
    return float(inside.size / max(1, np.unique(inside).size))


async def throughput(setup: Setup, bar: tqdm) -> list[dict]:
    a, w = setup.args, setup.engine.window
    prefix = "bench"
    names = TopicNames(prefix)
    await ensure_topics(setup.bootstrap, topic_specs(prefix, a.partitions) + topic_specs(f"{prefix}-raw", a.partitions))
    ticks = w + a.events // a.services
    workload, capacity = setup.workload(a.services, ticks)
    sizes = output_sizes(setup.engine, workload, capacity)
    app_ids = {g: f"{prefix}-{g.replace('_', '-')}" for g in a.guarantees}
    await produce(setup.bootstrap, names.usage, usage_messages(workload, capacity, range(w)), "produce warm-up")
    warm = await end_offsets(setup.bootstrap, names.usage, a.partitions)
    await produce(setup.bootstrap, names.usage, usage_messages(workload, capacity, range(w, ticks)), "produce events")
    total = await end_offsets(setup.bootstrap, names.usage, a.partitions)
    broker = {
        "broker": lambda: cpu_seconds(setup.broker_pid),
        "steal": steal_seconds,
        "busy": busy_seconds,
        "bench": time.process_time,
    }
    bar.update(1)

    window = await measure_raw_pipe(
        setup.bootstrap,
        names.usage,
        warm,
        total,
        f"{prefix}-raw",
        sizes,
        a.batch_max,
        a.commit_interval,
        a.timeout,
        {"pipe": time.process_time, **broker},  # pipe = bench: one process
    )
    rows = [{**row("raw aiokafka pipe", window, "pipe"), "action_bytes": sizes[0], "transition_bytes": sizes[1]}]
    bar.update(1)
    windows = {}
    for guarantee, app_id in app_ids.items():
        worker = WorkerProcess(setup.worker_args(prefix, app_id, guarantee), setup.folder / app_id)
        spy = None if a.py_spy is None else functools.partial(worker.start_py_spy, a.py_spy / f"worker-{guarantee}.txt")
        try:
            windows[guarantee] = window = await drain(
                setup.bootstrap,
                app_id,
                names.usage,
                warm,
                total,
                f"worker {guarantee}",
                a.timeout,
                worker.alive,
                {"worker": worker.cpu, **broker},
                spy,
            )
        finally:
            peak = worker.stop()
        rows.append({**row(f"picrl worker ({guarantee})", window, "worker"), "worker_peak_rss_mib": peak})
        bar.update(1)
    decided = np.array(await decision_batches(setup.bootstrap, names.actions, a.partitions))
    dead = await end_offsets(setup.bootstrap, names.deadletter, a.partitions)
    for r, guarantee in zip(rows[1:], app_ids):
        r["events_per_decision_batch"] = events_per_batch(decided, windows[guarantee].wall)
        r["dead_letters"] = sum(dead.values())
    if a.workers > 1:
        for guarantee in a.guarantees[:1]:
            rows.append(await scale_out(setup, guarantee, workload, capacity, ticks))
            bar.update(1)
    for r in rows:
        r["ratio_to_raw_pipe"] = r["events_per_second"] / rows[0]["events_per_second"]
    return rows


async def group_members(bootstrap: str, group: str) -> tuple[str, int]:
    """(state, number of members) of a consumer group."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        description = (await admin.describe_consumer_groups([group]))[0].groups[0]
    finally:
        await admin.close()
    return description[2], len(description[5])


async def scale_out(setup: Setup, guarantee: str, workload: Workload, capacity: np.ndarray, ticks: int) -> dict:
    """``--workers`` workers of one app id on fresh topics with the same workload: once the group is stable with
    every worker in it, the warm-up ticks are produced and decided, and then the measured ticks are produced at
    once; the window runs from the first poll after that to the last commit, production included (~1 s of it;
    the backlog is not there before the window as in the one-worker rows). The warm-up waits for the group: a
    worker that joined after another had decided it would take its partitions over, restoring their rows from
    the changelog, inside the window (a ~10 s stall in half of the runs, before the warm-up waited)."""
    a, w = setup.args, setup.engine.window
    prefix = f"scale{a.workers}"
    names = TopicNames(prefix)
    app_id = f"{prefix}-{guarantee.replace('_', '-')}"
    await ensure_topics(setup.bootstrap, topic_specs(prefix, a.partitions))
    workers = [
        WorkerProcess(setup.worker_args(prefix, app_id, guarantee), setup.folder / f"{app_id}-{i}")
        for i in range(a.workers)
    ]

    def alive() -> None:
        for worker in workers:
            worker.alive()

    try:
        deadline = time.monotonic() + a.timeout
        while await group_members(setup.bootstrap, app_id) != ("Stable", a.workers):
            alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"{app_id}: the group did not settle with {a.workers} members")
            await asyncio.sleep(0.5)
        await produce(setup.bootstrap, names.usage, usage_messages(workload, capacity, range(w)), "produce warm-up")
        warm = await end_offsets(setup.bootstrap, names.usage, a.partitions)
        await drain(setup.bootstrap, app_id, names.usage, warm, warm, "scale-out warm-up", a.timeout, alive)
        await asyncio.sleep(2.0)  # the group stays as it is (a late rebalance would show in the window)
        if await group_members(setup.bootstrap, app_id) != ("Stable", a.workers):
            raise RuntimeError(f"{app_id}: the group changed after its warm-up")
        cpu = {f"worker{i}": worker.cpu for i, worker in enumerate(workers)}
        producing = asyncio.create_task(
            produce(setup.bootstrap, names.usage, usage_messages(workload, capacity, range(w, ticks)), "produce events")
        )
        total = {p: warm[p] + n for p, n in (await expected_counts(workload, a.partitions, ticks - w)).items()}
        window = await drain(
            setup.bootstrap,
            app_id,
            names.usage,
            warm,
            total,
            f"{a.workers} workers {guarantee}",
            a.timeout,
            alive,
            {
                **cpu,
                "broker": lambda: cpu_seconds(setup.broker_pid),
                "steal": steal_seconds,
                "busy": busy_seconds,
                "bench": time.process_time,
            },
        )
        await producing
    finally:
        peaks = [worker.stop() for worker in workers]
    window.cpu["workers"] = sum(window.cpu.pop(f"worker{i}") for i in range(a.workers))
    return {
        **row(f"{a.workers} picrl workers ({guarantee})", window, "workers"),
        "workers": a.workers,
        "worker_peak_rss_mib": max(peaks),
    }


async def group_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The offsets ``group`` committed on ``topic``, by partition."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return await committed_offsets(admin, group, topic)
    finally:
        await admin.close()


async def expected_counts(workload: Workload, partitions: int, ticks: int) -> dict[int, int]:
    """Usage events per partition of ``ticks`` ticks of every service (Kafka's default partitioner on the key)."""
    counts = dict.fromkeys(range(partitions), 0)
    for service in workload.services:
        counts[(murmur2(service.encode()) & 0x7FFFFFFF) % partitions] += ticks
    return counts


async def paced(
    bootstrap: str, topic: str, workload: Workload, capacity: np.ndarray, ticks: range, rate: float
) -> tuple[int, float]:
    """Offer ``ticks`` of every service at ``rate`` events/s, ``produced_at`` stamped at send; (sent, seconds)."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
    await producer.start()
    sent, futures = 0, []
    started = time.monotonic()
    try:
        with tqdm(
            total=len(ticks) * len(workload.services),
            desc=f"offer {rate:g} ev/s",
            unit="ev",
            dynamic_ncols=True,
            leave=False,
        ) as bar:
            for t in ticks:
                usage, censored = censor(workload.demand[t], capacity)
                for j, service in enumerate(workload.services):
                    ahead = sent / rate - (time.monotonic() - started)
                    if ahead > 0.001:
                        await asyncio.sleep(ahead)
                    context = (
                        None
                        if workload.context is None
                        else dict(zip(workload.context_names, workload.context[t, j].tolist()))
                    )
                    event = UsageEvent(
                        service, t, float(usage[j]), bool(censored[j]), float(capacity[j]), context, time.time()
                    )
                    futures.append(await producer.send(topic, event.to_bytes(), key=service.encode()))
                    sent += 1
                bar.update(len(workload.services))
        seconds = time.monotonic() - started
        await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return sent, seconds


async def watch_actions(
    bootstrap: str,
    topic: str,
    partitions: int,
    seen: list[tuple[float, bytes]],
    ready: asyncio.Event,
    stop: asyncio.Event,
) -> None:
    """Record (arrival time, value) of every action committed from now on (read_committed)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level="read_committed")
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        for tp in tps:
            await consumer.position(tp)
        ready.set()
        while not stop.is_set():
            for messages in (await consumer.getmany(timeout_ms=50)).values():
                now = time.time()
                seen.extend((now, m.value) for m in messages)
    finally:
        await consumer.stop()


def percentiles(values: np.ndarray) -> dict[str, float]:
    if not len(values):
        raise RuntimeError("no action was seen in time: see the worker's log")
    return {f"p{q}_ms": float(np.percentile(values, q) * 1e3) for q in (50, 90, 99)} | {
        "max_ms": float(values.max() * 1e3),
        "mean_ms": float(values.mean() * 1e3),
    }


@dataclass(frozen=True)
class PeerRecord:
    """What the latency part reads of an action record: the Faust peer's carries only these fields."""

    tick: int
    decided_at: float
    source_produced_at: float
    phase: str = "control"


def decode_peer_record(value: bytes) -> PeerRecord:
    record = orjson.loads(value)
    return PeerRecord(record["tick"], record["decided_at"], record["source_produced_at"])


async def latency(setup: Setup, rate: float, peer: bool = False) -> dict:
    """One offered load on a fresh worker, or (``peer``) on a fresh Faust peer that decides nothing, with its settings
    (benchmarks/faust_peer.py) on the same workload."""
    a, w = setup.args, setup.engine.window
    prefix = f"{'peer' if peer else 'lat'}{int(rate)}"
    app_id = f"{prefix}-worker"
    names = TopicNames(prefix)
    await ensure_topics(setup.bootstrap, topic_specs(prefix, a.partitions))
    lead = math.ceil(rate * a.lead_in / a.latency_services)  # lead-in ticks, offered at the rate, not measured
    ticks = w + lead + max(1, round(rate * a.duration / a.latency_services))
    workload, capacity = setup.workload(a.latency_services, ticks)
    await produce(setup.bootstrap, names.usage, usage_messages(workload, capacity, range(w)), "produce warm-up")
    warm = await end_offsets(setup.bootstrap, names.usage, a.partitions)
    if peer:
        sizes = output_sizes(setup.engine, workload, capacity)
        worker = WorkerProcess(
            setup.peer_args(prefix, app_id, sizes),
            setup.folder / app_id,
            [sys.executable, str(REPO / "benchmarks" / "faust_peer.py")],
        )
    else:
        worker = WorkerProcess(setup.worker_args(prefix, app_id, a.latency_guarantee), setup.folder / app_id)
    seen: list[tuple[float, bytes]] = []
    ready, stop = asyncio.Event(), asyncio.Event()
    watcher: asyncio.Task | None = None
    try:
        await drain(
            setup.bootstrap,
            app_id,
            names.usage,
            warm,
            warm,
            f"warm-up {rate:g} ev/s{' (peer)' if peer else ''}",
            a.timeout,
            worker.alive,
        )
        watcher = asyncio.create_task(watch_actions(setup.bootstrap, names.actions, a.partitions, seen, ready, stop))
        await asyncio.wait([watcher, asyncio.create_task(ready.wait())], return_when=asyncio.FIRST_COMPLETED)
        if watcher.done():
            watcher.result()
        if a.py_spy is not None:
            worker.start_py_spy(a.py_spy / f"{'peer' if peer else 'worker'}-latency-{rate:g}.txt")
        cpu_before, steal_before, offered_from = worker.cpu(), steal_seconds(), time.monotonic()
        busy_before, bench_before, broker_before = busy_seconds(), time.process_time(), cpu_seconds(setup.broker_pid)
        offered_at = time.time()
        sent, seconds = await paced(setup.bootstrap, names.usage, workload, capacity, range(w, ticks), rate)
        total = await end_offsets(setup.bootstrap, names.usage, a.partitions)
        behind = sum(total.values()) - sum((await group_offsets(setup.bootstrap, app_id, names.usage)).values())
        await drain(setup.bootstrap, app_id, names.usage, total, total, "drain", a.timeout, worker.alive)
        drained_at = time.time()
        cpu = worker.cpu() - cpu_before
        worker.stop_py_spy()
        elapsed_cpu = (time.monotonic() - offered_from) * (os.cpu_count() or 1)
        steal = (steal_seconds() - steal_before) / elapsed_cpu
        bench, broker = time.process_time() - bench_before, cpu_seconds(setup.broker_pid) - broker_before
        others = max(0.0, busy_seconds() - busy_before - cpu - bench - broker) / elapsed_cpu
        deadline = time.monotonic() + 30
        while len(seen) < sent and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        if watcher is not None:
            await asyncio.gather(watcher, return_exceptions=True)
        peak = worker.stop()
    decode: Callable[[bytes], Any] = decode_peer_record if peer else decode_action
    actions = [(arrived, decode(value)) for arrived, value in seen]
    control = [(arrived, x) for arrived, x in actions if x.phase == "control" and x.source_produced_at > 0]
    measured = [(arrived, x) for arrived, x in control if x.tick > w + lead]  # an action's tick is its event's + 1
    leading = [(arrived, x) for arrived, x in control if x.tick <= w + lead]

    def delays(pairs: list) -> dict[str, dict[str, float]]:
        return {
            "decided": percentiles(np.array([x.decided_at - x.source_produced_at for _, x in pairs])),
            "visible_read_committed": percentiles(np.array([arrived - x.source_produced_at for arrived, x in pairs])),
        }

    data = setup.folder / "kafka" / "node-1" / "data"
    outputs = [names.actions, names.replay] + ([] if peer else [names.deadletter, f"{app_id}-service-state-changelog"])
    appended = [log_batches(data, topic, offered_at, drained_at) for topic in outputs]
    return {
        "consumer": "Faust peer" if peer else "picrl worker",
        "offered_rate": rate,
        "achieved_rate": sent / seconds,
        "services": a.latency_services,
        "events": sent,
        "control_actions": len(measured),
        "guarantee": a.latency_guarantee,
        **delays(measured),
        "lead_in": {
            "seconds": a.lead_in,
            "ticks": lead,
            "control_actions": len(leading),
            **(delays(leading) if leading else {}),
        },
        "events_per_decision_batch": len(control) / max(1, len({x.decided_at for _, x in control})),
        # behind by more than BACKLOG_SECONDS of the offered load when the offer ended: it did not keep up
        "behind_at_offer_end": behind,
        "backlog": behind > BACKLOG_SECONDS * rate,
        # what the broker appended while the load was offered and drained (its log segments), per event offered:
        # transactions = commit markers on the actions topic (every transaction writes to it); a produce request
        # appends one record batch to each partition it carries, so the actions topic's batches count the produce
        # requests that carried actions (nearly all: a source partition's records go out together)
        "broker": {
            "transactions_per_event": appended[0][1] / sent,
            "actions_record_batches_per_event": appended[0][0] / sent,
            "record_batches_per_event": sum(d for d, _ in appended) / sent,
            "topics": {topic: {"data_batches": d, "control_batches": c} for topic, (d, c) in zip(outputs, appended)},
        },
        "worker_cpu_share": cpu / seconds,  # worker CPU seconds per offered second
        "broker_cpu_share": broker / seconds,  # the broker's, on the same host
        "benchmark_cpu_share": bench / seconds,  # this process's: the paced producer and the action watcher
        "worker_peak_rss_mib": peak,
        "cpu_steal_share": steal,
        "other_cpu_share": others,
    }


def to_peer(worker: dict, peer: dict) -> dict[str, float]:
    """The worker's numbers as multiples of the peer's at the same offered load."""
    broker = ("transactions_per_event", "actions_record_batches_per_event", "record_batches_per_event")
    return {
        "decided_p99": worker["decided"]["p99_ms"] / peer["decided"]["p99_ms"],
        "visible_p99": worker["visible_read_committed"]["p99_ms"] / peer["visible_read_committed"]["p99_ms"],
        **{key: worker["broker"][key] / peer["broker"][key] for key in broker if peer["broker"][key]},
    }


def add_workload_options(parser: argparse.ArgumentParser) -> None:
    """The options that say what the services are and the model that decides for them (shared with
    stream_scale.py): --dataset, --capacity-headroom, --model."""
    parser.add_argument("--dataset", default="genai-mem", help="trace the services are copies of (default genai-mem)")
    parser.add_argument(
        "--capacity-headroom",
        type=float,
        default=0.9,
        help="static capacity as a multiple of each service's peak (below 1: some censoring)",
    )
    parser.add_argument("--model", type=Path, help="model folder (default: train a quick genai-mem model first)")


def quick_model(folder: Path) -> Path:
    """Train ``picrl train --dataset genai-mem --quick`` into ``folder`` (a benchmark run without ``--model``)."""
    tqdm.write("training a quick genai-mem model (picrl train --quick) ...")
    subprocess.run(
        [sys.executable, "-m", "picrl", "train", "--dataset", "genai-mem", "--quick", "--out", str(folder)],
        check=True,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
    )
    return folder


async def run(args: argparse.Namespace, folder: Path) -> dict:
    broker = LocalKafka(home=folder / "kafka", log=tqdm.write)
    info = broker.start()
    try:
        model = args.model or quick_model(folder / "model")
        (node,) = info.nodes
        assert node.pid is not None, "the broker started but has no pid"
        setup = Setup(args, info.bootstrap, node.pid, folder, model, DecisionEngine(load_artifact(model)))
        steps = 2 + len(args.guarantees) + (args.workers > 1) + len(args.rates or args.shares)
        with tqdm(total=steps, desc="stream benchmark", unit="phase", dynamic_ncols=True) as bar:
            rows = await throughput(setup, bar) if args.events else []
            raw = rows[0]["events_per_second"] if rows else float("nan")
            latencies = []
            for rate in args.rates or [share * raw for share in args.shares]:
                row = {**await latency(setup, rate), "share_of_raw_pipe": rate / raw}
                if args.peer:
                    row["peer"] = await latency(setup, rate, peer=True)
                    row["worker_to_peer"] = to_peer(row, row["peer"])
                latencies.append(row)
                bar.update(1)
        return {
            "throughput": rows,
            "latency": latencies,
            "model": {"path": str(model), "window": setup.engine.window, "row_bytes": setup.engine.row_bytes},
        }
    finally:
        broker.stop()


def print_tables(result: dict) -> None:
    if result["throughput"]:
        print(
            f"\n{'consumer':<29}{'events':>8}{'seconds':>9}{'events/s':>10}{'x raw':>7}{'CPU us/ev':>10}"
            f"{'broker us/ev':>13}{'ev/batch':>9}{'steal':>7}{'others':>7}"
        )
        for r in result["throughput"]:
            print(
                f"{r['consumer']:<29}{r['events']:>8,}{r['seconds']:>9.1f}{r['events_per_second']:>10,.0f}"
                f"{r['ratio_to_raw_pipe']:>7.2f}{r['cpu_us_per_event']:>10.0f}{r['broker_cpu_us_per_event']:>13.0f}"
                f"{r.get('events_per_decision_batch', float('nan')):>9.0f}{r['cpu_steal_share']:>7.0%}"
                f"{r['other_cpu_share']:>7.0%}"
            )
    if result["latency"]:
        print(
            f"\n{'x raw':>6}{'offered/s':>10}{'achieved/s':>11}{'actions':>9}  {'decided p50/p99/max ms':<24}"
            f"{'visible p50/p99/max ms':<24}{'cores: worker broker bench':>27}{'ev/batch':>9}{'steal':>7}{'others':>7}"
            f"{'lead-in p99 ms (dec/vis)':>26}"
        )
        for r in result["latency"]:
            d, v, lead = r["decided"], r["visible_read_committed"], r["lead_in"]
            print(
                f"{r['share_of_raw_pipe']:>6.2f}{r['offered_rate']:>10,.0f}{r['achieved_rate']:>11,.0f}"
                f"{r['control_actions']:>9,}  "
                f"{d['p50_ms']:>6.1f} {d['p99_ms']:>7.1f} {d['max_ms']:>7.0f}   "
                f"{v['p50_ms']:>6.1f} {v['p99_ms']:>7.1f} {v['max_ms']:>7.0f}   {r['worker_cpu_share']:>11.2f}"
                f"{r['broker_cpu_share']:>7.2f}{r['benchmark_cpu_share']:>6.2f}"
                f"{r['events_per_decision_batch']:>9.1f}{r['cpu_steal_share']:>7.0%}{r['other_cpu_share']:>7.0%}"
                + (
                    f"{lead['decided']['p99_ms']:>15.0f} / {lead['visible_read_committed']['p99_ms']:.0f}"
                    if "decided" in lead
                    else f"{'--':>18}"
                )
            )


def print_peer_table(result: dict) -> None:
    """Per offered load: the worker against the Faust peer (decided p99, backlog, broker appends per event)."""
    rows = [r for r in result["latency"] if "peer" in r]
    if not rows:
        return
    print(
        f"\n{'x raw':>6}{'offered/s':>10}  {'decided p99 ms worker/peer':<28}{'x peer':>7}  {'backlog w/p':<12}"
        f"{'transactions/ev w/p':<22}{'x peer':>7}  {'record batches/ev w/p':<24}{'x peer':>7}"
    )
    for r in rows:
        p, ratio = r["peer"], r["worker_to_peer"]
        w_b, p_b = r["broker"], p["broker"]
        print(
            f"{r['share_of_raw_pipe']:>6.2f}{r['offered_rate']:>10,.0f}  "
            f"{r['decided']['p99_ms']:>9.1f} / {p['decided']['p99_ms']:<15.1f}{ratio['decided_p99']:>7.2f}  "
            f"{'yes' if r['backlog'] else 'no':>3} / {'yes' if p['backlog'] else 'no':<6}"
            f"{w_b['transactions_per_event']:>8.3f} / {p_b['transactions_per_event']:<11.3f}"
            f"{ratio.get('transactions_per_event', float('nan')):>7.2f}  "
            f"{w_b['record_batches_per_event']:>8.3f} / {p_b['record_batches_per_event']:<13.3f}"
            f"{ratio.get('record_batches_per_event', float('nan')):>7.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes: 20,000 events over 200 services, latency over 200 services for 10 s",
    )
    parser.add_argument(
        "--events",
        type=int,
        help="measured usage events, warm-up excluded (default 200,000; 0: skip the throughput part)",
    )
    parser.add_argument("--services", type=int, help="services of the throughput part (default 1,000)")
    parser.add_argument(
        "--shares",
        type=float,
        nargs="*",
        default=[0.15, 0.3, 0.5, 0.7],
        help="offered loads of the latency part as shares of the raw pipe's events/s measured in the same run "
        "(default 0.15 0.3 0.5 0.7; none: skip it)",
    )
    parser.add_argument(
        "--rates",
        type=float,
        nargs="*",
        default=[],
        help="offered loads of the latency part in events/s instead of --shares (also without the throughput part)",
    )
    parser.add_argument("--duration", type=float, help="seconds per offered load (default 20)")
    parser.add_argument(
        "--lead-in",
        type=float,
        default=2.0,
        help="seconds each offered load runs before the measured --duration (default 2; reported apart)",
    )
    parser.add_argument("--latency-services", type=int, help="services of the latency part (default 1,000)")
    parser.add_argument(
        "--guarantees",
        nargs="+",
        default=["exactly_once", "at_least_once"],
        choices=("exactly_once", "at_least_once"),
        help="worker rows of the throughput part",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="a throughput row with this many workers of one app id (first guarantee; 1: none)",
    )
    parser.add_argument("--latency-guarantee", default="exactly_once", choices=("exactly_once", "at_least_once"))
    parser.add_argument(
        "--no-peer",
        dest="peer",
        action="store_false",
        help="skip the Faust peer (benchmarks/faust_peer.py) measured after the worker at each offered load",
    )
    parser.add_argument("--partitions", type=int, default=8, help="partitions of the topics (default 8)")
    parser.add_argument(
        "--batch-max",
        type=int,
        default=WorkerSettings.batch_max,
        help=f"worker --batch-max and raw pipe batch (default {WorkerSettings.batch_max}, the worker's)",
    )
    parser.add_argument(
        "--batch-within",
        type=float,
        default=WorkerSettings.batch_within,
        help=f"worker --batch-within: seconds it waits for more events before deciding (default "
        f"{WorkerSettings.batch_within:g}, the worker's)",
    )
    parser.add_argument(
        "--commit-interval",
        type=float,
        default=WorkerSettings.commit_interval,
        help=f"seconds between commits (default {WorkerSettings.commit_interval:g}, the worker's)",
    )
    add_workload_options(parser)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per drain (default 900)")
    parser.add_argument("--py-spy", type=Path, metavar="DIR", help="record each throughput worker with py-spy into DIR")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="folder for the JSON result")
    args = parser.parse_args()
    quick = args.quick
    args.events = (20_000 if quick else 200_000) if args.events is None else args.events
    args.services = args.services or (200 if quick else 1_000)
    args.duration = args.duration or (10.0 if quick else 20.0)
    args.latency_services = args.latency_services or (200 if quick else 1_000)
    if args.peer and args.latency_guarantee != "exactly_once":
        parser.error("the Faust peer runs exactly_once: give --no-peer with --latency-guarantee at_least_once")
    if args.shares and not args.rates and not args.events:
        parser.error("--shares are shares of the raw pipe's events/s: give --events > 0, or --rates")
    if args.py_spy is not None:
        search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        if shutil.which("py-spy", path=search) is None:
            parser.error("--py-spy needs the py-spy executable next to Python or on PATH (pip install -e '.[bench]')")
        args.py_spy.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    folder = Path(tempfile.mkdtemp(prefix="picrl-stream-bench-"))
    started = time.monotonic()
    try:
        result = asyncio.run(run(args, folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print_tables(result)
    print_peer_table(result)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    result = {
        "benchmark": "stream_throughput",
        "settings": settings,
        "machine": machine(load_before),
        "wall_seconds": time.monotonic() - started,
        "warmup": "W = predictor-window ticks per service are produced first and not measured; every measured "
        "event is past its service's warm-up (full PIC-RL decision)",
        **result,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "stream_throughput.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out / "stream_throughput.png")
    print(f"written {args.out / 'stream_throughput.json'}, {args.out / 'stream_throughput.png'}")


def plot(result: dict, path: Path) -> None:
    """(a) events/s of each consumer on the same backlog; (b) event-to-action latency against offered load."""
    fig, (bars, lines) = plt.subplots(1, 2, figsize=(13, 4.5))
    rows = result["throughput"]
    if rows:
        bars.bar(
            [r["consumer"].replace(" (", "\n(") for r in rows],
            [r["events_per_second"] for r in rows],
            color=["grey"] + ["tab:blue"] * (len(rows) - 1),
        )
        for i, r in enumerate(rows):
            bars.annotate(
                f"{r['events_per_second']:,.0f}/s\n{r['ratio_to_raw_pipe']:.2f}x raw",
                (i, r["events_per_second"]),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        bars.set(
            ylabel="usage events per second",
            title="(a) throughput on one broker, same backlog",
            ylim=(0, 1.2 * max(r["events_per_second"] for r in rows)),
        )
        bars.tick_params(axis="x", labelsize=8)
    latency = result["latency"]
    if latency:
        rates = [r["offered_rate"] for r in latency]
        for key, label, style in (
            ("decided", "decided (worker clock)", "-"),
            ("visible_read_committed", "visible to read_committed", "--"),
        ):
            for pct, marker in (("p50_ms", "o"), ("p99_ms", "s")):
                lines.plot(rates, [r[key][pct] for r in latency], ls=style, marker=marker, label=f"{label} {pct[:3]}")
        lines.axhline(50.0, color="tab:red", lw=1, ls=":", label="decided p99 target (50 ms)")
        lines.axhline(150.0, color="tab:purple", lw=1, ls=":", label="visible p99 target (150 ms)")
        lead_in = latency[0].get("lead_in", {}).get("seconds")
        lines.set(
            xlabel="offered load (usage events/s)",
            ylabel="event -> action latency (ms)",
            yscale="log",
            title="(b) latency against offered load" + (f" (after a {lead_in:g} s lead-in)" if lead_in else ""),
        )
        lines.legend(fontsize=8)
        lines.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine(load_before: tuple[float, float, float]) -> dict:
    return describe() | {
        "faust": faust.__version__,
        "aiokafka": aiokafka.__version__,
        "load_average_before": load_before,
    }


if __name__ == "__main__":
    main()
