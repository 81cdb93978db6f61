"""Choosing a method's knobs on the validation split only: the protocol every tuned method follows.

A method with knobs is fitted on the training split, run under the PIC loop on the validation split
(from the end of the training split, :func:`~picrl_core.pipeline.evaluation_inputs` with
``split="val"``) once per candidate, and keeps the candidate of lowest validation regret. Every tuned
method gets the same budget, :data:`CANDIDATES` runs (PIC-RL's temperature rate,
:func:`~picrl_core.pipeline.select_scale_rate`, tries as many; PIC-RL's defaults themselves were chosen
on development splits by ``benchmarks/select_design.py``). The test split is read only by the
reported run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from picrl_core.config import PicRLConfig
from picrl_core.costs import mean_service_metrics
from picrl_core.methods.base import Provisioner, run_pic_loop
from picrl_core.pipeline import SCALE_RATES, evaluation_inputs
from picrl_core.series import PreparedSeries

CANDIDATES = len(SCALE_RATES)  # runs on the validation split per tuned method

Knob = TypeVar("Knob")


@dataclass(frozen=True)
class Selection(Generic[Knob]):
    """The candidates tried, their validation regret, and the one kept."""

    candidates: tuple[Knob, ...]
    validation_regret: tuple[float, ...]
    chosen: Knob


def validation_regret(provisioner: Provisioner, series: PreparedSeries, config: PicRLConfig) -> float:
    """Regret of ``provisioner`` under the PIC loop on the validation split (per service, for a fleet)."""
    inputs = evaluation_inputs(series, config.predictor.window, "val")
    loop = run_pic_loop(
        provisioner,
        inputs["demand"],
        inputs["history"],
        context=inputs["context"],
        history_context=inputs["history_context"],
    )
    return mean_service_metrics(loop.actions, inputs["demand"], config.cost).regret


def select_on_validation(
    candidates: Sequence[Knob], build: Callable[[Knob], Provisioner], series: PreparedSeries, config: PicRLConfig
) -> Selection[Knob]:
    """The candidate whose provisioner ``build(candidate)`` (ready for the validation split) has the lowest
    validation regret; ties go to the earliest candidate. At most :data:`CANDIDATES` candidates."""
    if not 1 <= len(candidates) <= CANDIDATES:
        raise ValueError(f"a method may try 1 to {CANDIDATES} candidates on validation; got {len(candidates)}")
    scores = tuple(validation_regret(build(c), series, config) for c in candidates)
    return Selection(tuple(candidates), scores, candidates[int(np.argmin(scores))])
