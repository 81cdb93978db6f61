"""The answer to "which method should I use?" that ends ``picrl compare``: per dataset, the method with the lowest
mean *validation* regret over seeds (within ``TIE`` of it, the simpler method: a single rule before the portfolio
that combines it), its margin over the next one, and whether the other budget agrees.

A cell's validation regret is its fitted provisioner run on the validation episode after its test run, under the
run's protocol (:func:`picrl_core.methods.evaluation.validation_regret` for the paper's,
:func:`~picrl_core.methods.evaluation.run_growth_test_split` for the product's: the episode unclipped, the range kept
as the worker keeps it): the ticks every method's knobs are chosen on, so the test split plays no part in the
recommendation, and it ranks the methods as the protocol scores them. The candidates are Table 2's methods that act
under censoring and that a worker can deploy (``Method.deployable``): the full-information references (demand
revealed every tick), the hindsight references (they read the test split), the ablations and the compare-only methods
are not.

``compare`` runs one budget. The other one's verdict is read from the cell cache (same traces, config, protocol and
method list): over the seeds ``0, 1, ...`` for which every candidate's cell is there. Without one, the note says the
other budget's winner is unknown and may differ (the quick budget trains a few epochs and iterations).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from picrl.comparison.runner import Budget, Cell, CellCache, CellResult
from picrl.comparison.tables import Summary, summarise, table2_methods
from picrl_core.methods import REGISTRY

MAX_SEEDS = 100  # the other budget's cells are looked up for seeds below this
TIE = 0.005  # mean validation regrets this close (relative to the lowest) are a tie, won by the simpler method


@dataclass(frozen=True)
class Recommendation:
    """The method named on ``dataset``, its mean validation regret (``std`` over ``seeds``), and the next one (None
    alone; on a tie, the lower method that combines more rules)."""

    dataset: str
    method: str
    regret: float
    std: float
    seeds: int
    runner_up: str | None
    runner_up_regret: float | None


def candidates(methods: Sequence[str]) -> list[str]:
    """The methods of ``methods`` a recommendation may name: Table 2's, acting under censoring, deployable, no
    reference."""
    return [
        m
        for m in table2_methods(methods)
        if REGISTRY[m].censoring and REGISTRY[m].group not in ("reference", "hindsight") and REGISTRY[m].deployable
    ]


def recommend(summaries: dict[tuple[str, str], Summary], methods: Sequence[str], dataset: str) -> Recommendation | None:
    """The candidate of ``methods`` with the lowest mean validation regret on ``dataset`` (None when none has one).

    A tie (within ``TIE`` of the lowest) goes to the simpler method: a single rule before a portfolio of rules."""
    scored = sorted(
        (summaries[(m, dataset)].mean["val_regret"], m)
        for m in candidates(methods)
        if (m, dataset) in summaries and math.isfinite(summaries[(m, dataset)].mean["val_regret"])
    )
    if not scored:
        return None
    tied = [s for s in scored if s[0] <= scored[0][0] + TIE * abs(scored[0][0])]
    regret, best = min(tied, key=lambda s: (len(REGISTRY[s[1]].combines), s[0]))
    rest = [s for s in scored if s[1] != best]
    summary = summaries[(best, dataset)]
    return Recommendation(
        dataset,
        best,
        regret,
        summary.std["val_regret"],
        summary.n,
        rest[0][1] if rest else None,
        rest[0][0] if rest else None,
    )


def cached_summaries(
    cache: CellCache, datasets: Sequence[str], methods: Sequence[str]
) -> dict[tuple[str, str], Summary]:
    """Summaries of the cells ``cache`` (another budget's) holds for every candidate of ``methods``, per dataset over
    the seeds ``0 .. k-1`` for which all of them are there (no entry for a dataset with ``k = 0``)."""
    results: list[CellResult] = []
    for dataset in datasets:
        for seed in range(MAX_SEEDS):
            cells = [cache.load(Cell(dataset, seed, m)) for m in candidates(methods)]
            if not cells or any(c is None or c.metrics is None or "val_regret" not in c.metrics for c in cells):
                break
            results += [c for c in cells if c is not None]
    return summarise(results)


def _line(rec: Recommendation | None, dataset: str) -> str:
    if rec is None:
        return f"- {dataset}: no method has a validation regret (only references ran, or every candidate failed)."
    name = f"{REGISTRY[rec.method].label} (`{rec.method}`)"
    if rec.runner_up is None or rec.runner_up_regret is None:
        return f"- {dataset}: {name}, validation regret {rec.regret:.2f}; the only candidate that ran."
    margin = rec.runner_up_regret - rec.regret
    if margin <= 0 and len(REGISTRY[rec.runner_up].combines) > len(REGISTRY[rec.method].combines):
        return (
            f"- {dataset}: **{name}**, validation regret {rec.regret:.2f}: tied with "
            f"{REGISTRY[rec.runner_up].label} ({rec.runner_up_regret:.2f}, within {100 * TIE:g}%), which combines "
            "more rules: the simpler method is named."
        )
    relative = f", {100 * margin / rec.runner_up_regret:.1f}% lower" if rec.runner_up_regret > 0 else ""
    text = (
        f"- {dataset}: **{name}**, validation regret {rec.regret:.2f}: {margin:.2f} below the next, "
        f"{REGISTRY[rec.runner_up].label} ({rec.runner_up_regret:.2f}{relative})."
    )
    if rec.seeds > 1 and margin < rec.std:
        text += f" The margin is below its std over {rec.seeds} seeds ({rec.std:.2f}): treat the two as tied."
    return text


def markdown_recommendation(
    this: dict[str, Recommendation | None],
    other: dict[str, Recommendation | None],
    budget: Budget,
    other_budget: Budget,
    protocols: dict[str, str],
) -> str:
    """Per dataset: what to use under ``budget``, then whether ``other_budget`` (from the cache, under the same
    protocol) agrees; ``protocols`` names each dataset's protocol (said in the heading, or per dataset when they
    differ)."""
    lines = []
    named = set(protocols.values())
    for dataset, rec in this.items():
        lines.append(_line(rec, dataset) + (f" ({protocols[dataset]} protocol)" if len(named) > 1 else ""))
        known = other.get(dataset)
        if rec is None:
            continue
        if known is None:
            how = "without" if other_budget.name == "full" else "with"
            lines.append(
                f"  The {other_budget.name} budget's winner is unknown (its cells are not in the cache) and may "
                f"differ; run `picrl compare` {how} --quick and the same options to check."
            )
        elif known.method == rec.method:
            lines.append(f"  The {other_budget.name} budget agrees (cached, {known.seeds} seed(s)).")
        else:
            full = rec if budget.name == "full" else known
            lines.append(
                f"  The budgets disagree: the {other_budget.name} budget (cached, {known.seeds} seed(s)) names "
                f"{REGISTRY[known.method].label} (`{known.method}`, validation regret {known.regret:.2f}); the full "
                f"budget trains as `picrl train` does, so prefer its answer, `{full.method}`."
            )
    which = f", {named.pop()} protocol" if len(named) == 1 else ""
    return (
        f"Recommendation ({budget.name} budget{which}): the lowest mean validation regret under the protocol of the "
        f"run, the simpler method within {100 * TIE:g}% of it (the test split plays no part; references are not "
        "candidates)\n\n" + "\n".join(lines) + "\n"
    )
