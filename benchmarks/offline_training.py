"""Offline training wall time: Phase 1 (Gaussian LSTM by NLL) and Phase 2 (actor-critic pretraining)
per bundled dataset, with the default config that ``picrl train`` uses.

Run on demand (not part of the test suite):

    python benchmarks/offline_training.py --out benchmarks/results [--datasets dlrm genai-mem genai-ctx]
        [--threads 1] [--quick]

Prints a table and writes ``offline_training.json`` (per dataset: training windows, epochs run,
seconds of each phase, validation MAE and the Phase-2 value-loss drop).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from host import StealMeter, describe

from picrl.commands.source import quick_budget
from picrl.datasets import DATASETS, load_dataset
from picrl_core.config import PicRLConfig
from picrl_core.pipeline import config_for, train_phase1
from picrl_core.pretrain import pretrain_policy
from picrl_core.series import prepare_series


def measure(name: str, config: PicRLConfig) -> dict:
    trace = load_dataset(name)
    series = prepare_series(trace.values, trace.name, trace.context, trace.context_names)
    config = config_for(series, config)
    steal = StealMeter()
    started = time.perf_counter()
    predictor, report = train_phase1(series, config)
    phase1 = time.perf_counter() - started
    started = time.perf_counter()
    _, _, pretrain = pretrain_policy(predictor, series.train, config, train_context=series.train_ctx)
    phase2 = time.perf_counter() - started
    losses = pretrain.value_loss
    return {"dataset": name, "train_steps": int(series.train.size), "phase1_seconds": phase1,
            "phase1_epochs": report.epochs_run, "phase1_seconds_per_epoch": phase1 / report.epochs_run,
            "val_mae": report.val_mae, "phase2_seconds": phase2, "phase2_iterations": pretrain.iterations,
            "phase2_seconds_per_iteration": phase2 / max(pretrain.iterations, 1),
            "value_loss_drop": 1.0 - losses[-1] / losses[0] if losses and losses[0] else None,
            "cpu_steal_share": steal.share()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1, as picrl train)")
    parser.add_argument("--quick", action="store_true", help="picrl train --quick budgets (6 epochs, 20 iterations)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="folder for the JSON result")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = quick_budget(PicRLConfig()) if args.quick else PicRLConfig()
    print(f"{'dataset':<11}{'train steps':>12}{'phase 1 s':>11}{'epochs':>8}{'val MAE':>9}{'phase 2 s':>11}"
          f"{'iters':>7}{'s/iter':>8}{'steal':>7}")
    rows = []
    for name in args.datasets:
        rows.append(measure(name, config))
        r = rows[-1]
        print(f"{name:<11}{r['train_steps']:>12,}{r['phase1_seconds']:>11.1f}{r['phase1_epochs']:>8}{r['val_mae']:>9.4f}"
              f"{r['phase2_seconds']:>11.1f}{r['phase2_iterations']:>7}{r['phase2_seconds_per_iteration']:>8.2f}"
              f"{r['cpu_steal_share']:>7.0%}",
              flush=True)
    result = {"benchmark": "offline_training", "machine": describe(), "threads": args.threads, "quick": args.quick,
              "config": {"predictor": config.to_dict()["predictor"], "pretrain": config.to_dict()["pretrain"]},
              "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "offline_training.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"written {args.out / 'offline_training.json'}")


if __name__ == "__main__":
    main()
