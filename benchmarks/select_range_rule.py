"""How the floor rule's constants were chosen (``picrl_core.scaling.next_low``: ``shrink_after``, ``floor_share``).

Each trace is cut by :func:`picrl_core.series.development_series` (the first 75% of the training split trains,
the rest validates, the validation split plays the test; no test split is read). PIC-RL's default is trained once
per trace and seed, conformal fitted beside it, and each runs the part that plays the test under the growth
protocol (:func:`picrl_core.methods.evaluation.growth_episode`) once per range rule: the floors fixed
(``shrink_after`` 0, the rule before) and each pair of ``--after`` x ``--shares``. The ranges only move on that part,
so the training is shared by every rule.

The traces: the select-design traces with idle ticks or a daily cycle (GenAI, DLRM, pods' memory and duty cycles,
a daily wave, idle stretches, scale to zero), five of :func:`picrl_core.synthetic.idle_nights`, busy through the
training part and idle at night in the part that plays the test (nights at 10% of the day's level, at 0, at 30%,
half a day long at 10%, a fifth of a day at 5%), one idle at night throughout, and a service whose level falls
to a third (``syn-falling``). A trace whose part that plays the test has no tick below the training floor is
listed and not run: no usage can lie below a floor its demand never goes under, so every rule decides there as
the fixed floors do, bit for bit.

For each (trace, seed, rule, method): regret in training-range units, native regret, and over the ticks whose
demand lies below the training range's floor ``L`` (the nights), the median capacity over the median demand
(``low_ratio``; NaN where that demand is 0) and the median capacity over ``L`` (``low_over_floor``). The verdict
of each rule against the fixed floors is the adoption rule of ``select_design.py`` over the trace-seed pairs.

    python benchmarks/select_range_rule.py --out benchmarks/results/design/floor-rule [--seeds 0]

``--test`` reads the test split once, after the choice: each trace trained on its training split (validation for
early stopping and knobs), the fixed floors against the worker's default rule only (``STREAM_GROWTH``).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from host import StealMeter, describe
from select_design import paired_verdict, traces

from picrl.comparison.runner import FULL
from picrl_core import synthetic
from picrl_core.config import PicRLConfig
from picrl_core.methods.base import Provisioner
from picrl_core.methods.conformal import fit_conformal
from picrl_core.methods.evaluation import growth_episode
from picrl_core.methods.growth import STREAM_GROWTH, RangeGrowth
from picrl_core.methods.pic_rl import PicRLProvisioner
from picrl_core.pipeline import phase1_predictor, train_offline
from picrl_core.series import PreparedSeries, development_series, native_splits, prepare_series
from picrl_core.training_memo import shared_training

KEPT = (
    "genai-mem",
    "genai-ctx",
    "dlrm",
    "pod-0",
    "pod-45",
    "pod-90",
    "syn-daily",
    "syn-idling",
    "syn-scale-to-zero",
)
FIXED = "fixed floors"


def range_traces() -> dict[str, tuple[np.ndarray, np.ndarray | None, tuple[str, ...]]]:
    """The traces of the module docstring: name -> (values, context, context names)."""
    chosen = {name: value for name, value in traces(3).items() if name in KEPT or name.startswith("duty-")}
    n = 1440
    nights = {
        "syn-idle-nights": synthetic.idle_nights(n, seed=11),
        "syn-zero-nights": synthetic.idle_nights(n, idle=0.0, seed=12),
        "syn-dim-nights": synthetic.idle_nights(n, idle=0.3, seed=14),
        "syn-long-nights": synthetic.idle_nights(n, night=0.5, seed=15),
        "syn-short-nights": synthetic.idle_nights(n, night=0.2, idle=0.05, seed=16),
        "syn-nights-always": synthetic.idle_nights(n, idle_from=0.0, seed=13),
        "syn-falling": synthetic.linear_drift(n, start=0.6, end=0.2, seed=17),
    }
    return chosen | {name: (values, None, ()) for name, values in nights.items()}


def rules(afters: list[int], shares: list[float]) -> dict[str, RangeGrowth]:
    out = {FIXED: replace(STREAM_GROWTH, shrink_after=0)}
    for after in afters:
        for share in shares:
            out[f"after {after}, share {share:g}"] = replace(STREAM_GROWTH, shrink_after=after, floor_share=share)
    return out


def episode(
    provisioner: Provisioner, series: PreparedSeries, native: np.ndarray, config: PicRLConfig, growth: RangeGrowth
) -> dict[str, float]:
    """The metrics of the module docstring for one growth-protocol episode."""
    run = growth_episode(provisioner, series, native, config, growth=growth)
    low, high = series.scaler.low, series.scaler.high
    capacity = low + np.asarray(run.actions) * (high - low)
    demand = np.asarray(native, dtype=np.float64).reshape(capacity.shape)
    below = demand < low
    out = {
        "regret": run.metrics.regret,
        "regret_native": run.extra["regret_native"],
        "over_mass_native": run.extra["over_mass_native"],
        "under_mass_native": run.extra["under_mass_native"],
        "below_floor_ticks": int(below.sum()),
    }
    if below.any():
        night = float(np.median(demand[below]))
        out["low_ratio"] = float(np.median(capacity[below])) / night if night > 0 else float("nan")
        out["low_over_floor"] = float(np.median(capacity[below])) / low
        first = (slice(None), 0) if capacity.ndim == 2 else slice(None)  # the first service of a fleet
        out |= night_timing(capacity[first], demand[first], np.asarray(run.censored)[first], low)
    return out


def night_timing(capacity: np.ndarray, demand: np.ndarray, censored: np.ndarray, low: float) -> dict[str, float]:
    """Over the runs of ticks below the floor ``low`` (nights) that end before the episode does: the median ticks
    from a night's start to its first capacity within 2x its median demand (or 2x ``low``/10 when it scales to
    zero), and the median ticks short in a row from its end (the morning's catch-up)."""
    below = demand < low
    edges = np.flatnonzero(np.diff(np.concatenate([[0], below.astype(int), [0]])))
    give_back, catch_up = [], []
    for start, end in zip(edges[::2], edges[1::2], strict=True):
        level = float(np.median(demand[start:end]))
        target = 2 * level if level > 0 else 0.2 * low
        within = np.flatnonzero(capacity[start:end] <= target)
        give_back.append(float(within[0]) if within.size else float(end - start))
        if end < len(demand):
            covered = np.flatnonzero(~censored[end:])
            catch_up.append(float(covered[0]) if covered.size else float(len(demand) - end))
    return {
        "nights": float(len(give_back)),
        "give_back_ticks": float(np.median(give_back)),
        "morning_short_ticks": float(np.median(catch_up)) if catch_up else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for rules.json")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--after", type=int, nargs="+", default=[1, 3, 6, 12], help="shrink_after values")
    parser.add_argument("--shares", type=float, nargs="+", default=[0.0, 0.5, 1.0], help="floor_share values")
    parser.add_argument("--traces", nargs="+", help="only these traces")
    parser.add_argument("--test", action="store_true", help="the test split, fixed floors against the default rule")
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    steal, started = StealMeter(), time.perf_counter()
    chosen = (
        {FIXED: replace(STREAM_GROWTH, shrink_after=0), "default": STREAM_GROWTH}
        if args.test
        else rules(args.after, args.shares)
    )
    results: dict[str, dict[str, dict]] = {}
    unchanged: list[str] = []
    for name, (values, context, names) in range_traces().items():
        if args.traces and name not in args.traces:
            continue
        series = prepare_series(values, name, context, names)
        series, native = (
            (series, native_splits(values, name)[2])
            if args.test
            else (
                development_series(series),
                native_splits(values, name)[1],
            )
        )
        if not (native < series.scaler.low).any():
            unchanged.append(name)
            print(f"{name}: no tick below the training floor {series.scaler.low:.6g}: every rule decides as fixed")
            continue
        for seed in args.seeds:
            config = replace(FULL.apply(PicRLConfig()), seed=seed)
            with shared_training():
                artifact = train_offline(series, config)
                conformal = fit_conformal(series, config, predictor=phase1_predictor(series, config))
            rows: dict[str, dict] = {}
            for label, growth in chosen.items():
                rows[f"pic-rl, {label}"] = episode(
                    PicRLProvisioner.from_artifact(artifact), series, native, artifact.config, growth
                )
                rows[f"conformal, {label}"] = episode(conformal, series, native, config, growth)
            results[f"{name} seed {seed}"] = rows
            fixed = rows[f"pic-rl, {FIXED}"]
            print(
                f"{name} seed {seed}: "
                + "  ".join(
                    f"[{label}] {rows[f'pic-rl, {label}']['regret']:.3f}"
                    f" ({rows[f'pic-rl, {label}'].get('low_ratio', float('nan')):.2f}x)"
                    for label in chosen
                )
                + f"  fixed {fixed['regret']:.3f}",
                flush=True,
            )
    verdicts = {
        f"{method}, {label}": paired_verdict(results, f"{method}, {label}", f"{method}, {FIXED}")
        for method in ("pic-rl", "conformal")
        for label in chosen
        if label != FIXED
    }
    print(f"\nagainst the fixed floors over {len(results)} trace-seed pairs (mean log regret ratio, 90% interval):")
    for variant, verdict in verdicts.items():
        low, high = verdict["interval"]
        print(f"  {variant:<34} {verdict['mean_log_ratio']:+.3f} [{low:+.3f}, {high:+.3f}] {verdict['verdict']}")
    (args.out / ("test.json" if args.test else "rules.json")).write_text(
        json.dumps(
            {
                "machine": describe(),
                "seconds": time.perf_counter() - started,
                "cpu_steal_share": steal.share(),
                "verdicts": verdicts,
                "unchanged": unchanged,
                "traces": results,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"written: {args.out / ('test.json' if args.test else 'rules.json')}")


if __name__ == "__main__":
    main()
