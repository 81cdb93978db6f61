"""What the slow loop is worth: the predictor refit on and off, and Table 3's slow-loop parts, on drift and growth.

Long synthetic development traces (:func:`picrl_core.synthetic.linear_drift`, :func:`~picrl_core.synthetic.
exponential_growth`, each seed its own draw) are cut by :func:`picrl_core.series.development_series` (the first 75%
of the training split trains, the rest validates, the validation split plays the test; the test split is never
read) and played under the growth protocol (:func:`picrl_core.methods.evaluation.growth_episode`), the offline
slow loop being :class:`picrl_core.pipeline.SlowLoop`, which calls the same core functions as ``picrl trainer``.
The regret reported is the summed cost over the last third of the played part, in units of the training range,
where a loop that learns should have learnt. Rows:

    default           the product's default (policy slow loop on, predictor refit off)
    +refit            the predictor refit on (refit.enabled)
    +refit lr x10     ... with refit.lr = 1e-2 (ten times the default's)
    +refit w/o KL     ... with refit.kl_coef = 0
    +refit w/o EMA    ... with refit.ema_decay = 0
    A5 w/o KL         the policy update's KL off (online.kl_coef = 0)
    A6 w/o EMA        the policy's EMA off (online.ema_decay = 0)
    A7 w/o pretrain   Phase 2 skipped
    no slow loop      neither the policy update nor the refit

Run on demand (not part of the test suite; ~2-4 minutes per trace and seed on one core):

    python benchmarks/slow_loop.py --seeds 0 1 2 3 4 --ticks 8640 \\
        --out benchmarks/results/design/predictor-refit/runs.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from picrl.comparison.runner import FULL
from picrl_core import synthetic
from picrl_core.config import PicRLConfig
from picrl_core.costs import asymmetric_cost
from picrl_core.methods.evaluation import growth_episode
from picrl_core.methods.pic_rl import PicRLProvisioner
from picrl_core.pipeline import train_offline
from picrl_core.series import development_series, native_splits, prepare_series
from picrl_core.training_memo import shared_training

TRACES: dict[str, Callable[[int, int], np.ndarray]] = {
    "drift": lambda n, seed: synthetic.linear_drift(n, seed=seed),
    "growth": lambda n, seed: synthetic.exponential_growth(n, seed=seed),
}


def _refit(**changes: float) -> Callable[[PicRLConfig], PicRLConfig]:
    return lambda c: replace(c, refit=replace(c.refit, enabled=True, **changes))


def _online(**changes: float) -> Callable[[PicRLConfig], PicRLConfig]:
    return lambda c: replace(c, online=replace(c.online, **changes))


ROWS: dict[str, Callable[[PicRLConfig], PicRLConfig]] = {
    "default": lambda c: c,
    "+refit": _refit(),
    "+refit lr x10": _refit(lr=1e-2),
    "+refit w/o KL": _refit(kl_coef=0.0),
    "+refit w/o EMA": _refit(ema_decay=0.0),
    "A5 w/o KL": _online(kl_coef=0.0),
    "A6 w/o EMA": _online(ema_decay=0.0),
}


def last_third_regret(run, config: PicRLConfig) -> float:
    """The summed cost of the last third of the played ticks."""
    demand, actions = np.atleast_2d(run.demand.T).T, np.atleast_2d(run.actions.T).T
    tail = slice(demand.shape[0] - demand.shape[0] // 3, None)
    return float(asymmetric_cost(actions[tail], demand[tail], config.cost).sum())


def evaluate(name: str, values: np.ndarray, seed: int, rows: list[str]) -> dict[str, dict]:
    series = development_series(prepare_series(values, name))
    native = native_splits(values, name)[1]
    base = replace(FULL.apply(PicRLConfig()), seed=seed)
    out: dict[str, dict] = {}
    with shared_training():
        artifact = train_offline(series, base)
        for row in (row for row in rows if row in ROWS):
            config = ROWS[row](artifact.config)
            provisioner = PicRLProvisioner.from_artifact(replace(artifact, config=config))
            started = time.perf_counter()
            run = growth_episode(provisioner, series, native, config)
            versions = [] if provisioner.slow is None else provisioner.slow.predictor_versions
            out[row] = {
                "regret_last_third": last_third_regret(run, config),
                "regret": run.metrics.regret,
                "predictor_versions": len(versions),
                "seconds": time.perf_counter() - started,
            }
        run = growth_episode(PicRLProvisioner.from_artifact(artifact, slow_updates=False), series, native, base)
        out["no slow loop"] = {"regret_last_third": last_third_regret(run, base), "regret": run.metrics.regret}
        if "A7 w/o pretrain" in rows:
            a7 = train_offline(series, replace(base, ablation=replace(base.ablation, pretrain=False)))
            run = growth_episode(PicRLProvisioner.from_artifact(a7), series, native, a7.config)
            out["A7 w/o pretrain"] = {
                "regret_last_third": last_third_regret(run, a7.config),
                "regret": run.metrics.regret,
            }
    return out


def paired(results: dict[str, dict[str, dict]], row: str, base: str = "default", draws: int = 10_000) -> dict:
    """Mean ``log(regret_row / regret_base)`` of the last thirds over the trace-seed pairs and its 90% bootstrap
    interval (negative: ``row`` is lower)."""
    logs = np.array(
        [
            np.log(max(r[row]["regret_last_third"], 1e-9) / max(r[base]["regret_last_third"], 1e-9))
            for r in results.values()
            if row in r
        ]
    )
    means = np.random.default_rng(0).choice(logs, size=(draws, logs.size)).mean(axis=1)
    low, high = np.quantile(means, [0.05, 0.95])
    return {"mean_log_ratio": float(logs.mean()), "interval": [float(low), float(high)], "pairs": int(logs.size)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--ticks", type=int, default=8640, help="length of each synthetic trace")
    parser.add_argument("--traces", nargs="+", default=list(TRACES), choices=list(TRACES))
    parser.add_argument("--rows", nargs="+", default=[*ROWS, "A7 w/o pretrain"], choices=[*ROWS, "A7 w/o pretrain"])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results: dict[str, dict[str, dict]] = json.loads(args.out.read_text()) if args.out.exists() else {}
    results.pop("summary", None)
    for trace in args.traces:
        for seed in args.seeds:
            key = f"{trace}/{seed}"
            if key in results:
                continue
            started = time.perf_counter()
            results[key] = evaluate(f"syn-{trace}", TRACES[trace](args.ticks, 100 + seed), seed, args.rows)
            line = "  ".join(f"{row} {r['regret_last_third']:.2f}" for row, r in results[key].items())
            print(f"{key:<10} {line}  ({time.perf_counter() - started:.0f} s)", flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=1) + "\n")
    rows = sorted({row for r in results.values() for row in r} - {"default"})
    summary = {row: paired(results, row) for row in rows}
    for row, verdict in summary.items():
        print(f"{row:<18} {verdict}")
    args.out.write_text(json.dumps(results | {"summary": summary}, indent=1) + "\n")


if __name__ == "__main__":
    main()
