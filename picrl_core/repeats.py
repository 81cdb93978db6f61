"""A demand that repeats: the shortage's E-step and the action under a forecast that is the last seen demand or the
Gaussian.

A real pod's demand is a staircase: on the 91 GenAI pods 88% of ticks repeat the tick before exactly. A
calibrator that runs short a third of the time on such a plateau is short by a hair (half the fleet's
shortages exceed the capacity by less than 0.1 sigma), but the Gaussian E-step ``E[d | d > a]`` under
``N(mu, sigma^2)`` puts every one of them ~0.8 sigma above the capacity: the window then holds a spike
where the demand was flat, and the forecast rises and widens after it.

The E-step here takes the predictive distribution of the next demand as the two-part mixture

    d_t = v_t           with probability p      (the last demand seen uncensored, repeated)
    d_t ~ N(mu, sigma^2) with probability 1 - p,

with ``p`` each service's running share of seen ticks that repeated the demand seen the tick before
(:func:`track_repeats`). Given a shortage ``d_t > a_t`` the repeat is possible only when ``v_t > a_t``, and
then its posterior weight is ``w = p / (p + (1 - p)(1 - Phi((a_t - mu) / sigma)))``, so

    E[d_t | d_t > a_t] = w v_t + (1 - w) (mu + sigma lambda((a_t - mu) / sigma))          (Tobit E-step, mixed)

(:func:`mean_above_or_repeat`). With ``estimator.act_on_repeat`` the action is that mixture's critical-fractile
quantile (:func:`repeat_quantile`), and ``p`` then also counts a shortage at or above ``v`` as no repeat and leaves out
pairs that start at a bound of the range (:func:`inside_range`). A series whose values never repeat has ``p = 0``, the
Gaussian E-step and the Gaussian order exactly; nothing here reads anything but the service's own feedback.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np
import torch

from picrl_core.mills import log_normal_survival, mean_above

REPEAT_TOLERANCE = 1e-7  # scaled demands this close are one value repeated (the window holds float32: rounding 3e-8)


def repeats_in(observations: np.ndarray, interior: bool = False) -> np.ndarray:
    """The share of consecutive pairs of each window row ``(B, W)`` that repeat a value: ``p``'s cold start
    from the (uncensored) history. A window of one value has no pair and gives 0. ``interior``: only pairs whose
    first value lies inside the range ``(0, 1)`` count (:func:`inside_range`); a row without one gives 0."""
    values = np.asarray(observations, dtype=np.float64)
    repeated = np.abs(np.diff(values, axis=1)) <= REPEAT_TOLERANCE
    counted = inside_range(values[:, :-1]) if interior else np.ones_like(repeated)
    return (repeated & counted).sum(axis=1) / np.maximum(counted.sum(axis=1), 1)


def inside_range(values: np.ndarray) -> np.ndarray:
    """Scaled demands strictly inside ``(0, 1)``: a value at a bound is one the scaling clipped (a demand beyond the
    training range), whose repeats say that the demand stayed beyond it, not that it held still."""
    return (values > REPEAT_TOLERANCE) & (values < 1.0 - REPEAT_TOLERANCE)


def track_repeats(
    share: np.ndarray,
    last_seen: np.ndarray,
    y: np.ndarray,
    observed: np.ndarray,
    after_seen: np.ndarray,
    rate: float,
    missed: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """One tick of ``(p, v)``: where the demand was seen (``observed``) right after a seen tick (``after_seen``),
    ``p += rate (1[y = v] - p)``; ``v`` becomes every seen demand. Elsewhere both hold. (The controller's
    ``after_seen`` is "no censoring streak": a tick whose demand nobody saw holds the streak, so the tick after it
    is compared with the demand seen before it, the same ``v`` the E-step would have used.) ``missed``: ticks
    after a seen tick known not to repeat though unseen (a shortage at an action at or above ``v``: ``d > a >= v``),
    which count as ``1[y = v] = 0``."""
    repeated = (np.abs(y - last_seen) <= REPEAT_TOLERANCE).astype(np.float64)
    counted = observed if missed is None else observed | missed
    share = np.where(counted & after_seen, share + rate * (np.where(observed, repeated, 0.0) - share), share)
    return share, np.where(observed, y, last_seen)


def repeat_quantile(
    action: np.ndarray,
    sigma: np.ndarray,
    share: np.ndarray,
    last_seen: np.ndarray,
    fresh: np.ndarray,
    fractile: float,
    level: np.ndarray | None = None,
) -> np.ndarray:
    """The ``tau = fractile`` quantile (the critical fractile) of the module's mixture, with the Gaussian part the
    controller's own: ``N(g - z* sigma, sigma^2)``, ``z* = Phi^-1(tau)``, whose ``tau`` quantile is the action ``g`` it
    planned (Eq. 11, its ``k``, margin, bias and escape included). Where the last tick was seen (``fresh``) the
    mixture's cdf is ``F(x) = p 1[x >= v] + (1 - p) G(x)``, ``G(x) = Phi((x - g) / sigma + z*)``, and its ``tau``
    quantile is

        v                                         where (1 - p) G(v) < tau <= p + (1 - p) G(v)   (the atom)
        g + (Phi^-1(tau / (1 - p)) - z*) sigma     where (1 - p) G(v) >= tau                      (below v)
        g + (Phi^-1((tau - p) / (1 - p)) - z*) sigma  otherwise                                  (above v)

    the newsvendor's order under the forecast the E-step uses (:func:`mean_above_or_repeat`). With ``p = 0`` (or
    not ``fresh``, where the last demand is not known) it is ``g`` unchanged, and nothing is computed for that row.

    ``level`` (per row): the same mixture's quantile at ``level`` in place of ``tau`` (``z*`` stays ``tau``'s; with
    ``p = 0`` or not ``fresh`` it is ``g + (Phi^-1(level) - z*) sigma``), for a mixture that holds this one as its
    continuous part (:func:`~picrl_core.idle.hurdle_quantile`)."""
    order = np.array(action, dtype=np.float64)
    shifted_rows = fresh & (share > 0.0)
    if level is not None:
        shifted_rows = shifted_rows | (level != fractile)
    rows = shifted_rows.nonzero()[0]
    if not rows.size:
        return order
    g, s, p, v = order[rows], sigma[rows], np.where(fresh[rows], share[rows], 0.0), last_seen[rows]
    tau = fractile if level is None else level[rows]
    z = NormalDist().inv_cdf(fractile)
    at_v = 1.0 - np.exp(log_normal_survival((v - g) / s + z))
    below, atom = (1.0 - p) * at_v >= tau, p + (1.0 - p) * at_v >= tau
    gaussian_level = np.where(below, tau, tau - p) / np.maximum(1.0 - p, 1e-300)
    shifted = g + (torch.special.ndtri(torch.from_numpy(gaussian_level.clip(1e-12, 1 - 1e-12))).numpy() - z) * s
    order[rows] = np.where(~below & atom, v, shifted)
    return order


def repeat_weight_above(
    mu: np.ndarray, sigma: np.ndarray, bound: np.ndarray, share: np.ndarray, last_seen: np.ndarray
) -> np.ndarray:
    """The posterior weight of the repeat given ``d > bound`` under the mixture of the module docstring,
    ``w = p / (p + (1 - p)(1 - Phi((bound - mu) / sigma)))`` where ``last_seen > bound``, else 0."""
    slab = (1.0 - share) * np.exp(log_normal_survival((bound - mu) / sigma))
    return np.where(last_seen > bound, share / np.maximum(share + slab, np.finfo(np.float64).tiny), 0.0)


def gaussian_responsibility(
    y: np.ndarray,
    censored: np.ndarray,
    mu: np.ndarray,
    sigma: np.ndarray,
    action: np.ndarray,
    share: np.ndarray,
    last_seen: np.ndarray,
    after_seen: np.ndarray,
) -> np.ndarray:
    """Each tick's posterior responsibility of the mixture's Gaussian part (the E-step weight of its scale): 0 for a
    seen demand that repeated ``last_seen`` right after a seen tick (the atom explains it; a density does not compete
    with a point mass), ``1 - w`` for a censored one (:func:`repeat_weight_above` at the action), 1 otherwise.
    ``w`` is computed only where it can be nonzero (a shortage below the last demand seen), not on every row."""
    repeated = ~censored & after_seen & (np.abs(y - last_seen) <= REPEAT_TOLERANCE)
    responsibility = np.where(repeated, 0.0, 1.0)
    rows = (censored & (last_seen > action)).nonzero()[0]
    if rows.size:
        responsibility[rows] = 1.0 - repeat_weight_above(
            mu[rows], sigma[rows], action[rows], share[rows], last_seen[rows]
        )
    return responsibility


def mean_above_or_repeat(
    mu: np.ndarray, sigma: np.ndarray, bound: np.ndarray, share: np.ndarray, last_seen: np.ndarray
) -> np.ndarray:
    """``E[d | d > bound]`` under the mixture of the module docstring: the repeat ``last_seen`` (probability
    ``share``) or ``N(mu, sigma^2)``. Equals :func:`~picrl_core.mills.mean_above` where ``share`` is 0 or the
    repeat lies at or below the bound."""
    gaussian = mean_above(mu, sigma, bound)
    weight = repeat_weight_above(mu, sigma, bound, share, last_seen)
    return weight * last_seen + (1.0 - weight) * gaussian
