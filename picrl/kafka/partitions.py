"""Who leads each partition of a cluster, and which partitions are short of in-sync replicas (``picrl kafka
status``)."""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient

NO_LEADER = -1


@dataclass(frozen=True, order=True)
class PartitionState:
    """One partition as the cluster's metadata describes it."""

    topic: str
    partition: int
    leader: int  # NO_LEADER while none is elected
    replicas: tuple[int, ...]
    isr: tuple[int, ...]

    @property
    def under_replicated(self) -> bool:
        return len(self.isr) < len(self.replicas)

    def as_dict(self) -> dict:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "leader": self.leader,
            "replicas": list(self.replicas),
            "isr": list(self.isr),
        }


async def describe_partitions(bootstrap: str, timeout: float = 10.0) -> list[PartitionState]:
    """Every partition of every topic (internal ones included) of the cluster at ``bootstrap``; ``TimeoutError``
    when it does not answer within ``timeout`` seconds."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="picrl-status", request_timeout_ms=5_000)

    async def describe() -> list[PartitionState]:
        await admin.start()
        described = await admin.describe_topics(await admin.list_topics())
        return sorted(
            PartitionState(t["topic"], p["partition"], p["leader"], tuple(p["replicas"]), tuple(p["isr"]))
            for t in described
            for p in t["partitions"]
        )

    try:
        return await asyncio.wait_for(describe(), timeout)
    finally:
        await admin.close()


def leaders(partitions: list[PartitionState]) -> Counter[int]:
    """How many partitions each node leads (:data:`NO_LEADER`: those without a leader)."""
    return Counter(p.leader for p in partitions)


def partition_lines(partitions: list[PartitionState]) -> list[str]:
    """The partitions' summary as ``picrl kafka status`` prints it: a count, those without a leader and those
    under-replicated, one line each."""
    short = [p for p in partitions if p.leader == NO_LEADER or p.under_replicated]
    led = leaders(partitions)
    lines = [
        f"partitions: {len(partitions)} in {len({p.topic for p in partitions})} topic(s), {led[NO_LEADER]} without a "
        f"leader, {sum(p.under_replicated for p in partitions)} under-replicated"
    ]
    lines += [
        f"  {p.topic}[{p.partition}]: "
        + ("no leader" if p.leader == NO_LEADER else f"leader node {p.leader}")
        + f", in sync {list(p.isr)} of replicas {list(p.replicas)}"
        for p in short
    ]
    return lines
