"""The report stage of ``picrl compare``: tables, figures, the recommendation and ``results.json`` from its cells.

Each writer returns the files it wrote; :func:`report` runs them in order, prints the tables and returns the
command's exit status (1 when a cell failed).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from picrl.comparison.figures import plot_ablation_bars, plot_cumulative_regret, plot_resources, plot_trajectories
from picrl.comparison.plan import Plan
from picrl.comparison.product_table import markdown_product, product_means, write_product_csv
from picrl.comparison.recommendation import cached_summaries, markdown_recommendation, recommend
from picrl.comparison.runner import FULL, QUICK, CellCache, CellResult, dataset_protocol, scored_demand
from picrl.comparison.tables import (
    Summary,
    full_information_pairs,
    idle_shares,
    markdown_censoring_cost,
    markdown_fleet,
    markdown_resources,
    markdown_table2,
    markdown_table3,
    summarise,
    table2_methods,
    table3_methods,
    write_csv,
)
from picrl_core.methods import REGISTRY

Summaries = dict[tuple[str, str], Summary]


def product_table(plan: Plan, results: list[CellResult], out: Path) -> list[Path]:
    """product.md and product.csv when cells ran under the product protocol (printed too)."""
    means = product_means(results)
    if not means:
        return []
    table = markdown_product(means, plan.methods)
    (out / "product.md").write_text(table)
    print("Product protocol: native units first, and demand above the training peak (mean over seeds)\n")
    print(table)
    return [out / "product.md", write_product_csv(out / "product.csv", means, plan.methods)]


def method_tables(plan: Plan, summaries: Summaries, out: Path) -> list[Path]:
    """Table 2, the cost of censoring and Table 3, for the methods that have them (printed too)."""
    methods, datasets, written = plan.methods, plan.datasets, []
    if table2_methods(methods):
        (out / "table2.md").write_text(markdown_table2(summaries, methods, datasets))
        written += [out / "table2.md", write_csv(out / "table2.csv", summaries, table2_methods(methods), datasets)]
        units = "units of the training range, unclipped" if plan.protocol == "product" else "clipped, scaled units"
        print(f"\nTable 2: test-split MAE, regret and shortage rate ({units}; mean ± std over seeds; lowest in bold)\n")
        print(markdown_table2(summaries, methods, datasets))
    if full_information_pairs(methods):
        censoring = markdown_censoring_cost(summaries, methods, datasets)
        (out / "censoring_cost.md").write_text(censoring)
        written.append(out / "censoring_cost.md")
        print("Cost of censoring: regret under PIC over the same method's full-information regret\n")
        print(censoring)
    if len(table3_methods(methods)) > 1:
        table3 = markdown_table3(summaries, methods, datasets)
        (out / "table3.md").write_text(table3)
        written += [out / "table3.md", write_csv(out / "table3.csv", summaries, table3_methods(methods), datasets)]
        print("Table 3: ablations (ΔMAE relative to PIC-RL Full)\n")
        print(table3)
    return written


def resource_sections(plan: Plan, results: list[CellResult], demands: dict[str, np.ndarray], out: Path) -> list[Path]:
    """resources.md and a figure per multi-resource dataset (printed too)."""
    multi = [n for n in plan.datasets if plan.series[n].resources]
    sections, written = [], []
    for name in multi:
        resources = plan.series[name].resources
        table = markdown_resources(results, name, plan.methods, resources)
        table += "\n" + idle_shares(demands[name], resources)
        sections.append(f"### {name}\n\n{table}")
        print(f"Resources of {name} (mean over seeds)\n")
        print(table)
        drawn = [m for m in ("pic-rl", "pic-rl-per-resource") if m in plan.methods] or table2_methods(plan.methods)[:2]
        path = out / ("resources.png" if len(multi) == 1 else f"resources-{name}.png")
        figure = plot_resources(results, demands[name], resources, name, path, drawn)
        written += [figure] if figure else []
    if sections:
        (out / "resources.md").write_text("\n".join(sections))
        written.append(out / "resources.md")
    return written


def fleet_spread(plan: Plan, results: list[CellResult], demands: dict[str, np.ndarray], out: Path) -> list[Path]:
    """fleet.md: each fleet's spread of regret over its services (printed too)."""
    fleets = [n for n in plan.datasets if plan.series[n].services > 1 and not plan.series[n].resources]
    if not fleets or not table2_methods(plan.methods):
        return []
    spread = "".join(
        f"### {name} ({plan.series[name].services} services)\n\n"
        f"{markdown_fleet(results, demands[name], name, plan.methods, plan.config.cost)}\n"
        for name in fleets
    )
    (out / "fleet.md").write_text(spread)
    print("Fleets: regret of each service, pooled over seeds\n")
    print(spread)
    return [out / "fleet.md"]


def figures(
    plan: Plan, results: list[CellResult], summaries: Summaries, demands: dict[str, np.ndarray], out: Path
) -> list[Path]:
    """trajectories.png, ablation_bars.png and cumulative_regret.png, where there is something to draw."""
    shown = "genai-mem" if "genai-mem" in plan.traces else plan.datasets[0]
    drawn = (
        plot_trajectories(results, demands[shown], shown, 0, out / "trajectories.png"),
        plot_ablation_bars(summaries, plan.methods, plan.datasets, out / "ablation_bars.png"),
        plot_cumulative_regret(results, demands, plan.methods, plan.config.cost, out / "cumulative_regret.png"),
    )
    return [p for p in drawn if p is not None]


def recommendation(plan: Plan, summaries: Summaries) -> tuple[str, dict]:
    """recommendation.md's text under the run's protocol, and its entries for results.json; the other budget's
    verdict is read from the cache of the same protocol."""
    other_budget = FULL if plan.budget is QUICK else QUICK
    other_cache = CellCache(plan.cache.root, plan.traces, plan.config, other_budget, plan.protocol)
    other = cached_summaries(other_cache, plan.datasets, plan.methods)
    advice = {d: recommend(summaries, plan.methods, d) for d in plan.datasets}
    protocols = {d: dataset_protocol(plan.traces[d], plan.protocol) for d in plan.datasets}
    text = markdown_recommendation(
        advice, {d: recommend(other, plan.methods, d) for d in plan.datasets}, plan.budget, other_budget, protocols
    )
    return text, {d: None if r is None else asdict(r) | {"protocol": protocols[d]} for d, r in advice.items()}


def results_json(
    plan: Plan, results: list[CellResult], summaries: Summaries, wall: float, jobs: int, advice: dict
) -> dict:
    """Everything the run did, as results.json holds it."""
    return {
        "command": " ".join(["picrl", *sys.argv[1:]]) if _is_picrl(sys.argv[0]) else " ".join(sys.argv),
        "wall_seconds": wall,
        "jobs": jobs,
        "seeds": plan.seeds,
        "protocol": plan.protocol,
        "budget": plan.budget.__dict__,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
        "config": plan.config.to_dict(),
        "datasets": {
            name: {
                "test_ticks": int(s.by_service("test").shape[1]),
                "services": s.services,
                "step_seconds": plan.traces[name].step_seconds,
                "protocol": dataset_protocol(plan.traces[name], plan.protocol),
                "notes": [*plan.traces[name].notes, *s.notes],
            }
            for name, s in plan.series.items()
        },
        "methods": {
            m: {"label": REGISTRY[m].label, "group": REGISTRY[m].group, "reference": REGISTRY[m].reference}
            for m in plan.methods
        },
        "cells": [
            {
                "dataset": r.cell.dataset,
                "seed": r.cell.seed,
                "method": r.cell.method,
                "metrics": r.metrics,
                "seconds": r.fit_and_run_seconds,
                "cached": r.cached,
                "error": r.error,
            }
            for r in results
        ],
        "summary": [
            {"method": s.method, "dataset": s.dataset, "seeds": s.n, "failed": s.failed, "mean": s.mean, "std": s.std}
            for s in summaries.values()
        ],
        "recommendation": advice,
    }


def _is_picrl(program: str) -> bool:
    """``picrl`` or ``python -m picrl``, recorded alike as ``picrl``."""
    path = Path(program)
    return path.name == "picrl" or (path.name == "__main__.py" and path.parent.name == "picrl")


def report(plan: Plan, results: list[CellResult], wall: float, jobs: int, out: Path) -> int:
    """The report stage: every output file of the run in ``out``; 1 when a cell failed, else 0."""
    summaries = summarise(results)
    demands = {name: scored_demand(plan.traces[name], s, plan.budget, plan.protocol) for name, s in plan.series.items()}
    written = product_table(plan, results, out)  # native units first
    written += method_tables(plan, summaries, out)
    written += resource_sections(plan, results, demands, out)
    written += fleet_spread(plan, results, demands, out)
    written += figures(plan, results, summaries, demands, out)
    text, advice = recommendation(plan, summaries)
    (out / "recommendation.md").write_text(text)
    record = results_json(plan, results, summaries, wall, jobs, advice)
    (out / "results.json").write_text(json.dumps(record, indent=2) + "\n")
    written += [out / "recommendation.md", out / "results.json"]
    computed = sum(not r.cached for r in results)
    print(f"{len(results)} cells ({computed} computed, {len(results) - computed} from the cache) in {wall:.0f} s")
    print("written: " + ", ".join(str(p) for p in written))
    print("\n" + text)
    failed = [r for r in results if r.error]
    for result in failed:
        print(
            f"\nFAILED {result.cell.method} on {result.cell.dataset} seed {result.cell.seed}:\n{result.error}",
            file=sys.stderr,
        )
    return 1 if failed else 0
