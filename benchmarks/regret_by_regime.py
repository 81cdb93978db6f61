"""Where a method's regret comes from: the ticks whose demand lies below the training range, above it, or inside.

The protocol scales every split with the training split's min-max and clips to ``[0, 1]`` (Sec. 4.1.1), so a test day
that runs below everything the training split held shows up as a stretch of demand exactly at 0 (GenAI-Mem's test day:
84 of 288 ticks). No development split can choose a method for a regime it does not contain. This script splits each
method's regret Eq. (2) into those three regimes, so a table can say how much of a gap between two methods lies in a
regime the development splits lacked and how much lies where they could have seen it.

Run on demand (not part of the test suite; ~1 minute for the default on 2 cores):

    python benchmarks/regret_by_regime.py --out DIR [--datasets genai-mem genai-ctx] [--seeds 5]
        [--methods pic-rl conformal pic-rl-fi conformal-fi] [--split test|development] [--jobs 2]

``--split test`` reruns the cells of ``picrl compare``'s full budget (the same numbers as its tables, the test split
read for a diagnosis, choosing nothing); ``--split development`` runs them on the development split of
``benchmarks/select_design.py`` (the validation split plays the test), where the design was chosen. Per (dataset,
method), as mean and std over seeds: the regime's share of ticks, its part of the regret (the parts add up to the
regret of the tables; a fleet's are means over services), its shortage rate, and the mean action and demand in it.
Prints the table and writes ``regime.csv``, ``regime.json`` and ``regime.png`` (stacked regret per method) to ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import json
import multiprocessing
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

import matplotlib
import numpy as np
import torch
from host import StealMeter, describe

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from picrl.comparison.runner import FULL, test_series  # noqa: E402
from picrl.datasets import DATASETS, FLEETS, load_dataset  # noqa: E402
from picrl.datasets.loaders import prepare_trace  # noqa: E402
from picrl_core.config import PicRLConfig  # noqa: E402
from picrl_core.costs import asymmetric_cost  # noqa: E402
from picrl_core.methods import REGISTRY  # noqa: E402
from picrl_core.methods.evaluation import TestSplitRun, run_on_test_split  # noqa: E402
from picrl_core.series import development_series  # noqa: E402
from picrl_core.training_memo import shared_training  # noqa: E402

REGIMES = ("below the training range", "inside", "above the training range")
DEFAULT_METHODS = ("pic-rl", "conformal", "pic-rl-fi", "conformal-fi")


def regimes(demand: np.ndarray) -> dict[str, np.ndarray]:
    """Masks of the ticks (and services) whose scaled demand was clipped to 0, clipped to 1, or lies inside."""
    below, above = demand <= 0.0, demand >= 1.0
    return dict(zip(REGIMES, (below, ~below & ~above, above)))


def regime_rows(actions: np.ndarray, demand: np.ndarray, config: PicRLConfig) -> dict[str, dict[str, float]]:
    """Per regime: share of ticks, regret part (Eq. 2 over its ticks, a fleet's mean over services), shortage
    rate, mean action and mean demand; NaN for the rates and means of a regime without ticks."""
    demand = demand.reshape(demand.shape[0], -1)
    actions = actions.reshape(demand.shape)
    cost = asymmetric_cost(actions, demand, config.cost)
    services = demand.shape[1]
    rows = {}
    for name, mask in regimes(demand).items():
        n = int(mask.sum())
        rows[name] = {
            "share": n / mask.size,
            "regret": float(cost[mask].sum() / services),
            "shortage_rate": float((demand > actions)[mask].mean()) if n else float("nan"),
            "mean_action": float(actions[mask].mean()) if n else float("nan"),
            "mean_demand": float(demand[mask].mean()) if n else float("nan"),
        }
    return rows


def method_runs(dataset: str, seed: int, methods: list[str], split: str) -> tuple[dict[str, TestSplitRun], PicRLConfig]:
    """Every method's run of one (dataset, seed) at ``picrl compare``'s full budget on ``split``, and the config;
    identical offline phases train once."""
    torch.set_num_threads(1)
    trace = load_dataset(dataset)
    series = test_series(trace, FULL) if split == "test" else development_series(prepare_trace(trace))
    config = replace(FULL.apply(PicRLConfig()), seed=seed)
    with shared_training():
        return {m: run_on_test_split(REGISTRY[m], series, config, trace.step_seconds) for m in methods}, config


def run_group(dataset: str, seed: int, methods: list[str], split: str) -> dict[str, dict[str, dict[str, float]]]:
    """Every method's regime rows on one (dataset, seed)."""
    runs, config = method_runs(dataset, seed, methods, split)
    return {m: regime_rows(np.asarray(run.actions), np.asarray(run.demand), config) for m, run in runs.items()}


def summarise(cells: dict[tuple[str, int], dict], parts: tuple[str, ...] = REGIMES, key: str = "regime") -> list[dict]:
    """Mean and std over seeds of every (dataset, method, part) field; each cell maps method -> part -> fields,
    and a row names its part under ``key``."""
    rows = []
    for dataset in dict.fromkeys(d for d, _ in cells):
        seeds = [cells[c] for c in cells if c[0] == dataset]
        for method in seeds[0]:
            for part in parts:
                values = {f: np.array([s[method][part][f] for s in seeds]) for f in seeds[0][method][part]}
                row = {"dataset": dataset, "method": method, key: part, "seeds": len(seeds)}
                for field, v in values.items():
                    row[field] = float(np.nanmean(v)) if np.isfinite(v).any() else float("nan")
                    row[f"{field}_std"] = float(np.nanstd(v)) if np.isfinite(v).any() else float("nan")
                rows.append(row)
    return rows


def plot(rows: list[dict], path: Path) -> Path:
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.5 * len(datasets), 3.8), squeeze=False)
    colours = dict(zip(REGIMES, ("#4c72b0", "#bbbbbb", "#c44e52")))
    for ax, dataset in zip(axes[0], datasets):
        methods = list(dict.fromkeys(r["method"] for r in rows if r["dataset"] == dataset))
        bottom = np.zeros(len(methods))
        for regime in REGIMES:
            part = np.array(
                [
                    next(r["regret"] for r in rows if (r["dataset"], r["method"], r["regime"]) == (dataset, m, regime))
                    for m in methods
                ]
            )
            ax.bar(methods, part, bottom=bottom, color=colours[regime], label=regime)
            bottom += part
        ax.set_title(dataset)
        ax.set_ylabel("regret (Eq. 2), mean over seeds")
        ax.tick_params(axis="x", rotation=30)
    axes[0][0].legend(fontsize=8, title="demand", title_fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def add_split_arguments(parser: argparse.ArgumentParser) -> None:
    """``--seeds``, ``--split`` and ``--jobs``, as this script and ``censoring_cost.py`` take them."""
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0 .. N-1 (default 5, as the tables)")
    parser.add_argument(
        "--split",
        choices=("test", "development"),
        default="test",
        help="the reported test split (default) or the development split the design was chosen on",
    )
    parser.add_argument("--jobs", type=int, default=2, help="(dataset, seed) groups run in parallel (default 2)")


def parse_split_arguments(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The parsed command line, ``--seeds`` and ``--jobs`` checked, ``--out`` made."""
    args = parser.parse_args()
    if args.seeds < 1 or args.jobs < 1:
        parser.error("--seeds and --jobs must be >= 1")
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def run_cells(
    work: Callable[[str, int, list[str], str], dict], args: argparse.Namespace, line: Callable[[dict], str]
) -> dict[tuple[str, int], dict]:
    """``work(dataset, seed, methods, split)`` for every (dataset, seed) of ``args``, ``args.jobs`` groups in spawned
    processes at once; each group's ``line(cell)`` is printed as it completes, in order."""
    groups = [(d, s) for d in dict.fromkeys(args.datasets) for s in range(args.seeds)]
    methods = list(dict.fromkeys(args.methods))
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {g: pool.submit(work, *g, methods, args.split) for g in groups}
        cells = {}
        for (dataset, seed), future in futures.items():
            cells[(dataset, seed)] = future.result()
            print(f"{dataset} seed {seed}: {line(cells[(dataset, seed)])}", flush=True)
    return cells


def write_results(
    args: argparse.Namespace,
    stem: str,
    rows: list[dict],
    cells: dict[tuple[str, int], dict],
    tables: dict[str, list[dict]],
    draw: Callable[[list[dict], Path], Path],
    clock: tuple[StealMeter, float],
) -> None:
    """``STEM.csv`` (``rows``), ``STEM.json`` (the machine, the run's seconds and CPU steal, ``tables`` and every
    cell) and ``STEM.png`` (``draw(rows, path)``) in ``args.out``; prints their paths."""
    steal, started = clock
    with (args.out / f"{stem}.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (args.out / f"{stem}.json").write_text(
        json.dumps(
            {
                "machine": describe(),
                "seconds": time.perf_counter() - started,
                "cpu_steal_share": steal.share(),
                "split": args.split,
                "seeds": args.seeds,
                **tables,
                "cells": [{"dataset": d, "seed": s, "methods": cell} for (d, s), cell in cells.items()],
            },
            indent=2,
        )
        + "\n"
    )
    written = [args.out / f"{stem}.csv", args.out / f"{stem}.json", draw(rows, args.out / f"{stem}.png")]
    print("written: " + ", ".join(map(str, written)))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for regime.csv, regime.json, regime.png")
    parser.add_argument(
        "--datasets",
        nargs="+",
        default=["genai-mem", "genai-ctx"],
        choices=[*DATASETS, *FLEETS],
        help="bundled datasets (default genai-mem genai-ctx)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=list(DEFAULT_METHODS),
        choices=list(REGISTRY),
        metavar="METHOD",
        help=f"methods of picrl compare (default {' '.join(DEFAULT_METHODS)})",
    )
    add_split_arguments(parser)
    args = parse_split_arguments(parser)
    steal, started = StealMeter(), time.perf_counter()
    cells = run_cells(
        run_group,
        args,
        lambda cell: "  ".join(f"{m} {sum(r['regret'] for r in rows.values()):.2f}" for m, rows in cell.items()),
    )
    rows = summarise(cells)
    print(
        f"\n{'dataset':<11} {'method':<14} {'demand':<26} {'ticks':>6} {'regret':>14} {'shortage':>9} "
        f"{'action':>8} {'demand':>8}"
    )
    for r in rows:
        print(
            f"{r['dataset']:<11} {r['method']:<14} {r['regime']:<26} {r['share']:>6.1%} "
            f"{r['regret']:>7.3f} ± {r['regret_std']:<5.3f} {r['shortage_rate']:>9.3f} {r['mean_action']:>8.4f} "
            f"{r['mean_demand']:>8.4f}"
        )
    write_results(args, "regime", rows, cells, {"rows": rows}, plot, (steal, started))


if __name__ == "__main__":
    main()
