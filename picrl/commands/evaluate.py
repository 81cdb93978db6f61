"""``picrl evaluate``: Phase 3 (online, censored feedback only) on a trace's test split.

Under the product protocol (the default) the trained controller runs as a worker runs it
(:func:`~picrl_core.methods.evaluation.growth_episode`: the demand unclipped, the range kept by the worker's rules);
under ``--protocol paper`` on the test split clipped to the training range (:func:`~picrl_core.pipeline.run_online`,
the paper's Table 2). Metrics in native units first, in units of the training range beside.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from picrl.commands.source import add_trace_arguments, cached_model, config_from_args, load_series, model_folder
from picrl.comparison.runner import PROTOCOLS
from picrl.datasets import Trace
from picrl.progress import progress_bar
from picrl.reports.figures import plot_native_trajectory, plot_phase3, plot_training
from picrl_core.artifact import ModelArtifact, load_artifact
from picrl_core.costs import mean_service_metrics
from picrl_core.methods.evaluation import growth_episode
from picrl_core.methods.pic_rl import PicRLProvisioner
from picrl_core.pipeline import evaluation_inputs, run_online
from picrl_core.series import PreparedSeries, native_splits

_COLUMNS = ("mae", "regret", "shortage_rate", "under_mass", "over_mass", "action_variance")
ABOVE_PEAK = ("shortfall_above_peak", "ticks_above_peak", "catch_up_ticks", "over_cost_native")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "evaluate",
        help="run PIC-RL online on a trace's test split and report MAE, regret and shortages",
        description="Run Phase 3 on the test split in the counterfactual simulator: the controller only sees "
        "min(d, a) and the censoring flag. Without --model, phases 1 and 2 are first trained on the "
        "trace's own training split and cached (a rerun with the same trace and settings reuses them). "
        "Writes metrics.json (native units first; under the product protocol the shortfall above the training "
        "peak and the ticks to catch up), trajectory.csv (with demand_native and action_native) and a figure "
        "(and training.png) to --out.",
    )
    add_trace_arguments(parser)
    parser.add_argument(
        "--model", type=model_folder, help="a model folder from `picrl train` (default: train and cache)"
    )
    parser.add_argument("--cache", type=Path, default=None, help="model cache folder (default ~/.cache/picrl)")
    parser.add_argument("--no-slow-updates", action="store_true", help="keep the pretrained policy fixed online")
    parser.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        default="product",
        help="product (default; what a worker does): the test demand unclipped, the service starting in its "
        "training range and keeping it by the worker's own rules; figure trajectory.png in native units. paper: "
        "the paper's preset (its Table 2): the test demand clipped to the training range; figure phase3.png with "
        "the controller's mu, sigma, margin and bias, which trajectory.csv then holds too",
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for metrics and figures")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)  # a bad --config or model fails before the trace's notes are printed
    given = load_artifact(args.model) if args.model else None
    trace, series = load_series(args)
    if given is not None:
        artifact, origin = given, f"model {args.model}"
    else:
        artifact, folder, trained = cached_model(trace, series, config, args.cache)
        origin = f"{'trained and cached' if trained else 'cached model'} {folder}"
    channels = 0 if series.test_ctx is None else series.test_ctx.shape[1]
    if channels != artifact.config.predictor.context_channels:
        raise ValueError(
            f"the model expects {artifact.config.predictor.context_channels} context channel(s) "
            f"but the trace has {channels}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    episode = _product(artifact, trace, series, args) if args.protocol == "product" else _paper(artifact, series, args)
    seconds = time.monotonic() - started
    metrics, native = episode["metrics"], episode["metrics_native"]
    report = {
        "series": trace.name,
        "model": origin,
        "protocol": args.protocol,
        "test_ticks": int(series.test.shape[0]),
        "training_range": [series.scaler.low, series.scaler.high],
        "online_seconds": seconds,
        "metrics_native": native,
        "metrics": metrics,
        "above_peak": episode["above_peak"],
        "slow_updates": episode["slow_updates"],
        "notes": [*trace.notes, *series.notes],
        "phase1": {
            k: artifact.reports.get("phase1", {}).get(k)
            for k in ("val_mae", "val_nll", "coverage_1sigma", "coverage_2sigma")
        },
    }
    (args.out / "metrics.json").write_text(json.dumps(report, indent=2) + "\n")
    header, table = episode["table"]
    np.savetxt(args.out / "trajectory.csv", table, delimiter=",", fmt="%.6g", comments="", header=header)
    if "phase1" in artifact.reports and "phase2" in artifact.reports:
        plot_training(artifact.reports, args.out / "training.png")
    print(
        f"\nPIC-RL on {trace.name}, test split ({series.test.shape[0]} ticks, {args.protocol} protocol, "
        f"{len(episode['slow_updates'])} slow updates, {origin})"
    )
    print("| units | " + " | ".join(_COLUMNS) + " |")
    print("|---|" + "---|" * len(_COLUMNS))
    for units, values in (("native", native), ("training range", metrics)):
        print(f"| {units} | " + " | ".join(f"{values[c]:.4g}" for c in _COLUMNS) + " |")
    if episode["above_peak"] is not None:
        above = episode["above_peak"].items()
        print("above the training peak: " + ", ".join(f"{k} {'n/a' if v is None else f'{v:.4g}'}" for k, v in above))
    print(f"written: {args.out / 'metrics.json'}, {args.out / 'trajectory.csv'}, {episode['figure']}")
    return 0


def _native_metrics(capacity: np.ndarray, demand: np.ndarray, artifact: ModelArtifact) -> dict[str, Any]:
    """The metrics of a one-service episode in native units (the shortage rate is the same in any)."""
    return mean_service_metrics(capacity, demand, artifact.config.cost).to_dict()


def _paper(artifact: ModelArtifact, series: PreparedSeries, args: argparse.Namespace) -> dict[str, Any]:
    """The paper's protocol: :func:`run_online` on the test split clipped to the training range."""
    inputs = evaluation_inputs(series, artifact.config.predictor.window)
    with progress_bar(series.test.shape[0], "phase 3: online", "tick") as bar:
        result = run_online(artifact, **inputs, slow_updates=not args.no_slow_updates, progress=lambda _: bar.update(1))
    tr = result.trajectory.column(0)
    low, span = series.scaler.low, series.scaler.high - series.scaler.low
    demand_native, action_native = low + span * tr.demand, low + span * tr.action
    columns = {
        "tick": np.arange(tr.demand.shape[0]),
        "demand": tr.demand[:, 0],
        "action": tr.action[:, 0],
        "demand_native": demand_native[:, 0],
        "action_native": action_native[:, 0],
        **{name: getattr(tr, name)[:, 0] for name in ("observed", "censored", "mu", "sigma", "k", "eta")},
        **{name: getattr(tr, name)[:, 0] for name in ("margin", "bias", "reward")},
    }
    figure = plot_phase3(
        result.trajectory, artifact.config.cost, args.out / "phase3.png", title=f"PIC-RL on {series.name} (test split)"
    )
    return {
        "metrics": result.metrics.to_dict(),
        "metrics_native": _native_metrics(action_native, demand_native, artifact),
        "above_peak": None,  # the paper's demand never leaves the training range
        "slow_updates": [u.to_dict() for u in result.updates],
        "table": (",".join(columns), np.column_stack(list(columns.values()))),
        "figure": figure,
    }


def _product(artifact: ModelArtifact, trace: Trace, series: PreparedSeries, args: argparse.Namespace) -> dict[str, Any]:
    """The product's protocol: the controller as a worker runs it, on the unclipped test split
    (:func:`growth_episode`)."""
    provisioner = PicRLProvisioner.from_artifact(artifact, slow_updates=not args.no_slow_updates)
    native_test = native_splits(trace.values, trace.name)[2]
    run = growth_episode(provisioner, series, native_test, artifact.config)
    low, span = series.scaler.low, series.scaler.high - series.scaler.low
    demand_native, action_native = native_test[:, 0], low + span * run.actions
    columns = {
        "tick": np.arange(run.demand.shape[0]),
        "demand": run.demand,
        "action": run.actions,
        "demand_native": demand_native,
        "action_native": action_native,
        "censored": run.censored,
    }
    figure = plot_native_trajectory(
        demand_native,
        action_native,
        run.censored,
        series.scaler.high,
        args.out / "trajectory.png",
        title=f"PIC-RL on {trace.name} (test split, product protocol)",
    )
    return {
        "metrics": run.metrics.to_dict(),
        "metrics_native": _native_metrics(action_native, demand_native, artifact),
        "above_peak": {k: None if math.isnan(run.extra[k]) else run.extra[k] for k in ABOVE_PEAK},
        "slow_updates": [u.to_dict() for u in provisioner.slow.updates] if provisioner.slow is not None else [],
        "table": (",".join(columns), np.column_stack(list(columns.values()))),
        "figure": figure,
    }
