"""Tables 2 and 3 of the comparison from its cell results: Markdown, CSV and the summary they share.

Every entry is the mean (and, over more than one seed, the std) of a test-split metric over seeds; the CSV adds
the validation regret :mod:`picrl.comparison.recommendation` reads.
Table 2 lists PIC-RL and the baselines in the paper's order (phase substitutions, full pipelines),
then the operator baselines and the hindsight references; Table 3 lists PIC-RL (Full) and the ablations
with their MAE change relative to Full.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from picrl.comparison.runner import CellResult
from picrl_core.config import CostConfig
from picrl_core.costs import per_service_metrics
from picrl_core.methods import REGISTRY
from picrl_core.resources import Resource

GROUP_ORDER = (
    "pic-rl",
    "phase-1",
    "phase-2",
    "phase-3",
    "phase-2+3",
    "full",
    "operator",
    "multi-resource",
    "reference",
    "hindsight",
)
GROUP_TITLES = {
    "pic-rl": "",
    "phase-1": "Phase 1 substitution (predictor)",
    "phase-2": "Phase 2 substitution (offline RL)",
    "phase-3": "Phase 3 substitution (online calibration; no Phase 2)",
    "phase-2+3": "Phase 2+3 substitution (decision module)",
    "full": "Full-pipeline baselines",
    "operator": "Operator and textbook baselines (beyond the paper)",
    "multi-resource": "Multi-resource variants (which censoring flags a method reads)",
    "reference": "Full-information references (the same controller, demand revealed every tick)",
    "hindsight": "Hindsight references (read the test demand: not methods, not bounds)",
    "ablation": "Ablations",
}
# val_regret: regret on the validation episode (picrl.comparison.recommendation); absent for a hindsight reference
METRICS = ("mae", "regret", "shortage_rate", "val_regret")
# Below half the tables' last MAE digit a relative change is noise over zero (e.g. a trace clipped flat).
MAE_FLOOR = 5e-5


@dataclass(frozen=True)
class Summary:
    """Mean and std over seeds of each metric for one (method, dataset); ``n`` seeds that finished."""

    method: str
    dataset: str
    mean: dict[str, float]
    std: dict[str, float]
    n: int
    failed: int


def summarise(results: Sequence[CellResult]) -> dict[tuple[str, str], Summary]:
    """(method, dataset) -> :class:`Summary` over the seeds that ran."""
    cells: dict[tuple[str, str], list[CellResult]] = {}
    for result in results:
        cells.setdefault((result.cell.method, result.cell.dataset), []).append(result)
    out = {}
    for (method, dataset), group in cells.items():
        ok = [r.metrics for r in group if r.metrics is not None]
        values = {m: np.array([r.get(m, np.nan) for r in ok], dtype=np.float64) for m in METRICS}
        out[(method, dataset)] = Summary(
            method,
            dataset,
            {m: float(v.mean()) if v.size else float("nan") for m, v in values.items()},
            {m: float(v.std(ddof=1)) if v.size > 1 else 0.0 for m, v in values.items()},
            len(ok),
            len(group) - len(ok),
        )
    return out


def table2_methods(methods: Sequence[str]) -> list[str]:
    """The non-ablation methods of ``methods`` in the paper's row order."""
    return sorted(
        (m for m in methods if REGISTRY[m].group != "ablation"),
        key=lambda m: (GROUP_ORDER.index(REGISTRY[m].group), list(REGISTRY).index(m)),
    )


def table3_methods(methods: Sequence[str]) -> list[str]:
    """PIC-RL (Full) and the ablations of ``methods``, A1 to A7."""
    return [m for m in ("pic-rl", *(m for m in REGISTRY if REGISTRY[m].group == "ablation")) if m in methods]


def _cell(summary: Summary | None, metric: str, digits: int) -> str:
    if summary is None or summary.n == 0:
        return "failed" if summary is not None else "-"
    text = f"{summary.mean[metric]:.{digits}f}"
    if summary.n > 1:
        text += f" ± {summary.std[metric]:.{digits}f}"
    return text + (f" ({summary.failed} failed)" if summary.failed else "")


def _digits(metric: str) -> int:
    return {"mae": 4, "regret": 2, "shortage_rate": 3}[metric]


def _best_regret(summaries: dict[tuple[str, str], Summary], methods: Sequence[str], dataset: str) -> str | None:
    """The method with the lowest mean regret on ``dataset`` (the hindsight and full-information
    references, which see what no method sees, excluded)."""
    scored = [
        (summaries[(m, dataset)].mean["regret"], m)
        for m in methods
        if (m, dataset) in summaries
        and summaries[(m, dataset)].n
        and REGISTRY[m].censoring
        and REGISTRY[m].group != "hindsight"
    ]
    return min(scored)[1] if scored else None


def markdown_table2(summaries: dict[tuple[str, str], Summary], methods: Sequence[str], datasets: Sequence[str]) -> str:
    """Table 2: MAE, regret and shortage rate per dataset; the lowest regret per dataset in bold; the methods a
    worker cannot deploy marked "compare only" (:func:`table_label`)."""
    rows = table2_methods(methods)
    best = {d: _best_regret(summaries, rows, d) for d in datasets}
    header = "| Method | " + " | ".join(f"{d} MAE | {d} Regret | {d} shortage" for d in datasets) + " |"
    lines = [header, "|---|" + "---|" * (3 * len(datasets))]
    group = None
    for method in rows:
        if REGISTRY[method].group != group:
            group = REGISTRY[method].group
            if GROUP_TITLES[group]:
                lines.append(f"| *{GROUP_TITLES[group]}* |" + " |" * (3 * len(datasets)))
        cells = []
        for d in datasets:
            s = summaries.get((method, d))
            regret = _cell(s, "regret", 2)
            cells += [
                _cell(s, "mae", 4),
                f"**{regret}**" if best[d] == method else regret,
                _cell(s, "shortage_rate", 3),
            ]
        lines.append(f"| {table_label(method)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def table_label(method: str) -> str:
    """A method's label in Table 2, marked "compare only" where no worker can deploy it (``Method.deployable``)."""
    entry = REGISTRY[method]
    return entry.label if entry.deployable else f"{entry.label} (compare only)"


def full_information_pairs(methods: Sequence[str]) -> list[tuple[str, str]]:
    """``(method, its full-information reference)`` for every method of ``methods`` whose ``<name>-fi`` is there."""
    return [(m, f"{m}-fi") for m in methods if REGISTRY[m].censoring and f"{m}-fi" in methods]


def censoring_cost(summaries: dict[tuple[str, str], Summary], method: str, dataset: str) -> float:
    """``regret(censored) / regret(full information)`` of ``method`` on ``dataset`` (NaN when unknown or 0)."""
    censored, full = summaries.get((method, dataset)), summaries.get((f"{method}-fi", dataset))
    if not censored or not full or not censored.n or not full.n or full.mean["regret"] <= 0:
        return float("nan")
    return censored.mean["regret"] / full.mean["regret"]


def markdown_censoring_cost(
    summaries: dict[tuple[str, str], Summary], methods: Sequence[str], datasets: Sequence[str]
) -> str:
    """The cost of censoring: each method's mean regret over its full-information reference's, per dataset."""
    lines = [
        "| Method | " + " | ".join(f"{d} regret / full-information regret" for d in datasets) + " |",
        "|---|" + "---|" * len(datasets),
    ]
    for method, _ in full_information_pairs(methods):
        ratios = [censoring_cost(summaries, method, d) for d in datasets]
        cells = ("—" if np.isnan(r) else f"{r:.2f}x" for r in ratios)
        lines.append(f"| {REGISTRY[method].label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def markdown_fleet(
    results: Sequence[CellResult], demand: np.ndarray, dataset: str, methods: Sequence[str], cost: CostConfig
) -> str:
    """A fleet's spread: for each Table-2 method, the regret of its services (``demand`` ``(T, N)``) pooled
    over seeds: mean, std, quartiles, and the share of services on which it has the lowest regret of the
    methods (the hindsight and full-information references aside), seed by seed."""
    rows = table2_methods(methods)
    regrets: dict[str, dict[int, np.ndarray]] = {}  # method -> seed -> (N,)
    for r in results:
        if r.cell.dataset == dataset and r.cell.method in rows and r.actions is not None:
            regrets.setdefault(r.cell.method, {})[r.cell.seed] = np.array(
                [m.regret for m in per_service_metrics(r.actions, demand, cost)]
            )
    rivals = [m for m in regrets if REGISTRY[m].censoring and REGISTRY[m].group != "hindsight"]
    seeds = sorted(set.intersection(*(set(regrets[m]) for m in rivals))) if rivals else []
    wins = {m: [] for m in rivals}
    for seed in seeds:
        best = np.argmin(np.stack([regrets[m][seed] for m in rivals]), axis=0)
        for i, m in enumerate(rivals):
            wins[m].append(np.mean(best == i))
    lines = [
        "| Method | services | regret per service | std over services | p25 | median | p75 | services where lowest |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method in rows:
        if method not in regrets:
            continue
        pooled = np.concatenate(list(regrets[method].values()))
        quartiles = np.percentile(pooled, [25, 50, 75])
        share = f"{np.mean(wins[method]):.0%}" if wins.get(method) else "—"
        lines.append(
            f"| {REGISTRY[method].label} | {pooled.size // len(regrets[method])} | {pooled.mean():.2f} | "
            f"{pooled.std(ddof=1):.2f} | " + " | ".join(f"{q:.2f}" for q in quartiles) + f" | {share} |"
        )
    return "\n".join(lines) + "\n"


def markdown_resources(
    results: Sequence[CellResult], dataset: str, methods: Sequence[str], resources: Sequence[Resource]
) -> str:
    """A multi-resource fleet, per method: each resource's regret and shortage rate (mean over seeds), and
    how a hard shortage meets a soft one (:func:`picrl_core.methods.coupled.resource_metrics`)."""
    keys = [f"{key}_{r.name}" for r in resources for key in ("regret", "shortage")]
    keys += ["soft_short_with_hard_short", "soft_short_after_hard_short", "soft_short_otherwise"]
    heads = [f"{r.name} regret | {r.name} shortage" for r in resources]
    lines = [
        "| Method | total regret | " + " | ".join(heads) + " | soft short with a hard shortage | "
        "the tick after | soft short otherwise |",
        "|---|" + "---|" * (1 + len(keys)),
    ]
    for method in table2_methods(methods):
        cells = [
            r.metrics
            for r in results
            if r.cell.dataset == dataset and r.cell.method == method and r.metrics is not None
        ]
        if not cells:
            continue
        mean = {k: float(np.nanmean([c.get(k, np.nan) for c in cells])) for k in ["regret", *keys]}
        lines.append(
            f"| {REGISTRY[method].label} | {mean['regret']:.2f} | "
            + " | ".join(f"{mean[k]:.2f}" if k.startswith("regret") else f"{mean[k]:.3f}" for k in keys)
            + " |"
        )
    return "\n".join(lines) + "\n"


def idle_shares(demand: np.ndarray, resources: Sequence[Resource]) -> str:
    """One line: the share of the test split's (service, tick) at which each resource's demand sits at the bottom
    of its training range (``demand`` ``(T, R * N)`` scaled, resource-major), e.g. a duty cycle of 0. Where a soft
    resource idles, a hard shortage hides nothing of it, and the coupled flags cannot matter."""
    blocks = np.split(np.asarray(demand), len(resources), axis=1)
    shares = ", ".join(f"{r.name} {np.mean(block <= 0.0):.1%}" for r, block in zip(resources, blocks))
    return f"Test-split demand at the bottom of its training range (idle): {shares} of (service, tick).\n"


def mae_change(summaries: dict[tuple[str, str], Summary], method: str, dataset: str) -> float:
    """Relative MAE change of ``method`` against PIC-RL (Full) on ``dataset``, in percent.

    NaN where either is unknown or Full's MAE is below :data:`MAE_FLOOR` (a ratio to ~0 means nothing).
    """
    full, ablated = summaries.get(("pic-rl", dataset)), summaries.get((method, dataset))
    if not full or not ablated or not full.n or not ablated.n or full.mean["mae"] < MAE_FLOOR:
        return float("nan")
    return 100.0 * (ablated.mean["mae"] / full.mean["mae"] - 1.0)


def markdown_table3(summaries: dict[tuple[str, str], Summary], methods: Sequence[str], datasets: Sequence[str]) -> str:
    """Table 3: PIC-RL (Full) and A1-A7 with MAE, its change vs Full, regret and shortage rate."""
    header = "| Method | " + " | ".join(f"{d} MAE | {d} ΔMAE | {d} Regret | {d} shortage" for d in datasets) + " |"
    lines = [header, "|---|" + "---|" * (4 * len(datasets))]
    for method in table3_methods(methods):
        cells = []
        for d in datasets:
            s = summaries.get((method, d))
            change = mae_change(summaries, method, d)
            cells += [
                _cell(s, "mae", 4),
                "—" if method == "pic-rl" or np.isnan(change) else f"{change:+.0f}%",
                _cell(s, "regret", 2),
                _cell(s, "shortage_rate", 3),
            ]
        label = "PIC-RL (Full)" if method == "pic-rl" else REGISTRY[method].label
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_csv(
    path: Path, summaries: dict[tuple[str, str], Summary], methods: Sequence[str], datasets: Sequence[str]
) -> Path:
    """Long format: one row per (method, dataset) with mean and std of every metric."""
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                "method",
                "label",
                "group",
                "dataset",
                "seeds",
                "failed",
                *(f"{m}_{stat}" for m in METRICS for stat in ("mean", "std")),
                "mae_change_vs_full_pct",
            ]
        )
        for method in methods:
            for d in datasets:
                s = summaries.get((method, d))
                if s is None:
                    continue
                writer.writerow(
                    [
                        method,
                        REGISTRY[method].label,
                        REGISTRY[method].group,
                        d,
                        s.n,
                        s.failed,
                        *(f"{v:.6g}" for m in METRICS for v in (s.mean[m], s.std[m])),
                        f"{mae_change(summaries, method, d):.4g}",
                    ]
                )
    return path
