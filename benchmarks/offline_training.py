"""Offline training wall time and what it bought: Phase 1 (Gaussian LSTM by NLL) and Phase 2
(actor-critic pretraining) per bundled dataset, with the default config that ``picrl train`` uses.

Run on demand (not part of the test suite):

    python benchmarks/offline_training.py --out benchmarks/results [--datasets dlrm genai-mem genai-ctx]
        [--seeds 0 1] [--threads 1] [--quick] [--segments N] [--name offline_training]
        [--budget compare] [--chunks N] [--model lstm|tft|informer|autoformer]

Prints a table and writes ``<name>.json`` (per dataset and seed: training windows, epochs run, seconds
of each phase (and Phase 2's process CPU seconds, less sensitive to a busy host), validation MAE, the Phase-2
value loss (first, last, mean of the last 10 iterations)
and the **validation regret** of the trained controller: Phase 3 as ``picrl compare`` runs it (one
service, slow loop on) on the validation episode (the last 2,000 ticks of the validation split, what
knobs are chosen on; the test split is never read), with the regret of the Phase-1 forecast ``mu``
acted on directly for scale), and the predictor's validation NLL and 1/2-sigma coverage (``--predictor
incremental``: the carried LSTM, scored as it runs: one stream over the split). ``--segments`` overrides
``pretrain.segments`` (1: Phase 2's original
rollouts, fresh 128-step chunks every iteration). ``--budget compare`` trains with ``picrl compare``'s full budget
instead of ``picrl train``'s, ``--chunks`` overrides Phase 2's rollout chunks per iteration, and ``--model`` trains
one of the comparison's transformer substitutions in place of the LSTM (with the windowed config they read
windows with): what sizing the comparison's Phase 2 was measured with (``docs/performance.md``, "``picrl compare``").
"""

from __future__ import annotations

import argparse
import inspect
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from host import StealMeter, describe

from picrl.commands.source import quick_budget
from picrl.datasets import DATASETS, load_dataset
from picrl_core.artifact import ModelArtifact
from picrl_core.config import PicRLConfig
from picrl_core.costs import episode_metrics
from picrl_core.pipeline import config_for, evaluation_inputs, run_online, train_phase1
from picrl_core.pretrain import pretrain_policy
from picrl_core.series import prepare_series

# Phase-1 models: PIC-RL's LSTM, or one of picrl compare's substitutions (picrl_core.methods.predictors). Those, the
# comparison's budget and the windowed config are imported where used, so the script still runs against older code
# (PYTHONPATH=<checkout>) for the LSTM at picrl train's budget.
MODELS = ("lstm", "tft", "informer", "autoformer")


def phase1_model(model: str, config: PicRLConfig) -> tuple[dict, PicRLConfig]:
    """``train_phase1``'s model argument (none for the LSTM, which older code's ``train_phase1`` takes no argument
    for) and the config the model trains with (a transformer reads windows: the windowed predictor)."""
    if model == "lstm":
        return {}, config
    from picrl_core.methods import predictors
    from picrl_core.pipeline import with_windowed_predictor

    classes = {
        "tft": predictors.GaussianTFT,
        "informer": predictors.GaussianInformer,
        "autoformer": predictors.GaussianAutoformer,
    }
    return {"model_factory": classes[model]}, with_windowed_predictor(config)


def measure(name: str, config: PicRLConfig, model: str = "lstm") -> dict:
    trace = load_dataset(name)
    series = prepare_series(trace.values, trace.name, trace.context, trace.context_names)
    factory, config = phase1_model(model, config)
    config = config_for(series, config)
    steal = StealMeter()
    started = time.perf_counter()
    predictor, report = train_phase1(series, config, **factory)
    phase1 = time.perf_counter() - started
    extra = {"services": series.services} if "services" in inspect.signature(pretrain_policy).parameters else {}
    started, cpu = time.perf_counter(), time.process_time()
    policy, value, pretrain = pretrain_policy(predictor, series.train, config, train_context=series.train_ctx, **extra)
    phase2, phase2_cpu = time.perf_counter() - started, time.process_time() - cpu
    stolen = steal.share()
    losses = pretrain.value_loss
    # Phase 3 on the validation episode, one service acting alone as picrl compare runs it.
    acting = replace(config, online=replace(config.online, inference_chunk=1))
    artifact = ModelArtifact(acting, predictor, policy, value)
    inputs = evaluation_inputs(series, config.predictor.window, "val")
    run = run_online(
        artifact,
        inputs["demand"],
        inputs["history"],
        context=inputs["context"],
        history_context=inputs["history_context"],
    )
    forecast = episode_metrics(np.clip(run.trajectory.mu, 0.0, 1.0), run.trajectory.demand, config.cost)
    return {
        "dataset": name,
        "seed": config.seed,
        "model": model,
        "phase2_chunks": config.pretrain.chunks,
        "train_steps": int(series.train.size),
        "phase1_seconds": phase1,
        "phase1_epochs": report.epochs_run,
        "phase1_seconds_per_epoch": phase1 / report.epochs_run,
        "predictor": getattr(config.predictor, "kind", "windowed"),
        "val_nll": report.val_nll,
        "val_coverage_1sigma": report.coverage_1sigma,
        "val_coverage_2sigma": report.coverage_2sigma,
        "sigma_scale": report.sigma_scale,
        "val_mae": report.val_mae,
        "phase2_seconds": phase2,
        "phase2_cpu_seconds": phase2_cpu,
        "phase2_iterations": pretrain.iterations,
        "phase2_seconds_per_iteration": phase2 / max(pretrain.iterations, 1),
        "value_loss_first": losses[0] if losses else None,
        "value_loss_last": losses[-1] if losses else None,
        "value_loss_last10": float(np.mean(losses[-10:])) if losses else None,
        "value_loss_drop": 1.0 - losses[-1] / losses[0] if losses and losses[0] else None,
        "val_regret": run.metrics.regret,
        "val_shortage_rate": run.metrics.shortage_rate,
        "val_ticks": int(run.metrics.steps),
        "val_regret_forecast_mu": forecast.regret,
        "cpu_steal_share": stolen,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as picrl train)")
    parser.add_argument("--quick", action="store_true", help="picrl train --quick budgets (6 epochs, 20 iterations)")
    parser.add_argument(
        "--budget",
        choices=["train", "compare"],
        default="train",
        help="train: picrl train's budgets (default); compare: picrl compare's full budget "
        "(40 epochs of 8,000 windows, 30 Phase-2 iterations)",
    )
    parser.add_argument(
        "--chunks", type=int, default=None, help="override pretrain.chunks (rollout chunks per iteration)"
    )
    parser.add_argument(
        "--model",
        choices=MODELS,
        default="lstm",
        help="Phase-1 model: PIC-RL's LSTM (default) or a transformer substitution of picrl compare",
    )
    parser.add_argument("--segments", type=int, default=None, help="override pretrain.segments")
    parser.add_argument(
        "--predictor",
        choices=["windowed", "incremental"],
        default=None,
        help="override predictor.kind (default: the config's, incremental)",
    )
    parser.add_argument("--name", default="offline_training", help="result file name (without .json)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="folder for the JSON result")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = quick_budget(PicRLConfig()) if args.quick else PicRLConfig()
    if args.budget == "compare":
        from picrl.comparison.runner import FULL

        config = FULL.apply(config)
    if args.chunks is not None:
        config = replace(config, pretrain=replace(config.pretrain, chunks=args.chunks))
    if args.segments is not None:
        config = replace(config, pretrain=replace(config.pretrain, segments=args.segments))
    if args.predictor is not None:
        config = replace(config, predictor=replace(config.predictor, kind=args.predictor))
    print(
        f"{'dataset':<11}{'seed':>5}{'train steps':>12}{'phase 1 s':>11}{'epochs':>8}{'val NLL':>9}{'cov1':>6}"
        f"{'val MAE':>9}{'phase 2 s':>11}"
        f"{'CPU s':>8}{'iters':>7}{'s/iter':>8}{'V loss':>9}{'val regret':>12}{'steal':>7}"
    )
    rows = []
    for name in args.datasets:
        for seed in args.seeds:
            rows.append(measure(name, replace(config, seed=seed), args.model))
            r = rows[-1]
            print(
                f"{name:<11}{seed:>5}{r['train_steps']:>12,}{r['phase1_seconds']:>11.1f}{r['phase1_epochs']:>8}"
                f"{r['val_nll']:>9.3f}{r['val_coverage_1sigma']:>6.2f}"
                f"{r['val_mae']:>9.4f}{r['phase2_seconds']:>11.1f}{r['phase2_cpu_seconds']:>8.1f}{r['phase2_iterations']:>7}"
                f"{r['phase2_seconds_per_iteration']:>8.2f}{r['value_loss_last10'] or 0:>9.4f}{r['val_regret']:>12.2f}"
                f"{r['cpu_steal_share']:>7.0%}",
                flush=True,
            )
    result = {
        "benchmark": "offline_training",
        "machine": describe(),
        "threads": args.threads,
        "quick": args.quick,
        "budget": args.budget,
        "model": args.model,
        "config": {"predictor": config.to_dict()["predictor"], "pretrain": config.to_dict()["pretrain"]},
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"written {args.out / (args.name + '.json')}")


if __name__ == "__main__":
    main()
