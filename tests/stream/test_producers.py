"""The producers on the real broker: open-loop replay telemetry, and the workloads they play."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from picrl.cli import main
from picrl.datasets import Trace, load_dataset, load_pod_fleet
from picrl.reports.closed_loop import write_report
from picrl.workloads import copies_of, fleet_of, resource_fleet_of
from picrl_core.config import CostConfig
from picrl_core.costs import episode_metrics
from picrl_core.methods.coupled import resource_metrics
from picrl_core.resources import GPU_POD, killing, observe
from producers.closed_loop import ClosedLoopRecord, NoActionError, topic_partitions
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


def test_the_two_resource_fleet_gives_each_pod_its_memory_and_its_compute() -> None:
    trace = load_dataset("pods-2r")
    workload = resource_fleet_of(trace, 3, 50, start=10)
    pods = trace.values.shape[1] // 2
    assert workload.resources == GPU_POD and workload.demand.shape == (50, 6)
    np.testing.assert_array_equal(workload.demand[:, :3], trace.values[10:60, :3])  # memory block
    np.testing.assert_array_equal(workload.demand[:, 3:], trace.values[10:60, pods : pods + 3])  # compute block
    with pytest.raises(ValueError, match=f"exceeds the {pods} services"):
        resource_fleet_of(trace, pods + 1, 50)
    with pytest.raises(ValueError, match="several resources"):
        resource_fleet_of(load_dataset("genai-mem"), 1, 50)


def test_a_two_resource_report_scores_each_resource_and_draws_a_pods_resources(tmp_path) -> None:
    workload = resource_fleet_of(load_dataset("pods-2r"), 4, 80, start=100)
    capacity = np.vstack([workload.demand[:1] * 1.2, workload.demand[:-1] * 1.02])  # last tick's demand, +2%
    usage, own = np.empty_like(capacity), np.zeros(capacity.shape, bool)
    for t in range(80):  # what the closed loop observes
        y, _, flags, _ = observe(workload.demand[t].reshape(2, 4), capacity[t].reshape(2, 4), GPU_POD)
        usage[t], own[t] = y.ravel(), flags.ravel()
    control = np.ones((80, 8), bool)
    control[:8] = False
    breakdown = {name: np.zeros((80, 8)) for name in ("capacity_norm", "mu", "sigma", "k", "eta", "margin", "bias")}
    record = ClosedLoopRecord(workload, capacity, usage, own, control, np.zeros((80, 8), np.int64), breakdown)
    summary = write_report(record, tmp_path, "two resources")
    low, span = workload.demand.min(axis=0), np.ptp(workload.demand, axis=0)
    span = np.where(span > 0, span, 1.0)
    total, extra = resource_metrics(
        ((capacity - low) / span)[8:], ((workload.demand - low) / span)[8:], GPU_POD, CostConfig()
    )
    assert summary["resources"]["total_regret"] == pytest.approx(total.regret)
    assert summary["resources"]["regret_gpu_compute"] == pytest.approx(extra["regret_gpu_compute"])
    assert summary["resources"]["hard"] == ["gpu_mem"]
    n = len(workload.services)  # native units first: per resource, its own unit
    native = episode_metrics(capacity[8:, n:], workload.demand[8:, n:], CostConfig())
    assert summary["metrics_native"]["gpu_compute"]["regret"] == pytest.approx(native.regret)
    header = (tmp_path / "ticks.csv").read_text().splitlines()[0]
    assert header.endswith(",resource") and len((tmp_path / "ticks.csv").read_text().splitlines()) == 1 + 80 * 8
    assert (tmp_path / "resources.png").stat().st_size > 10_000


def test_the_closed_loop_waits_for_a_topic_created_meanwhile_and_names_one_that_never_comes(
    kafka_bootstrap: str,
) -> None:
    """A topic that reaches the answering node's metadata a moment late (a cluster's nodes learn it from the
    controller each on its own) is waited for; one that never comes is a clear error once the wait is over."""
    prefix = unique("late-topic")
    actions = TopicNames(prefix).actions

    async def run() -> tuple[list[TopicPartition], float]:
        consumer, producer = (
            AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap),
            AIOKafkaProducer(bootstrap_servers=kafka_bootstrap),
        )
        await consumer.start()
        await producer.start()
        try:
            looked_up = asyncio.ensure_future(topic_partitions(consumer, producer, actions, wait=60.0))
            await asyncio.sleep(1.0)
            assert not looked_up.done()
            await ensure_topics(kafka_bootstrap, topic_specs(prefix, 2))
            partitions = await looked_up
            started = time.monotonic()
            with pytest.raises(NoActionError, match="create the topics first"):
                await topic_partitions(consumer, producer, unique("never") + ".actions", wait=0.5)
            return partitions, time.monotonic() - started
        finally:
            await consumer.stop()
            await producer.stop()

    partitions, gave_up_after = asyncio.run(run())
    assert partitions == [TopicPartition(actions, 0), TopicPartition(actions, 1)]
    assert gave_up_after >= 0.5


def test_replay_sends_every_tick_of_every_service_at_the_asked_rate(kafka_bootstrap: str, tmp_path) -> None:
    prefix = unique("replay")
    asyncio.run(ensure_topics(kafka_bootstrap, topic_specs(prefix, 2)))
    started = time.monotonic()
    code = main(
        [
            "produce",
            "replay",
            "--dataset",
            "genai-mem",
            "--services",
            "3",
            "--ticks",
            "20",
            "--rate",
            "200",
            "--capacity-headroom",
            "0.8",
            "--bootstrap",
            kafka_bootstrap,
            "--prefix",
            prefix,
        ]
    )
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


def test_the_closed_loop_producer_plays_the_test_split_of_the_two_resource_pods() -> None:
    from argparse import Namespace

    from picrl.commands.produce import workload_from_args
    from picrl.settings import SettingsError

    args = Namespace(
        resources=("gpu_mem", "gpu_compute"), services=2, ticks=None, part="test", hard_shortage="requests"
    )
    workload = workload_from_args(args)
    trace = load_dataset("pods-2r")
    length = trace.values.shape[0]
    assert workload.resources == GPU_POD and workload.ticks == length - int(length * 0.8)
    killed = workload_from_args(Namespace(**{**vars(args), "hard_shortage": "pod"}))  # --hard-shortage pod: pods-2r-oom
    assert killed.resources == killing(GPU_POD) and np.array_equal(killed.demand, workload.demand)
    with pytest.raises(SettingsError, match="decided together"):
        workload_from_args(
            Namespace(resources=("gpu_mem",), services=2, ticks=None, part="test", hard_shortage="requests")
        )
    with pytest.raises(SettingsError, match="needs --resources"):
        workload_from_args(Namespace(resources=None, services=2, ticks=None, part="test", hard_shortage="pod"))
