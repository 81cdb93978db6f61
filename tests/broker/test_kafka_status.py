"""What `picrl kafka status` says about the partitions: how many each node leads, and those without a leader or
short of in-sync replicas."""

from __future__ import annotations

import pytest

from picrl.cli import main
from picrl.kafka.partitions import NO_LEADER, PartitionState, leaders, partition_lines


def test_partition_lines_name_the_leaderless_and_under_replicated_partitions() -> None:
    partitions = [
        PartitionState("picrl.usage", 0, 1, (1, 2, 3), (1, 2, 3)),
        PartitionState("picrl.usage", 1, 3, (2, 3, 1), (3, 1)),  # node 2 away
        PartitionState("__consumer_offsets", 0, NO_LEADER, (2,), (2,)),
        PartitionState("__consumer_offsets", 1, 1, (1,), (1,)),
    ]
    assert leaders(partitions) == {1: 2, 3: 1, NO_LEADER: 1}
    assert partition_lines(partitions) == [
        "partitions: 4 in 2 topic(s), 1 without a leader, 1 under-replicated",
        "  picrl.usage[1]: leader node 3, in sync [3, 1] of replicas [2, 3, 1]",
        "  __consumer_offsets[0]: no leader, in sync [2] of replicas [2]",
    ]
    assert partition_lines(partitions[:1]) == ["partitions: 1 in 1 topic(s), 0 without a leader, 0 under-replicated"]


def test_status_shows_every_node_so_node_is_for_start_and_stop(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["kafka", "status", "--node", "2"]) == 2
    assert "--node goes with start or stop" in capsys.readouterr().err
