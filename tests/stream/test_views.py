"""The worker's web endpoints: every path answers with and without a trailing slash (Prometheus scrapes
``/metrics``), and the views read only a :class:`stream.views.StatusSource`, which the worker implements."""

from __future__ import annotations

import asyncio
from typing import Any

import faust
import orjson
import pytest
from aiohttp.test_utils import make_mocked_request

from picrl_core.artifact import ModelArtifact
from stream.decisions import DecisionEngine, Incoming
from stream.metrics import WorkerMetrics
from stream.records import UsageEvent
from stream.views import Health, StatusSource, add_views, service_view
from stream.worker import StreamWorker, WorkerSettings
from tests.stream.conftest import WINDOW


@pytest.mark.parametrize(
    "path", ["/healthz", "/healthz/", "/metrics", "/metrics/", "/services/web-1", "/services/web-1/"]
)
def test_every_view_is_routed_with_and_without_the_trailing_slash(tiny_artifact: ModelArtifact, path: str) -> None:
    worker = StreamWorker(WorkerSettings(bootstrap="127.0.0.1:9", web_port=6066), tiny_artifact)  # never started
    router = worker.app.web.web_app.router
    match = asyncio.run(router.resolve(make_mocked_request("GET", path)))
    assert match.http_exception is None, f"{path}: {match.http_exception}"
    assert match.route.resource.canonical == path.replace("web-1", "{service}")


class Status:
    """A status source that is not a worker: one service's row, readiness set by the test."""

    def __init__(self, engine: DecisionEngine, rows: dict[str, bytes]) -> None:
        self.engine, self.rows, self.ready = engine, rows, False
        self.metrics = WorkerMetrics(lambda: {0})

    def health(self) -> Health:
        return Health(self.ready, 4, len(self.rows), [0, 3])

    def explain(self, service: str) -> dict[str, Any] | None:
        raw = self.rows.get(service)
        return None if raw is None else service_view(self.engine, service, raw, [])


def _get(app: faust.App, path: str) -> tuple[int, bytes]:
    async def get() -> tuple[int, bytes]:
        match = await app.web.web_app.router.resolve(make_mocked_request("GET", path))
        response = await match.handler(make_mocked_request("GET", path, match_info=match))
        return response.status, response.body

    return asyncio.run(get())


def test_the_views_serve_any_status_source(tiny_artifact: ModelArtifact) -> None:
    engine = DecisionEngine(tiny_artifact)
    warm = [Incoming(UsageEvent("web-1", t, 4.0 + t % 3, False, 10.0), 0, t) for t in range(WINDOW)]
    status = Status(engine, engine.process(warm, {"web-1": None}).rows)
    source: StatusSource = status
    app = faust.App("views-test", broker="kafka://127.0.0.1:9", web_port=6067, store="memory://")
    add_views(app, source)
    code, body = _get(app, "/healthz")
    assert code == 503 and orjson.loads(body) == {
        "status": "starting",
        "policy_version": 4,
        "services": 1,
        "partitions": [0, 3],
    }
    status.ready = True
    assert _get(app, "/healthz/")[0] == 200
    code, body = _get(app, "/services/web-1")
    view = orjson.loads(body)
    assert code == 200 and (view["service"], view["phase"], view["next_tick"]) == ("web-1", "control", WINDOW)
    assert view["last_decisions"] == []
    assert _get(app, "/services/web-2")[0] == 404
    status.metrics.events.inc(7)
    code, body = _get(app, "/metrics/")
    assert code == 200 and b"picrl_events_total 7.0" in body


def test_a_worker_explains_only_the_services_it_holds(tiny_artifact: ModelArtifact) -> None:
    worker = StreamWorker(WorkerSettings(bootstrap="127.0.0.1:9", web_port=6066), tiny_artifact)  # never started
    source: StatusSource = worker
    assert source.explain("web-1") is None
