"""Bounded resources: the replay buffer, a worker's per-service state and decision history, and what a
flood of refused input costs, all stay within their documented bounds when fed 10x the bound.

Bounds (docs/guide/reliability.md): the replay buffer holds ``OnlineConfig.buffer_size`` transitions
(preallocated); a worker holds one fixed-size state row per service, at most ``max_services`` of
them, and the last ``RECENT_DECISIONS`` actions of at most ``RECENT_SERVICES`` services; refused
input is written to the dead-letter topic (retention 14 days / 64 MiB per partition) and not kept.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import stream.observer as observer_module
from picrl_core.artifact import ModelArtifact
from picrl_core.controller import Transition
from picrl_core.online import ReplayBuffer
from picrl_core.policy import N_FEATURES
from stream.records import decode_action
from stream.topics import TopicNames, ensure_topics, topic_specs
from stream.worker import StreamWorker, WorkerSettings
from tests.stream.conftest import WINDOW
from tests.support.kafka import consume, produce, unique, usage_json
from tests.support.processes import picrl_process, tail, worker_args, worker_pid
from tests.support.web import free_port, http_get, metric

KIB = 1 << 10


def _transitions(n: int, rng: np.random.Generator) -> Transition:
    features = rng.normal(size=(n, N_FEATURES)).astype(np.float32)
    return Transition(
        features=features,
        pre=rng.normal(size=(n, 2)).astype(np.float32),
        log_prob=rng.normal(size=n).astype(np.float32),
        reward=rng.normal(size=n),
        next_features=features,
        censored=rng.random(n) < 0.3,
        action=rng.random(n),
    )


def _traced_growth(feed, rounds: int) -> int:
    """Bytes still allocated after ``rounds`` more calls of ``feed`` than after the first one."""
    tracemalloc.start()
    try:
        feed()
        base = tracemalloc.get_traced_memory()[0]
        for _ in range(rounds):
            feed()
        return tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()


def test_replay_buffer_fed_ten_times_its_size_keeps_its_size_and_memory() -> None:
    capacity, rng = 2_000, np.random.default_rng(0)
    buffer = ReplayBuffer(capacity, N_FEATURES)
    batches = [_transitions(200, rng) for _ in range(10 * capacity // 200)]
    fed = iter(batches)
    growth = _traced_growth(lambda: buffer.add(next(fed)), len(batches) - 1)
    assert len(buffer) == capacity and buffer.added == 10 * capacity
    assert growth < 16 * KIB, growth  # preallocated: nothing grows with what went through
    newest = batches[-1].reward[-1]
    assert np.isclose(buffer.contents()["reward"].numpy(), newest).any()  # the oldest were overwritten


def test_recent_decisions_are_kept_for_a_bounded_number_of_services(
    tiny_artifact: ModelArtifact, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(observer_module, "RECENT_SERVICES", 100)
    worker = StreamWorker(WorkerSettings(bootstrap="127.0.0.1:9"), tiny_artifact)  # never started: no broker
    template = decode_action(_action_bytes())

    rounds = itertools.count()

    def feed() -> None:  # the next 100 services, each with more decisions than are kept
        first = 100 * next(rounds)
        for i in range(first, first + 100):
            for tick in range(observer_module.RECENT_DECISIONS + 5):
                worker.observer.remember(dataclasses.replace(template, service=f"svc-{i}", tick=tick))

    growth = _traced_growth(feed, 9)  # 1,000 services through a bound of 100
    assert len(worker.observer.recent) == 100 and set(worker.observer.recent) == {f"svc-{i}" for i in range(900, 1000)}
    assert all(len(history) == observer_module.RECENT_DECISIONS for history in worker.observer.recent.values())
    assert growth < 64 * KIB, growth


def _action_bytes() -> bytes:
    return (
        b'{"schema": 1, "type": "action", "service": "s", "tick": 1, "capacity": 1.0, "capacity_norm": 0.5, '
        b'"mu": 0.5, "sigma": 0.1, "k": 1.0, "eta": 1.0, "margin": 0.0, "bias": 0.0, "policy_version": 0, '
        b'"censor_streak": 0, "advisory": false, "decided_at": 1.0, "source_produced_at": 0.0, '
        b'"phase": "control", "k_sigma": 0.1, "clipped": "none"}'
    )


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def test_a_worker_fed_ten_times_its_service_cap_holds_the_cap_and_stays_flat(
    kafka_bootstrap: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    cap, ticks = 20, WINDOW + 12
    prefix = unique("bounds")
    asyncio.run(ensure_topics(kafka_bootstrap, topic_specs(prefix, 2)))
    topics, port = TopicNames(prefix), free_port()
    args = worker_args(
        tiny_model_dir,
        kafka_bootstrap,
        prefix,
        "--web-port",
        str(port),
        "--max-services",
        str(cap),
        partitions=2,
        log_level="error",
    )

    def usage(services: range) -> list[tuple[bytes, bytes]]:
        return [
            (f"svc-{s}".encode(), usage_json(f"svc-{s}", t, 5.0 + (s + t) % 7, 20.0))
            for t in range(ticks)
            for s in services
        ]

    def scrape() -> str:
        return str(http_get(port, "/metrics/")[1])

    with picrl_process(args, tmp_path / "worker.log") as worker:
        produce(kafka_bootstrap, topics.usage, usage(range(cap)))  # the cap: every service held
        held = asyncio.run(consume(kafka_bootstrap, topics.actions, cap * ticks, timeout=120))
        assert len(held) == cap * ticks, tail(tmp_path / "worker.log")
        before = _rss_mib(worker_pid(worker))
        produce(kafka_bootstrap, topics.usage, usage(range(cap, 10 * cap)))  # 9x more services: all refused
        letters = asyncio.run(consume(kafka_bootstrap, topics.deadletter, 9 * cap * ticks, timeout=120))
        assert len(letters) == 9 * cap * ticks, tail(tmp_path / "worker.log")
        text = scrape()
        after = _rss_mib(worker_pid(worker))
        assert worker.poll() is None, tail(tmp_path / "worker.log")
    assert metric(text, "picrl_services") == cap
    assert metric(text, "picrl_dead_letters_total", reason="service_limit") == 9 * cap * ticks
    print(f"\nworker RSS {before:.0f} MiB at the cap, {after:.0f} MiB after 10x the cap")
    assert after - before < 32, (before, after)
