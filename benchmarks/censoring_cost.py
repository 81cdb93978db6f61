"""Where the cost of censoring lies: a method's regret minus its full-information reference's, tick by tick.

``regret(censored) / regret(full information)`` is the cost of censoring that Table 2 prints. This script splits the
difference of the two runs (the same trained models, the same seed; one sees ``(min(d, a), 1[d > a])``, the other the
demand) by where each tick lies against the censored run's shortage streaks:

    first shortage    the first tick of a streak of shortages (d > a): the demand above the action is hidden
    later shortages   the second and later ticks of a streak
    first covered     the tick after a streak, whose action is the first to cover the demand again
    next 10 ticks     the ten ticks after that
    elsewhere         every other tick

Under full information a shortage is seen and the next action can sit on the new demand; under censoring the next
action has to guess how far above the capacity the demand went. The second table asks whether that guess could be
better: over every first (and every second) shortage of a streak, the chance that the next tick is short too (a
newsvendor's guess is short with probability ``1 - c_under / (c_under + c_over)``, 1/3), and the cost of the next
tick under the method's own step, under the best constant step in hindsight (the critical-fractile quantile of every
such event's excess, pooled), under each service's own best constant step in hindsight (the same quantile of its own
events: what a per-service model of jump sizes could at best learn, optimistic with few events) and under full
information.

Run on demand (not part of the test suite; ~3 minutes for the default on 2 cores):

    python benchmarks/censoring_cost.py --out DIR [--datasets pods genai-mem genai-ctx] [--seeds 5]
        [--methods pic-rl conformal] [--split test|development] [--jobs 2]

Each method ``M`` runs with its reference ``M-fi``. ``--split test`` reruns the cells of ``picrl compare``'s full
budget (the test split read for a diagnosis, choosing nothing); ``--split development`` the development split of
``benchmarks/select_design.py``. Prints both tables (mean and std over seeds) and writes ``censoring.csv``,
``censoring.json`` and ``censoring.png`` (the extra regret per class, stacked) to ``--out``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import matplotlib
import numpy as np
from host import StealMeter
from regret_by_regime import (
    add_split_arguments,
    method_runs,
    parse_split_arguments,
    run_cells,
    summarise,
    write_results,
)

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from picrl.datasets import DATASETS  # noqa: E402
from picrl_core.config import CostConfig  # noqa: E402
from picrl_core.costs import asymmetric_cost, critical_ratio  # noqa: E402
from picrl_core.methods import REGISTRY  # noqa: E402

CLASSES = ("first shortage", "later shortages", "first covered", "next 10 ticks", "elsewhere")
AFTER = 10  # ticks after the first covered one that count as "next 10 ticks"
STREAK_STEPS = (1, 2)  # the ticks after the first and the second shortage of a streak
STEP_FIELDS = ("events", "short_again", "step_cost", "best_constant_cost", "per_service_cost", "fi_cost")


def shortage_streak(demand: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """``(T, N)``: 0 on a tick with ``d <= a``, else its place in the streak of shortages ``d > a`` (1, 2, ...)."""
    short = demand > actions
    streak = np.zeros(short.shape, dtype=np.int64)
    streak[0] = short[0]
    for t in range(1, short.shape[0]):
        streak[t] = np.where(short[t], streak[t - 1] + 1, 0)
    return streak


def streak_classes(streak: np.ndarray) -> dict[str, np.ndarray]:
    """Masks ``(T, N)`` of :data:`CLASSES` from the censored run's :func:`shortage_streak`."""
    since = np.full(streak.shape, np.iinfo(np.int64).max // 2)  # ticks since the last streak ended
    for t in range(1, streak.shape[0]):
        since[t] = np.where(streak[t - 1] > 0, 0, since[t - 1] + 1)
    covered = streak == 0
    return dict(
        zip(
            CLASSES,
            (
                streak == 1,
                streak >= 2,
                covered & (since == 0),
                covered & (since >= 1) & (since <= AFTER),
                covered & (since > AFTER),
            ),
        )
    )


def class_rows(
    censored: tuple[np.ndarray, np.ndarray], full: np.ndarray, streak: np.ndarray, cost: CostConfig
) -> dict[str, dict]:
    """Per class (of the censored run's ``streak``): share of ticks, the censored run's and the reference's regret over
    them (Eq. 2, a fleet's mean over services) and their difference; the differences add up to
    ``regret(censored) - regret(full information)``."""
    demand, actions = censored
    services = demand.shape[1]
    paid, limit = asymmetric_cost(actions, demand, cost), asymmetric_cost(full, demand, cost)
    return {
        name: {
            "share": float(mask.mean()),
            "regret": float(paid[mask].sum() / services),
            "regret_fi": float(limit[mask].sum() / services),
            "extra": float((paid[mask].sum() - limit[mask].sum()) / services),
        }
        for name, mask in streak_classes(streak).items()
    }


def step_row(
    censored: tuple[np.ndarray, np.ndarray], full: np.ndarray, streak: np.ndarray, cost: CostConfig, position: int
) -> dict[str, float]:
    """The tick after every ``position``-th shortage of a streak: how often it is short again, and its cost (Eq. 1,
    mean over events) under the method's step, the best pooled constant step, each service's best constant step (both
    in hindsight) and full information. A step is measured from the shortage's action ``a_t``: the excess
    ``d_{t+1} - a_t`` it had to cover."""
    demand, actions = censored
    ticks, services = np.nonzero(streak[:-1] == position)
    if not ticks.size:
        return dict.fromkeys(STEP_FIELDS, float("nan")) | {"events": 0}
    excess = demand[ticks + 1, services] - actions[ticks, services]
    step = actions[ticks + 1, services] - actions[ticks, services]
    fractile = critical_ratio(cost)
    own = np.empty_like(excess)
    for service in np.unique(services):
        mine = services == service
        own[mine] = np.quantile(excess[mine], fractile)
    return {
        "events": int(ticks.size),
        "short_again": float((excess > step).mean()),
        "step_cost": float(asymmetric_cost(step, excess, cost).mean()),
        "best_constant_cost": float(asymmetric_cost(np.quantile(excess, fractile), excess, cost).mean()),
        "per_service_cost": float(asymmetric_cost(own, excess, cost).mean()),
        "fi_cost": float(asymmetric_cost(full[ticks + 1, services], demand[ticks + 1, services], cost).mean()),
    }


def run_pairs(dataset: str, seed: int, methods: list[str], split: str) -> dict[str, dict]:
    """Each method and its full-information reference on one (dataset, seed): the class rows and the step row."""
    runs, config = method_runs(dataset, seed, [m for method in methods for m in (method, f"{method}-fi")], split)
    out = {}
    for method in methods:
        demand = np.asarray(runs[method].demand, dtype=np.float64)
        demand = demand.reshape(demand.shape[0], -1)
        censored = (demand, np.asarray(runs[method].actions, dtype=np.float64).reshape(demand.shape))
        full = np.asarray(runs[f"{method}-fi"].actions, dtype=np.float64).reshape(demand.shape)
        streak = shortage_streak(*censored)
        out[method] = {
            "classes": class_rows(censored, full, streak, config.cost),
            "steps": {str(n): step_row(censored, full, streak, config.cost, n) for n in STREAK_STEPS},
        }
    return out


def plot(rows: list[dict], path: Path) -> Path:
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.2 * len(datasets), 3.8), squeeze=False)
    colours = dict(zip(CLASSES, ("#c44e52", "#8c2d30", "#4c72b0", "#8fa8d0", "#bbbbbb")))
    for ax, dataset in zip(axes[0], datasets):
        methods = list(dict.fromkeys(r["method"] for r in rows if r["dataset"] == dataset))
        up, down = np.zeros(len(methods)), np.zeros(len(methods))
        for name in CLASSES:
            part = np.array(
                [
                    next(r["extra"] for r in rows if (r["dataset"], r["method"], r["ticks"]) == (dataset, m, name))
                    for m in methods
                ]
            )
            base = np.where(part >= 0, up, down)
            ax.bar(methods, part, bottom=base, color=colours[name], label=name)
            up, down = up + np.maximum(part, 0), down + np.minimum(part, 0)
        ax.scatter(methods, up + down, marker="D", color="black", zorder=3, label="net")
        ax.axhline(0, color="black", linewidth=0.6)
        ax.set_title(dataset)
        ax.set_ylabel("regret(censored) - regret(full information)")
    axes[0][0].legend(fontsize=8, title="ticks", title_fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def step_summary(cells: dict[tuple[str, int], dict]) -> list[dict]:
    """Mean and std over seeds of every (dataset, method, shortage position) step field."""
    rows = []
    for dataset in dict.fromkeys(d for d, _ in cells):
        seeds = [cells[key] for key in cells if key[0] == dataset]
        for method in seeds[0]:
            for n in STREAK_STEPS:
                row = {"dataset": dataset, "method": method, "after_shortage": n, "seeds": len(seeds)}
                for name in STEP_FIELDS:
                    values = np.array([s[method]["steps"][str(n)][name] for s in seeds], dtype=np.float64)
                    row[name], row[f"{name}_std"] = float(np.nanmean(values)), float(np.nanstd(values))
                rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for censoring.csv, .json and .png")
    parser.add_argument(
        "--datasets",
        nargs="+",
        default=["pods", "genai-mem", "genai-ctx"],
        choices=[*DATASETS, "pods"],
        help="bundled single-resource datasets (default pods genai-mem genai-ctx; a multi-resource "
        "fleet's tables weigh each resource, which these classes do not)",
    )
    paired = sorted(m for m in REGISTRY if f"{m}-fi" in REGISTRY)
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["pic-rl", "conformal"],
        choices=paired,
        metavar="METHOD",
        help=f"methods with a full-information reference: {', '.join(paired)} (default pic-rl conformal)",
    )
    add_split_arguments(parser)
    args = parse_split_arguments(parser)
    steal, started = StealMeter(), time.perf_counter()
    cells = run_cells(
        run_pairs,
        args,
        lambda cell: "  ".join(
            f"{m} {sum(r['regret'] for r in out['classes'].values()):.2f} / "
            f"{sum(r['regret_fi'] for r in out['classes'].values()):.2f}"
            for m, out in cell.items()
        ),
    )
    rows = summarise(
        {key: {m: out["classes"] for m, out in cell.items()} for key, cell in cells.items()}, CLASSES, "ticks"
    )
    print(
        f"\n{'dataset':<10} {'method':<10} {'ticks':<16} {'share':>6} {'censored':>9} {'full info':>10} {'extra':>15}"
    )
    for r in rows:
        print(
            f"{r['dataset']:<10} {r['method']:<10} {r['ticks']:<16} {r['share']:>6.1%} {r['regret']:>9.3f} "
            f"{r['regret_fi']:>10.3f} {r['extra']:>8.3f} ± {r['extra_std']:<5.3f}"
        )
    steps = step_summary(cells)
    print(
        f"\nthe tick after the n-th shortage of a streak (cost per event, Eq. 1; short again: its shortage rate)\n"
        f"{'dataset':<10} {'method':<10} {'n':>2} {'events':>7} {'short again':>12} {'its step':>9} "
        f"{'best constant':>14} {'per service':>12} {'full info':>10}"
    )
    for r in steps:
        print(
            f"{r['dataset']:<10} {r['method']:<10} {r['after_shortage']:>2} {r['events']:>7.0f} "
            f"{r['short_again']:>12.3f} {r['step_cost']:>9.4f} {r['best_constant_cost']:>14.4f} "
            f"{r['per_service_cost']:>12.4f} {r['fi_cost']:>10.4f}"
        )
    write_results(args, "censoring", rows, cells, {"rows": rows, "steps": steps}, plot, (steal, started))


if __name__ == "__main__":
    main()
