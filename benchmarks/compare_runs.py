"""Did a change move a comparison's tables beyond seed noise? Two ``picrl compare`` results side by side.

Run on demand (not part of the test suite):

    python benchmarks/compare_runs.py BEFORE/results.json AFTER/results.json --out DIR [--metric regret]

For every (dataset, method) in both runs: the mean and std over seeds of the metric, and the change in units of
the pooled std of the two runs' seeds (``(after - before) / sqrt((s_b^2 + s_a^2) / 2)``). A row whose methods
are deterministic (std 0 in both) counts as within noise only when it is unchanged. Prints the table and the
count within one pooled std, and writes ``compare_runs.csv`` and ``compare_runs.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

from picrl.comparison.runner import Cell, CellResult
from picrl.comparison.tables import METRICS, Summary, summarise


def summaries(path: Path) -> tuple[dict, dict[tuple[str, str], Summary]]:
    """The run's ``results.json`` and its (method, dataset) summaries over seeds, as its tables were made."""
    run = json.loads(path.read_text())
    results = [
        CellResult(
            Cell(c["dataset"], c["seed"], c["method"]),
            c["metrics"] if c["error"] is None else None,
            c["seconds"],
            c["cached"],
            error=c["error"],
        )
        for c in run["cells"]
    ]
    return run, summarise(results)


def compare(before: dict[tuple[str, str], Summary], after: dict[tuple[str, str], Summary], metric: str) -> list[dict]:
    """One row per (dataset, method) that finished in both runs."""
    rows = []
    for method, dataset in sorted(set(before) & set(after), key=lambda key: (key[1], key[0])):
        b, a = before[(method, dataset)], after[(method, dataset)]
        if not (b.n and a.n):
            continue
        pooled = math.sqrt((b.std[metric] ** 2 + a.std[metric] ** 2) / 2)
        change = a.mean[metric] - b.mean[metric]
        in_std = change / pooled if pooled > 0 else (0.0 if change == 0 else math.copysign(math.inf, change))
        rows.append(
            {
                "dataset": dataset,
                "method": method,
                "before_mean": b.mean[metric],
                "before_std": b.std[metric],
                "after_mean": a.mean[metric],
                "after_std": a.std[metric],
                "change": change,
                "change_in_pooled_std": in_std,
                "within_noise": abs(in_std) <= 1.0,
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path, help="results.json of the earlier run")
    parser.add_argument("after", type=Path, help="results.json of the later run")
    parser.add_argument("--metric", default="regret", choices=METRICS, help="the metric compared (default regret)")
    parser.add_argument("--out", type=Path, required=True, help="folder for compare_runs.csv and compare_runs.json")
    args = parser.parse_args()
    for path in (args.before, args.after):
        if not path.is_file():
            parser.error(f"{path} is not a file (give the results.json that picrl compare wrote)")
    run_b, before = summaries(args.before)
    run_a, after = summaries(args.after)
    rows = compare(before, after, args.metric)
    if not rows:
        parser.error("the two runs have no (dataset, method) in common")
    print(f"wall: {run_b.get('wall_seconds', float('nan')):.0f} s -> {run_a.get('wall_seconds', float('nan')):.0f} s")
    print(f"{'dataset':<12}{'method':<22}{'before':>17}{'after':>17}{'change / std':>14}")
    for r in rows:
        print(
            f"{r['dataset']:<12}{r['method']:<22}{r['before_mean']:>9.3f} ± {r['before_std']:<5.2f}"
            f"{r['after_mean']:>9.3f} ± {r['after_std']:<5.2f}{r['change_in_pooled_std']:>14.2f}"
        )
    within = sum(r["within_noise"] for r in rows)
    print(f"{within} of {len(rows)} rows moved by at most one pooled std of the seeds ({args.metric})")
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "compare_runs.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summary = {
        "before": str(args.before),
        "after": str(args.after),
        "metric": args.metric,
        "wall_seconds": [run_b.get("wall_seconds"), run_a.get("wall_seconds")],
        "within_noise": within,
        "rows": rows,
    }
    (args.out / "compare_runs.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"written: {args.out / 'compare_runs.csv'}, {args.out / 'compare_runs.json'}")


if __name__ == "__main__":
    main()
