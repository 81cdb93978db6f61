"""PNG figures in the spirit of the paper's Figures 3-5 (training curves and Phase 3 dynamics)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from picrl_core.config import CostConfig
from picrl_core.costs import cumulative_regret
from picrl_core.simulator import Trajectory


def plot_training(reports: dict[str, Any], path: Path) -> Path:
    """Phase 1 NLL and validation MAE per epoch; Phase 2 critic value loss per iteration."""
    fig, (nll_ax, mae_ax, value_ax) = plt.subplots(1, 3, figsize=(15, 4))
    history = reports["phase1"]["history"]
    epochs = [h["epoch"] for h in history]
    nll_ax.plot(epochs, [h["train_nll"] for h in history], label="train NLL")
    nll_ax.plot(epochs, [h["val_nll"] for h in history], label="validation NLL")
    nll_ax.axvline(reports["phase1"]["best_epoch"], color="grey", ls=":", label="best epoch")
    nll_ax.set(title="(a) Phase 1: Gaussian NLL", xlabel="epoch", ylabel="NLL")
    nll_ax.legend()
    mae_ax.plot(epochs, [h["val_mae"] for h in history], color="tab:green")
    mae_ax.set(title="(b) Phase 1: validation MAE of mu", xlabel="epoch", ylabel="MAE")
    value_loss = reports["phase2"]["value_loss"]
    if value_loss:
        value_ax.plot(np.arange(1, len(value_loss) + 1), value_loss, color="tab:red")
        drop = 1 - value_loss[-1] / value_loss[0] if value_loss[0] else float("nan")
        value_ax.set_title(f"(c) Phase 2: critic value loss ({drop:.0%} drop)")
    else:
        value_ax.set_title("(c) Phase 2 skipped (no pretraining)")
    value_ax.set(xlabel="iteration", ylabel="value loss")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_phase3(trajectory: Trajectory, cost: CostConfig, path: Path, title: str = "") -> Path:
    """(a) demand vs action with mu +- sigma and censored steps, (b) error histogram, (c) margin and
    bias, (d) cumulative regret against a sqrt(T) reference (single service: column 0)."""
    tr = trajectory.column(0)
    t = np.arange(tr.demand.shape[0])
    demand, action, mu, sigma = tr.demand[:, 0], tr.action[:, 0], tr.mu[:, 0], tr.sigma[:, 0]
    censored = tr.censored[:, 0]
    fig, axes = plt.subplots(2, 2, figsize=(14, 8))
    ax = axes[0, 0]
    ax.fill_between(t, mu - sigma, mu + sigma, color="tab:blue", alpha=0.2, label="mu +- sigma")
    ax.plot(t, demand, color="black", lw=1, label="demand d (hidden from the controller)")
    ax.plot(t, action, color="tab:orange", lw=1.2, label="action a")
    ax.scatter(t[censored], action[censored], marker="x", color="red", s=14, label=f"censored ({censored.mean():.0%})")
    ax.set(title="(a) Deployment trajectory", xlabel="tick", ylabel="normalised capacity")
    ax.legend(fontsize=8, loc="upper left")
    ax = axes[0, 1]
    error = action - demand
    ax.hist(error, bins=50, color="tab:purple", alpha=0.8)
    ax.axvline(0, color="black", lw=1)
    ax.set(title=f"(b) Error a - d (mean {error.mean():+.4f})", xlabel="a - d", ylabel="ticks")
    ax = axes[1, 0]
    ax.plot(t, tr.margin[:, 0], label="margin m (fast)")
    ax.plot(t, tr.bias[:, 0], label="bias b (slow)")
    ax.plot(t, tr.k[:, 0] * sigma, label="risk buffer k*sigma", alpha=0.7)
    ax.set(title="(c) Fast and slow calibration", xlabel="tick", ylabel="normalised capacity")
    ax.legend(fontsize=8)
    ax = axes[1, 1]
    regret = cumulative_regret(action, demand, cost)
    ax.plot(t, regret, label="cumulative regret")
    if regret[-1] > 0:
        ax.plot(t, regret[-1] * np.sqrt((t + 1) / (t[-1] + 1)), ls="--", color="grey", label="sqrt(T) reference")
    ax.set(title="(d) Cumulative regret", xlabel="tick", ylabel="regret")
    ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_native_trajectory(
    demand: np.ndarray, capacity: np.ndarray, censored: np.ndarray, peak: float, path: Path, title: str = ""
) -> Path:
    """One service's ``(T,)`` capacity in force against the hidden demand in native units, shortages marked,
    with the training range's top (the product protocol's run of ``picrl evaluate``)."""
    t = np.arange(demand.shape[0])
    short = np.asarray(censored, dtype=bool)
    fig, ax = plt.subplots(figsize=(14, 4.5))
    ax.plot(t, demand, color="black", lw=1, label="demand (hidden from the controller)")
    ax.plot(t, capacity, color="tab:orange", lw=1.2, label="capacity in force")
    ax.scatter(t[short], capacity[short], marker="x", color="red", s=14, label=f"short ({short.mean():.0%})")
    ax.axhline(peak, color="grey", ls=":", label="training peak")
    ax.set(title=title, xlabel="tick", ylabel="native units")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
