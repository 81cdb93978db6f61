"""One cell of Tables 2 and 3: a method trained on a series and run on its test split under the PIC loop.

Every method gets the same inputs (Sec. 4.1.2): the test split as the demand ``d_t`` of one service
(of each service of a fleet, all acting together), the last predictor window of the validation split
as its uncensored cold-start history, the scaled context channels where the series has them, and the
config's cost weights for the metrics (a fleet's are the mean over its services). Only
:func:`~picrl_core.methods.base.run_pic_loop` and the metrics see ``d_t``.

:func:`run_on_test_split` is the paper's protocol (test demand clipped to the training range);
:func:`run_growth_test_split` the product's (:mod:`picrl_core.methods.growth`: unclipped demand, ranges
kept by the worker's rules), with metrics in native units, in training-range units and of the growth
(:mod:`picrl_core.growth_metrics`), its validation episode run under the same protocol;
:func:`growth_episode` runs a fitted provisioner under it (the design ladder's development episodes).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from picrl_core.config import PicRLConfig
from picrl_core.costs import EpisodeMetrics, mean_service_metrics
from picrl_core.growth_metrics import growth_metrics
from picrl_core.methods.base import LoopResult, Method, Provisioner, run_pic_loop
from picrl_core.methods.coupled import resource_metrics, run_coupled_loop
from picrl_core.methods.growth import STREAM_GROWTH, RangeGrowth, run_growth_loop
from picrl_core.pipeline import EvaluationInputs, evaluation_inputs
from picrl_core.series import PreparedSeries


@dataclass(frozen=True)
class TestSplitRun:
    """The test-split episode of one method: ``demand``, ``actions`` and ``censored`` are ``(T,)``, or
    ``(T, N)`` for a fleet of N services, whose ``metrics`` are the mean over services (on a multi-resource
    fleet, summed over resources with their weights; per-resource metrics in ``extra``)."""

    demand: np.ndarray
    actions: np.ndarray
    censored: np.ndarray
    metrics: EpisodeMetrics
    extra: dict[str, float] = field(default_factory=dict)
    validation_regret: float | None = None  # the same provisioner on the validation episode (validation_regret)


def run_on_test_split(method: Method, series: PreparedSeries, config: PicRLConfig, step_seconds: float) -> TestSplitRun:
    """Fit ``method`` on the training (and validation) split, then run it on the test split (with the
    demand revealed every tick for a full-information reference, ``method.censoring`` False). A
    multi-resource fleet runs in :func:`~picrl_core.methods.coupled.run_coupled_loop`, reading the coupled
    flags when ``method.coupled``. The same provisioner then runs the validation episode
    (:func:`validation_regret`), after the test run, which it cannot change (``start`` resets every state)."""
    provisioner = method.fitted(series, config, step_seconds)
    run = _episode(provisioner, method, series, config, evaluation_inputs(series, config.predictor.window))
    return replace(run, validation_regret=validation_regret(provisioner, method, series, config))


def validation_regret(
    provisioner: Provisioner, method: Method, series: PreparedSeries, config: PicRLConfig
) -> float | None:
    """Regret Eq. (2) of a fitted ``provisioner`` on the validation episode (``evaluation_inputs(..., "val")``,
    the ticks every method's knobs are chosen on), in the loop and metrics of :func:`run_on_test_split`; None for
    a hindsight reference, which only replays the test split. What ``picrl compare`` recommends by: it never
    reads the test split."""
    if method.group == "hindsight":
        return None
    inputs = evaluation_inputs(series, config.predictor.window, "val")
    return _episode(provisioner, method, series, config, inputs).metrics.regret


def _episode(
    provisioner: Provisioner, method: Method, series: PreparedSeries, config: PicRLConfig, inputs: EvaluationInputs
) -> TestSplitRun:
    """``provisioner`` on the episode of ``inputs`` (:func:`~picrl_core.pipeline.evaluation_inputs`)."""
    if series.resources:
        loop: LoopResult = run_coupled_loop(
            provisioner,
            inputs["demand"],
            inputs["history"],
            series.resources,
            coupled=method.coupled,
            censoring=method.censoring,
        )
        metrics, extra = resource_metrics(loop.actions, inputs["demand"], series.resources, config.cost)
        return TestSplitRun(inputs["demand"], loop.actions, loop.censored, metrics, extra)
    loop = run_pic_loop(
        provisioner,
        inputs["demand"],
        inputs["history"],
        context=inputs["context"],
        history_context=inputs["history_context"],
        censoring=method.censoring,
    )
    demand, actions, censored = np.asarray(inputs["demand"]), loop.actions, loop.censored
    if series.services == 1:
        demand, actions, censored = demand[:, 0], actions[:, 0], censored[:, 0]
    return TestSplitRun(demand, actions, censored, mean_service_metrics(actions, demand, config.cost))


# the native metrics a growth-protocol run reports next to the training-range ones (suffixed "_native")
NATIVE_METRICS = ("mae", "regret", "under_mass", "over_mass")


def run_growth_test_split(
    method: Method,
    series: PreparedSeries,
    native_test: np.ndarray,
    native_validation: np.ndarray,
    config: PicRLConfig,
    step_seconds: float,
    growth: RangeGrowth = STREAM_GROWTH,
) -> TestSplitRun:
    """:func:`run_on_test_split` under the product's protocol (:func:`growth_episode`): the test split
    ``native_test`` and the validation split ``native_validation`` unclipped in native units, ``(T_i, N)``
    (:func:`~picrl_core.series.native_splits`). The validation regret comes from the validation episode under
    the same protocol, so a recommendation by it ranks what the worker would do. Not defined for a
    multi-resource fleet, nor for a hindsight reference (group ``"hindsight"``: it replays the clipped test
    split)."""
    if method.group == "hindsight":
        raise ValueError(f"{method.name} replays the clipped test split; it has no run under the product protocol")
    provisioner = method.fitted(series, config, step_seconds)
    run = growth_episode(provisioner, series, native_test, config, censoring=method.censoring, growth=growth)
    validation = growth_episode(
        provisioner, series, native_validation, config, censoring=method.censoring, growth=growth, split="val"
    )
    return replace(run, validation_regret=validation.metrics.regret)


def growth_episode(
    provisioner: Provisioner,
    series: PreparedSeries,
    native_demand: np.ndarray,
    config: PicRLConfig,
    *,
    censoring: bool = True,
    growth: RangeGrowth = STREAM_GROWTH,
    split: str = "test",
) -> TestSplitRun:
    """A fitted ``provisioner`` on the test split of ``series`` under the product's protocol: ``native_demand``
    ``(T, N)`` is that split unclipped in native units (:func:`~picrl_core.series.native_splits`), each service
    starts in the training range (the stream's ``scaling="artifact"``) and keeps it by ``growth``. ``demand`` and
    ``actions`` of the result are in units of the training range (``(x - L) / (H - L)``, beyond ``[0, 1]``
    where the demand is); ``extra`` holds the native metrics and the growth metrics. ``split="val"`` runs the
    validation episode of :func:`~picrl_core.pipeline.evaluation_inputs` instead: ``native_demand`` is then the
    whole validation split, of which the episode is the last ticks."""
    if series.resources:
        raise ValueError("the product protocol runs services of one resource; a multi-resource fleet runs the paper's")
    inputs = evaluation_inputs(series, config.predictor.window, split)
    native = np.asarray(native_demand, dtype=np.float64)
    if split == "val":
        native = native[native.shape[0] - inputs["demand"].shape[0] :]
    if native.shape != inputs["demand"].shape:
        raise ValueError(f"native demand {native.shape} is not the test split's shape {inputs['demand'].shape}")
    low, high = series.scaler.low, series.scaler.high
    loop = run_growth_loop(
        provisioner,
        native,
        inputs["history"],
        low,
        high,
        growth,
        context=inputs["context"],
        history_context=inputs["history_context"],
        censoring=censoring,
    )
    demand, actions = (native - low) / (high - low), (loop.capacity - low) / (high - low)
    in_native = mean_service_metrics(loop.capacity, native, config.cost).to_dict()
    extra = {f"{name}_native": in_native[name] for name in NATIVE_METRICS}
    extra |= growth_metrics(loop.capacity, native, high, config.cost)
    censored = loop.censored
    if series.services == 1:
        demand, actions, censored = demand[:, 0], actions[:, 0], censored[:, 0]
    return TestSplitRun(demand, actions, censored, mean_service_metrics(actions, demand, config.cost), extra)
