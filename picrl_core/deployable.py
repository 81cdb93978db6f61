"""The methods a stream worker can deploy, by name: the one place ``stream`` reaches a decision rule through.

Each entry says how ``picrl train --method NAME`` fits the method into a model artifact (:func:`train_model`) and
how a worker rebuilds its :class:`~picrl_core.rules.base.DeployableRule` from that artifact (:func:`deployed_rule`).
A method of the comparison that is not listed here is compare only (``Method.deployable`` False): the recommendation
never names it. Every rule here needs only what the stream sees: the censored feedback, the context channels and
the service's history from its warm-up window.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

import numpy as np
import torch

from picrl_core.artifact import ModelArtifact, load_artifact, served_method
from picrl_core.config import PicRLConfig, PredictorConfig
from picrl_core.controller_state import ControllerState
from picrl_core.methods.censored_sgd import fit_censored_sgd, fit_censored_sgd_residual
from picrl_core.methods.conformal import fit_conformal
from picrl_core.methods.headroom import fit_recent_max
from picrl_core.methods.newsvendor import fit_kaplan_meier
from picrl_core.methods.portfolio import train_portfolio
from picrl_core.methods.predictors import GaussianAutoformer, GaussianInformer, GaussianTFT
from picrl_core.methods.thompson import fit_thompson
from picrl_core.methods.vpa import fit_vpa
from picrl_core.pipeline import config_for, train_offline, with_windowed_predictor
from picrl_core.predictor.model import GaussianLSTM
from picrl_core.rules import DEPLOYABLE_METHODS
from picrl_core.rules.base import DeployableRule
from picrl_core.rules.censored_sgd import CensoredSGDRule
from picrl_core.rules.conformal import ConformalRule
from picrl_core.rules.kaplan_meier import KaplanMeierRule
from picrl_core.rules.pic_rl import PicRLRule
from picrl_core.rules.portfolio import PortfolioRule, PortfolioState
from picrl_core.rules.recent_max import RecentMaxRule
from picrl_core.rules.thompson import ThompsonRule
from picrl_core.rules.vpa import VPARule
from picrl_core.series import PreparedSeries

# a batch's states: PIC-RL's controller state, the portfolio's (the controller's and its choice's), or a record
# rule's records
RuleState = ControllerState | PortfolioState | np.recarray
Train = Callable[[PreparedSeries, PicRLConfig, float], ModelArtifact]  # (series, config, step seconds) -> artifact


@dataclass(frozen=True)
class Deployable:
    """How one method is trained into an artifact and rebuilt from it."""

    train: Train
    rule: Callable[[ModelArtifact], DeployableRule]
    predictor_model: Callable[[PredictorConfig], torch.nn.Module] = GaussianLSTM  # the predictor network it keeps


def _pic_rl(model: Callable[[PredictorConfig], torch.nn.Module] | None, method: str) -> Train:
    """PIC-RL's phases 1 and 2 (the predictor ``model`` in the LSTM's place, windowed, where given)."""

    def train(series: PreparedSeries, config: PicRLConfig, step_seconds: float) -> ModelArtifact:
        if model is None:
            return train_offline(series, config)
        return replace(train_offline(series, with_windowed_predictor(config), model_factory=model), method=method)

    return train


def _rule_artifact(
    rule: DeployableRule, series: PreparedSeries, config: PicRLConfig, predictor: torch.nn.Module | None = None
) -> ModelArtifact:
    """An artifact of a record rule: its fitted parameters, the Phase-1 ``predictor`` it reads (None: none), the
    config (its window: the warm-up) and the scaling."""
    return ModelArtifact(
        config_for(series, config),
        predictor,
        None,
        None,
        scaling={
            "series": series.scaler.to_dict(),
            "context": [s.to_dict() for s in series.context_scalers],
            "context_names": list(series.context_names),
        },
        reports={"series": series.name, "notes": list(series.notes)},
        method=rule.method,
        parameters=rule.parameters(),
    )


def _train_recent_max(series: PreparedSeries, config: PicRLConfig, step_seconds: float) -> ModelArtifact:
    fitted = fit_recent_max(series, config, step_seconds=step_seconds)
    return _rule_artifact(fitted.rule, series, config)


def _train_conformal(series: PreparedSeries, config: PicRLConfig, step_seconds: float) -> ModelArtifact:
    """The comparison's conformal fit; a fleet's seed pools (one per service) end to end, their last ``n`` seed every
    new service."""
    fitted = cast(ConformalRule, fit_conformal(series, config).rule)
    pool = fitted.calibration.reshape(-1)[-fitted.calibration.shape[-1] :]
    rule = ConformalRule(fitted.model, pool, fitted.alpha, fitted.aci_step, fitted.chunk)
    return _rule_artifact(rule, series, with_windowed_predictor(config), fitted.model)


def _train_sgd(residual: bool) -> Train:
    """The comparison's censored SGD fit (on the Phase-1 predictor's ``mu`` when ``residual``)."""

    def train(series: PreparedSeries, config: PicRLConfig, step_seconds: float) -> ModelArtifact:
        fit = fit_censored_sgd_residual if residual else fit_censored_sgd
        rule = cast(CensoredSGDRule, fit(series, config).rule)
        return _rule_artifact(rule, series, with_windowed_predictor(config), rule.predictor)

    return train


def _train_kaplan_meier(series: PreparedSeries, config: PicRLConfig, step_seconds: float) -> ModelArtifact:
    """Nothing to train: the window is the config's estimator window."""
    return _rule_artifact(cast(KaplanMeierRule, fit_kaplan_meier(series, config).rule), series, config)


def _train_thompson(series: PreparedSeries, config: PicRLConfig, step_seconds: float) -> ModelArtifact:
    """The comparison's Thompson fit: the Phase-1 predictor and the offline posterior every service starts from."""
    rule = cast(ThompsonRule, fit_thompson(series, config).rule)
    return _rule_artifact(rule, series, with_windowed_predictor(config), rule.model)


def _train_vpa(series: PreparedSeries, config: PicRLConfig, step_seconds: float) -> ModelArtifact:
    """Nothing to train: the 24 h half-life in ticks of the trace's step."""
    return _rule_artifact(fit_vpa(series, config, step_seconds=step_seconds).rule, series, config)


_ENTRIES: dict[str, Deployable] = {
    "pic-rl": Deployable(_pic_rl(None, "pic-rl"), PicRLRule),
    "tft": Deployable(_pic_rl(GaussianTFT, "tft"), PicRLRule, GaussianTFT),
    "informer": Deployable(_pic_rl(GaussianInformer, "informer"), PicRLRule, GaussianInformer),
    "autoformer": Deployable(_pic_rl(GaussianAutoformer, "autoformer"), PicRLRule, GaussianAutoformer),
    "portfolio": Deployable(
        lambda series, config, step_seconds: train_portfolio(series, config), PortfolioRule.from_artifact
    ),
    "recent-max": Deployable(_train_recent_max, lambda a: RecentMaxRule.from_parameters(a.parameters)),
    "conformal": Deployable(_train_conformal, ConformalRule.from_artifact),
    "sgd": Deployable(_train_sgd(residual=False), CensoredSGDRule.from_artifact),
    "sgd-residual": Deployable(_train_sgd(residual=True), CensoredSGDRule.from_artifact),
    "kaplan-meier": Deployable(_train_kaplan_meier, KaplanMeierRule.from_artifact),
    "thompson": Deployable(_train_thompson, ThompsonRule.from_artifact),
    "vpa": Deployable(_train_vpa, VPARule.from_artifact),
}


DEPLOYABLE: dict[str, Deployable] = {name: _ENTRIES[name] for name in DEPLOYABLE_METHODS}  # every name has one


__all__ = [
    "DEPLOYABLE",
    "DeployError",
    "DeployableRule",
    "RuleState",
    "check_serves",
    "deployed_rule",
    "load_model",
    "train_model",
]


class DeployError(ValueError):
    """A model that cannot be deployed as asked: for another method, or for one no worker runs."""


def _entry(method: str) -> Deployable:
    if method not in DEPLOYABLE:
        raise DeployError(f"{method!r} is not deployable (compare only); a worker runs {', '.join(DEPLOYABLE)}")
    return DEPLOYABLE[method]


def train_model(method: str, series: PreparedSeries, config: PicRLConfig, step_seconds: float) -> ModelArtifact:
    """``method`` fitted on ``series``'s training (and, where it chooses a parameter, validation) split."""
    return _entry(method).train(series, config, step_seconds)


def load_model(folder: Path) -> ModelArtifact:
    """The artifact in ``folder``, whichever deployable method it serves (its predictor network built as that method
    keeps it)."""
    return load_artifact(folder, _entry(served_method(folder)).predictor_model)


def deployed_rule(artifact: ModelArtifact, method: str | None = None) -> DeployableRule:
    """The rule serving ``artifact``; :class:`DeployError` when ``method`` is given and the artifact serves another."""
    check_serves(artifact, method)
    return _entry(artifact.method).rule(artifact)


def check_serves(artifact: ModelArtifact, method: str | None) -> None:
    """:class:`DeployError` unless ``artifact`` serves ``method`` (any deployable method when None)."""
    if method is not None and method != artifact.method:
        raise DeployError(
            f"the model serves {artifact.method!r}, not {method!r}: train one with picrl train --method {method}"
        )
    _entry(artifact.method)
