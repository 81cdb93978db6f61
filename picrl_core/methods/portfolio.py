"""The per-service choice among buffer rules on PIC-RL's predictor (:mod:`picrl_core.rules.portfolio`) as a method of
the comparison and a deployable model.

Fitting it trains PIC-RL (phases 1 and 2, :func:`~picrl_core.pipeline.train_offline`), then runs the choice on the
validation split from equal scores for each ``(lambda, kappa)`` of :data:`CHOICES`
(:mod:`picrl_core.methods.selection`), its conformal pool started from the training split's last residuals. The
chosen run's fleet mean scores at its end are the start ``S_0`` of every service the model serves (a fleet shares
what it learnt), and the pool starts from the validation split's last residuals. The test split is never read.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from picrl_core.artifact import ModelArtifact
from picrl_core.config import PicRLConfig
from picrl_core.methods.base import Method
from picrl_core.methods.conformal import split_residuals
from picrl_core.methods.deployed import RuleProvisioner
from picrl_core.methods.selection import select_on_validation
from picrl_core.pipeline import train_offline
from picrl_core.rules.portfolio import CANDIDATES, POOL, PortfolioParameters, PortfolioRule
from picrl_core.series import PreparedSeries

# (lambda, kappa) chosen on the validation split: the scores' forgetting per tick (a horizon of ~100 or ~1,000 ticks)
# and the switching price in cost units of the range (the last one never switches on the traces measured)
CHOICES = ((0.99, 0.1), (0.999, 0.1), (0.99, 0.5), (0.999, 0.5), (0.999, 2.0))
ACI_STEP = 0.005  # gamma (Gibbs & Candes 2021's)
SGD_STEP = 0.01  # epsilon (the middle of picrl_core.methods.censored_sgd.STEPS)


def pooled_residuals(artifact: ModelArtifact, series: PreparedSeries, split: str) -> tuple[float, ...]:
    """``P`` residuals of the predictor on ``split``'s last windows: a service's own, or for a fleet the ``P``
    evenly spaced quantiles of every service's (one pool any new service can start from)."""
    values, context = (series.train, series.train_ctx) if split == "train" else (series.val, series.val_ctx)
    predictor, _, _ = artifact.networks()
    residuals = split_residuals(predictor, values, context, artifact.config, POOL, series.services)
    if residuals.ndim == 1:
        return tuple(float(r) for r in residuals)
    return tuple(float(r) for r in np.quantile(residuals, (np.arange(POOL) + 0.5) / POOL))


def train_portfolio(series: PreparedSeries, config: PicRLConfig) -> ModelArtifact:
    """PIC-RL's artifact serving the portfolio: ``(lambda, kappa)`` of lowest validation regret among
    :data:`CHOICES` (each run from equal scores), the fleet's mean scores at the end of that run as the start."""
    artifact = train_offline(series, config)
    predictor, policy, _ = artifact.networks()
    on_train = pooled_residuals(artifact, series, "train")
    runs: dict[tuple[float, float], RuleProvisioner] = {}

    def build(choice: tuple[float, float]) -> RuleProvisioner:
        settings = PortfolioParameters(*choice, ACI_STEP, SGD_STEP, on_train, (0.0,) * len(CANDIDATES))
        rule = PortfolioRule(predictor, policy, artifact.config, settings)
        runs[choice] = RuleProvisioner(rule, series.scaler.low, series.scaler.high)
        return runs[choice]

    chosen = select_on_validation(CHOICES, build, series, config).chosen
    scores = runs[chosen].state.own.scores.mean(axis=0)
    settings = PortfolioParameters(
        *chosen,
        ACI_STEP,
        SGD_STEP,
        pooled_residuals(artifact, series, "val"),
        tuple(float(s) for s in scores - scores.min()),
    )
    return replace(artifact, method=PortfolioRule.method, parameters=settings.to_dict())


def fit_portfolio(series: PreparedSeries, config: PicRLConfig) -> RuleProvisioner:
    """The deployable rule a worker runs, for the comparison."""
    rule = PortfolioRule.from_artifact(train_portfolio(series, config))
    return RuleProvisioner(rule, series.scaler.low, series.scaler.high)


METHOD = Method(
    "portfolio",
    "Portfolio (PIC-RL, conformal, SGD on mu)",
    "PIC-RL's Phase 3 choosing per service among PIC-RL's order, conformal and censored SGD on its mu, on the costs "
    "the censored feedback reveals (docs/guide/algorithm.md)",
    "pic-rl",
    fit_portfolio,
    deployable=True,
    combines=CANDIDATES,
)
