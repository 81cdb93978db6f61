"""``picrl evaluate``: Phase 3 (online, censored feedback only) on a trace's test split."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from picrl.commands.source import add_trace_arguments, cached_model, config_from_args, load_series, model_folder
from picrl.progress import progress_bar
from picrl.reports.figures import plot_phase3, plot_training
from picrl_core.artifact import load_artifact
from picrl_core.pipeline import evaluation_inputs, run_online

_COLUMNS = ("mae", "regret", "shortage_rate", "under_mass", "over_mass", "action_variance")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "evaluate",
        help="run PIC-RL online on a trace's test split and report MAE, regret and shortages",
        description="Run Phase 3 on the test split in the counterfactual simulator: the controller only sees "
        "min(d, a) and the censoring flag. Without --model, phases 1 and 2 are first trained on the "
        "trace's own training split and cached (a rerun with the same trace and settings reuses them). "
        "Writes metrics.json, trajectory.csv and phase3.png (and training.png) to --out.",
    )
    add_trace_arguments(parser)
    parser.add_argument(
        "--model", type=model_folder, help="a model folder from `picrl train` (default: train and cache)"
    )
    parser.add_argument("--cache", type=Path, default=None, help="model cache folder (default ~/.cache/picrl)")
    parser.add_argument("--no-slow-updates", action="store_true", help="keep the pretrained policy fixed online")
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
    inputs = evaluation_inputs(series, artifact.config.predictor.window)
    started = time.monotonic()
    with progress_bar(series.test.shape[0], "phase 3: online", "tick") as bar:
        result = run_online(artifact, **inputs, slow_updates=not args.no_slow_updates, progress=lambda _: bar.update(1))
    seconds = time.monotonic() - started
    metrics = result.metrics.to_dict()
    report = {
        "series": trace.name,
        "model": origin,
        "test_ticks": int(series.test.shape[0]),
        "online_seconds": seconds,
        "metrics": metrics,
        "slow_updates": [u.to_dict() for u in result.updates],
        "notes": list(series.notes),
        "phase1": {
            k: artifact.reports.get("phase1", {}).get(k)
            for k in ("val_mae", "val_nll", "coverage_1sigma", "coverage_2sigma")
        },
    }
    (args.out / "metrics.json").write_text(json.dumps(report, indent=2) + "\n")
    tr = result.trajectory.column(0)
    table = np.column_stack(
        [
            np.arange(tr.demand.shape[0]),
            tr.demand[:, 0],
            tr.action[:, 0],
            tr.observed[:, 0],
            tr.censored[:, 0],
            tr.mu[:, 0],
            tr.sigma[:, 0],
            tr.k[:, 0],
            tr.eta[:, 0],
            tr.margin[:, 0],
            tr.bias[:, 0],
            tr.reward[:, 0],
        ]
    )
    np.savetxt(
        args.out / "trajectory.csv",
        table,
        delimiter=",",
        fmt="%.6g",
        comments="",
        header="tick,demand,action,observed,censored,mu,sigma,k,eta,margin,bias,reward",
    )
    plot_phase3(
        result.trajectory, artifact.config.cost, args.out / "phase3.png", title=f"PIC-RL on {trace.name} (test split)"
    )
    if "phase1" in artifact.reports and "phase2" in artifact.reports:
        plot_training(artifact.reports, args.out / "training.png")
    print(
        f"\nPIC-RL on {trace.name}, test split ({series.test.shape[0]} ticks, "
        f"{len(result.updates)} slow updates, {origin})"
    )
    print("| " + " | ".join(_COLUMNS) + " |")
    print("|" + "---|" * len(_COLUMNS))
    print("| " + " | ".join(f"{metrics[c]:.4g}" for c in _COLUMNS) + " |")
    print(f"written: {args.out / 'metrics.json'}, {args.out / 'trajectory.csv'}, {args.out / 'phase3.png'}")
    return 0
