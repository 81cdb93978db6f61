"""The PIC loop of a multi-resource series: every method acts for N services x R resources at once
(one provisioner row per (resource, service), resource-major) and the environment censors them
together by the rule of :func:`picrl_core.resources.observe`.

A method reads the coupled flags ``c_r`` (:attr:`Method.coupled`) or, as a per-resource autoscaler does,
the flags of each resource's own monitor, with the same observations ``y_r`` either way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from picrl_core.config import CostConfig
from picrl_core.costs import EpisodeMetrics, mean_service_metrics
from picrl_core.methods.base import LoopResult, Provisioner, _checked
from picrl_core.resources import Resource, observe


def run_coupled_loop(
    provisioner: Provisioner,
    demand: np.ndarray,
    history: np.ndarray,
    resources: Sequence[Resource],
    *,
    coupled: bool,
    censoring: bool = True,
) -> LoopResult:
    """:func:`~picrl_core.methods.base.run_pic_loop` for ``demand`` ``(T, R * N)`` (resource-major
    columns) under the coupled observation rule; ``coupled`` picks the flags the provisioner reads,
    ``censoring=False`` reveals the demand (the full-information reference). ``censored`` in the result
    records each resource's own shortages ``1[d_r > a_r]``."""
    demand = np.asarray(demand, dtype=np.float64)
    steps, rows = demand.shape
    r = len(resources)
    if rows % r:
        raise ValueError(f"{rows} demand columns are not {r} resources x services")
    actions, observed = np.empty((steps, rows)), np.empty((steps, rows))
    short = np.empty((steps, rows), dtype=bool)
    a = _checked(provisioner.start(np.asarray(history, dtype=np.float64), None), rows, provisioner)
    for t in range(steps):
        actions[t] = a
        y, coupled_flags, own, shortage = observe(demand[t].reshape(r, -1), a.reshape(r, -1), resources)
        observed[t], short[t] = (y if censoring else demand[t].reshape(r, -1)).ravel(), shortage.ravel()
        flags = (coupled_flags if coupled else own).ravel() & censoring
        if t + 1 < steps:
            a = _checked(provisioner.act(observed[t].copy(), flags, None), rows, provisioner)
    return LoopResult(actions, observed, short)


def resource_metrics(
    actions: np.ndarray, demand: np.ndarray, resources: Sequence[Resource], cost: CostConfig
) -> tuple[EpisodeMetrics, dict[str, float]]:
    """Metrics of a multi-resource episode (``(T, R * N)``, resource-major). The first are the table's:
    regret is the weighted sum over resources of each one's mean regret per service (the cost of
    :mod:`picrl_core.resources`), the other fields the mean over resources. The second are per resource
    (``regret_<name>``, ``shortage_<name>``) and how a hard shortage meets a soft one: the share of
    (service, tick) with a hard resource short in which a soft resource is short too, the same tick
    (``soft_short_with_hard_short``) and the next (``soft_short_after_hard_short``), against the soft
    resources' shortage rate on the other ticks (``soft_short_otherwise``)."""
    steps = actions.shape[0]
    r = len(resources)
    blocks = [
        mean_service_metrics(a, d, cost) for a, d in zip(np.split(actions, r, axis=1), np.split(demand, r, axis=1))
    ]
    mean = {
        name: float(np.mean([getattr(b, name) for b in blocks]))
        for name in ("mae", "shortage_rate", "under_mass", "over_mass", "action_variance")
    }
    total = EpisodeMetrics(
        regret=float(sum(res.weight * b.regret for res, b in zip(resources, blocks))), steps=steps, **mean
    )
    extra = {
        f"{key}_{res.name}": float(getattr(b, field))
        for res, b in zip(resources, blocks)
        for key, field in (("regret", "regret"), ("shortage", "shortage_rate"))
    }
    short = (demand > actions).reshape(steps, r, -1)
    hard = np.array([res.hard for res in resources])
    if hard.any() and not hard.all():
        hard_short, soft_short = np.any(short[:, hard], axis=1), np.any(short[:, ~hard], axis=1)  # (T, N)
        extra["soft_short_with_hard_short"] = _share(soft_short, hard_short)
        extra["soft_short_after_hard_short"] = _share(soft_short[1:], hard_short[:-1])
        extra["soft_short_otherwise"] = _share(soft_short, ~hard_short)
    return total, extra


def _share(event: np.ndarray, given: np.ndarray) -> float:
    """``P(event | given)`` over the entries where ``given`` holds (NaN where it never does)."""
    return float(event[given].mean()) if given.any() else float("nan")
