"""Table 2 reference: the censored newsvendor learner by projected stochastic gradient.

Huh & Rusmevichientong, "A Nonparametric Asymptotic Analysis of Inventory Planning with Censored
Demand", Mathematics of Operations Research 34(1), 2009: the order moves along a stochastic
subgradient of the newsvendor cost, which needs only whether demand exceeded the order, exactly the
censoring flag under PIC. For the asymmetric cost Eq. (1) the subgradient in the order ``a`` is
``-c_under`` on a shortage and ``c_over`` when demand fell short of it, so

    q_{t+1} = Proj(q_t + eps * [c_under 1(d_t > a_t) - c_over 1(d_t < a_t)]),

which settles where shortages happen with probability ``c_over / (c_under + c_over)``. Two forms:

* standalone (:func:`fit_censored_sgd`): ``a_t = q_t`` projected on ``[0, 1]``, started at the
  critical-fractile quantile of the uncensored history;
* residual (:func:`fit_censored_sgd_residual`): ``a_t = clip(mu_t + q_t, 0, 1)`` on the Phase-1
  predictor's ``mu`` (the same Gaussian LSTM as PIC-RL and conformal), ``q`` started at the
  critical-fractile quantile of the predictor's residuals on held-out data and projected on ``[-1, 1]``.

The paper's diminishing step ``eps / sqrt(t)`` targets stationary demand; a trace drifts, so the step
is constant and chosen on the validation split from :data:`STEPS` (:mod:`picrl_core.methods.selection`). The
provisioner is the deployable rule of :mod:`picrl_core.rules.censored_sgd`, so the comparison scores what a worker
runs.
"""

from __future__ import annotations

import numpy as np

from picrl_core.config import CostConfig, PicRLConfig
from picrl_core.costs import critical_ratio
from picrl_core.methods.conformal import split_residuals
from picrl_core.methods.deployed import RuleProvisioner
from picrl_core.methods.selection import Selection, select_on_validation
from picrl_core.pipeline import phase1_predictor
from picrl_core.predictor.model import GaussianLSTM
from picrl_core.rules.censored_sgd import CensoredSGDRule
from picrl_core.series import PreparedSeries

STEPS = (0.001, 0.003, 0.01, 0.03, 0.1)  # candidate eps (scaled units per unit of cost gradient)


class CensoredSGDProvisioner(RuleProvisioner):
    """The deployable :class:`~picrl_core.rules.censored_sgd.CensoredSGDRule` (``base`` 0, or the predictor's ``mu``):
    the very rule a worker runs (``picrl worker --method sgd`` or ``sgd-residual``)."""

    def __init__(
        self,
        step: float,
        cost: CostConfig,
        start: float,
        *,
        predictor: GaussianLSTM | None = None,
        chunk: int = 1,
        low: float = 0.0,
        high: float = 1.0,
    ) -> None:
        super().__init__(CensoredSGDRule(step, cost, start, predictor=predictor, chunk=chunk), low, high)


def fit_censored_sgd(series: PreparedSeries, config: PicRLConfig) -> CensoredSGDProvisioner:
    """Standalone learner; its step is chosen on the validation split, its start is the critical quantile
    of the split before the one it runs on."""
    ratio = critical_ratio(config.cost)
    for_validation = float(np.quantile(series.train, ratio))
    selection: Selection[float] = select_on_validation(
        STEPS, lambda step: CensoredSGDProvisioner(step, config.cost, for_validation), series, config
    )
    return CensoredSGDProvisioner(selection.chosen, config.cost, float(np.quantile(series.val, ratio)))


def fit_censored_sgd_residual(
    series: PreparedSeries, config: PicRLConfig, *, predictor: GaussianLSTM | None = None
) -> CensoredSGDProvisioner:
    """Residual tracker on the Phase-1 predictor's ``mu``; step chosen on the validation split (started
    from the training split's residuals there), then started from the validation residuals."""
    model = phase1_predictor(series, config) if predictor is None else predictor.eval()
    ratio = critical_ratio(config.cost)
    chunk = config.online.inference_chunk
    on_train = float(
        np.quantile(split_residuals(model, series.train, series.train_ctx, config, services=series.services), ratio)
    )
    selection: Selection[float] = select_on_validation(
        STEPS,
        lambda step: CensoredSGDProvisioner(step, config.cost, on_train, predictor=model, chunk=chunk),
        series,
        config,
    )
    on_val = float(
        np.quantile(split_residuals(model, series.val, series.val_ctx, config, services=series.services), ratio)
    )
    return CensoredSGDProvisioner(selection.chosen, config.cost, on_val, predictor=model, chunk=chunk)
