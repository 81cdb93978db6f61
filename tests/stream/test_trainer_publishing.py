"""The trainer publishes a candidate only when it differs from the published version (``min_kl``) and scores better."""

from __future__ import annotations

import asyncio
import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from aiokafka import AIOKafkaConsumer, TopicPartition

from picrl_core.artifact import ModelArtifact
from picrl_core.config import PolicyConfig
from picrl_core.policy import N_FEATURES, PolicyNetwork
from stream.records import PolicyVersion, decode_transition
from stream.topics import TopicNames, ensure_topics, topic_specs
from stream.trainer import PolicyTrainer, policy_kl
from stream.trainer_replay import TrainerSettings, is_held_out, untrained_transitions
from tests.stream.test_policy_versions import _transitions
from tests.support.kafka import produce, unique


def test_the_kl_to_the_published_version_is_zero_for_a_copy_and_grows_with_the_shift() -> None:
    torch.manual_seed(0)
    policy = PolicyNetwork(PolicyConfig())
    features = torch.randn(256, N_FEATURES)
    assert policy_kl(copy.deepcopy(policy), policy, features) == 0.0
    moved = copy.deepcopy(policy)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(1e-3 * torch.randn_like(p))
    small = policy_kl(moved, policy, features)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(3e-2 * torch.randn_like(p))
    assert 0.0 < small < TrainerSettings.min_kl <= policy_kl(moved, policy, features)


def test_min_kl_is_a_setting_that_refuses_a_negative_threshold() -> None:
    assert TrainerSettings("localhost:9092").min_kl == 1e-4
    with pytest.raises(ValueError, match="min_kl"):
        TrainerSettings("localhost:9092", min_kl=-1.0)


class _Replay:
    """A stand-in for the trainer's replay consumer: ``batches`` batches of transitions on one partition, then it
    stops the trainer; records how many transitions had been consumed at each commit."""

    def __init__(self, trainer: PolicyTrainer, batches: int) -> None:
        self.trainer, self.batches = trainer, batches
        self.partition = TopicPartition(trainer.topics.replay, 0)
        self.consumed = 0
        self.commits: list[int] = []

    def __call__(self, *topics: str, **settings: object) -> _Replay:
        return self

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def assignment(self) -> set[TopicPartition]:
        return {self.partition}

    async def committed(self, partition: TopicPartition) -> int | None:
        return self.commits[-1] if self.commits else None

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[TopicPartition, list[SimpleNamespace]]:
        if self.consumed == 40 * self.batches:
            self.trainer.stop()
            return {}
        rng = np.random.default_rng(self.consumed)
        messages = [
            SimpleNamespace(value=value, topic=self.partition.topic, partition=0, offset=self.consumed + i)
            for i, (_, value) in enumerate(_transitions(self.consumed, 40, rng))
        ]
        self.consumed += len(messages)
        return {self.partition: messages}

    async def commit(self) -> None:
        self.commits.append(self.consumed)


def test_a_skipped_candidate_commits_the_offsets_it_trained_on(
    tiny_artifact: ModelArtifact, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restart resumes after the transitions a skipped candidate trained on, as after a published one."""
    trainer = PolicyTrainer(tiny_artifact, TrainerSettings("localhost:9092", update_every=8, min_kl=1e9))
    replay = _Replay(trainer, batches=4)
    monkeypatch.setattr("stream.trainer.AIOKafkaConsumer", replay)

    async def latest() -> tuple[int, PolicyNetwork]:
        return 0, copy.deepcopy(tiny_artifact.policy)

    async def publish(record: PolicyVersion) -> PolicyVersion:
        raise AssertionError(f"version {record.version} published with min_kl 1e9")

    monkeypatch.setattr(trainer, "_latest", latest)
    monkeypatch.setattr(trainer, "_publish", publish)
    assert asyncio.run(trainer.run()) == []
    assert trainer.skipped == 4 and replay.commits == [40, 80, 120, 160]
    assert trainer.metrics.skipped._value.get() == 4


def test_untrained_transitions_counts_the_training_ones_past_the_trainers_commit(kafka_bootstrap: str) -> None:
    """What `picrl up` waits on before it stops the trainer: held-out transitions never train, so they do not
    count, and nothing before the group's committed offset counts."""
    prefix = unique("untrained")
    asyncio.run(ensure_topics(kafka_bootstrap, topic_specs(prefix, 1)))
    settings = TrainerSettings(kafka_bootstrap, prefix, group_id=unique("trainer"))
    messages = _transitions(0, 30, np.random.default_rng(0))
    produce(kafka_bootstrap, TopicNames(prefix).replay, messages)
    training = [not is_held_out(decode_transition(value), settings.holdout_every) for _, value in messages]
    assert 0 < sum(training) < 30
    assert asyncio.run(untrained_transitions(settings, 1)) == sum(training)  # before the group's first commit

    async def commit(offset: int) -> None:
        consumer = AIOKafkaConsumer(
            bootstrap_servers=kafka_bootstrap, group_id=settings.group_id, enable_auto_commit=False
        )  # an auto-commit on stop would commit the position the assignment set, over this one
        await consumer.start()
        try:
            partition = TopicPartition(TopicNames(prefix).replay, 0)
            consumer.assign([partition])
            await consumer.commit({partition: offset})
        finally:
            await consumer.stop()

    asyncio.run(commit(10))
    assert asyncio.run(untrained_transitions(settings, 1)) == sum(training[10:])
    asyncio.run(commit(30))
    assert asyncio.run(untrained_transitions(settings, 1)) == 0
