"""The producers on the real broker: open-loop replay telemetry, and the workloads they play."""
from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from picrl.cli import main
from picrl.datasets import Trace, load_pod_fleet
from producers.workload import copies_of, fleet_of
from stream.records import decode_usage
from stream.topics import TopicNames, ensure_topics, topic_specs
from tests.support.kafka import consume, unique


def test_copies_are_shifted_and_scaled_and_service_zero_is_the_trace(native_trace: Trace) -> None:
    workload = copies_of(native_trace, 5, 100, start=200, seed=1)
    assert workload.demand.shape == (100, 5) and workload.context is not None and workload.context.shape == (100, 5, 1)
    np.testing.assert_array_equal(workload.demand[:, 0], native_trace.values[200:300])
    assert len(set(workload.services)) == 5
    assert not np.allclose(workload.demand[:, 1] / workload.demand[:, 0], 1.0)
    with pytest.raises(ValueError, match="--ticks"):
        copies_of(native_trace, 2, 10_000)


def test_pod_fleet_gives_each_service_its_own_series() -> None:
    fleet = load_pod_fleet()
    workload = fleet_of(fleet, 3, 50)
    assert workload.services == tuple(t.name for t in fleet[:3]) and workload.unit == "bytes"
    with pytest.raises(ValueError, match="exceeds the 91"):
        fleet_of(fleet, 92, 50)


def test_replay_sends_every_tick_of_every_service_at_the_asked_rate(kafka_bootstrap: str, tmp_path) -> None:
    prefix = unique("replay")
    asyncio.run(ensure_topics(kafka_bootstrap, topic_specs(prefix, 2)))
    started = time.monotonic()
    code = main(["produce", "replay", "--dataset", "genai-mem", "--services", "3", "--ticks", "20", "--rate", "200",
                 "--capacity-headroom", "0.8", "--bootstrap", kafka_bootstrap, "--prefix", prefix])
    seconds = time.monotonic() - started
    assert code == 0
    events = [decode_usage(m.value) for m in asyncio.run(consume(kafka_bootstrap, TopicNames(prefix).usage, 60))]
    assert len(events) == 60 and seconds >= 60 / 200 * 0.8  # paced to the rate
    by_service: dict[str, list] = {}
    for event in events:
        by_service.setdefault(event.service, []).append(event)
    assert len(by_service) == 3
    for service_events in by_service.values():
        assert [e.tick for e in service_events] == list(range(20))
        capacity = {e.capacity for e in service_events}
        assert len(capacity) == 1  # a static allocation
        assert any(e.censored for e in service_events)  # 0.8 x peak censors the peaks
        assert all(e.usage <= e.capacity for e in service_events)
