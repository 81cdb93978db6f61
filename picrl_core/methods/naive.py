"""Operator baseline (Table 2): the naive uncensored-only learner of Proposition 1.

The Gaussian newsvendor of :mod:`picrl_core.methods.newsvendor` with the censoring flags thrown away:
each service fits ``N(m, s^2)`` to its last ``window`` observations by the plain sample mean and
standard deviation, reading a censored ``y = a`` as if it were the demand, and orders
``m + s * Phi^{-1}(c_under / (c_under + c_over))``. It is the Tobit newsvendor minus the censoring
correction, so the two differ only in how they read ``c``.

Proposition 1: whenever censoring is active, the observations ``min(d, a)`` have a mean below ``E[D]``
(the mixture target) and a shrunken spread, so the refit order sits below the last one and the order
falls tick after tick. For stationary ``N(mu, sigma^2)`` demand at the 2:1 prices it slides from
the newsvendor order ``mu + 0.43 sigma`` to a fixed point near ``mu - 0.7 sigma``, where three
shortages in four are the norm: the downward spiral into the censoring trap.
"""

from __future__ import annotations

from picrl_core.config import PicRLConfig
from picrl_core.costs import critical_ratio
from picrl_core.methods.newsvendor import GaussianNewsvendor
from picrl_core.series import PreparedSeries


def fit_naive(series: PreparedSeries, config: PicRLConfig, *, window: int | None = None) -> GaussianNewsvendor:
    """The naive learner (nothing to train: ``series`` is not read)."""
    return GaussianNewsvendor(
        window or config.estimator.window,
        critical_ratio(config.cost),
        config.estimator,
        config.reward,
        read_censored_as_demand=True,
    )
