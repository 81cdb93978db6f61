"""Rewards under censoring: the pessimistic surrogate, Eq. (9), and the true cost, Eq. (10).

On a censored step only ``d > a`` is known. Under the belief ``d ~ N(mu, sigma^2)`` the expected
shortage is ``E[d - a | d > a] = mu + sigma * lambda((a - mu)/sigma) - a`` (inverse Mills ratio
``lambda``), and Eq. (9) charges it at the shortage price, amplified by the pessimism factor
``Psi(n) = 1 + beta * min(n, N_max)`` of the ``n``-th consecutive censored step. Proposition 2:
``dr/da = c_under * Psi(n) * (1 - lambda'(z)) > 0`` since ``0 < lambda' < 1`` (baricz2008mills), so
the surrogate always pushes the action up, and harder the longer the censoring lasts.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from picrl_core.config import CostConfig, RewardConfig
from picrl_core.costs import asymmetric_cost
from picrl_core.mills import inverse_mills_gap, log_normal_survival


class RewardInputError(ValueError):
    """Inputs a reward cannot be computed from (non-positive sigma, negative counts...)."""


def pessimism_factor(n: ArrayLike, reward: RewardConfig) -> np.ndarray:
    """``Psi(n) = 1 + beta * min(n, N_max)`` (Eq. 9); all ones when ``reward.use_pessimism`` is off
    (ablation A3). ``n`` is a count of consecutive censored steps, so it must be ``>= 0``."""
    n = np.asarray(n, dtype=np.float64)
    if not (n >= 0).all():  # also rejects NaN
        raise RewardInputError(f"consecutive-censoring counts must be >= 0; got {n[~(n >= 0)].min()}")
    if not reward.use_pessimism:
        return np.ones_like(n)
    return 1.0 + reward.beta * np.minimum(n, reward.n_max)


def expected_gap(a: ArrayLike, mu: ArrayLike, sigma: ArrayLike) -> np.ndarray:
    """``mu + sigma * lambda((a - mu)/sigma) - a = E[d - a | d > a]`` for ``d ~ N(mu, sigma^2)``.

    Computed as ``sigma * (lambda(z) - z)`` with the cancellation-free
    :func:`~picrl_core.mills.inverse_mills_gap`, so it stays ``> 0`` even for ``a >> mu``.
    """
    a, mu, sigma = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (a, mu, sigma)))
    if not (sigma > 0).all():
        raise RewardInputError(f"sigma must be > 0 for the expected gap; got {sigma[~(sigma > 0)].min()}")
    return sigma * inverse_mills_gap((a - mu) / sigma)


def expected_cost(a: ArrayLike, mu: ArrayLike, sigma: ArrayLike, cost: CostConfig) -> np.ndarray:
    """``E[l(a, d)]`` of Eq. (1) for ``d ~ N(mu, sigma^2)``: what a tick whose demand went unobserved costs under
    the forecast (it is not known to be censored, so not Eq. 9's ``d > a``). With ``E[(d - a)+] = (1 - Phi(z))
    E[d - a | d > a]`` (``z = (a - mu)/sigma``) and ``(a - d)+ = (d - a)+ + a - d``:
    ``c_under E[(d - a)+] + c_over (E[(d - a)+] + a - mu)``."""
    a, mu, sigma = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (a, mu, sigma)))
    short = np.exp(log_normal_survival((a - mu) / sigma)) * expected_gap(a, mu, sigma)
    return cost.c_under * short + cost.c_over * (short + a - mu)


def surrogate_reward(
    a: ArrayLike, mu: ArrayLike, sigma: ArrayLike, n: ArrayLike, cost: CostConfig, reward: RewardConfig
) -> np.ndarray:
    """Eq. (9): ``r = -c_under * (mu + sigma * lambda((a - mu)/sigma) - a) * Psi(n)``."""
    return -cost.c_under * expected_gap(a, mu, sigma) * pessimism_factor(n, reward)


def step_reward(
    a: ArrayLike,
    y: ArrayLike,
    censored: ArrayLike,
    mu: ArrayLike,
    sigma: ArrayLike,
    n_consecutive: ArrayLike,
    cost: CostConfig,
    reward: RewardConfig,
) -> np.ndarray:
    """Per-step reward of Algorithm 1, vectorised over services (all inputs broadcast together).

    Uncensored steps (``y = d``): Eq. (10), ``-l(a, y)``. Censored steps: the surrogate Eq. (9) with
    ``n_consecutive`` = number of consecutive censored steps *including this one* (so ``>= 1``,
    ``Psi = 1 + beta`` on the first).
    ``mu``/``sigma`` are only read on censored steps.
    With ``reward.use_censored_reward`` off (ablation A2) every step gets the naive ``-l(a, y)``,
    which on a censored step (``y = a``) is 0: censoring then looks free.
    """
    a, y, censored, mu, sigma, n = np.broadcast_arrays(
        np.asarray(a, dtype=np.float64),
        np.asarray(y, dtype=np.float64),
        np.asarray(censored, dtype=bool),
        np.asarray(mu, dtype=np.float64),
        np.asarray(sigma, dtype=np.float64),
        np.asarray(n_consecutive, dtype=np.float64),
    )
    rewards = np.array(-asymmetric_cost(a, y, cost))  # a writable array even for 0-d input
    if reward.use_censored_reward and censored.any():
        if not (n[censored] >= 1).all():
            raise RewardInputError(
                "n_consecutive counts the current censored step too, so it must be >= 1 wherever "
                f"censored is True; got {n[censored].min()}"
            )
        rewards[censored] = surrogate_reward(a[censored], mu[censored], sigma[censored], n[censored], cost, reward)
    return rewards
