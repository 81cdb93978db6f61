"""The censoring-streak gauges cover every service a worker holds, not only the last batch's; the decided-capacity
gauge is capped and follows the partitions held; skipped ticks are counted and logged sparingly."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import generate_latest

import stream.observer as observer_module
from stream.metrics import WorkerMetrics
from stream.observer import BatchObserver
from stream.records import Action, ResourceAction, ResourceDecision
from tests.support.web import metric


def test_streak_gauges_keep_services_absent_from_the_last_batches() -> None:
    held = {0, 1}
    metrics = WorkerMetrics(lambda: held)
    metrics.streaks.update("long-short", 0, 21)  # in a streak, then silent for a few batches
    for batch in range(5):
        metrics.streaks.update("fine", 1, 0)
        metrics.streaks.update("short-now", 1, batch)

    def scrape() -> str:
        return generate_latest(metrics.registry).decode()

    assert metric(scrape(), "picrl_censor_streak_max") == 21
    assert metric(scrape(), "picrl_services_in_censor_streak") == 2  # long-short (21) and short-now (4)
    metrics.streaks.update("long-short", 0, 0)  # provisioned enough again
    assert metric(scrape(), "picrl_censor_streak_max") == 4
    metrics.streaks.update("long-short", 0, 30)
    held.discard(0)  # its partition moved to another worker, which reports it from now on
    assert metric(scrape(), "picrl_censor_streak_max") == 4
    assert metric(scrape(), "picrl_services_in_censor_streak") == 1


def _action(service: str, capacity: float) -> Action:
    return Action(service, 1, capacity, 0.5, 0, 0, 0, 0, 0, 0, 0, 0, False, 0, 0)


def test_the_decided_capacity_gauge_is_opt_in_capped_and_follows_the_partitions_held() -> None:
    assert WorkerMetrics(lambda: {0}).decided is None  # off by default: no label per service
    held = {0, 1}
    metrics = WorkerMetrics(lambda: held, capacity_gauge=2)
    assert metrics.decided is not None
    metrics.decided.update(_action("a", 10.0), 0)
    metrics.decided.update(_action("a", 12.0), 0)  # the newest action
    decision = ResourceDecision(7.0, 0.5, 0, 0, 0, 0, 0, 0, 0)
    metrics.decided.update(ResourceAction("b", 1, {"gpu_mem": decision}, 0, False, 0, 0), 1)
    metrics.decided.update(_action("c", 5.0), 1)  # beyond the cap of 2

    def scrape() -> str:
        return generate_latest(metrics.registry).decode()

    assert metric(scrape(), "picrl_decided_capacity", resource="", service="a") == 12.0
    assert metric(scrape(), "picrl_decided_capacity", resource="gpu_mem", service="b") == 7.0
    assert 'service="c"' not in scrape() and metric(scrape(), "picrl_decided_capacity_beyond_cap_total") == 1
    held.discard(0)  # a's partition moved to another worker: its slot is free again
    assert 'service="a"' not in scrape()
    metrics.decided.update(_action("c", 5.0), 1)
    assert metric(scrape(), "picrl_decided_capacity", resource="", service="c") == 5.0


def test_skipped_ticks_are_all_counted_and_logged_at_most_once_a_minute(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every tick a service skips is counted; the log says so at the first gap, then at most once a minute, with
    the services and ticks since its last line."""
    observer = BatchObserver(lambda: {0})
    clock = iter([100.0, 130.0, 170.0])
    monkeypatch.setattr(observer_module.time, "monotonic", lambda: next(clock))
    with caplog.at_level(logging.WARNING, logger="picrl.worker"):
        observer.missed({"a": (5, 7)})  # 2 ticks: logged
        observer.missed({"b": (3, 4), "c": (9, 12)})  # 30 s later: counted only
        observer.missed({"a": (8, 9)})  # 70 s after the first line: logged with the counts since
    lines = [r.getMessage() for r in caplog.records if r.name == "picrl.worker"]
    assert len(lines) == 2 and "1 service(s)" in lines[0] and "2 tick(s)" in lines[0]
    assert "3 service(s)" in lines[1] and "5 tick(s)" in lines[1] and "a: tick 9, expected 8" in lines[1]
    assert metric(generate_latest(observer.metrics.registry).decode(), "picrl_missed_ticks_total") == 7
