"""picrl's topics on the real broker: created with their partitions, retention and compaction."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import NodeNotReadyError

from picrl.cli import main
from picrl.settings import SettingsError, load_settings
from stream.topics import (
    Replication,
    TopicMismatchError,
    cluster_brokers,
    ensure_topics,
    live_brokers,
    read_partition,
    topic_specs,
)
from tests.support.kafka import create_topics


async def _describe(bootstrap: str, names: list[str]) -> tuple[dict[str, int], dict[str, dict[str, str]]]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        partitions = {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(names)}
        responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, n) for n in names])
        configs = {
            resource[3]: {entry[0]: entry[1] for entry in resource[4]}
            for response in responses
            for resource in response.resources
        }
    finally:
        await admin.close()
    return partitions, configs


def test_topics_get_partitions_retention_and_compaction(
    kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = f"t{uuid.uuid4().hex[:8]}"
    assert main(["topics", "create", "--bootstrap", kafka_bootstrap, "--prefix", prefix, "--partitions", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("created") == 5
    expected = Replication.for_brokers(asyncio.run(cluster_brokers(kafka_bootstrap)))
    assert out.count(f"replicas={expected.factor}  min.insync.replicas={expected.min_insync}") == 5
    names = [s.name for s in topic_specs(prefix, 3)]
    partitions, configs = asyncio.run(_describe(kafka_bootstrap, names))
    assert partitions == {
        f"{prefix}.usage": 3,
        f"{prefix}.actions": 3,
        f"{prefix}.replay": 3,
        f"{prefix}.policy": 1,
        f"{prefix}.deadletter": 3,
    }
    assert configs[f"{prefix}.policy"]["cleanup.policy"] == "compact"
    assert configs[f"{prefix}.replay"]["cleanup.policy"] == "delete"
    assert configs[f"{prefix}.replay"]["retention.bytes"] == str(256 << 20)
    assert configs[f"{prefix}.deadletter"]["retention.ms"] == str(14 * 86_400_000)
    assert {configs[name]["min.insync.replicas"] for name in names} == {str(expected.min_insync)}

    assert main(["topics", "create", "--bootstrap", kafka_bootstrap, "--prefix", prefix, "--partitions", "3"]) == 0
    assert capsys.readouterr().out.count("exists") == 5
    with pytest.raises(TopicMismatchError, match=rf"{prefix}\.usage exists with 3 partition\(s\) but picrl needs 6"):
        asyncio.run(ensure_topics(kafka_bootstrap, topic_specs(prefix, 6)))


def test_replication_follows_the_brokers_unless_set() -> None:
    assert [Replication.for_brokers(n) for n in (1, 2, 3, 5)] == [
        Replication(1, 1),
        Replication(2, 1),
        Replication(3, 2),
        Replication(3, 2),
    ]
    assert Replication.for_brokers(5, factor=5) == Replication(5, 4)
    assert Replication.for_brokers(3, min_insync=3) == Replication(3, 3)
    assert Replication(3, 2).config == {"min.insync.replicas": "2"}
    with pytest.raises(ValueError, match="min.insync.replicas from 1 to the factor"):
        Replication.for_brokers(1, min_insync=2)
    settings = load_settings(None, {"replication_factor": 2}, {"PICRL_MIN_INSYNC_REPLICAS": "3"})
    with pytest.raises(SettingsError, match="replication_factor \\(from flag\\) and min_insync_replicas \\(from env"):
        settings.replication(3)


def test_more_replicas_than_brokers_is_a_clear_error(kafka_bootstrap: str) -> None:
    brokers = asyncio.run(cluster_brokers(kafka_bootstrap))
    specs = topic_specs(f"t{uuid.uuid4().hex[:8]}", 1)
    with pytest.raises(TopicMismatchError, match=f"replication factor {brokers + 1}: the cluster has {brokers} live"):
        asyncio.run(ensure_topics(kafka_bootstrap, specs, Replication(brokers + 1, 1)))


def test_no_broker_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PICRL_KAFKA_HOME", str(tmp_path))
    assert main(["topics", "create"]) == 2
    assert "no local broker is running: start one with `picrl kafka start`" in capsys.readouterr().err


def test_partitions_must_be_positive() -> None:
    with pytest.raises(ValueError, match="partitions must be >= 1"):
        topic_specs("x", 0)


def test_read_partition_reads_from_its_start_committed_records_only(kafka_bootstrap: str) -> None:
    """The worker reads a partition's rows again with this (``ServiceStateTable.reload``): every key's last
    committed value, none of an aborted transaction's. It used to read nothing at all: its reset to the start
    came after the assignment's own reset to the end."""
    topic = f"latest-{uuid.uuid4().hex[:8]}"

    async def write() -> None:
        await create_topics(kafka_bootstrap, {topic: 2})
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=topic)
        await producer.start()
        try:
            async with producer.transaction():
                for key, value in [(b"a", b"1"), (b"b", b"1"), (b"a", b"2")]:
                    await producer.send(topic, value, key=key, partition=0)
            await producer.begin_transaction()
            await producer.send(topic, b"aborted", key=b"b", partition=0)
            await producer.send(topic, b"aborted", key=b"c", partition=0)
            await producer.abort_transaction()
            async with producer.transaction():
                await producer.send(topic, b"elsewhere", key=b"d", partition=1)
        finally:
            await producer.stop()

    asyncio.run(write())
    assert asyncio.run(read_partition(kafka_bootstrap, topic, 0))[0] == {b"a": b"2", b"b": b"1"}


class _AdminWithADeadNode:
    """An admin client whose first ``dead`` DescribeCluster requests go to a node killed a moment ago."""

    def __init__(self, dead: int) -> None:
        self.dead, self.asked = dead, 0

    async def describe_cluster(self) -> dict:
        self.asked += 1
        if self.asked <= self.dead:
            raise NodeNotReadyError("Attempt to send a request to node which is not ready (node id 1).")
        return {"brokers": [{"node_id": 2}, {"node_id": 3}]}


def test_counting_brokers_asks_another_node_when_a_dead_one_is_picked() -> None:
    admin = _AdminWithADeadNode(dead=2)
    assert asyncio.run(live_brokers(admin)) == 2 and admin.asked == 3  # type: ignore[arg-type]
    with pytest.raises(NodeNotReadyError):
        asyncio.run(live_brokers(_AdminWithADeadNode(dead=5)))  # type: ignore[arg-type]
