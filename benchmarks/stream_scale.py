"""The stream at 100,000 services: throughput, worker memory per service and the take-over restore time.

Run on demand (not part of the test suite); it starts its own local Kafka (a temporary home, stopped at the end):

    python benchmarks/stream_scale.py [--services 100000] [--ticks 3] [--workers 1 2] [--brokers 1] [--model DIR]

A model comes from ``picrl train --dataset genai-mem --quick --out DIR`` (trained first when ``--model`` is not
given). For each ``--workers`` count, one after the other, on fresh topics and a fresh app id:

1. **Idle.** ``N`` workers (``python -m picrl worker`` at its default settings, each given a free ``--web-port``
   so that its ``/healthz`` can be read) start and join one group; once every ``/healthz`` answers 200 and the
   group is stable with ``N`` members, each worker's ``VmRSS`` (``/proc/<pid>/status``) is its idle RSS.
2. **Run.** ``--ticks`` ticks of ``--services`` services (copies of ``--dataset`` on static capacities at
   ``--capacity-headroom`` times each copy's peak; tick-major, keyed by service) are produced as fast as one
   aiokafka producer goes, while a ``read_committed`` consumer counts the actions. events/s = events / (last action
   visible - first send), production included. Then every ``(service, tick)`` must have exactly one action and
   no event a dead letter. RSS per service = (sum of the workers' ``VmRSS`` now - their idle RSS) / services.
   With the default 3 ticks every action is a warm-up action (a service's first ``W`` ticks, ``W`` the model's
   predictor window, collect its window and hold its capacity): the row and changelog write per event are a
   control decision's, the PIC-RL decision itself is not timed.
3. **Take-over.** The run's workers are SIGKILLed and one fresh worker of the same app id starts. Start-up:
   from its spawn to the first answer of its ``/healthz`` (imports, model, topic check, Faust's start);
   restore: from then to ``/healthz`` answering 200 with every service's row in its table (the group's
   assignment and the changelog read). A killed static member's partitions move only after its session timeout
   (6 s), so with ``N`` >= 2 workers killed the fresh worker (which takes the first one's slot and partitions at
   once) waits that long for the others' partitions: the one-worker row is the restore proper.

The raw aiokafka pipe of ``benchmarks/stream_throughput.py`` (consume, send an action-sized and a
transition-sized message per event, commit; compute nothing) drains the first run's usage topic afterwards as a
reference on the same broker (``--no-raw-pipe`` skips it). Prints a table and writes ``stream_scale.json``
(machine with CPU steal and ``/proc/loadavg``, command line, settings, rows) to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
import torch
from aiokafka import AIOKafkaConsumer, TopicPartition
from host import StealMeter, describe
from stream_throughput import (
    WorkerProcess,
    add_workload_options,
    busy_seconds,
    cpu_seconds,
    expected_counts,
    group_members,
    measure_raw_pipe,
    output_sizes,
    produce,
    quick_model,
    usage_messages,
)
from tqdm import tqdm

from picrl.datasets import load_dataset
from picrl.kafka import LocalKafka
from picrl.kafka.local_broker import free_port
from picrl.workloads import copies_of
from picrl_core.artifact import load_artifact
from producers.workload import Workload
from stream.decisions import DecisionEngine
from stream.topics import TopicNames, end_offsets, ensure_topics, topic_specs
from stream.worker import WorkerSettings

REPO = Path(__file__).resolve().parents[1]
POLL = 0.05  # seconds between /healthz polls (the resolution of the take-over times)
STALL_SECONDS = 120.0  # no new action for this long: the run has stalled


def vm_rss_mib(pid: int) -> float:
    """Resident memory of a process now (``VmRSS``), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().strip()


async def healthz(session: aiohttp.ClientSession, port: int) -> tuple[int, dict] | None:
    """(status, body) of a worker's ``/healthz``; None while nothing answers on ``port``."""
    try:
        async with session.get(f"http://127.0.0.1:{port}/healthz", timeout=aiohttp.ClientTimeout(total=2)) as r:
            return r.status, await r.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return None


@dataclass
class Bench:
    """What every run shares: the broker, the model, the workload and its encoded events."""

    args: argparse.Namespace
    bootstrap: str
    broker_pids: list[int]
    folder: Path
    model: Path
    workload: Workload
    messages: list[tuple[bytes, bytes]]

    def worker(self, prefix: str, app_id: str, port: int, name: str) -> WorkerProcess:
        """A worker at its default settings, but for where it finds its topics and a web port of its own."""
        args = ["--model", str(self.model), "--bootstrap", self.bootstrap, "--prefix", prefix, "--app-id", app_id]
        return WorkerProcess([*args, "--web-port", str(port)], self.folder / name)

    def broker_cpu(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.broker_pids)


async def until_ready(
    workers: list[WorkerProcess], ports: list[int], app_id: str, bootstrap: str, timeout: float
) -> None:
    """Wait until every worker's /healthz answers 200 and the group is stable with all of them."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while True:
            for w in workers:
                w.alive()
            answers = [await healthz(session, port) for port in ports]
            if all(a is not None and a[0] == 200 for a in answers):
                if await group_members(bootstrap, app_id) == ("Stable", len(workers)):
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{app_id}: workers not ready after {timeout:.0f} s: {answers}")
            await asyncio.sleep(0.5)


async def last_action(bootstrap: str, topic: str, partitions: int, expected: int, alive: Callable[[], None]) -> float:
    """Read ``topic`` (read_committed) from its start until ``expected`` actions arrived; the ``perf_counter``
    at which the last of them arrived."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, isolation_level="read_committed", auto_offset_reset="earliest"
    )
    await consumer.start()
    seen, last, moved = 0, 0.0, time.monotonic()
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        with tqdm(total=expected, desc="actions visible", unit="ev", dynamic_ncols=True, leave=False) as bar:
            while seen < expected:
                batch = await consumer.getmany(timeout_ms=100, max_records=10_000)
                now = time.perf_counter()
                arrived = sum(len(m) for m in batch.values())
                if arrived:
                    seen, last, moved = seen + arrived, now, time.monotonic()
                    bar.update(arrived)
                elif time.monotonic() - moved > STALL_SECONDS:
                    raise TimeoutError(f"{topic}: {seen} of {expected} actions, none for {STALL_SECONDS:.0f} s")
                alive()
    finally:
        await consumer.stop()
    return last


async def audit(bootstrap: str, topic: str, partitions: int) -> dict:
    """Every committed action of ``topic``: how many, how many (service, tick) pairs have more than one, by phase."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        max_poll_records=10_000,
    )
    await consumer.start()
    pairs: Counter[tuple[str, int]] = Counter()
    phases: Counter[str] = Counter()
    value_bytes = 0
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        empty = 0
        while empty < 3:
            batch = await consumer.getmany(timeout_ms=300)
            empty = 0 if batch else empty + 1
            for messages in batch.values():
                for m in messages:
                    action = orjson.loads(m.value)
                    pairs[action["service"], action["tick"]] += 1
                    phases[action.get("phase", "control")] += 1
                    value_bytes += len(m.value)
    finally:
        await consumer.stop()
    total = sum(pairs.values())
    return {
        "actions": total,
        "pairs": len(pairs),
        "repeated_pairs": sum(1 for n in pairs.values() if n > 1),
        "phases": dict(phases),
        "action_bytes_mean": value_bytes / max(1, total),
    }


async def take_over(bench: Bench, prefix: str, app_id: str) -> dict:
    """One fresh worker of ``app_id`` (its predecessors killed): start-up and restore times, rows restored."""
    a = bench.args
    port = free_port()
    started = time.perf_counter()
    worker = bench.worker(prefix, app_id, port, f"{app_id}-takeover")
    web = ready = None
    body: dict = {}
    deadline = time.monotonic() + a.timeout
    try:
        async with aiohttp.ClientSession() as session:
            while ready is None:
                worker.alive()
                answer = await healthz(session, port)
                now = time.perf_counter()
                if answer is not None:
                    web = web or now
                    status, body = answer
                    if status == 200 and body["services"] >= a.services:
                        ready = now
                if time.monotonic() > deadline:
                    raise TimeoutError(f"take-over of {app_id}: not restored after {a.timeout:.0f} s: {body}")
                await asyncio.sleep(POLL)
        rss = vm_rss_mib(worker.process.pid)
    finally:
        worker.stop()
    assert web is not None
    changelog = await end_offsets(bench.bootstrap, f"{app_id}-service-state-changelog", a.partitions)
    return {
        "startup_seconds": web - started,
        "restore_seconds": ready - web,
        "total_seconds": ready - started,
        "rows_restored": body["services"],
        "partitions": body["partitions"],
        "changelog_records": sum(changelog.values()),
        "rss_mib_after_restore": rss,
    }


async def scale_run(bench: Bench, n: int) -> dict:
    """``n`` workers decide every event of the workload; then a take-over by one fresh worker."""
    a = bench.args
    prefix = f"scale{n}-{uuid.uuid4().hex[:6]}"
    app_id = f"{prefix}-worker"
    names = TopicNames(prefix)
    await ensure_topics(bench.bootstrap, topic_specs(prefix, a.partitions))
    ports = [free_port() for _ in range(n)]
    workers = [bench.worker(prefix, app_id, port, f"{app_id}-{i}") for i, port in enumerate(ports)]

    def alive() -> None:
        for w in workers:
            w.alive()

    expected = len(bench.messages)
    try:
        await until_ready(workers, ports, app_id, bench.bootstrap, a.timeout)
        idle = [vm_rss_mib(w.process.pid) for w in workers]
        load_before = loadavg()
        steal = StealMeter()
        cpu_before = [w.cpu() for w in workers]
        broker_before, busy_before, bench_before = bench.broker_cpu(), busy_seconds(), time.process_time()
        counting = asyncio.create_task(last_action(bench.bootstrap, names.actions, a.partitions, expected, alive))
        first_send = time.perf_counter()
        await produce(bench.bootstrap, names.usage, bench.messages, f"produce {expected:,} events")
        produced = time.perf_counter()
        seconds = await counting - first_send
        workers_cpu = sum(w.cpu() for w in workers) - sum(cpu_before)
        broker_cpu = bench.broker_cpu() - broker_before
        bench_cpu = time.process_time() - bench_before
        others = max(0.0, busy_seconds() - busy_before - workers_cpu - broker_cpu - bench_cpu)
        cores = seconds * (os.cpu_count() or 1)
        steal_share, load_after = steal.share(), loadavg()
        after = [vm_rss_mib(w.process.pid) for w in workers]
        async with aiohttp.ClientSession() as session:
            held = [await healthz(session, port) for port in ports]
    finally:
        for w in workers:  # a take-over after a crash: no goodbye to the group, nothing committed on the way out
            if w.process.poll() is None:
                w.process.send_signal(signal.SIGKILL)
                w.process.wait()
    checked = await audit(bench.bootstrap, names.actions, a.partitions)
    dead = sum((await end_offsets(bench.bootstrap, names.deadletter, a.partitions)).values())
    if checked["actions"] != expected or checked["pairs"] != expected or checked["repeated_pairs"] or dead:
        raise RuntimeError(f"{n} worker(s): {checked} for {expected} events, {dead} dead letters")
    row = {
        "workers": n,
        "services": a.services,
        "ticks": a.ticks,
        "events": expected,
        "seconds": seconds,
        "events_per_second": expected / seconds,
        "produce_seconds": produced - first_send,
        "services_held": [h[1]["services"] if h else None for h in held],
        "idle_rss_mib": idle,
        "rss_mib_after": after,
        "rss_bytes_per_service": (sum(after) - sum(idle)) * (1 << 20) / a.services,
        "worker_cpu_us_per_event": 1e6 * workers_cpu / expected,
        "broker_cpu_us_per_event": 1e6 * broker_cpu / expected,
        "cpu_steal_share": steal_share,
        "other_cpu_share": others / cores,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "dead_letters": dead,
        **checked,
    }
    tqdm.write(f"{n} worker(s): {row['events_per_second']:,.0f} events/s; take-over ...")
    row["take_over"] = await take_over(bench, prefix, app_id)
    row["prefix"] = prefix
    return row


async def pipe_reference(bench: Bench, source_prefix: str) -> dict:
    """The raw aiokafka pipe of stream_throughput.py on the usage topic of ``source_prefix`` (its whole backlog)."""
    a = bench.args
    prefix = f"{source_prefix}-raw"
    await ensure_topics(bench.bootstrap, topic_specs(prefix, a.partitions))
    engine = DecisionEngine(load_artifact(bench.model))
    one = copies_of(load_dataset(a.dataset), 1, engine.window + 2, seed=0)  # a control decision's output sizes
    sizes = output_sizes(engine, one, one.demand.max(axis=0) * a.capacity_headroom)
    source = TopicNames(source_prefix).usage
    begin = dict.fromkeys(range(a.partitions), 0)
    total = await expected_counts(bench.workload, a.partitions, a.ticks)
    steal, load_before, started = StealMeter(), loadavg(), time.perf_counter()
    window = await measure_raw_pipe(
        bench.bootstrap,
        source,
        begin,
        total,
        prefix,
        sizes,
        WorkerSettings.batch_max,
        WorkerSettings.commit_interval,
        a.timeout,
    )
    return {
        "events": window.total,
        "seconds": window.ended - started,  # from the pipe's start to its last commit
        "events_per_second": window.total / (window.ended - started),
        "action_bytes": sizes[0],
        "transition_bytes": sizes[1],
        "cpu_steal_share": steal.share(),
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
    }


async def run(args: argparse.Namespace, folder: Path) -> dict:
    kafka = LocalKafka(home=folder / "kafka", brokers=args.brokers, log=tqdm.write)
    info = kafka.start()
    try:
        model = args.model or quick_model(folder / "model")
        workload = copies_of(load_dataset(args.dataset), args.services, args.ticks, seed=0)
        capacity = workload.demand.max(axis=0) * args.capacity_headroom
        messages = usage_messages(workload, capacity, range(args.ticks))
        pids = [node.pid for node in info.nodes if node.pid is not None]
        bench = Bench(args, info.bootstrap, pids, folder, model, workload, messages)
        rows, pipe = [], None
        steps = len(args.workers) + (not args.no_raw_pipe)
        with tqdm(total=steps, desc="stream scale", unit="run", dynamic_ncols=True) as bar:
            for n in args.workers:
                rows.append(await scale_run(bench, n))
                bar.update(1)
            if not args.no_raw_pipe:
                pipe = await pipe_reference(bench, rows[0]["prefix"])
                for r in rows:
                    r["ratio_to_raw_pipe"] = r["events_per_second"] / pipe["events_per_second"]
                bar.update(1)
        window = DecisionEngine(load_artifact(model)).window
        return {"runs": rows, "raw_pipe": pipe, "model": {"path": str(model), "window": window}}
    finally:
        kafka.stop()


def print_table(result: dict) -> None:
    print(
        f"\n{'workers':>7}{'events':>9}{'seconds':>9}{'events/s':>10}{'x raw':>7}{'idle MiB':>10}{'after MiB':>11}"
        f"{'B/service':>11}{'start-up s':>12}{'restore s':>11}{'rows':>9}{'steal':>7}{'others':>8}"
    )
    for r in result["runs"]:
        t = r["take_over"]
        print(
            f"{r['workers']:>7}{r['events']:>9,}{r['seconds']:>9.1f}{r['events_per_second']:>10,.0f}"
            f"{r.get('ratio_to_raw_pipe', float('nan')):>7.2f}{sum(r['idle_rss_mib']):>10.0f}"
            f"{sum(r['rss_mib_after']):>11.0f}{r['rss_bytes_per_service']:>11,.0f}{t['startup_seconds']:>12.1f}"
            f"{t['restore_seconds']:>11.1f}{t['rows_restored']:>9,}{r['cpu_steal_share']:>7.1%}"
            f"{r['other_cpu_share']:>8.0%}"
        )
    pipe = result["raw_pipe"]
    if pipe:
        print(f"raw aiokafka pipe: {pipe['events_per_second']:,.0f} events/s over {pipe['events']:,} events")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--services", type=int, default=100_000, help="services (default 100,000)")
    parser.add_argument("--ticks", type=int, default=3, help="ticks per service (default 3)")
    parser.add_argument(
        "--workers", type=int, nargs="+", default=[1, 2], help="a run with each many workers (default 1 2)"
    )
    parser.add_argument(
        "--brokers",
        type=int,
        default=1,
        help="brokers of the local Kafka cluster (default 1; 2 or more come with 3 dedicated controllers)",
    )
    parser.add_argument("--partitions", type=int, default=8, help="partitions of the topics (default 8)")
    add_workload_options(parser)
    parser.add_argument("--no-raw-pipe", action="store_true", help="skip the raw aiokafka pipe reference")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per wait (default 900)")
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/stream-scale"), help="folder for stream_scale.json"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_before, machine_before = loadavg(), describe()
    steal = StealMeter()
    folder = Path(tempfile.mkdtemp(prefix="picrl-stream-scale-"))
    started = time.monotonic()
    try:
        result = asyncio.run(run(args, folder))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print_table(result)
    result = {
        "benchmark": "stream_scale",
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": machine_before
        | {"loadavg_before": load_before, "loadavg_after": loadavg(), "cpu_steal_share": steal.share()},
        "wall_seconds": time.monotonic() - started,
        **result,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "stream_scale.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"written {args.out / 'stream_scale.json'}")


if __name__ == "__main__":
    main()
