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
import statistics
from collections import defaultdict
from pathlib import Path


def per_cell(path: Path, metric: str) -> tuple[dict, dict[tuple[str, str], list[float]]]:
    """The run's ``results.json`` and each (dataset, method)'s metric over its seeds (failed cells left out)."""
    run = json.loads(path.read_text())
    values: dict[tuple[str, str], list[float]] = defaultdict(list)
    for cell in run["cells"]:
        if cell["error"] is None:
            values[(cell["dataset"], cell["method"])].append(float(cell["metrics"][metric]))
    return run, values


def std(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def compare(before: dict[tuple[str, str], list[float]],
            after: dict[tuple[str, str], list[float]]) -> list[dict]:
    """One row per (dataset, method) present in both runs."""
    rows = []
    for key in sorted(set(before) & set(after)):
        b, a = before[key], after[key]
        pooled = math.sqrt((std(b) ** 2 + std(a) ** 2) / 2)
        change = statistics.mean(a) - statistics.mean(b)
        in_std = change / pooled if pooled > 0 else (0.0 if change == 0 else math.copysign(math.inf, change))
        rows.append({"dataset": key[0], "method": key[1], "before_mean": statistics.mean(b), "before_std": std(b),
                     "after_mean": statistics.mean(a), "after_std": std(a), "change": change,
                     "change_in_pooled_std": in_std, "within_noise": abs(in_std) <= 1.0})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path, help="results.json of the earlier run")
    parser.add_argument("after", type=Path, help="results.json of the later run")
    parser.add_argument("--metric", default="regret", help="a key of each cell's metrics (default regret)")
    parser.add_argument("--out", type=Path, required=True, help="folder for compare_runs.csv and compare_runs.json")
    args = parser.parse_args()
    for path in (args.before, args.after):
        if not path.is_file():
            parser.error(f"{path} is not a file (give the results.json that picrl compare wrote)")
    run_b, before = per_cell(args.before, args.metric)
    run_a, after = per_cell(args.after, args.metric)
    rows = compare(before, after)
    if not rows:
        parser.error("the two runs have no (dataset, method) in common")
    print(f"wall: {run_b.get('wall_seconds', float('nan')):.0f} s -> {run_a.get('wall_seconds', float('nan')):.0f} s")
    print(f"{'dataset':<12}{'method':<22}{'before':>17}{'after':>17}{'change / std':>14}")
    for r in rows:
        print(f"{r['dataset']:<12}{r['method']:<22}{r['before_mean']:>9.3f} ± {r['before_std']:<5.2f}"
              f"{r['after_mean']:>9.3f} ± {r['after_std']:<5.2f}{r['change_in_pooled_std']:>14.2f}")
    within = sum(r["within_noise"] for r in rows)
    print(f"{within} of {len(rows)} rows moved by at most one pooled std of the seeds ({args.metric})")
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "compare_runs.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summary = {"before": str(args.before), "after": str(args.after), "metric": args.metric,
               "wall_seconds": [run_b.get("wall_seconds"), run_a.get("wall_seconds")],
               "within_noise": within, "rows": rows}
    (args.out / "compare_runs.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"written: {args.out / 'compare_runs.csv'}, {args.out / 'compare_runs.json'}")


if __name__ == "__main__":
    main()
