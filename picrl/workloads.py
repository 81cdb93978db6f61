"""Multi-service workloads built from a trace: what the replay producer and the closed loop play.

A real fleet has many services of different sizes whose peaks do not line up. From one trace,
service ``i`` is a copy shifted in time (its own start in the trace) and scaled (its own size,
log-uniform in ``[1/scale_spread, scale_spread]``); service 0 is the trace itself, unshifted and
unscaled. Per-pod traces give each service its own series instead, and a fleet provisioned on several
resources (``pods-2r``) gives each service one series per resource (:func:`resource_fleet_of`).
"""

from __future__ import annotations

import numpy as np

from picrl.datasets import Trace, trace_resources
from producers.workload import Workload


def _check(trace_length: int, ticks: int, services: int) -> None:
    if services < 1:
        raise ValueError(f"--services must be >= 1; got {services}")
    if ticks < 1 or ticks > trace_length:
        raise ValueError(f"--ticks must be in [1, {trace_length}] (the trace part's length); got {ticks}")


def copies_of(
    trace: Trace,
    services: int,
    ticks: int,
    *,
    start: int = 0,
    seed: int = 0,
    scale_spread: float = 2.0,
    prefix: str | None = None,
) -> Workload:
    """``services`` shifted and scaled copies of ``trace.values[start:]``, ``ticks`` long each."""
    values = trace.values[start:]
    context = None if trace.context is None else trace.context[start:]
    _check(values.size, ticks, services)
    rng = np.random.default_rng(seed)
    offsets = np.concatenate([[0], rng.integers(0, values.size - ticks + 1, size=services - 1)])
    scales = np.concatenate([[1.0], np.exp(rng.uniform(-np.log(scale_spread), np.log(scale_spread), services - 1))])
    demand = np.stack([values[o : o + ticks] * s for o, s in zip(offsets, scales)], axis=1)
    ctx = None if context is None else np.stack([context[o : o + ticks] for o in offsets], axis=1)
    name = prefix or trace.name
    return Workload(tuple(f"{name}-{i}" for i in range(services)), demand, ctx, trace.context_names, trace.unit)


def fleet_of(traces: list[Trace], services: int, ticks: int, *, start: int = 0) -> Workload:
    """The first ``services`` traces of a per-service fleet (e.g. the GenAI pods), ``ticks`` long each."""
    if services > len(traces):
        raise ValueError(f"--services {services} exceeds the {len(traces)} series of the fleet")
    chosen = traces[:services]
    _check(min(t.values.size for t in chosen) - start, ticks, services)
    demand = np.stack([t.values[start : start + ticks] for t in chosen], axis=1)
    names = chosen[0].context_names
    with_context = names and all(t.context is not None and t.context_names == names for t in chosen)
    ctx = np.stack([t.context[start : start + ticks] for t in chosen], axis=1) if with_context else None  # type: ignore[index]  # with_context: all set
    return Workload(tuple(t.name for t in chosen), demand, ctx, names if with_context else (), chosen[0].unit)


def resource_fleet_of(trace: Trace, services: int, ticks: int, *, start: int = 0) -> Workload:
    """The first ``services`` services of a fleet provisioned on several resources (``trace.resources``, e.g.
    ``pods-2r``: each pod's GPU memory and GPU duty cycle), ``ticks`` long each, as one resource-major workload."""
    if not trace.resources:
        raise ValueError(f"{trace.name} is not provisioned on several resources (pick a dataset such as pods-2r)")
    blocks = np.split(np.asarray(trace.values), len(trace.resources), axis=1)
    if services > blocks[0].shape[1]:
        raise ValueError(f"--services {services} exceeds the {blocks[0].shape[1]} services of {trace.name}")
    _check(blocks[0].shape[0] - start, ticks, services)
    demand = np.concatenate([b[start : start + ticks, :services] for b in blocks], axis=1)
    return Workload(
        tuple(f"{trace.name}-{j}" for j in range(services)), demand, None, (), trace.unit, trace_resources(trace)
    )
