"""The broker-outage log filter: aiokafka's connection errors are logged once per node and outage, and the node's
recovery only once it answers, with the errors counted meanwhile."""

from __future__ import annotations

import logging

import pytest

import picrl.broker_outage as outage
from picrl.broker_outage import BrokerOutageFilter


def _record(name: str, message: str, *args: object, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, args, None)


def _connect(node: int, port: int) -> logging.LogRecord:
    return _record(
        "aiokafka",
        "Unable connect to node with id %s: [Errno 111] Connect call failed (%r, %d)",
        node,
        "127.0.0.1",
        port,
    )


def _fetch(node: int) -> logging.LogRecord:
    return _record(
        "aiokafka.consumer.fetcher",
        f"Failed fetch messages from {node}: NodeNotReadyError: Attempt to send a request to node which is not "
        f"ready (node id {node}).",
    )


class _Cluster:
    """Which addresses answer, and a clock."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.up: set[str] = set()
        self.now = 1000.0
        monkeypatch.setattr(outage.time, "time", lambda: self.now)

    def answers(self, address: str) -> bool:
        return address in self.up


@pytest.fixture()
def cluster(monkeypatch: pytest.MonkeyPatch) -> _Cluster:
    return _Cluster(monkeypatch)


def test_each_node_is_logged_once_per_outage_and_its_recovery_once_it_answers(
    cluster: _Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    filter_ = BrokerOutageFilter(cluster.answers, watch=False)
    cluster.up = {"127.0.0.1:9092"}
    first = _connect(1, 9091)
    assert filter_.filter(first)
    assert first.getMessage().startswith("Kafka node 1 (127.0.0.1:9091) unreachable since 00:16:40Z (Unable connect")
    assert first.getMessage().endswith("; the next errors are counted until it answers")
    passed = []
    for _ in range(144):  # what `picrl produce` repeated, and a fetcher beside it
        cluster.now += 0.1
        passed += [r for r in (_connect(1, 9091), _fetch(1)) if filter_.filter(r)]
    second = _connect(2, 9092)
    assert (
        passed == [] and filter_.filter(second) and "Kafka node 2 (127.0.0.1:9092) unreachable" in second.getMessage()
    )
    with caplog.at_level(logging.INFO, logger="picrl.kafka"):
        assert filter_.check() == [
            "Kafka node 2 (127.0.0.1:9092) answered again after 0 s (unreachable since 00:16:54Z; 0 more connection "
            "errors about it were not logged)"
        ]  # node 1 does not answer: no line about it, however long its errors have stopped
        cluster.now += 60
        assert filter_.check() == []
        cluster.up.add("127.0.0.1:9091")
        assert filter_.check() == [
            "Kafka node 1 (127.0.0.1:9091) answered again after 74 s (unreachable since 00:16:40Z; 288 more "
            "connection errors about it were not logged)"
        ]
    assert [r.getMessage() for r in caplog.records if r.name == "picrl.kafka"] == [
        "Kafka node 2 (127.0.0.1:9092) answered again after 0 s (unreachable since 00:16:54Z; 0 more connection "
        "errors about it were not logged)",
        "Kafka node 1 (127.0.0.1:9091) answered again after 74 s (unreachable since 00:16:40Z; 288 more connection "
        "errors about it were not logged)",
    ]
    again = _connect(1, 9091)  # a new outage of node 1: logged once more
    assert filter_.filter(again) and "Kafka node 1 (127.0.0.1:9091) unreachable" in again.getMessage()


def test_errors_that_cannot_be_probed_are_closed_with_a_count_once_they_stop(cluster: _Cluster) -> None:
    filter_ = BrokerOutageFilter(cluster.answers, watch=False)
    produce = "Got error produce response on topic-partition %s, retrying. Error: %s"
    records = [
        _record("aiokafka.producer.sender", produce, "TopicPartition(topic='t', partition=1)", "NotEnoughReplicasError")
        for _ in range(5)
    ]
    assert filter_.filter(records[0]) and not any(filter_.filter(r) for r in records[1:])
    first = records[0].getMessage()
    assert first.startswith("produce requests refused with NotEnoughReplicasError since 00:16:40Z")
    assert "a transactional write it cannot verify yet" in first and "on one node only the second" in first
    fetch = _fetch(3)  # no line named node 3's address: it cannot be asked
    assert filter_.filter(fetch) and fetch.getMessage().startswith("Kafka node 3 unreachable since 00:16:40Z")
    assert fetch.getMessage().endswith("; the next errors are counted until they stop")
    cluster.now += outage.QUIET - 1
    assert filter_.check() == []
    cluster.now += 1
    assert filter_.check() == [
        "produce requests refused with NotEnoughReplicasError: no more errors since 00:16:40Z (the first at "
        "00:16:40Z; 4 more were not logged)",
        "Kafka node 3: no more errors since 00:16:40Z (the first at 00:16:40Z; 0 more were not logged)",
    ]


def test_a_node_named_later_is_probed_at_its_address(cluster: _Cluster) -> None:
    filter_ = BrokerOutageFilter(cluster.answers, watch=False)
    assert filter_.filter(_fetch(1))
    assert not filter_.filter(_connect(1, 9091))  # counted, and its address learnt
    cluster.now += 2 * outage.QUIET
    assert filter_.check() == []  # it does not answer: still away
    cluster.up = {"127.0.0.1:9091"}
    assert filter_.check()[0].startswith("Kafka node 1 (127.0.0.1:9091) answered again after 20 s")


def test_other_records_pass_unchanged() -> None:
    filter_ = BrokerOutageFilter(lambda _: True, watch=False)
    record = _record("aiokafka", "Topic %s not found in cluster metadata", "x", level=logging.WARNING)
    assert filter_.filter(record) and record.getMessage() == "Topic x not found in cluster metadata"
    mine = _record("picrl.worker", "Unable connect to node with id 1: %s", "mine", level=logging.INFO)
    assert filter_.filter(mine) and mine.getMessage() == "Unable connect to node with id 1: mine"
