"""The worker's web endpoints (Faust web server, ``--web-port``).

    GET /healthz            200 once the worker follows the policy topic and is assigned partitions, else 503
    GET /metrics            Prometheus exposition of :class:`stream.metrics.WorkerMetrics`
    GET /services/<id>      the service's state (range, calibrator, streaks, pending decision) and its last
                            decisions with their breakdown; 404 when this worker does not hold the service

Each path answers with and without a trailing slash: Prometheus scrapes ``/metrics`` by default, and
aiohttp (Faust's web driver) matches paths exactly. The views read a :class:`StatusSource` (the worker,
``stream.worker.StreamWorker``), never the worker's internals.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from stream.decisions import DecisionEngine
from stream.metrics import IN_STREAK, WorkerMetrics
from stream.records import Action, ResourceAction


@dataclass(frozen=True)
class Health:
    """What ``GET /healthz`` reports: whether the worker is ready (it follows the policy topic and is assigned
    partitions), the policy version it acts with, how many services it holds and its usage partitions."""

    ready: bool
    policy_version: int
    services: int
    partitions: list[int]

    def body(self) -> dict[str, Any]:
        return {
            "status": "ok" if self.ready else "starting",
            "policy_version": self.policy_version,
            "services": self.services,
            "partitions": self.partitions,
        }


class StatusSource(Protocol):
    """What the status pages read from a worker."""

    @property
    def metrics(self) -> WorkerMetrics: ...

    def health(self) -> Health: ...

    def explain(self, service: str) -> dict[str, Any] | None:
        """The service's state and last decisions (:func:`service_view`); None when the worker does not hold it."""


def service_view(
    engine: DecisionEngine, service: str, raw: bytes, recent: Iterable[Action | ResourceAction]
) -> dict[str, Any]:
    """What ``GET /services/<id>`` returns for ``service``: its stored row ``raw`` (decoded by ``engine``) and its
    ``recent`` decisions; a service provisioned several resources shows each resource's row under ``resources``."""
    rows = engine.decode_row(raw)
    state: dict[str, Any] = {"service": service}
    if engine.resources:
        state["resources"] = {r.name: _row_view(row, engine.window) for r, row in zip(engine.resources, rows)}
    else:
        state.update(_row_view(rows[0], engine.window))
    state["last_decisions"] = [action.to_dict() for action in recent]
    return state


def _row_view(row: Any, window: int) -> dict[str, Any]:
    """One controller row: warm-up progress, or its range, calibrator, streaks and pending decision."""
    core = row["core"]
    warming = int(row["warm_count"]) < window
    state: dict[str, Any] = {
        "phase": "warmup" if warming else "control",
        "next_tick": int(row["expected_tick"]),
        "capacity": float(row["capacity"]),
        "policy_version": int(row["policy_version"]),
    }
    if warming:
        state["warmup_ticks_seen"] = int(row["warm_count"])
    else:
        state.update(
            {
                "range": [float(row["low"]), float(row["high"])],
                "capacity_norm": float(core["action"]),
                "mu": float(core["mu"]),
                "sigma": float(core["sigma"]),
                "k": float(core["k"]),
                "eta": float(core["eta"]),
                "k_sigma": float(core["k"] * core["sigma"]),
                "margin": float(core["margin"]),
                "bias": float(core["bias"]),
                "escape": float(core["escape"]),
                "censor_streak": int(core["censor_streak"]),
                "over_streak": int(core["over_streak"]),
                "in_censoring_streak": int(core["censor_streak"]) >= IN_STREAK,
            }
        )
    return state


def _page(app: Any, path: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``app.page`` for ``path`` both without and with its trailing slash."""

    def register(handler: Callable[..., Any]) -> Callable[..., Any]:
        app.page(path, name=handler.__name__)(handler)
        app.page(path + "/", name=handler.__name__ + "_slash")(handler)
        return handler

    return register


def add_views(app: Any, source: StatusSource) -> None:
    """Serve ``source``'s status pages on the Faust ``app``'s web server."""

    @_page(app, "/healthz")
    async def healthz(self: Any, request: Any) -> Any:
        health = source.health()
        return self.json(health.body(), status=200 if health.ready else 503)

    @_page(app, "/metrics")
    async def metrics(self: Any, request: Any) -> Any:
        # aiohttp wants the charset out of content_type ("text/plain; version=0.0.4; charset=utf-8")
        content_type = "; ".join(p for p in CONTENT_TYPE_LATEST.split("; ") if not p.startswith("charset"))
        return self.bytes(generate_latest(source.metrics.registry), content_type=content_type)

    @_page(app, "/services/{service}")
    async def services(self: Any, request: Any, service: str) -> Any:
        view = source.explain(service)
        if view is None:
            return self.json(
                {
                    "error": f"service {service!r} is not held by this worker (another worker may own "
                    "its partition, or it has sent no usage yet)"
                },
                status=404,
            )
        return self.json(view)
