"""Results of a closed-loop run over Kafka: metrics, a per-tick CSV and a figure.

Metrics come in native units first (``metrics_native``: the capacity the worker decided against the demand, in
the workload's unit, pooled over the services; per resource for services provisioned several), then normalised
(``metrics``): services differ in size, so each service's demand is scaled by its own demand range over the run
(0 = its minimum, 1 = its maximum) and then pooled. Both on the ticks where PIC-RL was in control (after the
warm-up). Services provisioned several resources are scored per resource and in total
(``picrl_core.methods.coupled.resource_metrics``: the resources' regrets weighted as in the coupled cost), with a
figure of one service's resources.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from picrl_core.config import CostConfig
from picrl_core.costs import asymmetric_cost, episode_metrics
from producers.closed_loop import ClosedLoopRecord

COLUMNS = ("mae", "regret", "shortage_rate", "under_mass", "over_mass", "action_variance")


def _normalised(record: ClosedLoopRecord) -> tuple[np.ndarray, np.ndarray]:
    demand = record.workload.demand
    low, high = demand.min(axis=0), demand.max(axis=0)
    span = np.where(high > low, high - low, 1.0)
    return (record.capacity - low) / span, (demand - low) / span


def _native_metrics(record: ClosedLoopRecord, ticks: np.ndarray, cost: CostConfig) -> dict:
    """The metrics of the capacity decided against the demand in native units over ``ticks``, pooled over the
    services; with several resources, per resource name (their units differ)."""
    w = record.workload
    if not w.resources:
        return episode_metrics(record.capacity[ticks], w.demand[ticks], cost).to_dict()
    n = len(w.services)
    return {
        r.name: episode_metrics(
            record.capacity[ticks, i * n : (i + 1) * n], w.demand[ticks, i * n : (i + 1) * n], cost
        ).to_dict()
        for i, r in enumerate(w.resources)
    }


def summarise(record: ClosedLoopRecord, cost: CostConfig = CostConfig()) -> dict:
    """Pooled metrics over the control ticks, plus run facts (ticks, services, versions, seconds)."""
    capacity, demand = _normalised(record)
    control = record.control
    ticks = np.flatnonzero(control.all(axis=1))
    metrics = episode_metrics(capacity[ticks], demand[ticks], cost).to_dict() if ticks.size else {}
    native = _native_metrics(record, ticks, cost) if ticks.size else {}
    versions = record.policy_version[record.policy_version >= 0]
    resources = record.workload.resources
    per_resource = {}
    if resources and ticks.size:
        from picrl_core.methods.coupled import resource_metrics  # here: picrl_core.methods loads torch

        total, extra = resource_metrics(capacity[ticks], demand[ticks], resources, cost)
        per_resource = {
            "total_regret": total.regret,
            "weights": {r.name: r.weight for r in resources},
            "hard": [r.name for r in resources if r.hard],
            **extra,
        }
    return {
        "services": len(record.workload.services),
        "ticks": record.workload.ticks,
        "control_ticks": int(ticks.size),
        "seconds": round(record.seconds, 2),
        "censoring_rate": float(record.censored[control].mean()) if control.any() else 0.0,
        "policy_versions": sorted({int(v) for v in versions}),
        "duplicate_actions": record.duplicate_actions,
        "metrics_native": native,
        "metrics": metrics,
        "unit": record.workload.unit,
        "normalisation": "each service's demand range over the run; control ticks only",
        **({"resources": per_resource} if per_resource else {}),
    }


def write_report(record: ClosedLoopRecord, out: Path, title: str, cost: CostConfig = CostConfig()) -> dict:
    """Write ``metrics.json``, ``ticks.csv`` (one row per tick and service) and ``closed_loop.png``."""
    out.mkdir(parents=True, exist_ok=True)
    summary = summarise(record, cost)
    (out / "metrics.json").write_text(json.dumps(summary, indent=2) + "\n")
    w = record.workload
    ticks, columns = w.demand.shape
    n = len(w.services)
    rows = [
        [
            t,
            j % n,
            w.demand[t, j],
            record.capacity[t, j],
            record.usage[t, j],
            int(record.censored[t, j]),
            int(record.control[t, j]),
            record.policy_version[t, j],
            *(record.breakdown[name][t, j] for name in ("mu", "sigma", "k", "eta", "margin", "bias")),
            *([j // n] if w.resources else []),
        ]
        for t in range(ticks)
        for j in range(columns)
    ]
    header = "tick,service,demand,capacity,usage,censored,control,policy_version,mu,sigma,k,eta,margin,bias" + (
        ",resource" if w.resources else ""
    )
    np.savetxt(
        out / "ticks.csv", np.array(rows, dtype=np.float64), delimiter=",", fmt="%.6g", header=header, comments=""
    )
    (out / "services.txt").write_text("\n".join(f"{j},{s}" for j, s in enumerate(w.services)) + "\n")
    if w.resources:
        (out / "resources.txt").write_text("\n".join(f"{i},{r.name}" for i, r in enumerate(w.resources)) + "\n")
        plot_resources(record, out / "resources.png", title)
    plot_closed_loop(record, out / "closed_loop.png", title, cost)
    return summary


def plot_resources(record: ClosedLoopRecord, path: Path, title: str) -> Path:
    """One service's capacities against its demands, a panel per resource, the ticks where a hard resource
    (memory) ran short marked on every panel: there the other resources were observed on the load served only.
    The service shown is the one whose hard shortages fell on the most ticks with soft demand above its low."""
    w = record.workload
    n, resources = len(w.services), w.resources
    hard = [i for i, r in enumerate(resources) if r.hard]
    soft = [i for i, r in enumerate(resources) if not r.hard]

    def block(a: np.ndarray, i: int) -> np.ndarray:  # resource i's (T, N) columns
        return a[:, i * n : (i + 1) * n]

    hard_short = np.any([block(record.censored, i) for i in hard], axis=0) if hard else np.zeros((w.ticks, n), bool)
    busy = np.any([block(w.demand, i) > block(w.demand, i).min(axis=0) for i in soft], axis=0) if soft else hard_short
    j = int(np.argmax((hard_short & busy & block(record.control, 0)).sum(axis=0)))
    t = np.arange(w.ticks)
    fig, axes = plt.subplots(len(resources), 1, figsize=(12, 3.2 * len(resources)), sharex=True, squeeze=False)
    for i, (ax, resource) in enumerate(zip(axes[:, 0], resources)):
        demand, capacity = block(w.demand, i)[:, j], block(record.capacity, i)[:, j]
        ax.plot(t, demand, color="black", lw=1, label="demand (hidden from picrl)")
        ax.plot(t, capacity, color="tab:orange", lw=1.2, label="capacity decided")
        marks = hard_short[:, j]
        ax.scatter(
            t[marks],
            capacity[marks],
            marker="x",
            color="red",
            s=16,
            label=f"{'/'.join(resources[h].name for h in hard)} short ({marks.mean():.0%} of ticks)",
        )
        warm = ~block(record.control, i)[:, j]
        if warm.any():
            ax.axvspan(0, np.flatnonzero(warm).max(), color="grey", alpha=0.15, label="warm-up")
        kind = "hard: a shortage fails requests" if resource.hard else "soft: a shortage throttles"
        ax.set(title=f"{w.services[j]}: {resource.name} ({kind})", ylabel=resource.name)
        ax.legend(fontsize=8, loc="upper left")
    axes[-1, 0].set_xlabel("tick")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
    ax.set(
        title=f"(b) Share of the {len(w.services)} services short of capacity",
        xlabel="tick",
        ylabel="censoring rate",
        ylim=(-0.02, 1.02),
    )
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
