"""Results of a closed-loop run over Kafka: metrics, a per-tick CSV and a figure.

Services differ in size, so every metric is computed on each service's demand scaled by that
service's own demand range over the run (0 = its minimum, 1 = its maximum) and then pooled, on
the ticks where PIC-RL was in control (after the warm-up).
"""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from picrl_core.config import CostConfig  # noqa: E402
from picrl_core.costs import asymmetric_cost, episode_metrics  # noqa: E402
from producers.closed_loop import ClosedLoopRecord  # noqa: E402

COLUMNS = ("mae", "regret", "shortage_rate", "under_mass", "over_mass", "action_variance")


def _normalised(record: ClosedLoopRecord) -> tuple[np.ndarray, np.ndarray]:
    demand = record.workload.demand
    low, high = demand.min(axis=0), demand.max(axis=0)
    span = np.where(high > low, high - low, 1.0)
    return (record.capacity - low) / span, (demand - low) / span


def summarise(record: ClosedLoopRecord, cost: CostConfig = CostConfig()) -> dict:
    """Pooled metrics over the control ticks, plus run facts (ticks, services, versions, seconds)."""
    capacity, demand = _normalised(record)
    control = record.control
    ticks = np.flatnonzero(control.all(axis=1))
    metrics = episode_metrics(capacity[ticks], demand[ticks], cost).to_dict() if ticks.size else {}
    versions = record.policy_version[record.policy_version >= 0]
    return {
        "services": len(record.workload.services), "ticks": record.workload.ticks,
        "control_ticks": int(ticks.size), "seconds": round(record.seconds, 2),
        "censoring_rate": float(record.censored[control].mean()) if control.any() else 0.0,
        "policy_versions": sorted({int(v) for v in versions}), "duplicate_actions": record.duplicate_actions,
        "metrics": metrics, "unit": record.workload.unit,
        "normalisation": "each service's demand range over the run; control ticks only",
    }


def write_report(record: ClosedLoopRecord, out: Path, title: str, cost: CostConfig = CostConfig()) -> dict:
    """Write ``metrics.json``, ``ticks.csv`` (one row per tick and service) and ``closed_loop.png``."""
    out.mkdir(parents=True, exist_ok=True)
    summary = summarise(record, cost)
    (out / "metrics.json").write_text(json.dumps(summary, indent=2) + "\n")
    w = record.workload
    ticks, n = w.demand.shape
    rows = [
        [t, j, w.demand[t, j], record.capacity[t, j], record.usage[t, j], int(record.censored[t, j]),
         int(record.control[t, j]), record.policy_version[t, j],
         *(record.breakdown[name][t, j] for name in ("mu", "sigma", "k", "eta", "margin", "bias"))]
        for t in range(ticks) for j in range(n)]
    header = "tick,service,demand,capacity,usage,censored,control,policy_version,mu,sigma,k,eta,margin,bias"
    np.savetxt(out / "ticks.csv", np.array(rows, dtype=np.float64), delimiter=",", fmt="%.6g", header=header,
               comments="")
    (out / "services.txt").write_text("\n".join(f"{j},{s}" for j, s in enumerate(w.services)) + "\n")
    plot_closed_loop(record, out / "closed_loop.png", title, cost)
    return summary


def plot_closed_loop(record: ClosedLoopRecord, path: Path, title: str, cost: CostConfig = CostConfig()) -> Path:
    """(a) service 0: demand, capacity and shortages, (b) censoring rate per tick, (c) policy version in
    force, (d) cumulative regret of the normalised fleet."""
    capacity, demand = _normalised(record)
    w = record.workload
    t = np.arange(w.ticks)
    fig, axes = plt.subplots(2, 2, figsize=(14, 8))
    ax = axes[0, 0]
    short = record.censored[:, 0]
    ax.plot(t, w.demand[:, 0], color="black", lw=1, label="demand (hidden from picrl)")
    ax.plot(t, record.capacity[:, 0], color="tab:orange", lw=1.2, label="capacity decided")
    ax.scatter(t[short], record.capacity[short, 0], marker="x", color="red", s=14, label="shortage (censored)")
    warm = ~record.control[:, 0]
    if warm.any():
        ax.axvspan(0, np.flatnonzero(warm).max(), color="grey", alpha=0.15, label="warm-up")
    ax.set(title=f"(a) {w.services[0]}", xlabel="tick", ylabel=w.unit)
    ax.legend(fontsize=8, loc="upper left")
    ax = axes[0, 1]
    ax.plot(t, record.censored.mean(axis=1), color="tab:red", lw=1)
    ax.set(title=f"(b) Share of the {len(w.services)} services short of capacity", xlabel="tick",
           ylabel="censoring rate", ylim=(-0.02, 1.02))
    ax = axes[1, 0]
    ax.step(t, record.policy_version.max(axis=1), where="post", color="tab:green")
    ax.set(title="(c) Policy version stamped on the actions", xlabel="tick", ylabel="version")
    ax = axes[1, 1]
    loss = np.where(record.control, asymmetric_cost(capacity, demand, cost), 0.0).sum(axis=1)
    ax.plot(t, np.cumsum(loss), color="tab:blue")
    ax.set(title="(d) Cumulative regret (normalised, control ticks)", xlabel="tick", ylabel="regret")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
