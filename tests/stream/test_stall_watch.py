"""A usage partition with records waiting and nothing committed for ``stall_timeout`` seconds makes its worker
rejoin the group (stream/stall_watch.py), and a held partition is released once its rows are back
(``RebalanceGuard.watch_partitions``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest
from faust.types import TP

from picrl_core.artifact import ModelArtifact
from stream.stall_watch import StallWatch
from stream.state_table import WATERMARK_KEY
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


@dataclass
class Watched:
    """A worker (no broker) that owns usage partitions 0 and 1, whose group committed 5 and 7 of 9 records each
    and never more; what it asks of its consumer and its table is recorded."""

    worker: StreamWorker
    clock: _Clock
    rejoins: list[float] = field(default_factory=list)
    reloads: list[int] = field(default_factory=list)
    resumed: list[int] = field(default_factory=list)

    def watch_at(self, *times: float) -> None:
        for t in times:
            self.clock.now = t
            asyncio.run(self.worker.guard.watch_partitions())

    def hold(self, *partitions: int) -> None:
        self.worker.app.consumer.held = frozenset(TP(self.worker.topics.usage, p) for p in partitions)

    def held(self) -> set[int]:
        return {tp.partition for tp in self.worker.app.consumer.held}


@pytest.fixture()
def watched(tiny_artifact: ModelArtifact, monkeypatch: pytest.MonkeyPatch) -> Watched:
    worker = StreamWorker(
        WorkerSettings(bootstrap="127.0.0.1:9", app_id="stall-worker", partitions=2, stall_timeout=30.0), tiny_artifact
    )
    consumer, w = worker.app.consumer, Watched(worker, _Clock())

    async def committed() -> dict[int, int]:
        return {0: 5, 1: 7}

    async def highwaters(*tps: TP) -> dict[TP, int]:
        return {tp: 9 for tp in tps}

    async def reload(partition: int) -> int:
        w.reloads.append(partition)
        return 0

    monkeypatch.setattr(worker.guard, "assigned", lambda: {0, 1})
    monkeypatch.setattr(worker.guard, "committed", committed)
    monkeypatch.setattr(worker.states, "reload", reload)
    monkeypatch.setattr(consumer, "highwaters", highwaters)
    monkeypatch.setattr(consumer, "rejoin", lambda: w.rejoins.append(w.clock.now))
    monkeypatch.setattr(consumer, "pause_partitions", lambda tps: None)
    monkeypatch.setattr(consumer, "resume_partitions", lambda tps: w.resumed.extend(tp.partition for tp in tps))
    monkeypatch.setattr("stream.rebalance_guard.time.monotonic", w.clock)
    return w


def test_a_stalled_worker_rejoins_its_group_once_per_stall_and_counts_it(watched: Watched) -> None:
    watched.watch_at(0.0, 10.0, 20.0, 29.0)
    assert watched.rejoins == []
    watched.watch_at(30.0, 40.0, 50.0, 69.0)
    assert watched.rejoins == [30.0]  # after a rejoin the clock starts again at the next look (40 s)
    watched.watch_at(70.0)
    assert watched.rejoins == [30.0, 70.0]
    assert watched.worker.metrics.stall_rejoins._value.get() == 2


def test_held_partitions_and_rebalances_do_not_count_as_stalls(watched: Watched) -> None:
    watched.hold(0, 1)  # rows not restored
    watched.watch_at(0.0, 30.0, 60.0)
    assert watched.rejoins == [] and watched.reloads == [0, 1] * 3  # their rows read again each round
    watched.hold()
    watched.worker.app.rebalancing = True
    watched.watch_at(70.0, 100.0, 130.0)
    assert watched.rejoins == []
    watched.worker.app.rebalancing = False
    watched.watch_at(140.0, 169.0)
    assert watched.rejoins == []  # the rebalance restarted the clock
    watched.watch_at(170.0)
    assert watched.rejoins == [170.0]


def test_a_held_partition_is_released_once_its_rows_reach_the_committed_offset(watched: Watched) -> None:
    states, metrics = watched.worker.states, watched.worker.metrics
    watched.hold(0, 1)
    metrics.state_missing.labels("0").set(1)
    metrics.state_missing.labels("1").set(1)
    watched.watch_at(0.0)
    assert watched.held() == {0, 1} and watched.resumed == []
    states.data[WATERMARK_KEY + b"0"] = b"5"  # partition 0's rows are back in the changelog, up to offset 5
    watched.watch_at(1.0)
    assert watched.held() == {1} and watched.resumed == [0]
    assert metrics.state_missing.labels("0")._value.get() == 0 and metrics.state_missing.labels("1")._value.get() == 1


def test_the_stall_timeout_is_checked() -> None:
    with pytest.raises(ValueError, match="stall_timeout"):
        WorkerSettings(bootstrap="127.0.0.1:9", stall_timeout=-1.0)
