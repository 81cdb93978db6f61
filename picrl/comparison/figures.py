"""Figures of the comparison, after the paper's Figures 6 and 7 and a regret view per dataset.

* ``trajectories.png``: demand and action of PIC-RL, CQL, TFT and Autopilot on one dataset and seed
  (its first service, for a fleet), censored steps (``d > a``) marked;
* ``ablation_bars.png``: MAE change of each ablation relative to PIC-RL (Full), per dataset;
* ``cumulative_regret.png``: cumulative regret over the test split (mean over seeds, and per service
  for a fleet) of every Table-2 method, one panel per dataset;
* ``resources.png`` (a multi-resource fleet): one service's capacity of each resource against its
  demand, for PIC-RL and its per-resource variant, the ticks where a hard resource ran short marked
  on every panel.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from picrl.comparison.runner import CellResult
from picrl.comparison.tables import Summary, mae_change, table2_methods, table3_methods
from picrl_core.config import CostConfig
from picrl_core.costs import cumulative_regret
from picrl_core.methods import REGISTRY
from picrl_core.resources import Resource

TRAJECTORY_METHODS = ("pic-rl", "cql", "tft", "autopilot")


def _finished(results: Sequence[CellResult], dataset: str, method: str) -> list[CellResult]:
    return [r for r in results if r.cell.dataset == dataset and r.cell.method == method and r.actions is not None]


def plot_trajectories(
    results: Sequence[CellResult], demand: np.ndarray, dataset: str, seed: int, path: Path
) -> Path | None:
    """One panel per method of :data:`TRAJECTORY_METHODS` that ran: demand, action, censored steps
    (``demand`` ``(T,)``, or ``(T, N)`` for a fleet, of which the first service is drawn)."""
    runs = [(m, r) for m in TRAJECTORY_METHODS for r in _finished(results, dataset, m) if r.cell.seed == seed]
    if not runs:
        return None
    fleet = demand.ndim == 2

    def first(x: np.ndarray) -> np.ndarray:
        return x[:, 0] if fleet else x

    demand = first(demand)
    fig, axes = plt.subplots(len(runs), 1, figsize=(13, 2.6 * len(runs)), sharex=True, squeeze=False)
    ticks = np.arange(demand.shape[0])
    for ax, (method, run) in zip(axes[:, 0], runs):
        censored, actions = first(run.censored).astype(bool), first(run.actions)
        ax.plot(ticks, demand, color="black", lw=1.0, label="demand d (hidden from the method)")
        ax.plot(ticks, actions, color="tab:blue", lw=1.0, label="action a")
        ax.scatter(
            ticks[censored],
            actions[censored],
            marker="x",
            color="tab:red",
            s=14,
            label=f"censored (d > a): {censored.mean():.0%} of steps",
        )
        mae = float(np.mean(np.abs(actions - demand)))
        ax.set_title(f"{REGISTRY[method].label}: MAE {mae:.4f}", loc="left", fontsize=10)
        ax.set_ylabel("normalised")
        ax.legend(loc="upper right", fontsize=8, ncol=3)
    axes[-1, 0].set_xlabel(f"test tick ({dataset}{', first service' if fleet else ''}, seed {seed})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_resources(
    results: Sequence[CellResult],
    demand: np.ndarray,
    resources: Sequence[Resource],
    dataset: str,
    path: Path,
    methods: Sequence[str],
    seed: int = 0,
    service: int | None = None,
) -> Path | None:
    """Rows: ``methods`` that ran; columns: resources. ``demand`` ``(T, R * N)`` (resource-major). The service
    shown (unless given) is the one whose soft-resource capacities differ most between the first two methods
    (the joint and the per-resource learner in the default order): where reading the coupled flags mattered."""
    runs = [(m, r) for m in methods for r in _finished(results, dataset, m) if r.cell.seed == seed]
    if not runs:
        return None
    n = demand.shape[1] // len(resources)
    hard = [i for i, res in enumerate(resources) if res.hard]
    if service is None:
        soft = [i for i, res in enumerate(resources) if not res.hard]
        gaps = np.zeros(n)
        if len(runs) > 1 and soft:
            for i in soft:
                block = slice(i * n, (i + 1) * n)
                gaps += np.abs(runs[0][1].actions[:, block] - runs[1][1].actions[:, block]).sum(axis=0)
        service = int(np.argmax(gaps))
    fig, axes = plt.subplots(
        len(runs), len(resources), figsize=(7 * len(resources), 2.8 * len(runs)), sharex=True, squeeze=False
    )
    ticks = np.arange(demand.shape[0])
    for row, (method, run) in enumerate(runs):
        columns = [i * n + service for i in range(len(resources))]
        hard_short = np.any([demand[:, columns[i]] > run.actions[:, columns[i]] for i in hard], axis=0)
        for i, res in enumerate(resources):
            ax = axes[row, i]
            d, a = demand[:, columns[i]], run.actions[:, columns[i]]
            ax.plot(ticks, d, color="black", lw=1.0, label="demand (hidden)")
            ax.plot(ticks, a, color="tab:blue", lw=1.0, label="capacity")
            ax.scatter(
                ticks[hard_short],
                a[hard_short],
                marker="x",
                color="tab:red",
                s=14,
                label=f"{'/'.join(resources[h].name for h in hard)} short: {hard_short.mean():.0%} of ticks",
            )
            ax.set_title(
                f"{REGISTRY[method].label}: {res.name} ({'hard' if res.hard else 'soft'})", loc="left", fontsize=10
            )
            ax.legend(loc="upper right", fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel(f"test tick ({dataset}, service {service}, seed {seed})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_ablation_bars(
    summaries: dict[tuple[str, str], Summary], methods: Sequence[str], datasets: Sequence[str], path: Path
) -> Path | None:
    """Grouped bars: MAE change (%) of A1-A7 relative to Full, one bar per dataset."""
    ablations = [m for m in table3_methods(methods) if m != "pic-rl"]
    if not ablations or "pic-rl" not in methods:
        return None
    fig, ax = plt.subplots(figsize=(11, 4.2))
    width = 0.8 / max(len(datasets), 1)
    x = np.arange(len(ablations))
    for i, dataset in enumerate(datasets):
        changes = [mae_change(summaries, m, dataset) for m in ablations]
        label = dataset if not np.all(np.isnan(changes)) else f"{dataset} (Full MAE ≈ 0: no ratio)"
        ax.bar(x + (i - (len(datasets) - 1) / 2) * width, changes, width, label=label)
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set_xticks(x, [REGISTRY[m].label for m in ablations], rotation=15, ha="right")
    ax.set_ylabel("MAE change vs PIC-RL (Full), %")
    ax.set_title("Ablations: MAE change relative to the full method (mean over seeds; > 0 is worse)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_cumulative_regret(
    results: Sequence[CellResult], demands: dict[str, np.ndarray], methods: Sequence[str], cost: CostConfig, path: Path
) -> Path | None:
    """Per dataset, each Table-2 method's cumulative regret averaged over seeds (PIC-RL thick)."""
    rows = table2_methods(methods)
    datasets = [d for d in demands if any(_finished(results, d, m) for m in rows)]
    if not datasets:
        return None
    fig, axes = plt.subplots(1, len(datasets), figsize=(6.5 * len(datasets), 4.8), squeeze=False)
    colours = plt.get_cmap("tab20")
    for ax, dataset in zip(axes[0], datasets):
        demand = demands[dataset]
        for i, method in enumerate(rows):
            runs = _finished(results, dataset, method)
            if not runs:
                continue
            services = 1 if demand.ndim == 1 else demand.shape[1]
            curve = np.mean([cumulative_regret(r.actions, demand, cost) for r in runs], axis=0) / services
            ax.plot(
                curve,
                color="black" if method == "pic-rl" else colours(i % 20),
                lw=2.4 if method == "pic-rl" else 1.1,
                ls="--" if REGISTRY[method].group == "hindsight" else "-",
                label=REGISTRY[method].label,
            )
        ax.set(title=dataset, xlabel="test tick", ylabel="cumulative regret (Eq. 2)")
        ax.set_yscale("symlog", linthresh=1.0)
    axes[0, -1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
