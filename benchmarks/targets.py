"""The default against every deployable method and its full-information reference, paired over seeds.

Run on demand (not part of the test suite), on one or more ``picrl compare`` runs:

    python benchmarks/targets.py RUN/results.json [RUN2/results.json ...] --out DIR \\
        [--default pic-rl] [--reference pic-rl-fi] [--metric regret]

For each dataset of each run, and each method that ran on it, the paired ratio to the default: the geometric mean
over the seeds both ran of ``metric_method / metric_default``, with the 90% bootstrap interval of the mean log
ratio (seeds resampled, :func:`select_design.paired_verdict`; a single seed has no interval). A ratio above 1 means
the default is lower. The default's ratio to its full-information reference is the same statistic the other way
round. Per dataset it names the lowest deployable method other than the default and the default's ratio to it.
Prints the table and writes ``targets.json``, ``targets.csv`` and ``targets.png`` (the ratios with their intervals)
to ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from select_design import paired_verdict  # noqa: E402

from picrl_core.methods import REGISTRY  # noqa: E402


def per_seed(runs: list[dict], metric: str) -> dict[str, dict[str, dict[int, float]]]:
    """dataset -> method -> seed -> metric, over every cell that ran without error."""
    out: dict[str, dict[str, dict[int, float]]] = {}
    for run in runs:
        for cell in run["cells"]:
            if cell["error"] is None and cell["metrics"] is not None:
                out.setdefault(cell["dataset"], {}).setdefault(cell["method"], {})[cell["seed"]] = float(
                    cell["metrics"][metric]
                )
    return out


def paired(values: dict[str, dict[int, float]], method: str, base: str) -> dict:
    """``method`` over ``base`` on the seeds both ran: geometric-mean ratio, its 90% interval, the seeds."""
    seeds = sorted(set(values[method]) & set(values[base]))
    pairs = {f"seed {s}": {"m": {"regret": values[method][s]}, "b": {"regret": values[base][s]}} for s in seeds}
    verdict = paired_verdict(pairs, "m", "b")
    low, high = verdict["interval"] if len(seeds) > 1 else (math.nan, math.nan)
    return {
        "ratio": math.exp(verdict["mean_log_ratio"]),
        "interval": [math.exp(low), math.exp(high)],
        "seeds": len(seeds),
    }


def targets(values: dict[str, dict[str, dict[int, float]]], default: str, reference: str) -> list[dict]:
    """One row per (dataset, method): the method's mean, and its paired ratio to the default (the reference's
    row holds the default over the reference instead)."""
    rows = []
    for dataset, methods in values.items():
        if default not in methods:
            continue
        means = {m: sum(v.values()) / len(v) for m, v in methods.items()}
        rivals = [m for m in methods if m != default and REGISTRY[m].deployable]
        best = min(rivals, key=means.__getitem__) if rivals else None
        for method in methods:
            if method == default:
                continue
            ratio = paired(methods, default, method) if method == reference else paired(methods, method, default)
            rows.append(
                {
                    "dataset": dataset,
                    "method": method,
                    "mean": means[method],
                    "default_mean": means[default],
                    "statistic": f"{default} / {method}" if method == reference else f"{method} / {default}",
                    "best_rival": method == best,
                    **ratio,
                }
            )
    return rows


def _interval(row: dict) -> str:
    low, high = row["interval"]
    return "one seed" if math.isnan(low) else f"[{low:.3f}, {high:.3f}]"


def table(rows: list[dict], metric: str) -> str:
    lines = [
        f"| dataset | method | {metric} (mean) | default's | ratio | 90% interval | seeds |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        name = REGISTRY[row["method"]].label + (" (lowest rival)" if row["best_rival"] else "")
        lines.append(
            f"| {row['dataset']} | {name} | {row['mean']:.3f} | {row['default_mean']:.3f} | "
            f"{row['statistic']} = {row['ratio']:.3f} | {_interval(row)} | {row['seeds']} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> Path:
    datasets = list(dict.fromkeys(row["dataset"] for row in rows))
    methods = list(dict.fromkeys(row["method"] for row in rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(datasets)), 4.2))
    width = 0.8 / len(methods)
    for i, method in enumerate(methods):
        for j, dataset in enumerate(datasets):
            row = next((r for r in rows if r["dataset"] == dataset and r["method"] == method), None)
            if row is None:
                continue
            low, high = row["interval"]
            error = None if math.isnan(low) else [[row["ratio"] - low], [high - row["ratio"]]]
            label = row["statistic"] if j == 0 else None
            ax.errorbar(j + i * width, row["ratio"], yerr=error, fmt="o", color=f"C{i}", capsize=3, label=label)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(datasets))], datasets, rotation=20, ha="right")
    ax.set_ylabel("geometric-mean ratio (log scale)")
    ax.set_title("Paired ratios over seeds (90% bootstrap intervals)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("runs", type=Path, nargs="+", help="results.json files of picrl compare")
    parser.add_argument("--out", type=Path, required=True, help="folder for targets.json, targets.csv, targets.png")
    parser.add_argument("--default", default="pic-rl", help="the method the others are paired with (pic-rl)")
    parser.add_argument("--reference", default="pic-rl-fi", help="the default's full-information run (pic-rl-fi)")
    parser.add_argument("--metric", default="regret", help="a cell metric of results.json (regret)")
    args = parser.parse_args()
    for path in args.runs:
        if not path.is_file():
            parser.error(f"no such file: {path}")
    runs = [json.loads(path.read_text()) for path in args.runs]
    rows = targets(per_seed(runs, args.metric), args.default, args.reference)
    if not rows:
        parser.error(f"no dataset of these runs has {args.default} and another method")
    args.out.mkdir(parents=True, exist_ok=True)
    print(table(rows, args.metric))
    (args.out / "targets.json").write_text(
        json.dumps({"runs": [str(p) for p in args.runs], "metric": args.metric, "rows": rows}, indent=2)
    )
    with (args.out / "targets.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[k for k in rows[0] if k != "interval"] + ["low", "high"])
        writer.writeheader()
        for row in rows:
            writer.writerow(
                {
                    **{k: v for k, v in row.items() if k != "interval"},
                    "low": row["interval"][0],
                    "high": row["interval"][1],
                }
            )
    print(f"wrote {args.out / 'targets.json'}, targets.csv, {plot(rows, args.out / 'targets.png')}")


if __name__ == "__main__":
    main()
