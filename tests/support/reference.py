"""The embedded runner's view of a stream workload: what the worker must reproduce tick for tick."""
from __future__ import annotations

import copy

import numpy as np

from picrl_core.artifact import ModelArtifact
from picrl_core.controller import PicRLController
from picrl_core.noise import service_key
from picrl_core.scaling import to_unit, window_range
from picrl_core.series import MinMaxScaler
from picrl_core.simulator import Trajectory, simulate


def reference_run(artifact: ModelArtifact, demand: np.ndarray, services: tuple[str, ...], headroom: float,
                  context: np.ndarray | None = None) -> Trajectory:
    """``simulate`` over the ticks after the warm-up window, with each service scaled by the range a
    worker derives from its first window and the warm-up as uncensored history.

    Demand above a service's range stays above 1 (no capacity in range covers it: the tick is short, as
    on the cluster); below it, it is 0, as the worker sees usage under its range."""
    window = artifact.config.predictor.window
    low, high = window_range(demand[:window].T, headroom)
    unit = np.maximum((demand - low) / (high - low), 0.0)
    scaled_context = None
    if context is not None:
        scalers = [MinMaxScaler.from_dict(s) for s in artifact.scaling["context"]]
        scaled_context = to_unit(context, np.array([s.low for s in scalers]), np.array([s.high for s in scalers]))
    controller = PicRLController(artifact.predictor, copy.deepcopy(artifact.policy), artifact.config)
    keys = np.array([service_key(s) for s in services], dtype=np.uint64)
    return simulate(controller, unit[window:], unit[:window].T, keys=keys, start_tick=window,
                    context=None if scaled_context is None else scaled_context[window:],
                    history_context=None if scaled_context is None else scaled_context[:window].transpose(1, 0, 2))
