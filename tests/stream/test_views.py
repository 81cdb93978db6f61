"""The worker's web endpoints answer with and without a trailing slash (Prometheus scrapes ``/metrics``)."""
from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import make_mocked_request

from picrl_core.artifact import ModelArtifact
from stream.worker import StreamWorker, WorkerSettings


@pytest.mark.parametrize("path", ["/healthz", "/healthz/", "/metrics", "/metrics/", "/services/web-1",
                                  "/services/web-1/"])
def test_every_view_is_routed_with_and_without_the_trailing_slash(tiny_artifact: ModelArtifact, path: str) -> None:
    worker = StreamWorker(WorkerSettings(bootstrap="127.0.0.1:9", web_port=6066), tiny_artifact)  # never started
    router = worker.app.web.web_app.router
    match = asyncio.run(router.resolve(make_mocked_request("GET", path)))
    assert match.http_exception is None, f"{path}: {match.http_exception}"
    assert match.route.resource.canonical == path.replace("web-1", "{service}")
