"""Reliability against the real broker: crashes, rebalances, broker restarts, bad input, trainer outages and
policy guardrails. Workers and trainers run as the processes users run; every loop is bounded."""
from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import pytest
import torch
from aiokafka import AIOKafkaProducer

from picrl.datasets import Trace
from picrl.kafka import LocalKafka
from picrl_core.artifact import ModelArtifact, policy_to_bytes
from picrl_core.policy import PolicyNetwork
from producers.closed_loop import ClosedLoopEnvironment, ClosedLoopRecord, TickSummary
from producers.workload import Workload, copies_of
from stream.records import PolicyVersion, decode_action, decode_dead_letter
from stream.topics import TopicNames, ensure_topics, topic_specs
from tests.stream.conftest import WINDOW
from tests.support.kafka import consume, unique, wait_until
from tests.support.processes import REPO, picrl_process, stop, tail
from tests.support.reference import reference_run

PARTITIONS = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker_args(model: Path, bootstrap: str, prefix: str, *extra: str) -> list[str]:
    return ["worker", "--model", str(model), "--bootstrap", bootstrap, "--prefix", prefix, "--partitions",
            str(PARTITIONS), "--app-id", f"{prefix}-worker", "--log-level", "warning", *extra]


def _spawn(args: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "picrl", *args], stdout=open(log, "ab"), stderr=subprocess.STDOUT,
                            cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _topics(bootstrap: str, name: str) -> str:
    prefix = unique(name)
    asyncio.run(ensure_topics(bootstrap, topic_specs(prefix, PARTITIONS)))
    return prefix


def _play(bootstrap: str, prefix: str, workload: Workload, on_tick=None, timeout: float = 180.0) -> ClosedLoopRecord:
    env = ClosedLoopEnvironment(bootstrap, TopicNames(prefix), workload, action_timeout=timeout, on_tick=on_tick)
    return asyncio.run(env.run())


def _actions_per_key(bootstrap: str, prefix: str, expected: int) -> collections.Counter:
    messages = asyncio.run(consume(bootstrap, TopicNames(prefix).actions, expected + 50, timeout=15))
    return collections.Counter((a.service, a.tick) for a in (decode_action(m.value) for m in messages))


def _assert_exactly_once_and_equal(record: ClosedLoopRecord, bootstrap: str, prefix: str,
                                   artifact: ModelArtifact) -> int:
    workload = record.workload
    expected = len(workload.services) * (workload.ticks - 1)  # actions for ticks 1 .. T-1 were consumed
    counts = _actions_per_key(bootstrap, prefix, expected)
    wanted = {(s, t) for s in workload.services for t in range(1, workload.ticks)}
    assert wanted <= set(counts), f"missing actions: {sorted(wanted - set(counts))[:5]}"
    repeated = {k: n for k, n in counts.items() if n > 1}
    assert not repeated, f"repeated actions: {list(repeated.items())[:5]}"
    reference = reference_run(artifact, workload.demand, workload.services, headroom=0.5)
    assert np.array_equal(record.breakdown["capacity_norm"][WINDOW:], reference.action)
    return sum(counts.values())


@pytest.fixture()
def workload(native_trace: Trace) -> Workload:
    return copies_of(native_trace, 3, WINDOW + 40, start=900, seed=11)


def test_sigkilled_worker_restarts_from_the_changelog_without_losing_or_repeating_decisions(
        kafka_bootstrap: str, tiny_model_dir: Path, tiny_artifact: ModelArtifact, workload: Workload,
        tmp_path: Path) -> None:
    prefix = _topics(kafka_bootstrap, "crash")
    args = _worker_args(tiny_model_dir, kafka_bootstrap, prefix)
    log = tmp_path / "worker.log"
    workers = [_spawn(args, log)]
    tick_seen: dict[int, float] = {}
    kill_at = WINDOW + 15

    def on_tick(summary: TickSummary) -> None:
        tick_seen[summary.tick] = time.monotonic()
        if summary.tick == kill_at:
            workers[0].send_signal(signal.SIGKILL)
            workers[0].wait()
            workers.append(_spawn(args, log))

    try:
        record = _play(kafka_bootstrap, prefix, workload, on_tick)
    finally:
        for worker in workers:
            stop(worker)
    assert workers[0].returncode == -signal.SIGKILL
    recovery = tick_seen[kill_at + 1] - tick_seen[kill_at]
    checked = _assert_exactly_once_and_equal(record, kafka_bootstrap, prefix, tiny_artifact)
    print(f"\nrecovery after SIGKILL: {recovery:.1f} s (restart, changelog recovery, first decision); "
          f"{checked} actions checked, 0 missing, 0 repeated")
    assert record.duplicate_actions == 0


def test_a_stopped_worker_hands_its_partitions_and_state_to_the_other(
        kafka_bootstrap: str, tiny_model_dir: Path, tiny_artifact: ModelArtifact, workload: Workload,
        tmp_path: Path) -> None:
    prefix = _topics(kafka_bootstrap, "rebalance")
    ports = [_free_port(), _free_port()]
    workers = [_spawn(_worker_args(tiny_model_dir, kafka_bootstrap, prefix, "--web-port", str(port)),
                      tmp_path / f"worker{i}.log") for i, port in enumerate(ports)]
    partitions: dict[str, list] = {}

    def on_tick(summary: TickSummary) -> None:
        if summary.tick == WINDOW + 10:
            partitions["before"] = [_get(ports[0], "/healthz/")[1]["partitions"],
                                    _get(ports[1], "/healthz/")[1]["partitions"]]
            stop(workers[1])

    try:
        record = _play(kafka_bootstrap, prefix, workload, on_tick)
        partitions["after"] = _get(ports[0], "/healthz/")[1]["partitions"]
    finally:
        for worker in workers:
            stop(worker)
    before = partitions["before"]
    assert sorted(before[0] + before[1]) == list(range(PARTITIONS)) and before[0] and before[1], \
        f"both workers should have shared the partitions: {before}"
    assert partitions["after"] == list(range(PARTITIONS))
    _assert_exactly_once_and_equal(record, kafka_bootstrap, prefix, tiny_artifact)


def _get(port: int, path: str) -> tuple[int, dict | str]:
    """GET a worker endpoint (status, JSON body or text)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                body = response.read().decode()
                status = response.status
            break
        except urllib.error.HTTPError as exc:
            status, body = exc.code, exc.read().decode()
            break
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    try:
        return status, json.loads(body)
    except ValueError:
        return status, body


def test_the_worker_rides_out_a_broker_restart(local_kafka: LocalKafka | None, tiny_model_dir: Path,
                                               tiny_artifact: ModelArtifact, workload: Workload,
                                               tmp_path: Path) -> None:
    if local_kafka is None:
        pytest.fail("this test restarts a broker it owns: it needs the provisioned one (unset KAFKA_BOOTSTRAP_SERVERS)")
    broker = LocalKafka(home=tmp_path / "kafka", cache=local_kafka.cache, log=lambda _: None)
    bootstrap = broker.start().bootstrap
    try:
        prefix = _topics(bootstrap, "restart")
        downtime: dict[str, float] = {}

        def on_tick(summary: TickSummary) -> None:
            if summary.tick == WINDOW + 10:
                started = time.monotonic()
                broker.stop()
                time.sleep(3.0)
                broker.start()
                downtime["seconds"] = time.monotonic() - started

        with picrl_process(_worker_args(tiny_model_dir, bootstrap, prefix), tmp_path / "worker.log") as worker:
            try:
                record = _play(bootstrap, prefix, workload, on_tick, timeout=240)
            except Exception as exc:
                raise AssertionError(f"{exc}\n{tail(tmp_path / 'worker.log')}") from exc
            assert worker.poll() is None, tail(tmp_path / "worker.log")
        print(f"\nbroker down and back in {downtime['seconds']:.1f} s; run completed")
        _assert_exactly_once_and_equal(record, bootstrap, prefix, tiny_artifact)
    finally:
        broker.stop()
