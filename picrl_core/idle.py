"""Idle stretches: a point mass at the range's floor (a hurdle) in the predictive distribution of the next demand.

A service that scales to zero, or a GPU whose duty cycle drops to nothing, spends runs of ticks at the bottom of its
range: below the training range the scaling sees the demand as 0 (:mod:`picrl_core.methods.growth`), and the
capacity never goes below it. The Gaussian forecast has no mass there to speak of, and the repeat mixture
(:mod:`picrl_core.repeats`) leaves pairs at a bound out of its share, so the order sits above an idle service and
the margin walks down to it in steps of ``delta_m sigma``.

With ``estimator.idle_hurdle`` the next demand's distribution is a hurdle (zero-inflated) mixture

    d_{t+1} = 0              with probability pi_t                                  (idle: the floor)
    d_{t+1} ~ H_t            with probability 1 - pi_t                              (busy)

with ``H_t`` the continuous part the controller already uses: the repeat mixture ``p 1[x >= v] + (1 - p) G(x)``
(its atom only at a last seen demand ``v`` above the floor: a last demand at the floor is the hurdle's atom) or the
Gaussian ``G(x) = Phi((x - g) / sigma + z*)`` whose ``tau`` quantile is the planned action ``g`` (Eq. 11).

``pi_t`` is the two-state Markov chain's transition probability out of the last tick's state (idle or busy), as in
Croston's and Teunter-Syntetos-Babai's separation of demand occurrence from demand size, estimated on the window:

    i_j = 1[c_j = 0 and y_j = 0]                                            (tick j of the window was seen idle)
    pi_t = #{j : i_j = i_t, i_{j+1} = 1} / #{j : i_j = i_t}                 (pairs that start in the last state)

(:func:`idle_share`; 0 where no pair starts in that state, so a service that never idles gets ``pi = 0`` and the
controller's order exactly). A shortage is a busy tick (``d > a >= 0``).

Where the forecast is used:

* the action is the mixture's critical-fractile quantile (:func:`hurdle_quantile`): its cdf is
  ``F(x) = pi + (1 - pi) H(x)`` for ``x >= 0``, so after the clip to ``[0, 1]``

      a_{t+1} = 0                                        where pi_t >= tau
      a_{t+1} = max(H_t^-1((tau - pi_t) / (1 - pi_t)), 0)  otherwise;

* the shortage's E-step ``E[d | d > a]`` is unchanged: ``a >= 0`` rules the floor out, so the hurdle's posterior
  weight given a shortage is 0 and the continuous part's E-step stands (:func:`~picrl_core.repeats.
  mean_above_or_repeat`);
* the online temperature (the EM step of ``G``'s scale, :func:`~picrl_core.calibrator.track_temperature`) weighs a
  tick seen at the floor by the Gaussian's responsibility 0 when the pending ``pi`` was positive (a density does not
  compete with a point mass; :func:`busy_responsibility`): an idle tick says nothing about ``sigma``;
* the margin (Eq. 12) calibrates the continuous part's quantile, so a tick whose order was the floor's atom
  (``pi_t >= tau``) takes no margin or bias step: neither the idle tick it covered nor the busy onset it missed
  says where ``H``'s quantile lies.

The window's own estimate of ``pi``, not conditioned on the last tick (the share of idle ticks, zero-inflation
with independent ticks), and the hurdle with the margin stepping at the floor were measured too and left out
(``benchmarks/results/design/idle-hurdle``).
"""

from __future__ import annotations

import numpy as np

from picrl_core.repeats import REPEAT_TOLERANCE, repeat_quantile


def at_floor(values: np.ndarray) -> np.ndarray:
    """Scaled demands at the floor of the range, 0 (float32 rounding allowed)."""
    return np.asarray(values) <= REPEAT_TOLERANCE


def idle_share(observations: np.ndarray, censored: np.ndarray) -> np.ndarray:
    """``pi_t`` of each window row ``(B, W)`` (the module docstring): the share of the window's pairs that start in the
    state of its newest tick (idle: seen at the floor; busy: anything else) and move to idle. 0 where no pair starts
    in that state."""
    idle = ~np.asarray(censored, dtype=bool) & at_floor(observations)
    start, after = idle[:, :-1], idle[:, 1:]
    same = start == idle[:, -1:]
    return (same & after).sum(axis=1) / np.maximum(same.sum(axis=1), 1)


def hurdle_quantile(
    action: np.ndarray,
    sigma: np.ndarray,
    share: np.ndarray,
    last_seen: np.ndarray,
    fresh: np.ndarray,
    idle: np.ndarray,
    fractile: float,
) -> np.ndarray:
    """The ``tau = fractile`` quantile of the hurdle mixture of the module docstring, floored at 0: 0 where
    ``idle >= tau``, else the continuous part's quantile at ``(tau - pi) / (1 - pi)``
    (:func:`~picrl_core.repeats.repeat_quantile` at that level, the repeat's atom kept only at a last seen demand
    above the floor). With ``idle = 0`` it is :func:`~picrl_core.repeats.repeat_quantile`'s order at ``tau``, except
    that a last demand at the floor is no repeat atom."""
    floor = idle >= fractile
    level = np.where(floor, 0.0, (fractile - idle) / np.maximum(1.0 - idle, np.finfo(np.float64).tiny))
    busy_share = np.where(at_floor(last_seen), 0.0, share)
    order = repeat_quantile(action, sigma, busy_share, last_seen, fresh, fractile, level)
    return np.where(floor, 0.0, np.maximum(order, 0.0))


def busy_responsibility(y: np.ndarray, observed: np.ndarray, idle: np.ndarray) -> np.ndarray:
    """Each tick's posterior responsibility of the hurdle's continuous part: 0 for a demand seen at the floor where
    the pending ``pi`` (``idle``) was positive, 1 otherwise (a shortage rules the floor out)."""
    return np.where(observed & at_floor(y) & (idle > 0.0), 0.0, 1.0)
