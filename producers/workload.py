"""A multi-service workload: what the replay producer and the closed loop play.

:mod:`picrl.workloads` builds one from a bundled dataset or a user's trace.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from picrl_core.resources import Resource


@dataclass(frozen=True)
class Workload:
    """Demand ``(T, N)`` of N named services in native units, with context ``(T, N, C)`` or None; for services
    provisioned several ``resources``, ``(T, R * N)`` with one block of N columns per resource (resource-major)."""

    services: tuple[str, ...]
    demand: np.ndarray
    context: np.ndarray | None
    context_names: tuple[str, ...]
    unit: str
    resources: tuple[Resource, ...] = ()

    @property
    def ticks(self) -> int:
        return int(self.demand.shape[0])
