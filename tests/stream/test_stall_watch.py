"""A usage partition with records waiting and nothing committed for ``stall_timeout`` seconds makes its worker
rejoin the group (stream/stall_watch.py, ``StreamWorker._watch_for_stalls``)."""
from __future__ import annotations

import asyncio

import pytest
from faust.types import TP

from picrl_core.artifact import ModelArtifact
from stream.stall_watch import StallWatch
from stream.worker import StreamWorker, WorkerSettings


def test_a_partition_stalls_once_its_committed_offset_stays_below_its_end_for_the_timeout() -> None:
    watch = StallWatch(timeout=30.0)
    assert watch.stalled({0, 1}, {0: 5, 1: 7}, {0: 9, 1: 9}, now=0.0) == []
    assert watch.stalled({0, 1}, {0: 5, 1: 8}, {0: 9, 1: 9}, now=29.0) == []  # 1 committed: its clock restarts
    assert watch.stalled({0, 1}, {0: 5, 1: 8}, {0: 9, 1: 9}, now=30.0) == [0]
    assert watch.stalled({0, 1}, {0: 5, 1: 8}, {0: 9, 1: 9}, now=59.0) == [0, 1]


def test_a_partition_with_nothing_waiting_or_no_longer_watched_never_stalls() -> None:
    watch = StallWatch(timeout=30.0)
    watch.stalled({0, 1}, {0: 9}, {0: 9, 1: 4}, now=0.0)  # 0: all committed; 1: nothing committed yet, 4 waiting
    assert watch.stalled({0, 1}, {0: 9}, {0: 9, 1: 4}, now=40.0) == [1]
    assert watch.stalled({0}, {0: 9}, {0: 9, 1: 4}, now=41.0) == []  # 1 moved to another worker
    assert watch.stalled({0, 1}, {0: 9}, {0: 9, 1: 4}, now=42.0) == []  # back: its clock starts again
    watch.reset()
    assert watch.stalled({0, 1}, {0: 9}, {0: 9, 1: 4}, now=100.0) == []


class _Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def stalled_worker(tiny_artifact: ModelArtifact, monkeypatch: pytest.MonkeyPatch) -> tuple[StreamWorker, list, _Clock]:
    """A worker (no broker) that owns usage partitions 0 and 1, whose group committed 5 and 7 of 9 records each
    and never more; ``rejoins`` collects its rejoin requests."""
    worker = StreamWorker(WorkerSettings(bootstrap="127.0.0.1:9", app_id="stall-worker", partitions=2,
                                         stall_timeout=30.0), tiny_artifact)
    consumer, rejoins, clock = worker.app.consumer, [], _Clock()

    async def committed() -> dict[int, int]:
        return {0: 5, 1: 7}

    async def highwaters(*tps: TP) -> dict[TP, int]:
        return {tp: 9 for tp in tps}

    monkeypatch.setattr(worker, "usage_partitions", lambda: {0, 1})
    monkeypatch.setattr(worker, "_committed", committed)
    monkeypatch.setattr(consumer, "highwaters", highwaters)
    monkeypatch.setattr(consumer, "rejoin", lambda: rejoins.append(clock.now))
    monkeypatch.setattr("stream.worker.time.monotonic", clock)
    return worker, rejoins, clock


def _watch_at(worker: StreamWorker, clock: _Clock, *times: float) -> None:
    for t in times:
        clock.now = t
        asyncio.run(worker._watch_for_stalls())


def test_a_stalled_worker_rejoins_its_group_once_per_stall_and_counts_it(
        stalled_worker: tuple[StreamWorker, list, _Clock]) -> None:
    worker, rejoins, clock = stalled_worker
    _watch_at(worker, clock, 0.0, 10.0, 20.0, 29.0)
    assert rejoins == []
    _watch_at(worker, clock, 30.0, 40.0, 50.0, 69.0)
    assert rejoins == [30.0]  # after a rejoin the clock starts again at the next look (40 s)
    _watch_at(worker, clock, 70.0)
    assert rejoins == [30.0, 70.0]
    assert worker.metrics.stall_rejoins._value.get() == 2


def test_held_partitions_and_rebalances_do_not_count_as_stalls(
        stalled_worker: tuple[StreamWorker, list, _Clock]) -> None:
    worker, rejoins, clock = stalled_worker
    consumer = worker.app.consumer
    consumer.held = frozenset({TP(worker.topics.usage, 0), TP(worker.topics.usage, 1)})  # rows not restored
    _watch_at(worker, clock, 0.0, 30.0, 60.0)
    assert rejoins == []
    consumer.held = frozenset()
    worker.app.rebalancing = True
    _watch_at(worker, clock, 70.0, 100.0, 130.0)
    assert rejoins == []
    worker.app.rebalancing = False
    _watch_at(worker, clock, 140.0, 169.0)
    assert rejoins == []  # the rebalance restarted the clock
    _watch_at(worker, clock, 170.0)
    assert rejoins == [170.0]


def test_the_stall_timeout_is_checked() -> None:
    with pytest.raises(ValueError, match="stall_timeout"):
        WorkerSettings(bootstrap="127.0.0.1:9", stall_timeout=-1.0)
