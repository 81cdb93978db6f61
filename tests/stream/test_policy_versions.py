"""Policy versions get unique numbers and a rollback holds while a trainer runs: the trainer and
`picrl policy rollback` publish one at a time (stream.policy_writer), and the trainer continues
training from a rollback instead of publishing over it."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from aiokafka.errors import KafkaError, UnknownError

from picrl.cli import main
from picrl_core.artifact import ModelArtifact, policy_to_bytes
from picrl_core.policy import N_FEATURES
from stream.policy_follower import read_policy_versions
from stream.policy_writer import _quiet_unknown_commit_errors, next_version, publish_next
from stream.records import PolicyVersion, TransitionRecord
from stream.topics import TopicNames, ensure_topics, topic_specs
from tests.support.kafka import produce, unique
from tests.support.processes import picrl_process, tail


def _transitions(first_tick: int, n: int, rng: np.random.Generator) -> list[tuple[bytes, bytes]]:
    records = []
    for tick in range(first_tick, first_tick + n):
        features = rng.normal(size=N_FEATURES).astype(np.float32)
        record = TransitionRecord(
            f"svc-{tick % 3}",
            tick,
            features,
            rng.normal(size=2).astype(np.float32),
            float(rng.normal()),
            float(rng.normal()),
            features,
            bool(rng.random() < 0.3),
            float(rng.random()),
            0,
        )
        records.append((record.service.encode(), record.to_bytes()))
    return records


def _versions(bootstrap: str, topics: TopicNames) -> list[PolicyVersion]:
    return asyncio.run(read_policy_versions(bootstrap, topics.policy, "default"))


def _wait_for(bootstrap: str, topics: TopicNames, predicate, timeout: float = 120.0) -> list[PolicyVersion]:
    deadline = time.monotonic() + timeout
    while not predicate(versions := _versions(bootstrap, topics)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return versions


def test_rollbacks_racing_a_running_trainer_keep_numbers_unique_and_hold(
    kafka_bootstrap: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    prefix = unique("versions")
    asyncio.run(ensure_topics(kafka_bootstrap, topic_specs(prefix, 2)))
    topics, rng = TopicNames(prefix), np.random.default_rng(0)
    args = [
        "trainer",
        "--model",
        str(tiny_model_dir),
        "--bootstrap",
        kafka_bootstrap,
        "--prefix",
        prefix,
        "--partitions",
        "2",
        "--update-every",
        "8",
        "--min-kl",
        "0",  # on random replay a candidate scores better than its parent about half the time; replay keeps flowing
        "--log-format",
        "text",
    ]
    log = tmp_path / "trainer.log"
    feeding = threading.Event()

    def feed() -> None:  # replay keeps flowing, so candidates keep coming until one is published, also after rollbacks
        tick = 1_000
        while not feeding.is_set():
            produce(kafka_bootstrap, topics.replay, _transitions(tick, 12, np.random.default_rng(tick)))
            tick += 12
            time.sleep(0.3)

    with picrl_process(args, log) as trainer:
        produce(kafka_bootstrap, topics.replay, _transitions(0, 40, rng))
        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        try:
            before = _wait_for(kafka_bootstrap, topics, lambda vs: len(vs) >= 2)  # the root and one update
            assert len(before) >= 2, tail(log)
            for _ in range(3):
                assert (
                    main(["policy", "rollback", "--to", "1", "--bootstrap", kafka_bootstrap, "--prefix", prefix]) == 0
                )
                time.sleep(0.3)
            last_rollback = max(v.version for v in _versions(kafka_bootstrap, topics) if v.rollback_of == 1)
            after = _wait_for(
                kafka_bootstrap, topics, lambda vs: any(v.parent == last_rollback and v.rollback_of is None for v in vs)
            )
        finally:
            feeding.set()
            feeder.join(30)
        assert trainer.poll() is None, tail(log)
    numbers = [v.version for v in after]
    assert sorted(numbers) == list(range(len(numbers))), numbers  # unique and without holes
    by_number = {v.version: v for v in after}
    rollbacks = [v for v in after if v.rollback_of == 1]
    assert len(rollbacks) == 3 and all(v.weights == by_number[1].weights for v in rollbacks)
    for version in (v for v in after if v.version > last_rollback):  # everything after descends from it
        chain = version
        while chain.version > last_rollback:
            chain = by_number[chain.parent]
        assert chain.version == last_rollback, version.version
    text = log.read_text()
    assert f"version {last_rollback} was published by another writer (a rollback to version 1)" in text, tail(log)
    assert "Traceback" not in text, tail(log)


def test_concurrent_writers_get_distinct_numbers(
    kafka_bootstrap: str, tiny_artifact: ModelArtifact, caplog: pytest.LogCaptureFixture
) -> None:
    prefix = unique("writers")
    asyncio.run(ensure_topics(kafka_bootstrap, topic_specs(prefix, 1)))
    topic, weights = TopicNames(prefix).policy, policy_to_bytes(tiny_artifact.policy)

    def build(versions: list[PolicyVersion]) -> PolicyVersion:
        version = next_version(versions)
        return PolicyVersion("default", version, version - 1 if version else None, 0.0, 0.0, time.time(), weights)

    async def writers() -> list[PolicyVersion | None]:
        async def writer() -> list[PolicyVersion | None]:
            return [await publish_next(kafka_bootstrap, topic, "default", build, attempts=20) for _ in range(3)]

        return [record for records in await asyncio.gather(*[writer() for _ in range(4)]) for record in records]

    published = asyncio.run(writers())
    versions = asyncio.run(read_policy_versions(kafka_bootstrap, topic, "default"))
    assert sorted(v.version for v in versions) == list(range(12))  # every write landed, each number once
    assert sorted(r.version for r in published if r is not None) == list(range(12))
    assert "never retrieved" not in caplog.text


def test_policy_list_marks_the_version_in_force_and_those_the_workers_refuse(
    kafka_bootstrap: str, tiny_artifact: ModelArtifact, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = unique("list")
    asyncio.run(ensure_topics(kafka_bootstrap, topic_specs(prefix, 1)))
    weights = policy_to_bytes(tiny_artifact.policy)
    versions = [
        PolicyVersion("default", 0, None, 0.0, 0.0, time.time(), weights),
        PolicyVersion("default", 1, 0, 0.01, 0.5, time.time(), weights, parent_score=0.5),
        PolicyVersion("default", 2, 1, 5.0, 0.5, time.time(), weights, parent_score=0.5),
    ]  # KL too large
    produce(kafka_bootstrap, TopicNames(prefix).policy, [(v.key, v.to_bytes()) for v in versions])
    assert main(["policy", "list", "--bootstrap", kafka_bootstrap, "--prefix", prefix]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line[:2] for line in lines[:3]] == ["  ", "* ", "  "]
    assert lines[2].endswith("refused by the workers: kl_above_bound")
    assert lines[3].startswith("* in force: version 1")


def test_a_commit_answered_with_an_unknown_error_leaves_no_aiokafka_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A broker can answer a fenced writer's commit with UNKNOWN_SERVER_ERROR; the writer judges it by the topic and
    logs it itself, so aiokafka's two lines for it (one with a traceback) are dropped, and nothing else is."""
    _quiet_unknown_commit_errors()
    sender = logging.getLogger("aiokafka.producer.sender")
    with caplog.at_level(logging.ERROR, logger="aiokafka.producer.sender"):
        sender.error("Could not end transaction due to unexpected error: %s", UnknownError)
        try:
            raise UnknownError()
        except UnknownError:
            sender.error("Unexpected error in sender routine", exc_info=True)
        sender.error("Could not end transaction due to unexpected error: %s", KafkaError)
    assert [r.getMessage() for r in caplog.records] == [
        "Could not end transaction due to unexpected error: <class 'aiokafka.errors.KafkaError'>"
    ]
