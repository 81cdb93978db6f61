"""The worker's web endpoints (Faust web server, ``--web-port``).

    GET /healthz            200 once the worker follows the policy topic and is assigned partitions, else 503
    GET /metrics            Prometheus exposition of :class:`stream.metrics.WorkerMetrics`
    GET /services/<id>      the service's state (range, calibrator, streaks, pending decision) and its last
                            decisions with their breakdown; 404 when this worker does not hold the service

Each path answers with and without a trailing slash: Prometheus scrapes ``/metrics`` by default, and
aiohttp (Faust's web driver) matches paths exactly.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from stream.metrics import IN_STREAK

if TYPE_CHECKING:
    from stream.worker import StreamWorker


def service_view(worker: "StreamWorker", service: str) -> dict[str, Any] | None:
    """What ``GET /services/<id>`` returns (None when the service is not held by this worker); a service
    provisioned several resources shows each resource's row under ``resources``."""
    raw = worker.states.get(service.encode())
    if raw is None:
        return None
    engine = worker.engine
    rows = engine.decode_row(raw)
    state: dict[str, Any] = {"service": service}
    if engine.resources:
        state["resources"] = {r.name: _row_view(row, engine.window) for r, row in zip(engine.resources, rows)}
    else:
        state.update(_row_view(rows[0], engine.window))
    state["last_decisions"] = [action.to_dict() for action in worker.recent.get(service, ())]
    return state


def _row_view(row: Any, window: int) -> dict[str, Any]:
    """One controller row: warm-up progress, or its range, calibrator, streaks and pending decision."""
    core = row["core"]
    warming = int(row["warm_count"]) < window
    state: dict[str, Any] = {
        "phase": "warmup" if warming else "control", "next_tick": int(row["expected_tick"]),
        "capacity": float(row["capacity"]), "policy_version": int(row["policy_version"]),
    }
    if warming:
        state["warmup_ticks_seen"] = int(row["warm_count"])
    else:
        state.update({
            "range": [float(row["low"]), float(row["high"])], "capacity_norm": float(core["action"]),
            "mu": float(core["mu"]), "sigma": float(core["sigma"]), "k": float(core["k"]), "eta": float(core["eta"]),
            "k_sigma": float(core["k"] * core["sigma"]), "margin": float(core["margin"]), "bias": float(core["bias"]),
            "escape": float(core["escape"]), "censor_streak": int(core["censor_streak"]),
            "over_streak": int(core["over_streak"]),
            "in_censoring_streak": int(core["censor_streak"]) >= IN_STREAK,
        })
    return state


def _page(app: Any, path: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``app.page`` for ``path`` both without and with its trailing slash."""
    def register(handler: Callable[..., Any]) -> Callable[..., Any]:
        app.page(path, name=handler.__name__)(handler)
        app.page(path + "/", name=handler.__name__ + "_slash")(handler)
        return handler
    return register


def add_views(worker: "StreamWorker") -> None:
    app = worker.app

    @_page(app, "/healthz")
    async def healthz(self: Any, request: Any) -> Any:
        ready = worker.follower.ready.is_set() and bool(app.consumer.assignment())
        body = {"status": "ok" if ready else "starting", "policy_version": worker.engine.policy_version,
                "services": worker.states.services(), "partitions": sorted(worker.usage_partitions())}
        return self.json(body, status=200 if ready else 503)

    @_page(app, "/metrics")
    async def metrics(self: Any, request: Any) -> Any:
        # aiohttp wants the charset out of content_type ("text/plain; version=0.0.4; charset=utf-8")
        content_type = "; ".join(p for p in CONTENT_TYPE_LATEST.split("; ") if not p.startswith("charset"))
        return self.bytes(generate_latest(worker.metrics.registry), content_type=content_type)

    @_page(app, "/services/{service}")
    async def services(self: Any, request: Any, service: str) -> Any:
        view = service_view(worker, service)
        if view is None:
            return self.json({"error": f"service {service!r} is not held by this worker (another worker may own "
                                       "its partition, or it has sent no usage yet)"}, status=404)
        return self.json(view)
