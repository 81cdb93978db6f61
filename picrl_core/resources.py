"""Several resources per service, censored together: the paper's next step ("multi-resource coupled
constraints, e.g. joint GPU memory and compute censoring"), as the observation rule of the PIC loop.

A service is provisioned ``a_r`` of each resource ``r`` (scaled to ``[0, 1]`` like the single-resource
series) and its demand is ``d_r``. Resources are of two kinds:

* a **hard** resource (GPU memory) that runs short fails the requests that do not fit: only the share
  ``f = min_{hard r} min(1, a_r / d_r)`` of the tick's load is served, so *every* resource of that tick
  is observed on the served load only and its observation is a lower bound of its demand;
* a **soft** resource (GPU compute) that runs short throttles: it censors itself only.

A hard resource whose shortage **kills** the service (``Resource.kills``: a container over its memory
limit is OOM-killed, and the tick's in-flight requests die with it) serves none of the tick's load
instead: its ``min(1, a_r / d_r)`` is 0 when it runs short.

So, with ``short_r = 1[d_r > a_r]``:

    y_r = min(d_r, a_r)               for a hard resource,
    y_r = min(f * d_r, a_r)           for a soft one (f = 1 when no hard resource is short, 0 when one that kills is),
    c_r = short_r  or  any_{hard r'} short_{r'}      (the coupled censoring flag).

A per-resource monitor instead flags resource ``r`` when it ran at its limit on the load it was given
(``f d_r > a_r`` for a soft one), so a compute shortage hidden behind failed requests goes unseen.

``c_r`` is what a learner must read: when memory ran short, the compute observation is low because
requests failed, not because compute demand was low. A learner that reads only its own resource's
flag (``short_r``, what a per-resource autoscaler such as the Kubernetes VPA recommender sees) takes
those ticks as uncensored low demand: the selection bias of Proposition 1, crossing resources.

The cost of a tick is the sum over resources of the asymmetric cost Eq. (1), each weighted by
``weight_r`` (:data:`GPU_POD`): Eq. (1)'s ``c_under / c_over`` ratio, and so each resource's critical
fractile, is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from picrl_core.scaling import from_unit


@dataclass(frozen=True)
class Resource:
    """One provisioned resource of a service: its name, whether a shortage of it fails requests (hard) or
    throttles them (soft), the weight of its asymmetric cost in a tick's total, and, for a hard one, whether
    its shortage fails the requests that do not fit (``kills=False``) or kills the service and the whole
    tick's load with it (``kills=True``, an OOM kill)."""

    name: str
    hard: bool
    weight: float
    kills: bool = False

    def __post_init__(self) -> None:
        if not self.name or not np.isfinite(self.weight) or self.weight <= 0:
            raise ValueError(f"a resource needs a name and a positive weight; got {self.name!r}, {self.weight}")
        if self.kills and not self.hard:
            raise ValueError(f"resource {self.name!r}: only a hard resource's shortage kills the service")


# A GPU inference pod. Memory is hard: a request that does not fit fails (CUDA out of memory), which is
# an error the user sees, and idle memory is the capacity that decides how many pods pack on a GPU; so
# each unit of it, short or idle, weighs twice a unit of compute. Compute is soft: a short duty cycle
# slows requests down (latency), and idle duty cycle is cheap to hand to a neighbour (MPS/time slicing).
GPU_POD: tuple[Resource, ...] = (
    Resource("gpu_mem", hard=True, weight=2.0),
    Resource("gpu_compute", hard=False, weight=1.0),
)
KNOWN: dict[str, Resource] = {r.name: r for r in GPU_POD}


def killing(resources: Sequence[Resource]) -> tuple[Resource, ...]:
    """``resources`` with every hard one's shortage killing the service (an OOM kill instead of failed requests)."""
    return tuple(replace(r, kills=True) if r.hard else r for r in check_resources(resources))


def resources_named(names: Sequence[str], kills: bool = False) -> tuple[Resource, ...]:
    """The :data:`KNOWN` resources of ``names``, in order; with ``kills``, a hard one's shortage kills the service."""
    resources = check_resources([KNOWN[name] for name in names])
    return killing(resources) if kills else resources


def check_resources(resources: Sequence[Resource]) -> tuple[Resource, ...]:
    """``resources`` as a tuple, refusing duplicates and an empty list."""
    resources = tuple(resources)
    names = [r.name for r in resources]
    if not resources or len(set(names)) != len(names):
        raise ValueError(f"resources must be a non-empty list of distinct names; got {names}")
    return resources


def observe(
    demand: np.ndarray, action: np.ndarray, resources: Sequence[Resource]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The coupled observation rule for ``(R, N)`` demand and actions (resource-major, N services):
    ``(y, coupled, own, short)``, each ``(R, N)``: the observations ``y_r``, the coupled censoring flags
    ``c_r``, the flags a per-resource monitor raises (resource ``r`` ran at its limit on the load it was
    given: ``f d_r > a_r`` for a soft resource) and the true shortages ``1[d_r > a_r]``."""
    resources = check_resources(resources)
    demand = np.asarray(demand, dtype=np.float64)
    action = np.asarray(action, dtype=np.float64)
    if demand.shape != action.shape or demand.ndim != 2 or demand.shape[0] != len(resources):
        raise ValueError(
            f"demand and action must both have shape ({len(resources)}, services); "
            f"got {demand.shape} and {action.shape}"
        )
    short = demand > action
    hard = np.array([r.hard for r in resources])
    kills = np.array([r.kills for r in resources])[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        fits = np.where(short, np.where(kills, 0.0, action / demand), 1.0)  # share of the load resource r can carry
    served = fits[hard].min(axis=0) if hard.any() else np.ones(demand.shape[1])
    failed = short[hard].any(axis=0) if hard.any() else np.zeros(demand.shape[1], dtype=bool)
    load = np.where(hard[:, None], demand, served[None, :] * demand)  # what each resource was asked for
    return np.minimum(load, action), short | failed[None, :], load > action, short


def coupled_flags(own: np.ndarray, resources: Sequence[Resource]) -> np.ndarray:
    """The coupled censoring flags ``c_r`` of :func:`observe` from the flags each resource's own monitor raises
    (``(R, N)``): ``c_r = own_r or any_{hard r'} own_{r'}``. A hard resource's own flag is its shortage, so this
    is exactly ``observe``'s ``coupled`` (on a soft resource, ``own_r`` and ``short_r`` differ only on ticks a
    hard resource ran short, which are flagged either way)."""
    own = np.asarray(own, dtype=bool)
    hard = np.array([r.hard for r in check_resources(resources)])
    return own | own[hard].any(axis=0)[None, :]


# Where a hard shortage left less than this share of the load served, the soft observations stay plain lower bounds.
MIN_SERVED_SHARE = 1e-6


def impute_served_share(
    y: np.ndarray,
    censored: np.ndarray,
    action: np.ndarray,
    mu: np.ndarray,
    sigma: np.ndarray,
    resources: Sequence[Resource],
    tolerance: float = 1e-6,
    ranges: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The joint learner's E-step for the soft resources of a tick whose hard resource ran short, from the
    coupled flags and the learner's own forecast ``N(mu_r, sigma_r)`` of each hard demand (all ``(R, N)``).

    A soft observation on such a tick is ``y_s = f d_s`` with ``f = min_h a_h / d_h`` the served share, so
    ``d_s = y_s / f``. The hard demand is censored (``d_h > a_h``); under the forecast its expectation is
    the Tobit one, ``E[d_h | d_h > a_h] = mu_h + sigma_h lambda((a_h - mu_h) / sigma_h)``, and so

        f_hat = min_h a_h / E[d_h | d_h > a_h],      d_s_hat = y_s / f_hat.

    Where ``d_s_hat`` exceeds the soft capacity the soft resource is taken as short itself (observation
    ``a_s``, censored: an observation at its own capacity lands here unless that capacity is 0, which says
    nothing about the demand); up to it ``d_s_hat`` is its estimated demand, uncensored. The hard rows and
    every tick without a hard shortage are returned as they came. A shallow memory shortage thus costs the compute
    learner only its (small)
    correction instead of a lower bound of unknown depth, and a deep one lifts the compute observation by
    the depth the forecast expects: the memory shortage never reads as low compute demand. A hard resource that
    kills the service served nothing (``f = 0``): the soft observations of that tick stay what they are, lower
    bounds (of nothing) that say nothing about the demand.

    The served share is a ratio of physical quantities. The simulator's series are scaled so that 0 is no
    use at all (``ranges`` None: the ratio is taken on the values given); a worker scales each resource to its
    own range ``[low, high]`` (``ranges``, each ``(R, N)``), so the ratio is taken on the native values,
    ``f_hat = a_h^native / E[d_h]^native`` and ``d_s_hat = y_s^native / f_hat``, and brought back to the range."""
    from picrl_core.mills import mean_above  # here: it loads torch, which the CLI's light commands avoid

    resources = check_resources(resources)
    hard = np.array([r.hard for r in resources])
    y, action = np.asarray(y, np.float64), np.asarray(action, np.float64)
    censored = np.asarray(censored, bool)
    if not hard.any() or hard.all():
        return y, censored
    hard_short = _hard_shortages(y, censored, action, hard, tolerance)
    expected = mean_above(mu[hard], sigma[hard], action[hard])
    if ranges is not None:
        low, high = (np.asarray(bound, np.float64) for bound in ranges)
        carried, expected, observed = (
            from_unit(action[hard], low[hard], high[hard]),
            from_unit(expected, low[hard], high[hard]),
            from_unit(y, low, high),
        )
    else:
        carried, observed = action[hard], y
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(hard_short, np.where(_hard_kills(resources), 0.0, carried / expected), 1.0).min(axis=0)
    lifted = np.any(hard_short, axis=0)[None, :] & ~hard[:, None] & (share > MIN_SERVED_SHARE)[None, :]
    estimate = observed / np.maximum(share, MIN_SERVED_SHARE)[None, :]
    if ranges is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            estimate = (estimate - low) / (high - low)  # not to_unit: an estimate above the range must stay above it
    return (
        np.where(lifted, np.minimum(estimate, action), y),
        np.where(lifted, estimate > action + tolerance, censored),
    )


def _hard_kills(resources: Sequence[Resource]) -> np.ndarray:
    """``(H, 1)``: whether each hard resource's shortage kills the service (rows as ``_hard_shortages``)."""
    return np.array([r.kills for r in resources if r.hard])[:, None]


def _hard_shortages(
    y: np.ndarray, censored: np.ndarray, action: np.ndarray, hard: np.ndarray, tolerance: float
) -> np.ndarray:
    """``(H, N)``: which hard resource ran short on each service's tick (censored at its capacity)."""
    return censored[hard] & (y[hard] >= action[hard] - tolerance)


def unobserved(
    y: np.ndarray, censored: np.ndarray, action: np.ndarray, resources: Sequence[Resource], tolerance: float = 1e-6
) -> np.ndarray:
    """``(R, N)`` bool: the soft resources of the ticks a hard resource that kills ran short on, whose demand
    went unobserved (nothing of the tick was served, :attr:`Resource.kills`). The controller keeps its forecast
    for them instead (``PicRLController.step``'s ``missing``)."""
    resources = check_resources(resources)
    hard, kills = np.array([r.hard for r in resources]), _hard_kills(resources)
    y, action, censored = np.asarray(y, np.float64), np.asarray(action, np.float64), np.asarray(censored, bool)
    if not kills.any() or hard.all():
        return np.zeros(y.shape, dtype=bool)
    killed = (_hard_shortages(y, censored, action, hard, tolerance) & kills).any(axis=0)
    return killed[None, :] & ~hard[:, None]
