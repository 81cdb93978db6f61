"""The warm-started censored-demand estimator against the cold-start solver on the bundled traces.

The controller keeps each tick's Tobit estimate in the state row and starts the next tick's Newton
iterations from it (``EstimatorConfig.warm_start``). Warm and cold starts stop at the same convergence
test, so they reach the same maximiser up to it: every estimate along a closed loop on each bundled
trace matches the cold-start solver within ``TOLERANCE``, and so do the decisions of a whole closed
loop run one way and the other.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from picrl.datasets import DATASETS, load_dataset
from picrl_core.censored_estimator import estimate_censored_demand
from picrl_core.config import PicRLConfig
from picrl_core.controller import PicRLController
from picrl_core.policy import PolicyNetwork
from picrl_core.predictor.model import GaussianLSTM
from picrl_core.series import prepare_series
from picrl_core.simulator import censor

# absolute, on values of order 0.01-1 (demand scaled to [0, 1]); measured: < 4e-11 (means, stds, actions), 5.6e-9 (the
# standard error, read at the iterate before Newton's last unevaluated step), 9.3e-10 (k: a float32 policy output)
TOLERANCE = 1e-8
TICKS = 600  # closed-loop ticks per trace (from the start of its validation split)


def _closed_loop(config: PicRLConfig, demand: np.ndarray, history: np.ndarray, context, history_context):
    """(per-tick states, the estimator inputs and warm starts of each tick) of one closed loop."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        predictor, policy = GaussianLSTM(config.predictor), PolicyNetwork(config.policy)
    controller = PicRLController(predictor, policy, config, chunk=1)
    state = controller.initial_state(np.zeros(1, np.uint64), history[None], history_context)
    states = [state]
    for t in range(demand.shape[0]):
        y, c = censor(demand[t : t + 1], state.action)
        state, _ = controller.step(state, y, c, None if context is None else context[t])
        states.append(state)
    return states


@pytest.mark.parametrize("name", list(DATASETS))
def test_warm_start_matches_the_cold_start_solver_on_bundled_traces(name: str) -> None:
    torch.set_num_threads(1)
    trace = load_dataset(name)
    series = prepare_series(trace.values, trace.name, trace.context, trace.context_names)
    # windows that keep their shortages censored (no E-step), so the Tobit solver has censored windows to solve
    base = replace(PicRLConfig(), estimator=replace(PicRLConfig().estimator, impute_window=False))
    channels = 0 if series.val_ctx is None else series.val_ctx.shape[1]
    config = replace(base, predictor=replace(base.predictor, context_channels=channels))
    window = config.predictor.window
    demand, history = series.val[window : window + TICKS], series.val[:window]
    context = None if series.val_ctx is None else series.val_ctx[window : window + TICKS][:, None, :]
    history_context = None if series.val_ctx is None else series.val_ctx[None, :window]
    warm = _closed_loop(config, demand, history, context, history_context)
    cold_config = replace(config, estimator=replace(config.estimator, warm_start=False))
    cold = _closed_loop(cold_config, demand, history, context, history_context)

    # 1. Every estimate of the warm loop against the cold-start solver on the very same window.
    est = config.estimator
    worst, censored_windows = 0.0, 0
    for before, after in zip(warm[:-1], warm[1:]):
        y, c = after.observations[:, -est.window :].astype(np.float64), after.censored[:, -est.window :]
        solved = estimate_censored_demand(y, c, after.censor_streak, est, config.reward)
        restarted = estimate_censored_demand(
            y, c, after.censor_streak, est, config.reward, start=(before.est_mean, before.est_std)
        )
        censored_windows += int(c.any() and not c.all())
        for field in ("mean", "std", "uncertainty"):
            worst = max(worst, float(np.max(np.abs(getattr(restarted, field) - getattr(solved, field)))))
        np.testing.assert_array_equal(restarted.mean, after.est_mean)  # the controller's own estimate
    assert censored_windows > 50, f"{name}: too few Tobit windows to test ({censored_windows})"
    print(f"{name}: {censored_windows} Tobit windows, warm - cold estimates at most {worst:.3g}")
    assert worst <= TOLERANCE, f"{name}: warm and cold estimates differ by {worst:.3g}"

    # 2. Decisions of the whole closed loop, warm against cold.
    for field in ("action", "mu", "sigma", "k", "eta", "margin", "est_mean", "est_std"):
        gap = max(float(np.max(np.abs(getattr(w, field) - getattr(c, field)))) for w, c in zip(warm, cold))
        print(f"  {field}: warm - cold at most {gap:.3g}")
        assert gap <= TOLERANCE, f"{name}: {field} differs by {gap:.3g} between warm and cold starts"
