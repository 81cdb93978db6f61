"""The censoring-streak gauges cover every service a worker holds, not only the last batch's."""

from __future__ import annotations

from prometheus_client import generate_latest

from stream.metrics import WorkerMetrics
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
