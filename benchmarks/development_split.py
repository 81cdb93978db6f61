"""Methods on the development split of bundled datasets: how a design choice is made without the test split.

:func:`picrl_core.series.development_series` cuts each dataset: the first 75% of its training split trains,
the rest validates, and its validation split plays the test split, which is never read. Each (dataset,
seed, method) runs as a ``picrl compare`` cell does (the full budget, one service per row), and the
regret of each, with each resource's on a multi-resource fleet, is printed and written to ``--out``.

Run on demand (not part of the test suite), once per version of the code being compared (a commit in a
``git worktree``), then set the JSON files side by side:

    python benchmarks/development_split.py --datasets load-2r-oom pods-2r-oom --methods pic-rl --seeds 0 1 \\
        --out benchmarks/results/design/killed-ticks/after.json

(`select_design.py` is the same protocol for switches of the config on single series and the pod fleet.)
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch
from host import describe

from picrl.comparison.runner import FULL
from picrl.datasets import DATASETS, FLEETS, load_dataset, prepare_trace
from picrl_core.config import PicRLConfig
from picrl_core.methods import REGISTRY
from picrl_core.methods.evaluation import run_on_test_split
from picrl_core.series import development_series


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", required=True, choices=[*DATASETS, *FLEETS])
    parser.add_argument("--methods", nargs="+", default=["pic-rl"], choices=sorted(REGISTRY))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--out", type=Path, required=True, help="JSON file for the results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    print(f"{'dataset':<14}{'seed':>5}  {'method':<22}{'regret':>9}  per resource{'':>20}seconds")
    for name in args.datasets:
        trace = load_dataset(name)
        series = development_series(prepare_trace(trace))
        for seed in args.seeds:
            config = replace(FULL.apply(PicRLConfig()), seed=seed)
            for method in args.methods:
                started = time.perf_counter()
                run = run_on_test_split(REGISTRY[method], series, config, trace.step_seconds)
                rows.append(
                    {
                        "dataset": name,
                        "seed": seed,
                        "method": method,
                        "regret": run.metrics.regret,
                        **run.extra,
                        "seconds": time.perf_counter() - started,
                    }
                )
                per = ", ".join(f"{k[7:]} {v:.2f}" for k, v in run.extra.items() if k.startswith("regret_"))
                print(
                    f"{name:<14}{seed:>5}  {method:<22}{run.metrics.regret:>9.2f}  {per:<32}"
                    f"{rows[-1]['seconds']:>6.0f}",
                    flush=True,
                )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"benchmark": "development_split", "machine": describe(), "rows": rows}, indent=2) + "\n"
    )
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
