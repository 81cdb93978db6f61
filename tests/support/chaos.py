"""Real faults during a closed loop: stream workers of one app id SIGKILLed and restarted, or frozen; Kafka nodes
SIGKILLed (the one that leads the most partitions, the active controller, or the only one) and started again on
the same ports and data, at once or after some ticks away; then an audit of the actions against an uninterrupted
reference.

Shared by the chaos test (tests/stream/test_cluster.py) and the soak (benchmarks/soak.py)."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from aiokafka.admin import AIOKafkaAdminClient

from picrl.kafka import LocalKafka
from picrl_core.artifact import ModelArtifact
from producers.closed_loop import ClosedLoopRecord, TickSummary
from stream.records import decode_action, decode_dead_letter
from stream.topics import TopicNames, committed_offsets, end_offsets
from tests.support.kafka import consume
from tests.support.processes import Started, spawn, stop, tail, worker_pid
from tests.support.reference import coupled_reference_run, reference_run

BROKER = "broker"  # the only node of a single-node cluster
LEADER = "leader"  # the node that leads the most partitions (every topic, Kafka's internal ones included)
CONTROLLER = "controller"  # the node that leads the KRaft controller quorum
NODES = (BROKER, LEADER, CONTROLLER)
FREEZE = "freeze "  # + a worker index: SIGSTOP for longer than the session timeout, then SIGCONT (a zombie)
STOP = "stop "  # + a worker index: SIGTERM (a graceful stop: it leaves its group), restarted at once
PROCESS = "process "  # + a worker index: SIGKILL of its worker process, which its command forks again (respawn)


async def _leader_counts(bootstrap: str, topics: list[str] | None) -> collections.Counter[int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(topics)
    finally:
        await admin.close()
    return collections.Counter(p["leader"] for t in described for p in t["partitions"] if p["leader"] >= 0)


def leader_counts(bootstrap: str, topics: list[str] | None = None) -> collections.Counter[int]:
    """How many partitions of ``topics`` (default: all) each node leads (from any thread, a running event loop's
    included)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _leader_counts(bootstrap, topics)).result()


async def _under_replicated(bootstrap: str) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics()
    finally:
        await admin.close()
    return sum(len(p["isr"]) < len(p["replicas"]) for t in described for p in t["partitions"])


def under_replicated(bootstrap: str) -> int:
    """How many partitions (every topic, Kafka's internal ones included) have replicas out of their in-sync set."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _under_replicated(bootstrap)).result()


@dataclass
class Fault:
    """One fault right after ``tick`` was revealed: a SIGKILL of ``target`` (``worker 0``, ``worker 1``, ... or
    ``node N``), a freeze (``freeze 0``: SIGSTOP, then SIGCONT once the group has gone on without it) or a
    graceful stop (``stop 0``: SIGTERM);
    ``recovered`` is the time from the fault until the actions of the next tick were all in force."""

    tick: int
    target: str
    down: float = 0.0  # seconds a node killed and started again at once was away (its restart included)
    recovered: float = math.nan

    @property
    def node(self) -> bool:
        return self.target.startswith("node")


@dataclass
class Chaos:
    """Runs ``workers`` workers (``picrl worker ARGS``) and, through :meth:`on_tick`, inflicts what
    ``plan(tick)`` names at that tick: a worker index (SIGKILL, restarted at once), a Kafka node of ``cluster``
    (:data:`BROKER`, :data:`LEADER` or :data:`CONTROLLER`: SIGKILL, started again after ``node_away`` ticks, at once
    when 0), :data:`FREEZE` and an index (stopped for ``freeze`` seconds, more than the workers' session timeout,
    and continued: it comes back as a zombie whose producers were fenced) or :data:`STOP` and an index (SIGTERM,
    restarted once it has exited: ``stopped`` holds it, its exit code must be 0) or :data:`PROCESS` and an index
    (SIGKILL of the worker process, which the command forks again: ``respawn``, on by default on Linux). ``fresh``:
    every worker a new interpreter, its imports timed in the recovery (benchmarks); tests fork them from the fork
    server."""

    worker_args: list[str]
    logs: Path
    workers: int
    cluster: LocalKafka
    plan: Callable[[int], int | str | None]
    freeze: float = 12.0
    node_away: int = 0
    fresh: bool = False
    faults: list[Fault] = field(default_factory=list)
    running: list[Started] = field(default_factory=list)
    killed: list[Started] = field(default_factory=list)
    stopped: list[Started] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)  # workers found dead when their kill came
    _killed_at: float = 0.0
    _node_back_at: int | None = None  # tick at which the node away starts again
    _restart: threading.Thread | None = None  # a node starting again while the loop goes on

    def start(self) -> None:
        self.running = [spawn(self.worker_args, self.log(i), fresh=self.fresh) for i in range(self.workers)]

    def log(self, index: int) -> Path:
        return self.logs / f"worker{index}.log"

    def on_tick(self, summary: TickSummary) -> None:
        """The closed loop's tick callback: time the recovery of the last fault, start a node whose time away is
        over, then inflict the next fault."""
        if self.faults and math.isnan(self.faults[-1].recovered) and summary.tick > self.faults[-1].tick:
            self.faults[-1].recovered = time.monotonic() - self._killed_at
        if self._node_back_at is not None and summary.tick >= self._node_back_at:
            self._node_back_at = None
            self._restart = threading.Thread(target=self.cluster.start, daemon=True)
            self._restart.start()
        target = self.plan(summary.tick)
        if target is not None:
            self.kill(summary.tick, target)

    def kill(self, tick: int, target: int | str) -> None:
        """SIGKILL ``target`` and start it again (a worker: same arguments and log; a node: on its ports and data)."""
        if target in NODES:
            self._kill_node(tick, str(target))
            return
        self._killed_at = time.monotonic()
        if isinstance(target, str) and target.startswith(FREEZE):
            frozen = worker_pid(self.running[int(target[len(FREEZE) :])])
            os.kill(frozen, signal.SIGSTOP)
            time.sleep(self.freeze)
            os.kill(frozen, signal.SIGCONT)
            self.faults.append(Fault(tick, target))
            return
        if isinstance(target, str) and target.startswith(PROCESS):
            os.kill(worker_pid(self.running[int(target[len(PROCESS) :])]), signal.SIGKILL)
            self.faults.append(Fault(tick, f"{target[: len(PROCESS)]}of worker {target[len(PROCESS) :]}"))
            return
        graceful = isinstance(target, str) and target.startswith(STOP)
        index = int(target[len(STOP) :]) if graceful else int(target)
        victim = self.running[index]
        if victim.poll() is not None:
            self.gone.append(
                f"worker {index} had exited with {victim.returncode} before tick {tick}:\n{tail(self.log(index))}"
            )
        if graceful:
            stop(victim)
            self.stopped.append(victim)
        else:
            victim.send_signal(signal.SIGKILL)
            victim.wait()
            self.killed.append(victim)
        self.running[index] = spawn(self.worker_args, self.log(index), fresh=self.fresh)
        self.faults.append(Fault(tick, f"{STOP if graceful else ''}worker {index}"))

    def _kill_node(self, tick: int, target: str) -> None:
        """SIGKILL the node ``target`` names, once every node is back from the last such fault."""
        if self._restart is not None:
            self._restart.join()
            self._restart = None
        if self._node_back_at is not None:  # the last node killed is still away: it comes back first
            self._node_back_at = None
            self.cluster.start()
        info = self.cluster.status()
        assert info is not None, "the cluster is not running"
        if target == LEADER:
            node = leader_counts(info.bootstrap).most_common(1)[0][0]
        elif target == CONTROLLER:
            controller = self.cluster.active_controller()
            assert controller is not None, "no active controller is known"
            node = controller
        else:
            node = info.nodes[0].node_id
        self._killed_at = time.monotonic()
        self.cluster.stop(node=node, crash=True)
        if self.node_away:
            self._node_back_at = tick + self.node_away
            self.faults.append(Fault(tick, f"node {node} ({target})"))
            return
        self.cluster.start()
        self.faults.append(Fault(tick, f"node {node} ({target})", down=time.monotonic() - self._killed_at))

    def exited_by_themselves(self) -> list[str]:
        """A line (exit code and log tail) for every worker that ended without being killed."""
        return self.gone + [
            f"worker {i} exited with {p.returncode}:\n{tail(self.log(i))}"
            for i, p in enumerate(self.running)
            if p.poll() is not None
        ]

    def diagnose(self, bootstrap: str, prefix: str, partitions: int, group: str) -> str:
        """What a stalled loop leaves to read: per usage partition the offset ``group`` committed and the end;
        per actions partition its end and last stable offset (below the end, an open transaction holds back the
        actions after it from ``read_committed`` readers); the last dead letters; each worker's last warnings and
        errors."""
        topics = TopicNames(prefix)

        async def offsets() -> list[str]:
            usage = await end_offsets(bootstrap, topics.usage, partitions)
            actions = await end_offsets(bootstrap, topics.actions, partitions)
            stable = await end_offsets(bootstrap, topics.actions, partitions, isolation_level="read_committed")
            admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
            await admin.start()
            try:
                committed = await committed_offsets(admin, group, topics.usage)
            finally:
                await admin.close()
            return [f"usage[{p}]: committed {committed.get(p)}, end {usage[p]}" for p in range(partitions)] + [
                f"actions[{p}]: end {actions[p]}, last stable {stable[p]}" for p in range(partitions)
            ]

        async def letters() -> list[str]:
            messages = await consume(bootstrap, topics.deadletter, 10_000, timeout=5)
            return [f"dead letter: {decode_dead_letter(m.value)}"[:400] for m in messages][-20:]

        try:
            lines = asyncio.run(offsets()) + asyncio.run(letters())
        except Exception as exc:  # the broker may be what stalled
            lines = [f"offsets or dead letters unavailable: {type(exc).__name__}: {exc}"]
        for i in range(self.workers):
            log = self.log(i).read_text(errors="replace").splitlines() if self.log(i).exists() else []
            noted = [line[:300] for line in log if '"level": "warning"' in line or '"level": "error"' in line]
            lines += [f"worker {i}, last warnings and errors:"] + noted[-20:]
        return "\n".join(lines)

    def stop(self) -> None:
        for process in self.running:
            stop(process)
        if self._restart is not None:
            self._restart.join()

    def report(self) -> str:
        """One line per fault: what was killed at which tick and how long the loop took to recover."""
        return "\n".join(
            f"  tick {f.tick:>4}: {'' if f.target.startswith((FREEZE, STOP)) else 'SIGKILL '}{f.target:<18} "
            + (f"(down and back in {f.down:.1f} s) " if f.down else "")
            + f"recovered in {f.recovered:.1f} s"
            for f in self.faults
        )


@dataclass(frozen=True)
class Audit:
    """The actions of a closed loop read back with ``read_committed`` and compared with the reference."""

    checked: int  # actions read
    missing: list[tuple[str, int]]  # (service, tick) with no action
    repeated: list[tuple[str, int]]  # (service, tick) with more than one
    mismatches: int  # control decisions that differ from the uninterrupted reference run
    # each row that differs: (row, the first tick it does, the decision then, the reference's), earliest first
    diverged: list[tuple[str, int, float, float]] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.missing and not self.repeated and not self.mismatches


def audit(record: ClosedLoopRecord, bootstrap: str, prefix: str, artifact: ModelArtifact, window: int) -> Audit:
    """Exactly one action per (service, tick) for ticks 1 .. T-1, and every decision after the ``window`` warm-up
    ticks equal to the simulator's on the same workload (the reference a worker must reproduce bit for bit)."""
    workload = record.workload
    wanted = {(s, t) for s in workload.services for t in range(1, workload.ticks)}
    messages = asyncio.run(consume(bootstrap, TopicNames(prefix).actions, len(wanted) + 50, timeout=15))
    counts = collections.Counter((a.service, a.tick) for a in (decode_action(m.value) for m in messages))
    reference = (
        coupled_reference_run(artifact, workload, headroom=0.5)
        if workload.resources
        else reference_run(artifact, workload.demand, workload.services, headroom=0.5)
    ).trajectory
    decided = record.breakdown["capacity_norm"][window:]
    differ = decided != reference.action
    rows = [f"{s}/{r.name}" for r in workload.resources for s in workload.services] or list(workload.services)
    first = {}
    for c in np.flatnonzero(differ.any(axis=0)):
        t = int(np.argmax(differ[:, c]))
        first[rows[c]] = (window + t, float(decided[t, c]), float(reference.action[t, c]))
    return Audit(
        sum(counts.values()),
        sorted(wanted - set(counts)),
        sorted(k for k, n in counts.items() if n > 1),
        int(np.sum(differ)),
        sorted(((row, *cell) for row, cell in first.items()), key=lambda item: (item[1], item[0])),
    )
