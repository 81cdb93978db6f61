"""The product protocol's table (``compare``'s default, ``product.md``): each method in native units first, and how
it meets demand above its training peak.

Columns (mean over the seeds that ran; :mod:`picrl_core.growth_metrics` defines the growth ones): regret in native
units and in units of the training range, the native unit-ticks short while demand is above the training peak, the
ticks demand spent there, the ticks from the outgrowth until the capacity caught up, and the native
over-provisioning cost.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from picrl.comparison.runner import CellResult
from picrl_core.methods import REGISTRY

COLUMNS = (
    ("regret_native", "regret (native)"),
    ("regret", "regret (training range)"),
    ("shortfall_above_peak", "shortfall above peak (native unit-ticks)"),
    ("ticks_above_peak", "ticks above peak"),
    ("catch_up_ticks", "ticks to catch up"),
    ("over_cost_native", "over-provisioning cost (native)"),
)


def product_means(results: Sequence[CellResult]) -> dict[tuple[str, str], dict[str, float]]:
    """(method, dataset) -> the mean over seeds of each column, for the cells that report them."""
    cells: dict[tuple[str, str], list[dict[str, float]]] = {}
    for result in results:
        if result.metrics is not None and "shortfall_above_peak" in result.metrics:
            cells.setdefault((result.cell.method, result.cell.dataset), []).append(result.metrics)
    return {
        key: {name: float(np.nanmean([m[name] for m in rows])) if _any(rows, name) else math.nan for name, _ in COLUMNS}
        for key, rows in cells.items()
    }


def _any(rows: list[dict[str, float]], name: str) -> bool:
    return any(not math.isnan(m[name]) for m in rows)


def markdown_product(means: dict[tuple[str, str], dict[str, float]], methods: Sequence[str]) -> str:
    """One table per dataset, a row per method that ran on it."""
    out = []
    for dataset in dict.fromkeys(d for _, d in means):
        out += [f"### {dataset}", "", "| method | " + " | ".join(label for _, label in COLUMNS) + " |"]
        out.append("|---|" + "---:|" * len(COLUMNS))
        for method in methods:
            row = means.get((method, dataset))
            if row is not None:
                cells = " | ".join(_fmt(row[name]) for name, _ in COLUMNS)
                out.append(f"| {REGISTRY[method].label} | {cells} |")
        out.append("")
    return "\n".join(out)


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    if abs(value) >= 1e7:  # bytes and the like: four significant digits
        return f"{value:.4g}"
    return f"{value:,.1f}" if abs(value) >= 100 else f"{value:.3f}"


def write_product_csv(path: Path, means: dict[tuple[str, str], dict[str, float]], methods: Sequence[str]) -> Path:
    """Long format: one row per (method, dataset), a column per metric."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["method", "dataset", *(name for name, _ in COLUMNS)])
        for (method, dataset), row in sorted(means.items(), key=lambda kv: (kv[0][1], list(methods).index(kv[0][0]))):
            writer.writerow([method, dataset, *(row[name] for name, _ in COLUMNS)])
    return path
