"""What every method of the comparison (Tables 2 and 3) is: a provisioner acting under the PIC loop.

A :class:`Provisioner` sees only the censored feedback ``(y_t, c_t) = (min(d_t, a_t), 1[d_t > a_t])``
of the actions it chose (and the context channels), never the demand ``d_t``; :func:`run_pic_loop`
is the one loop every method runs in, on the same splits, scaling and cost weights. A
:class:`Method` says how a provisioner is trained offline from a :class:`PreparedSeries` (only the
hindsight references, group ``"hindsight"``, may read the test split: they are references, not methods).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from picrl_core.config import PicRLConfig
from picrl_core.series import PreparedSeries
from picrl_core.simulator import censor


class Provisioner(ABC):
    """One method acting online for N services at once; every action lies in ``[0, 1]``."""

    @abstractmethod
    def start(self, history: np.ndarray, history_context: np.ndarray | None) -> np.ndarray:
        """Uncensored history ``(N, H)`` (offline logs) and its context ``(N, H, C)`` -> first actions ``(N,)``."""

    @abstractmethod
    def act(self, y: np.ndarray, censored: np.ndarray, context: np.ndarray | None) -> np.ndarray:
        """Feedback ``y, c`` ``(N,)`` for the actions in force (and this tick's context ``(N, C)``) ->
        the actions for the next tick ``(N,)``."""


@dataclass(frozen=True)
class Method:
    """A method of the comparison: its name, where it comes from, and how it is trained."""

    name: str  # command-line name, e.g. "pic-rl", "tft", "vpa"
    label: str  # table label
    reference: str  # the paper or documentation the implementation follows
    group: str  # "pic-rl", "phase-1/2/3", "phase-2+3", "full", "operator", "reference", "hindsight", "ablation"
    fit: Callable[..., Provisioner]  # (series, config) -> provisioner; timed methods take step_seconds too
    timed: bool = False  # its windows are in seconds: fit takes the trace's step_seconds
    censoring: bool = True  # False: a full-information reference, run with the demand revealed every tick
    # On a multi-resource series (picrl_core.resources): True reads the coupled censoring flags (a hard
    # resource's shortage censors every resource of the tick), False only each resource's own shortage, as
    # a per-resource autoscaler does. Irrelevant with one resource.
    coupled: bool = False
    multi_resource_only: bool = False  # a variant that only differs from another on a multi-resource series
    # a worker runs it (picrl worker --method NAME, picrl_core.deployable); False: compare only, never recommended
    deployable: bool = False
    combines: tuple[str, ...] = ()  # the methods it chooses among (a portfolio); empty for a single rule

    def fitted(self, series: PreparedSeries, config: PicRLConfig, step_seconds: float) -> Provisioner:
        """The trained provisioner for ``series``, with the trace's sampling period where it needs one."""
        return self.fit(series, config, step_seconds=step_seconds) if self.timed else self.fit(series, config)


@dataclass(frozen=True)
class LoopResult:
    """Actions ``a_t`` in force at every tick and the feedback they produced, each ``(T, N)``."""

    actions: np.ndarray
    observed: np.ndarray
    censored: np.ndarray


class ProvisionerError(ValueError):
    """A provisioner returned actions of the wrong shape, non-finite, or outside [0, 1]."""


def _checked(actions: np.ndarray, n: int, who: Provisioner) -> np.ndarray:
    actions = np.asarray(actions, dtype=np.float64)
    if actions.shape != (n,) or not np.isfinite(actions).all() or actions.min() < 0.0 or actions.max() > 1.0:
        raise ProvisionerError(
            f"{type(who).__name__} returned actions of shape {actions.shape} outside [0, 1] or non-finite"
        )
    return actions


def run_pic_loop(
    provisioner: Provisioner,
    demand: np.ndarray,
    history: np.ndarray,
    *,
    context: np.ndarray | None = None,
    history_context: np.ndarray | None = None,
    censoring: bool = True,
) -> LoopResult:
    """The counterfactual PIC loop (Sec. 4.1.2) over ``demand`` ``(T, N)``: the provisioner acts, the
    environment reveals ``min(d, a)`` and ``1[d > a]``, the provisioner acts again.

    ``censoring=False`` is the full-information reference: the environment reveals the demand itself
    and never a censoring flag (a provisioner reads a shortage as ``y > a``). ``censored`` in the result
    still records the shortages ``1[d > a]``."""
    demand = np.asarray(demand, dtype=np.float64)
    if demand.ndim != 2:
        raise ValueError(f"demand must have shape (ticks, services); got {demand.shape}")
    steps, n = demand.shape
    actions = np.empty((steps, n))
    observed = np.empty((steps, n))
    censored = np.empty((steps, n), dtype=bool)
    a = _checked(provisioner.start(np.asarray(history, dtype=np.float64), history_context), n, provisioner)
    for t in range(steps):
        actions[t] = a
        observed[t], censored[t] = censor(demand[t], a)
        if not censoring:
            observed[t] = demand[t]
        if t + 1 < steps:
            a = _checked(
                provisioner.act(observed[t].copy(), censored[t] & censoring, None if context is None else context[t]),
                n,
                provisioner,
            )
    return LoopResult(actions, observed, censored)
