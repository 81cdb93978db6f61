"""``picrl train``: Phases 1 and 2 on a trace's training split, written as a model artifact; with ``--method`` another
deployable method fitted instead (:mod:`picrl_core.deployable`)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from picrl.commands.source import add_trace_arguments, config_from_args, load_series, train_with_progress
from picrl.reports.figures import plot_training
from picrl_core.artifact import save_artifact
from picrl_core.deployable import train_model
from picrl_core.rules import DEPLOYABLE_METHODS


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "train",
        help="train the predictor (phase 1) and pretrain the policy (phase 2) on a trace",
        description="Split the trace chronologically 60/20/20, scale it with min-max fitted on the training part, "
        "train the Gaussian LSTM predictor by NLL (early stopping on validation NLL), then pretrain the "
        "policy and value networks by actor-critic on simulator rollouts of the training split. Phase 3 "
        "then runs closed-loop on the validation part to choose the online temperature's rate and the "
        "margin and temperature every new service starts at (printed). Writes a model folder "
        "(weights.safetensors + artifact.json), training.json and training.png to --out. With --method another "
        "deployable method is fitted on the same splits instead (a PIC-RL predictor variant through the same "
        "phases; recent-max etc. choose their parameters on validation): the artifact records the method and its "
        "fitted parameters, and `picrl worker --model` runs it.",
    )
    add_trace_arguments(parser)
    parser.add_argument(
        "--method",
        default="pic-rl",
        choices=DEPLOYABLE_METHODS,
        help="the deployable method to fit (default pic-rl; compare's other methods are compare only)",
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for the model artifact and figures")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)  # a bad --config fails before the trace's notes are printed
    trace, series = load_series(args)
    started = time.monotonic()
    if args.method != "pic-rl":
        artifact = train_model(args.method, series, config, trace.step_seconds)
        save_artifact(artifact, args.out)
        print(f"{args.method} fitted ({artifact.parameters or 'PIC-RL phases'}): model written to {args.out}")
        return 0
    artifact = train_with_progress(series, config)
    seconds = time.monotonic() - started
    artifact.reports["train_seconds"] = seconds
    save_artifact(artifact, args.out)
    plot_training(artifact.reports, args.out / "training.png")
    p1, p2 = artifact.reports["phase1"], artifact.reports["phase2"]
    summary = {
        "series": trace.name,
        "train_seconds": round(seconds, 1),
        "phase1": {
            k: p1[k] for k in ("epochs_run", "best_epoch", "val_nll", "val_mae", "coverage_1sigma", "coverage_2sigma")
        },
        "phase2_value_loss_first_last": [p2["value_loss"][0], p2["value_loss"][-1]] if p2["value_loss"] else [],
    }
    for key in ("phase3_scale_rate", "phase3_start"):
        if key in artifact.reports:
            summary[key] = artifact.reports[key]
    (args.out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(
        f"phase 1: validation MAE {p1['val_mae']:.4f}, NLL {p1['val_nll']:.3f}, coverage "
        f"mu+-sigma {p1['coverage_1sigma']:.0%}, mu+-2sigma {p1['coverage_2sigma']:.0%} (epochs {p1['epochs_run']})"
    )
    if p2["value_loss"]:
        print(
            f"phase 2: value loss {p2['value_loss'][0]:.4f} -> {p2['value_loss'][-1]:.4f} "
            f"over {p2['iterations']} iterations"
        )
    start = artifact.reports.get("phase3_start")
    if start is not None:  # calibrator.start_from_validation: where every new service's fast loop starts
        print(
            f"phase 3: a new service starts at margin {start['margin_in_sigma']:+.2f} sigma, temperature "
            f"{start['scale']:.2f} (where the validation run settled)"
        )
    print(f"model written to {args.out} in {seconds:.0f} s")
    return 0
