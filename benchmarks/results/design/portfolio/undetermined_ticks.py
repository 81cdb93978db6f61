"""The portfolio on a dataset's validation episode (no test split read): each candidate alone, then the choice with
three treatments of a candidate's undetermined ticks (the E-step's expectation, the upper bound, missing) and several
``(lambda, kappa)``. Run from the repository root at commit the record's README names:

    python benchmarks/results/design/portfolio/undetermined_ticks.py genai-mem quick 0
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

import numpy as np
import torch

import picrl_core.rules.portfolio as portfolio
from picrl.comparison.runner import FULL, QUICK, test_series
from picrl.datasets.loaders import load_dataset
from picrl_core.config import PicRLConfig
from picrl_core.costs import mean_service_metrics
from picrl_core.methods.base import run_pic_loop
from picrl_core.methods.deployed import RuleProvisioner
from picrl_core.methods.portfolio import pooled_residuals
from picrl_core.pipeline import evaluation_inputs, train_offline

EXPECTATION = portfolio.undetermined_cost
TREATMENTS: dict[str, Any] = {
    "expectation": EXPECTATION,
    "bound": lambda a, c, mu, sigma, cost: cost.c_over * (c - a),
    "missing": lambda a, c, mu, sigma, cost: np.full(np.broadcast(a, c).shape, np.nan),  # its score holds
}


def main(name: str, budget_name: str, seed: int) -> None:
    torch.set_num_threads(1)
    budget = QUICK if budget_name == "quick" else FULL
    series = test_series(load_dataset(name), budget)
    config = replace(budget.apply(PicRLConfig()), seed=seed)
    artifact = train_offline(series, config)
    predictor, policy, _ = artifact.networks()
    inputs = evaluation_inputs(series, artifact.config.predictor.window, "val")
    on_train = pooled_residuals(artifact, series, "train")

    def run(forgetting: float, price: float, treatment: str, start: tuple[float, ...]) -> tuple[float, np.ndarray]:
        portfolio.undetermined_cost = TREATMENTS[treatment]
        settings = portfolio.PortfolioParameters(forgetting, price, 0.005, 0.01, on_train, start)
        rule = portfolio.PortfolioRule(predictor, policy, artifact.config, settings)
        step, chosen = rule.step, []

        def held(state: Any, y: Any, c: Any, context: Any = None, missing: Any = None) -> Any:
            new, transition = step(state, y, c, context, missing)
            new.own.scores = np.where(np.isnan(new.own.scores), state.own.scores, new.own.scores)
            chosen.append(new.own.chosen.copy())
            return new, transition

        rule.step = held  # type: ignore[method-assign]
        provisioner = RuleProvisioner(rule, series.scaler.low, series.scaler.high)
        loop = run_pic_loop(
            provisioner,
            inputs["demand"],
            inputs["history"],
            context=inputs["context"],
            history_context=inputs["history_context"],
        )
        regret = mean_service_metrics(loop.actions, inputs["demand"], config.cost).regret
        shares = np.array([(np.array(chosen) == j).mean() for j in range(len(portfolio.CANDIDATES))])
        return regret, shares

    for j, candidate in enumerate(portfolio.CANDIDATES):
        start = tuple(0.0 if i == j else 1e6 for i in range(len(portfolio.CANDIDATES)))
        print(f"alone {candidate:10s} val regret {run(0.99, 1e9, 'expectation', start)[0]:.3f}", flush=True)
    for treatment in TREATMENTS:
        for forgetting, price in ((0.99, 0.1), (0.999, 0.1), (0.999, 0.5)):
            regret, shares = run(forgetting, price, treatment, (0.0, 0.0, 0.0))
            print(f"{treatment:11s} lam={forgetting} price={price}: val regret {regret:.3f} shares {shares.round(3)}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
