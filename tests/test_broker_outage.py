"""The broker-outage log filter: aiokafka's connection errors become a first line, counts and an end line."""

from __future__ import annotations

import logging
import re

import pytest

import picrl.broker_outage as outage
from picrl.broker_outage import BrokerOutageFilter


def _record(name: str, message: str, *args: object, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, args, None)


def test_an_outage_is_one_line_then_counts_then_an_end_line(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(outage.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(outage.time, "time", lambda: clock[0])
    filter_ = BrokerOutageFilter()
    connect = _record(
        "aiokafka", "Unable connect to node with id 1: [Errno 111] Connect call failed (%r, %d)", "127.0.0.1", 9092
    )
    assert filter_.filter(connect)
    assert connect.getMessage().startswith("Kafka broker 127.0.0.1:9092 unreachable since 00:16:40Z (Unable connect")
    passed = []
    for _ in range(604):  # 60 s of errors, 10 a second, from several clients
        clock[0] += 0.1
        record = _record("aiokafka.consumer.fetcher", "Failed fetch messages from 1: NodeNotReadyError: ...")
        if filter_.filter(record):
            passed.append(record.getMessage())
    assert len(passed) == 2 and all("still unreachable since 00:16:40Z" in line for line in passed), passed
    assert re.search(r": 30\d connection errors in the last 30 s$", passed[0]), passed[0]
    unrelated = _record("picrl.worker", "decided %d", 3, level=logging.INFO)
    assert filter_.filter(unrelated) and unrelated.getMessage() == "decided 3"  # during the outage: untouched
    clock[0] += outage.QUIET + 1
    after = _record(
        "aiokafka.consumer.group_coordinator",
        "Heartbeat failed for group g because it is rebalancing",
        level=logging.WARNING,
    )
    assert filter_.filter(after)
    assert after.getMessage().startswith("Kafka broker 127.0.0.1:9092 answered again after 60 s")
    assert after.getMessage().endswith("Heartbeat failed for group g because it is rebalancing")


def test_other_records_pass_unchanged() -> None:
    filter_ = BrokerOutageFilter()
    record = _record("aiokafka", "Topic %s not found in cluster metadata", "x", level=logging.WARNING)
    assert filter_.filter(record) and record.getMessage() == "Topic x not found in cluster metadata"
