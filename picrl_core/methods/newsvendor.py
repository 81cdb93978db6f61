"""Operator baselines (Table 2): the textbook newsvendor with censored demand, re-solved every tick.

The newsvendor with underage price ``c_under`` and overage price ``c_over`` orders the critical
fractile ``F^{-1}(c_under / (c_under + c_over))`` of the demand distribution ``F`` (2/3 for the paper's
2:1 prices). Both estimators below fit ``F`` from each service's last ``window`` PIC observations
``(y, c)`` (default ``config.estimator.window``, the window of PIC-RL's own censored-demand
estimator), a censored ``y`` being a right-censored demand (``d > y``). Context is not used.

* Tobit (:class:`GaussianNewsvendor`): ``F = N(m, s^2)`` by censored maximum likelihood, reusing
  :func:`~picrl_core.censored_estimator.estimate_censored_demand` (Tobin 1958; Olsen's
  parameterisation); the order is ``m + s * Phi^{-1}(c_under / (c_under + c_over))``. A fully censored
  window gives that estimator's ``m = max(y) + s``, so the order keeps rising until demand is seen.
  With ``read_censored_as_demand`` the flags are ignored (the naive learner of
  :mod:`picrl_core.methods.naive`).
* Kaplan-Meier (:class:`KaplanMeierNewsvendor`): ``F`` is the product-limit estimator of the window,
  as in Huh, Levi, Rusmevichientong & Orlin, "Adaptive Data-Driven Inventory Control with Censored
  Demand Based on Kaplan-Meier Estimator", Operations Research 59(4), 2011; the order is its
  critical-fractile quantile (:func:`~picrl_core.rules.kaplan_meier.kaplan_meier_quantile`; the deployable rule of
  :mod:`picrl_core.rules.kaplan_meier`, which a worker runs). The estimator is undefined above the
  largest observation when that one is censored, so the quantile may not be identified. Efron's
  completion (the leftover mass sits on the largest observation) would order exactly the censoring
  threshold again and never observe above it: the PIC trap. Instead the order then steps
  :data:`~picrl_core.rules.kaplan_meier.KM_TAIL_STEP` above the largest observation (our completion rule), until
  an uncensored value identifies the quantile.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import replace
from statistics import NormalDist

import numpy as np

from picrl_core.censored_estimator import estimate_censored_demand
from picrl_core.config import EstimatorConfig, PicRLConfig, RewardConfig
from picrl_core.controller import _last_window, _shift
from picrl_core.costs import critical_ratio
from picrl_core.methods.base import Provisioner
from picrl_core.methods.deployed import RuleProvisioner
from picrl_core.rules.kaplan_meier import KaplanMeierRule
from picrl_core.series import PreparedSeries


class WindowNewsvendor(Provisioner):
    """Keeps each service's last ``window`` ``(y, c)`` (history uncensored, left-padded) and orders
    :meth:`order` of it."""

    def __init__(self, window: int, ratio: float) -> None:
        if window < 1:
            raise ValueError(f"the newsvendor window must be >= 1, got {window}")
        self.window = window
        self.ratio = ratio

    def start(self, history: np.ndarray, history_context: np.ndarray | None) -> np.ndarray:
        history = np.asarray(history, dtype=np.float64)
        if history.ndim != 2 or history.shape[1] < 1:
            raise ValueError(f"history must have shape (services, steps >= 1); got {history.shape}")
        self.y, _ = _last_window(history, np.zeros((*history.shape, 0)), self.window)
        self.censored = np.zeros(self.y.shape, dtype=bool)
        return np.clip(self.order(), 0.0, 1.0)

    def act(self, y: np.ndarray, censored: np.ndarray, context: np.ndarray | None) -> np.ndarray:
        self.y = _shift(self.y, np.asarray(y, dtype=np.float64))
        self.censored = _shift(self.censored, np.asarray(censored, dtype=bool))
        return np.clip(self.order(), 0.0, 1.0)

    @abstractmethod
    def order(self) -> np.ndarray:
        """Unclipped order ``(N,)`` from the current windows."""


class GaussianNewsvendor(WindowNewsvendor):
    """Tobit fit ``N(m, s^2)`` of the window, order ``m + s * Phi^{-1}(ratio)``."""

    def __init__(
        self,
        window: int,
        ratio: float,
        estimator: EstimatorConfig,
        reward: RewardConfig,
        *,
        read_censored_as_demand: bool = False,
    ) -> None:
        super().__init__(window, ratio)
        self.estimator = replace(estimator, window=window)
        self.reward = reward
        self.z = NormalDist().inv_cdf(ratio)
        self.read_censored_as_demand = read_censored_as_demand

    def order(self) -> np.ndarray:
        flags = np.zeros_like(self.censored) if self.read_censored_as_demand else self.censored
        fit = estimate_censored_demand(
            self.y, flags, np.zeros(self.y.shape[0], dtype=np.int64), self.estimator, self.reward
        )
        return fit.mean + self.z * fit.std


class KaplanMeierNewsvendor(RuleProvisioner):
    """The deployable :class:`~picrl_core.rules.kaplan_meier.KaplanMeierRule`: the very rule a worker runs
    (``picrl worker --method kaplan-meier``)."""

    def __init__(self, window: int, ratio: float) -> None:
        super().__init__(KaplanMeierRule(window, ratio), 0.0, 1.0)


def fit_tobit(series: PreparedSeries, config: PicRLConfig, *, window: int | None = None) -> GaussianNewsvendor:
    """The Tobit newsvendor (nothing to train: ``series`` is not read)."""
    return GaussianNewsvendor(
        window or config.estimator.window, critical_ratio(config.cost), config.estimator, config.reward
    )


def fit_kaplan_meier(
    series: PreparedSeries, config: PicRLConfig, *, window: int | None = None
) -> KaplanMeierNewsvendor:
    """The Kaplan-Meier newsvendor (nothing to train: ``series`` is not read)."""
    return KaplanMeierNewsvendor(window or config.estimator.window, critical_ratio(config.cost))
