"""Shared CLI plumbing for commands that read a trace: ``--dataset NAME`` or ``--trace FILE --column``.

torch and the training pipeline are imported by the functions that train or load a model, so that
``picrl produce`` (which only reads traces) starts without them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from picrl.datasets import DATASETS, Trace, load_csv, load_dataset
from picrl.kafka.local_broker import default_cache
from picrl.progress import PhaseBars
from picrl_core.config import PicRLConfig
from picrl_core.series import PreparedSeries, prepare_series

if TYPE_CHECKING:
    from picrl_core.artifact import ModelArtifact


def model_folder(value: str) -> Path:
    """argparse type of ``--model``: a folder holding a picrl model, checked when the arguments are parsed (an
    error with the command's usage, before the command prints or loads anything)."""
    from picrl_core.artifact import MANIFEST, WEIGHTS

    folder = Path(value)
    for name in (MANIFEST, WEIGHTS):
        if not (folder / name).is_file():
            raise argparse.ArgumentTypeError(f"{folder} is not a picrl model: {name} is missing")
    return folder


def add_trace_source(parser: argparse.ArgumentParser, *, pods: bool = False) -> None:
    """``--dataset NAME`` or ``--trace FILE --column NAME`` (or, with ``pods``, ``--pods``)."""
    group = parser.add_argument_group("trace (one of --dataset, --trace" + (" or --pods)" if pods else ")"))
    source = group.add_mutually_exclusive_group(required=True)
    if pods:
        source.add_argument(
            "--pods",
            action="store_true",
            help="the 91 per-pod GenAI GPU-memory series (bundled): each service its own series",
        )
    source.add_argument(
        "--dataset",
        choices=sorted(DATASETS),
        help="a bundled Alibaba trace: "
        + "; ".join(f"{k}: {v}" for k, v in sorted(DATASETS.items())).replace("%", "%%"),
    )  # argparse %-formats help: a description's "%" is literal
    source.add_argument("--trace", type=Path, help="a CSV file (plain or .gz) with a demand column")
    group.add_argument("--column", help="demand column of --trace")
    group.add_argument(
        "--time-column",
        help="time column of --trace (seconds, epoch milli-, micro- or nanoseconds, or ISO 8601); sorts the rows",
    )
    group.add_argument(
        "--context-columns",
        nargs="*",
        default=(),
        metavar="NAME",
        help="extra predictor inputs from --trace (e.g. a duty-cycle column)",
    )


def add_trace_arguments(parser: argparse.ArgumentParser) -> None:
    """The trace plus the training options."""
    add_trace_source(parser)
    add_training_options(parser)


def add_training_options(parser: argparse.ArgumentParser) -> None:
    """Seed, budgets, config file and threads of phases 1-2."""
    parser.add_argument("--seed", type=int, default=0, help="seed of every random choice (default 0)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small budgets (few epochs / iterations) for a fast look; results are weaker",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="JSON file overriding hyper-parameters of picrl_core/config.py, e.g. "
        '{"pretrain": {"iterations": 50}, "cost": {"c_under": 4}}; configs/paper.json is the '
        "paper's Phase 3 as printed",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: the networks are small, and extra threads mostly spin)",
    )


def load_trace(args: argparse.Namespace) -> Trace:
    if args.dataset:
        return load_dataset(args.dataset)
    if not args.column:
        raise ValueError("--trace needs --column NAME (the demand column)")
    return load_csv(args.trace, args.column, time_column=args.time_column, context_columns=args.context_columns)


def load_series(args: argparse.Namespace) -> tuple[Trace, PreparedSeries]:
    """The trace named by the arguments, split and scaled; notes on filled gaps or clipping are printed."""
    trace = load_trace(args)
    series = prepare_series(trace.values, trace.name, trace.context, trace.context_names)
    for note in (*trace.notes, *series.notes):
        print(f"note: {note}")
    return trace, series


def config_from_args(args: argparse.Namespace) -> PicRLConfig:
    """The config of ``--config``, ``--seed`` and ``--quick``; sets torch's CPU threads (``--threads``)."""
    import torch

    torch.set_num_threads(max(1, args.threads))
    overrides = {}
    if args.config is not None:
        try:
            overrides = json.loads(args.config.read_text())
        except ValueError as exc:
            raise ValueError(f"--config {args.config} is not valid JSON: {exc}") from exc
    config = replace(PicRLConfig.from_dict(overrides), seed=args.seed)
    return quick_budget(config) if args.quick else config


def quick_budget(config: PicRLConfig) -> PicRLConfig:
    """``--quick``: 6 predictor epochs of 4,000 windows and 20 actor-critic iterations of 32 chunks."""
    return replace(
        config,
        predictor=replace(config.predictor, epochs=6, max_train_windows=4000),
        pretrain=replace(config.pretrain, iterations=20, chunks=32),
    )


def cache_key(trace: Trace, config: PicRLConfig) -> str:
    """Digest of the trace content, its tick length (the windows of the methods timed in seconds) and the config: a
    cached model is reused only for all three unchanged."""
    digest = hashlib.sha256()
    trace.feed(digest.update)
    digest.update(json.dumps(config.to_dict(), sort_keys=True).encode())
    return digest.hexdigest()[:16]


def train_with_progress(series: PreparedSeries, config: PicRLConfig) -> ModelArtifact:
    """Phases 1 and 2 with a progress bar each."""
    from picrl_core.pipeline import train_offline

    with PhaseBars() as bars:
        return train_offline(
            series,
            config,
            phase1_progress=bars.phase(
                config.predictor.epochs, "phase 1: predictor", "epoch", ("train_nll", "val_nll", "val_mae")
            ),
            phase2_progress=bars.phase(
                config.pretrain.iterations,
                "phase 2: actor-critic",
                "iter",
                ("value_loss", "mean_reward", "censor_rate"),
            ),
        )


def cached_model(
    trace: Trace, series: PreparedSeries, config: PicRLConfig, cache: Path | None = None, method: str = "pic-rl"
) -> tuple[ModelArtifact, Path, bool]:
    """The model of deployable ``method`` for this trace and config from the cache, training (and caching) it when
    absent. Returns (artifact, its folder, whether it was trained now)."""
    from picrl_core.artifact import save_artifact
    from picrl_core.deployable import load_model, train_model

    name = _slug(trace.name) if method == "pic-rl" else f"{_slug(trace.name)}-{method}"
    folder = (cache or default_cache()) / "models" / f"{name}-{cache_key(trace, config)}"
    if (folder / "artifact.json").exists():
        return load_model(folder), folder, False
    artifact = (
        train_with_progress(series, config)
        if method == "pic-rl"
        else train_model(method, series, config, trace.step_seconds)
    )
    save_artifact(artifact, folder)
    return artifact, folder, True


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in name)[:40]
