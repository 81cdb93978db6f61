"""The method end to end: Phases 1-2 offline (``train_offline``) and Phase 3 online (``run_online``).

``run_online`` is the embedded runner: the same controller and slow learner the stream uses, driven
by the counterfactual simulator over one or many services.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypedDict

import numpy as np
import torch

from picrl_core.artifact import ModelArtifact
from picrl_core.config import OnlineConfig, PicRLConfig, PredictorConfig
from picrl_core.controller import PicRLController, Transition
from picrl_core.controller_state import ControllerState
from picrl_core.costs import EpisodeMetrics, episode_metrics
from picrl_core.online import ReplayBuffer, SlowPolicyLearner, SlowUpdateStats
from picrl_core.policy import N_FEATURES, PolicyNetwork, ValueNetwork
from picrl_core.predictor.model import GaussianLSTM, PredictorReport
from picrl_core.predictor.train import train_predictor
from picrl_core.pretrain import pretrain_policy
from picrl_core.series import PreparedSeries
from picrl_core.simulator import StepHook, Trajectory, simulate
from picrl_core.training_memo import memoized, series_fingerprint

Progress = Callable[[dict[str, float]], None]
# Phase 2: ``(predictor, train, config, *, train_context, services, progress) -> (policy, value, report)``,
# the report having ``to_dict()`` (``pretrain_policy``, or a substitution of the comparison).
Pretrainer = Callable[..., tuple[PolicyNetwork, ValueNetwork, Any]]


def config_for(series: PreparedSeries, config: PicRLConfig) -> PicRLConfig:
    """The config with the predictor's context channels set from the series."""
    channels = 0 if series.train_ctx is None else series.train_ctx.shape[1]
    return replace(config, predictor=replace(config.predictor, context_channels=channels))


def train_phase1(
    series: PreparedSeries,
    config: PicRLConfig,
    *,
    model_factory: Callable[[PredictorConfig], torch.nn.Module] = GaussianLSTM,
    progress: Progress | None = None,
) -> tuple[torch.nn.Module, PredictorReport]:
    """Phase 1 on the series' training split, early-stopped on its validation split (``config`` from
    :func:`config_for`). Inside :func:`~picrl_core.training_memo.shared_training` an identical
    earlier training (same series, predictor config, seed and model) is reused."""

    def train() -> tuple[torch.nn.Module, PredictorReport]:
        return train_predictor(
            series.train,
            series.val,
            config.predictor,
            seed=config.seed,
            train_context=series.train_ctx,
            val_context=series.val_ctx,
            progress=progress,
            model_factory=model_factory,
            services=series.services,
        )

    return memoized(("phase1", series_fingerprint(series), config.seed, config.predictor, model_factory), train)


def with_windowed_predictor(config: PicRLConfig) -> PicRLConfig:
    """``config`` with the paper's windowed LSTM (``predictor.kind = "windowed"``): what a method that reads windows
    of the last ``W`` ticks (the baselines' forecast feed, a transformer substitution) is trained with."""
    return replace(config, predictor=replace(config.predictor, kind="windowed"))


def phase1_predictor(series: PreparedSeries, config: PicRLConfig) -> torch.nn.Module:
    """The baselines' Phase-1 Gaussian LSTM, in eval mode: trained as PIC-RL's windowed predictor is (same config,
    seed and splits). The baselines read windows of the last ``W`` ticks (:class:`~picrl_core.methods.conformal.
    PredictorFeed`), so they get the windowed LSTM whatever ``predictor.kind`` says (the paper's)."""
    return train_phase1(series, config_for(series, with_windowed_predictor(config)))[0].eval()


def train_offline(
    series: PreparedSeries,
    config: PicRLConfig,
    *,
    phase1_progress: Progress | None = None,
    phase2_progress: Progress | None = None,
    model_factory: Callable[[PredictorConfig], torch.nn.Module] = GaussianLSTM,
    pretrainer: Pretrainer = pretrain_policy,
) -> ModelArtifact:
    """Phase 1 (Gaussian LSTM by NLL, early stopping on validation) then Phase 2 (actor-critic
    pretraining on rollouts of the training split). ``model_factory`` and ``pretrainer`` substitute
    Phase 1 or Phase 2 (the comparison's baselines); an artifact with a substituted predictor is
    used in memory only (``save_artifact`` stores a Gaussian LSTM). Inside
    :func:`~picrl_core.training_memo.shared_training` identical phases are trained once; Phase 2
    never reads ``config.online``, so configs differing only there share it. With
    ``calibrator.select_scale_rate`` the online temperature's rate is then chosen on the validation split
    (:func:`select_scale_rate`, the report under ``reports["phase3_scale_rate"]``)."""
    config = config_for(series, config)
    predictor, predictor_report = train_phase1(series, config, model_factory=model_factory, progress=phase1_progress)
    return _phases_2_and_3(
        series, config, predictor, predictor_report.to_dict(), model_factory, pretrainer, phase2_progress
    )


def _phases_2_and_3(
    series: PreparedSeries,
    config: PicRLConfig,
    predictor: torch.nn.Module,
    predictor_report: dict,
    model_factory: Callable[[PredictorConfig], torch.nn.Module],
    pretrainer: Pretrainer,
    phase2_progress: Progress | None,
) -> ModelArtifact:
    """Phase 2 on ``predictor`` and the Phase-3 settings chosen on the validation split (:func:`train_offline`)."""
    offline_config = replace(config, online=OnlineConfig())
    policy, value, pretrain_report = memoized(
        ("phase2", series_fingerprint(series), offline_config, model_factory, pretrainer),
        lambda: pretrainer(
            predictor,
            series.train,
            config,
            train_context=series.train_ctx,
            services=series.services,
            progress=phase2_progress,
        ),
    )
    artifact = ModelArtifact(
        config=config,
        predictor=predictor,
        policy=policy,
        value=value,
        scaling={
            "series": series.scaler.to_dict(),
            "context": [s.to_dict() for s in series.context_scalers],
            "context_names": list(series.context_names),
        },
        reports={
            "series": series.name,
            "notes": list(series.notes),
            "phase1": predictor_report,
            "phase2": pretrain_report.to_dict(),
        },
    )
    levels = None
    if config.calibrator.online_scale and config.calibrator.select_scale_rate:
        artifact, selection, levels = select_scale_rate(artifact, series)
        artifact = replace(artifact, reports={**artifact.reports, "phase3_scale_rate": selection})
    if config.calibrator.start_from_validation:
        levels = levels if levels is not None else validation_run(artifact, series)
        calibrator = replace(artifact.config.calibrator, initial_margin=levels.margin, initial_scale=levels.scale)
        artifact = replace(
            artifact,
            config=replace(artifact.config, calibrator=calibrator),
            reports={**artifact.reports, "phase3_start": {"margin_in_sigma": levels.margin, "scale": levels.scale}},
        )
    return artifact


@dataclass
class OnlineRun:
    """Result of Phase 3 on a demand matrix: the trajectory, its metrics and the slow updates."""

    trajectory: Trajectory
    metrics: EpisodeMetrics
    updates: list[SlowUpdateStats] = field(default_factory=list)


class SlowLoop:
    """Phase 3 slow loop (Algorithm 1, lines 31-35) as one object: every transition goes to the replay
    buffer, and the KL-regularised learner updates the acting policy every ``N_update`` ticks (once the
    buffer holds ``min(batch_size, 32)``). The acting policy changes in place. Algorithm 1 counts the
    steps of its one service; a tick of N services brings N transitions, so counting transitions would
    update N times as often (every tick for a 91-pod fleet), and each update would see one tick only."""

    def __init__(self, policy: PolicyNetwork, value: ValueNetwork, config: PicRLConfig) -> None:
        self.learner = SlowPolicyLearner(policy, value, config)
        self.buffer = ReplayBuffer(config.online.buffer_size, N_FEATURES)
        self.updates: list[SlowUpdateStats] = []
        self._online = config.online
        self._since_update = 0

    @property
    def acting(self) -> PolicyNetwork:
        return self.learner.acting

    def observe(self, transition: Transition) -> None:
        self.buffer.add(transition)
        self._since_update += 1
        if self._since_update >= self._online.n_update and len(self.buffer) >= min(self._online.batch_size, 32):
            self.updates.append(self.learner.update(self.buffer))
            self._since_update = 0


def online_controller(
    predictor: torch.nn.Module,
    policy: PolicyNetwork,
    value: ValueNetwork,
    config: PicRLConfig,
    slow_updates: bool = True,
) -> tuple[PicRLController, SlowLoop | None]:
    """The Phase 3 controller acting with (a copy of) ``policy`` and, when ``slow_updates``, the slow
    loop that refines it; the networks passed in are left untouched."""
    if not slow_updates:
        return PicRLController(predictor, copy.deepcopy(policy), config), None
    slow = SlowLoop(policy, value, config)
    return PicRLController(predictor, slow.acting, config), slow


def run_online(
    artifact: ModelArtifact,
    demand: np.ndarray,
    history: np.ndarray,
    *,
    context: np.ndarray | None = None,
    history_context: np.ndarray | None = None,
    keys: np.ndarray | None = None,
    config: PicRLConfig | None = None,
    slow_updates: bool = True,
    progress: Callable[[int], None] | None = None,
    on_step: StepHook | None = None,
) -> OnlineRun:
    """Phase 3 on ``demand`` ``(T, N)``: act with the pretrained policy, calibrate every tick and,
    when ``slow_updates``, refine the policy from replay every ``N_update`` transitions.

    ``config`` overrides the artifact's Phase 3 settings (ablations A3-A6 switch here); ``on_step`` sees
    every tick's new state and transition (:data:`~picrl_core.simulator.StepHook`).
    """
    config = config or artifact.config
    controller, slow = online_controller(*artifact.networks(), config, slow_updates)

    def hook(t: int, state: ControllerState, transition: Transition) -> None:
        if slow is not None:
            slow.observe(transition)
        if on_step is not None:
            on_step(t, state, transition)
        if progress is not None:
            progress(t)

    trajectory = simulate(
        controller, demand, history, context=context, history_context=history_context, keys=keys, on_step=hook
    )
    return OnlineRun(
        trajectory,
        episode_metrics(trajectory.action, trajectory.demand, config.cost),
        [] if slow is None else slow.updates,
    )


# The validation episode knobs are chosen on: the last this-many ticks of the validation split (all of
# GenAI's 288; 33 hours of DLRM's 8,928), so choosing stays cheap on long traces.
VALIDATION_EPISODE = 2_000


class EvaluationInputs(TypedDict):
    """:func:`evaluation_inputs`: the keyword arguments of :func:`run_online` and the methods' loops."""

    demand: np.ndarray
    history: np.ndarray
    context: np.ndarray | None
    history_context: np.ndarray | None


def evaluation_inputs(series: PreparedSeries, window: int, split: str = "test") -> EvaluationInputs:
    """Phase 3 inputs for the test split, one service per series of ``series.services``: its demand
    ``(T, N)``, with the end of validation as the cold-start history ``(N, window)`` (offline logs are
    uncensored). ``split="val"`` gives the last :data:`VALIDATION_EPISODE` ticks of the validation split
    with the ticks before them as history: what every method's knobs are chosen on
    (:func:`select_scale_rate`, :mod:`picrl_core.methods.selection`), so the test split is never read
    before the reported run."""
    n = series.services

    def rows(values: np.ndarray) -> np.ndarray:  # (N, T_i[, C]): one row per service
        return values.reshape(n, -1, *values.shape[1:])

    def context_rows(values: np.ndarray | None) -> np.ndarray | None:
        return None if values is None else rows(values)

    if split == "test":
        demand, past = rows(series.test), rows(series.val)
        ctx, past_ctx = context_rows(series.test_ctx), context_rows(series.val_ctx)
    elif split == "val":
        val, val_ctx = rows(series.val), context_rows(series.val_ctx)
        cut = max(val.shape[1] - VALIDATION_EPISODE, 0)
        demand, past = val[:, cut:], np.concatenate([rows(series.train), val[:, :cut]], axis=1)
        ctx = None if val_ctx is None else val_ctx[:, cut:]
        past_ctx = (
            None if val_ctx is None else np.concatenate([context_rows(series.train_ctx), val_ctx[:, :cut]], axis=1)
        )
    else:
        raise ValueError(f"split must be 'test' or 'val'; got {split!r}")
    return {
        "demand": demand.T,
        "history": past[:, -window:],
        "context": None if ctx is None else ctx.transpose(1, 0, 2),
        "history_context": None if past_ctx is None else past_ctx[:, -window:, :],
    }


@dataclass(frozen=True)
class ValidationRun:
    """Phase 3 (:func:`run_online`) on the validation episode (``evaluation_inputs(..., "val")``): its regret,
    and the levels the fast variables settled at over the episode's second half, where a new service of this
    model starts (``calibrator.start_from_validation``): each service's median margin in units of its sigma
    and its median temperature, then the median over the services."""

    regret: float
    margin: float
    scale: float


def validation_run(artifact: ModelArtifact, series: PreparedSeries) -> ValidationRun:
    """:class:`ValidationRun` of ``artifact`` (its config as it stands, from a cold start)."""
    inputs = evaluation_inputs(series, artifact.config.predictor.window, "val")
    settled = inputs["demand"].shape[0] // 2
    margins: list[np.ndarray] = []
    scales: list[np.ndarray] = []

    def record(t: int, state: ControllerState, _: Transition) -> None:
        if t >= settled:
            margins.append(state.margin / state.sigma)
            scales.append(state.temperature)

    run = run_online(artifact, **inputs, on_step=record)  # temperatures stay in [scale_min, scale_max], so do medians
    return ValidationRun(
        run.metrics.regret, float(np.median(np.median(margins, axis=0))), float(np.median(np.median(scales, axis=0)))
    )


def _lowest_validation_regret(
    artifact: ModelArtifact,
    series: PreparedSeries,
    candidates: dict[Any, PicRLConfig],
    known: dict[Any, ValidationRun] | None = None,
) -> tuple[Any, dict[Any, ValidationRun]]:
    """The key of the candidate config whose :func:`validation_run` has the lowest regret, ties to the earlier
    key; and each key's run (those in ``known`` are not run again)."""
    known = known or {}
    runs = {
        key: known[key] if key in known else validation_run(replace(artifact, config=candidate), series)
        for key, candidate in candidates.items()
    }
    return min(runs, key=lambda key: runs[key].regret), runs


# Candidate rates of the online temperature (calibrator.scale_rate), slowest first; the baselines' knobs get as many
# (picrl_core.methods.selection.CANDIDATES).
SCALE_RATES = (1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2)


def select_scale_rate(
    artifact: ModelArtifact, series: PreparedSeries
) -> tuple[ModelArtifact, dict[str, Any], ValidationRun]:
    """The online temperature's rate chosen on the validation split (``calibrator.select_scale_rate``): one
    validation run per rate of :data:`SCALE_RATES` and the artifact keeps the rate of lowest validation
    regret (ties: the slower). How fast a service's scale should follow its residuals is a property of
    the series (a smooth aggregate wants a slow, quiet temperature, a pod that holds flat for hours and
    then jumps a fast one), so it is fitted per model like the sigma temperature."""
    config = artifact.config

    def with_rate(rate: float) -> PicRLConfig:
        return replace(config, calibrator=replace(config.calibrator, scale_rate=rate))

    best, runs = _lowest_validation_regret(artifact, series, {rate: with_rate(rate) for rate in SCALE_RATES})
    return (
        replace(artifact, config=with_rate(best)),
        {"rates": list(SCALE_RATES), "validation_regret": [runs[r].regret for r in SCALE_RATES], "chosen": best},
        runs[best],
    )
