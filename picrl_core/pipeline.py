"""The method end to end: Phases 1-2 offline (``train_offline``) and Phase 3 online (``run_online``).

``run_online`` is the embedded runner: the same controller and slow learner the stream uses, driven
by the counterfactual simulator over one or many services.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from picrl_core.artifact import ModelArtifact
from picrl_core.config import PicRLConfig
from picrl_core.controller import ControllerState, PicRLController, Transition
from picrl_core.costs import EpisodeMetrics, episode_metrics
from picrl_core.online import ReplayBuffer, SlowPolicyLearner, SlowUpdateStats
from picrl_core.policy import N_FEATURES
from picrl_core.predictor import train_predictor
from picrl_core.pretrain import pretrain_policy
from picrl_core.series import PreparedSeries
from picrl_core.simulator import Trajectory, simulate

Progress = Callable[[dict[str, float]], None]


def config_for(series: PreparedSeries, config: PicRLConfig) -> PicRLConfig:
    """The config with the predictor's context channels set from the series."""
    channels = 0 if series.train_ctx is None else series.train_ctx.shape[1]
    return replace(config, predictor=replace(config.predictor, context_channels=channels))


def train_offline(series: PreparedSeries, config: PicRLConfig, *, phase1_progress: Progress | None = None,
                  phase2_progress: Progress | None = None) -> ModelArtifact:
    """Phase 1 (Gaussian LSTM by NLL, early stopping on validation) then Phase 2 (actor-critic
    pretraining on rollouts of the training split)."""
    config = config_for(series, config)
    predictor, predictor_report = train_predictor(
        series.train, series.val, config.predictor, seed=config.seed,
        train_context=series.train_ctx, val_context=series.val_ctx, progress=phase1_progress)
    policy, value, pretrain_report = pretrain_policy(predictor, series.train, config,
                                                     train_context=series.train_ctx, progress=phase2_progress)
    return ModelArtifact(
        config=config, predictor=predictor, policy=policy, value=value,
        scaling={"series": series.scaler.to_dict(), "context": [s.to_dict() for s in series.context_scalers],
                 "context_names": list(series.context_names)},
        reports={"series": series.name, "notes": list(series.notes), "phase1": predictor_report.to_dict(),
                 "phase2": pretrain_report.to_dict()},
    )


@dataclass
class OnlineRun:
    """Result of Phase 3 on a demand matrix: the trajectory, its metrics and the slow updates."""

    trajectory: Trajectory
    metrics: EpisodeMetrics
    updates: list[SlowUpdateStats] = field(default_factory=list)


def run_online(artifact: ModelArtifact, demand: np.ndarray, history: np.ndarray, *,
               context: np.ndarray | None = None, history_context: np.ndarray | None = None,
               keys: np.ndarray | None = None, config: PicRLConfig | None = None,
               slow_updates: bool = True, progress: Callable[[int], None] | None = None) -> OnlineRun:
    """Phase 3 on ``demand`` ``(T, N)``: act with the pretrained policy, calibrate every tick and,
    when ``slow_updates``, refine the policy from replay every ``N_update`` transitions.

    ``config`` overrides the artifact's Phase 3 settings (ablations A3-A6 switch here).
    """
    config = config or artifact.config
    policy = copy.deepcopy(artifact.policy)
    controller = PicRLController(artifact.predictor, policy, config)
    updates: list[SlowUpdateStats] = []
    learner = SlowPolicyLearner(policy, artifact.value, config) if slow_updates else None
    buffer = ReplayBuffer(config.online.buffer_size, N_FEATURES) if learner is not None else None
    if learner is not None:
        controller.set_policy(learner.acting)
    since_update = 0

    def hook(t: int, _: ControllerState, transition: Transition) -> None:
        nonlocal since_update
        if learner is not None and buffer is not None:
            buffer.add(transition)
            since_update += transition.reward.shape[0]
            if since_update >= config.online.n_update and len(buffer) >= min(config.online.batch_size, 32):
                updates.append(learner.update(buffer))
                since_update = 0
        if progress is not None:
            progress(t)

    trajectory = simulate(controller, demand, history, context=context, history_context=history_context,
                          keys=keys, on_step=hook)
    return OnlineRun(trajectory, episode_metrics(trajectory.action, trajectory.demand, config.cost), updates)


def evaluation_inputs(series: PreparedSeries, window: int) -> dict[str, np.ndarray | None]:
    """Single-service Phase 3 inputs for the test split: its demand, with the end of validation as the
    cold-start history (offline logs are uncensored)."""
    context = None if series.test_ctx is None else series.test_ctx[:, None, :]
    history_context = None if series.val_ctx is None else series.val_ctx[None, -window:, :]
    return {"demand": series.test[:, None], "history": series.val[None, -window:],
            "context": context, "history_context": history_context}
