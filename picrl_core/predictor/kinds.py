"""The two kinds of Phase-1 predictor (``predictor.kind``), chosen here and nowhere else.

``"windowed"`` (the paper's, :mod:`~picrl_core.predictor.windowed`): the LSTM re-reads the last ``W`` ticks from a
zero state every tick. ``"incremental"`` (the default, :mod:`~picrl_core.predictor.incremental`): it carries its
``(h, c)`` per service in the controller state and takes one cell step per tick. Both are a
:class:`~picrl_core.predictor.model.GaussianLSTM` in the artifact; a :class:`Kind` says how one is trained (its
:class:`~picrl_core.predictor.model.EpochSampler`), run by the controller (its
:class:`~picrl_core.predictor.model.Forecaster`) and read over a fully observed series.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from picrl_core.config import PredictorConfig
from picrl_core.predictor.incremental import IncrementalForecaster, SequenceSampler, stream_forecasts
from picrl_core.predictor.model import EpochSampler, Forecaster, Forecasts, GaussianLSTM
from picrl_core.predictor.windowed import WindowedForecaster, WindowSampler, windowed_forecasts


@dataclass(frozen=True)
class Kind:
    """What differs between the two kinds."""

    forecaster: Callable[[Any, int], Forecaster]  # (model, inference chunk) -> how the controller runs it
    memory_size: Callable[[PredictorConfig], int]  # floats a service's state carries for it
    forecasts: Callable[..., Forecasts]  # (model, series, context, window, services) over a fully observed series
    # (train, context, cfg, services) -> its training inputs (train_predictor)
    sampler: Callable[[np.ndarray, np.ndarray | None, PredictorConfig, int], EpochSampler]


KINDS: dict[str, Kind] = {
    "windowed": Kind(WindowedForecaster, WindowedForecaster.memory_size, windowed_forecasts, WindowSampler),
    "incremental": Kind(IncrementalForecaster, IncrementalForecaster.memory_size, stream_forecasts, SequenceSampler),
}


def kind_of(cfg: PredictorConfig) -> Kind:
    """The :class:`Kind` of ``cfg.kind``."""
    return KINDS[cfg.kind]


def memory_size(cfg: PredictorConfig) -> int:
    """Floats of predictor memory per service in a controller state of ``cfg`` (0 windowed, ``2 L H`` incremental)."""
    return kind_of(cfg).memory_size(cfg)


def forecasts_as_acted(
    model: GaussianLSTM, series: np.ndarray, context: np.ndarray | None, services: int = 1
) -> Forecasts:
    """``(mu, sigma, target)`` of every point of ``series`` after each segment's first ``window``, from the true
    demand before it, read as the controller reads ``model``: one carried stream per service (``kind =
    "incremental"``) or each point's window from a zero state."""
    return kind_of(model.cfg).forecasts(model, np.asarray(series, np.float64), context, model.cfg.window, services)
