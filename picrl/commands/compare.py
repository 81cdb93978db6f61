"""``picrl compare``: PIC-RL against every baseline and ablation under the same PIC loop (Tables 2-3).

Three stages: :func:`resolve` (arguments to a :class:`~picrl.comparison.plan.Plan`), :func:`execute` (its cells,
computed or cached) and :func:`~picrl.comparison.report.report` (tables, figures, recommendation, results.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from picrl.commands.source import load_trace
from picrl.comparison.plan import Plan
from picrl.comparison.report import report
from picrl.comparison.runner import (
    FULL,
    PROTOCOLS,
    QUICK,
    CellCache,
    CellResult,
    Protocol,
    dataset_protocol,
    run_comparison,
    test_series,
)
from picrl.datasets import DATASETS, FLEETS, Trace, load_dataset, load_resource_csv
from picrl.kafka.local_broker import default_cache
from picrl_core.config import PicRLConfig
from picrl_core.methods import REGISTRY


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "compare",
        help="reproduce Tables 2 and 3: PIC-RL vs baselines and ablations under the same PIC loop",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train every method on each dataset's training split and run it on the test split in the "
        "counterfactual simulator, seeing only min(d, a) and the censoring flag, for several seeds. "
        "Writes table2.md/.csv (baselines), censoring_cost.md (each method's regret over its full-information "
        "reference), product.md/.csv (under the product protocol: native metrics and the demand above the "
        "training peak), table3.md/.csv (ablations), fleet.md (for a fleet: the spread of regret over its services), "
        "resources.md and resources.png (for services provisioned several resources: each resource's regret "
        "and shortages; resources-<dataset>.png when there are several such datasets), results.json and figures "
        "(trajectories.png, ablation_bars.png, cumulative_regret.png) to --out. Finished cells are "
        "cached, so a rerun (or a run with more seeds or methods) trains only what is new. It ends with a "
        "recommendation (recommendation.md): per dataset, the method with the lowest mean validation regret, a "
        "single rule before the portfolio that combines it within 0.5% of it (each cell's trained method run on "
        "the validation episode under the run's protocol; the test split plays "
        "no part, references are not candidates), its margin over the next, and whether the other budget (--quick "
        "or not) agrees, read from the cache when a run with the other budget and the same options left its cells "
        "there.",
        epilog="methods (compare only: no worker deploys it, never recommended; the others run with "
        "picrl worker --method NAME):\n"
        + "\n".join(
            f"  {name:<13} {m.label} [{m.group}{'' if m.deployable else ', compare only'}]: {m.reference}"
            for name, m in REGISTRY.items()
        ),
    )
    source = parser.add_argument_group("data (default: the three bundled datasets)")
    source.add_argument(
        "--datasets",
        nargs="+",
        default=["all"],
        choices=["all", *DATASETS, *FLEETS],
        metavar="NAME",
        help=f"bundled datasets to compare on: all (the paper's {', '.join(DATASETS)}) and/or the "
        f"fleets {', '.join(FLEETS)} (many services as one fleet: pods is the 91 GenAI pods, the "
        "-2r ones provision each pod GPU memory and GPU compute at once, -oom where a memory "
        "shortage kills the pod; metrics are the mean over services)",
    )
    source.add_argument("--trace", type=Path, help="a CSV file (plain or .gz) instead of the bundled datasets")
    source.add_argument("--column", help="demand column of --trace")
    source.add_argument(
        "--time-column", help="time column of --trace (seconds, epoch milli-, micro- or nanoseconds, or ISO 8601)"
    )
    source.add_argument("--context-columns", nargs="*", default=(), metavar="NAME", help="extra inputs from --trace")
    source.add_argument(
        "--resources",
        nargs="+",
        metavar="NAME=COLUMN",
        type=_resource_column,
        help="instead of --column: one service of --trace provisioned several resources at once, each "
        "resource's demand in its own column, e.g. gpu_mem=mem_bytes gpu_compute=duty_pct (a "
        "memory shortage censors compute too; resources.md and resources.png)",
    )
    source.add_argument(
        "--hard-shortage",
        choices=("requests", "pod"),
        default="requests",
        help="with --resources, what a memory shortage does: requests (default: the requests that do "
        "not fit fail) or pod (an OOM kill: nothing of the tick is served)",
    )
    parser.add_argument(
        "--methods",
        nargs="+",
        default=["all"],
        choices=["all", *REGISTRY],
        metavar="NAME",
        help="methods to run (default all; names below)",
    )
    parser.add_argument(
        "--seeds", type=int, default=None, help="seeds 0..N-1 per (dataset, method) (default 5; 1 with --quick)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"tiny budgets ({QUICK.predictor_epochs} epochs, {QUICK.pretrain_iterations} Phase-2 "
        f"iterations), the first {QUICK.test_ticks} test ticks and PIC-RL's temperature rate not "
        "chosen on validation: a look in minutes",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="(dataset, seed) groups run in parallel processes (default: 2 or the CPU count)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="JSON file overriding hyper-parameters of picrl_core/config.py for every method; "
        "configs/paper.json is the paper's Phase 3 as printed (its Table 2)",
    )
    parser.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        default="product",
        help="product (default; what a worker does): the test demand unclipped, each service starting in its "
        "training range and keeping it by the worker's own rules (growing it when outgrown, lowering its floor when "
        "underused); metrics in native units first (product.md/.csv: "
        "regret, shortfall above the training peak, ticks to catch up, over-provisioning cost) with training-range "
        "units beside (table2.md), and the recommendation from the validation episode run the same way. Hindsight "
        "references do not run under it, and multi-resource data runs the paper's protocol (said per dataset). "
        "paper: the paper's preset (its Table 2): test demand clipped to the training range, every action in "
        "[0, 1] of it",
    )
    parser.add_argument("--cache", type=Path, help="cache folder (default ~/.cache/picrl; cells in compare/)")
    parser.add_argument("--out", type=Path, required=True, help="folder for tables, results.json and figures")
    parser.set_defaults(handler=run)


def _resource_column(text: str) -> tuple[str, str]:
    """``NAME=COLUMN`` as argparse reads ``--resources``."""
    name, equals, column = text.partition("=")
    if not equals or not name or not column:
        raise argparse.ArgumentTypeError(f"expected NAME=COLUMN (e.g. gpu_mem=mem_bytes); got {text!r}")
    return name, column


def _traces(args: argparse.Namespace) -> dict[str, Trace]:
    if args.resources:
        if not args.trace or args.column or args.context_columns:
            raise ValueError(
                "--resources reads --trace FILE, each resource from its own column (no --column or --context-columns)"
            )
        trace = load_resource_csv(args.trace, dict(args.resources), args.time_column, args.hard_shortage == "pod")
        return {trace.name: trace}
    if args.trace:
        trace = load_trace(
            argparse.Namespace(
                dataset=None,
                trace=args.trace,
                column=args.column,
                time_column=args.time_column,
                context_columns=args.context_columns,
            )
        )
        return {trace.name: trace}
    names = list(dict.fromkeys(args.datasets))
    if "all" in names:  # the paper's three; a fleet only when named (it trains on 91 series: minutes per cell)
        names = list(dict.fromkeys(n for n in [*DATASETS, *names] if n != "all"))
    return {name: load_dataset(name) for name in names}


def _base_config(path: Path | None) -> PicRLConfig:
    if path is None:
        return PicRLConfig()
    try:
        return PicRLConfig.from_dict(json.loads(path.read_text()))
    except ValueError as exc:
        raise ValueError(f"--config {path}: {exc}") from exc


class MethodBars:
    """One progress bar per method on a terminal: cells finished out of datasets x seeds, with the last
    cell's MAE. Elsewhere (a log file, CI) one line per finished cell instead of redrawn bars."""

    def __init__(self, methods: list[str], total: int) -> None:
        self.width = max(len(m) for m in methods)
        self.total, self.finished = total * len(methods), 0
        self.bars = (
            {
                m: tqdm(total=total, desc=f"{m:<{self.width}}", unit="cell", position=i, dynamic_ncols=True, leave=True)
                for i, m in enumerate(methods)
            }
            if sys.stderr.isatty()
            else {}
        )

    def update(self, result: CellResult) -> None:
        cell = result.cell
        state = (
            "failed" if result.error else f"MAE {result.metrics['mae']:.4f}" + (" (cached)" if result.cached else "")
        )
        self.finished += 1
        if not self.bars:
            print(
                f"[{self.finished}/{self.total}] {cell.method:<{self.width}} {cell.dataset} seed {cell.seed}: "
                f"{state} ({result.fit_and_run_seconds:.1f} s)",
                file=sys.stderr,
                flush=True,
            )
            return
        bar = self.bars[cell.method]
        bar.update(1)
        bar.set_postfix_str(f"{cell.dataset} seed {cell.seed}: {state}")

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()


def resolve(args: argparse.Namespace) -> Plan:
    """The resolve stage: the data, the methods, the seeds, the budget, the config and the cache of the run."""
    if args.jobs < 1:
        raise ValueError("--jobs must be >= 1")
    seeds = args.seeds if args.seeds is not None else (1 if args.quick else 5)
    if seeds < 1:
        raise ValueError("--seeds must be >= 1")
    budget = QUICK if args.quick else FULL
    traces = _traces(args)
    multi_resource = any(trace.resources for trace in traces.values())
    methods = (
        [m for m in REGISTRY if multi_resource or not REGISTRY[m].multi_resource_only]
        if "all" in args.methods
        else list(dict.fromkeys(args.methods))
    )
    config = _base_config(args.config)
    cache = CellCache((args.cache or default_cache()) / "compare", traces, config, budget, args.protocol)
    series = {name: test_series(trace, budget) for name, trace in traces.items()}
    methods = _protocol_methods(methods, traces, args.protocol)
    if not methods:
        raise ValueError("no method left to run: the hindsight references run under --protocol paper only")
    return Plan(traces, series, methods, seeds, budget, config, args.protocol, cache)


def _protocol_methods(methods: list[str], traces: dict[str, Trace], protocol: Protocol) -> list[str]:
    """Where a dataset runs under the product protocol the hindsight references are left out (they replay the
    paper's clipped test split)."""
    if all(dataset_protocol(trace, protocol) == "paper" for trace in traces.values()):
        return methods
    kept = [m for m in methods if REGISTRY[m].group != "hindsight"]
    if len(kept) < len(methods):
        print(f"product protocol: {', '.join(m for m in methods if m not in kept)} left out (hindsight references)")
    return kept


def execute(plan: Plan, jobs: int) -> tuple[list[CellResult], float]:
    """The run stage: every cell of the plan (computed or read from the cache) and the wall time it took."""
    for name, prepared in plan.series.items():
        used = dataset_protocol(plan.traces[name], plan.protocol)
        for note in plan.traces[name].notes:
            print(f"note ({name}): {note}")
        for note in prepared.notes:
            unclipped = used == "product" and note.endswith("clipped to [0, 1]")
            print(f"note ({name}): {note}" + (" in the model's inputs; scored unclipped" if unclipped else ""))
        if used != plan.protocol:
            print(f"{name}: paper protocol (the product protocol is defined for services of one resource)")
    torch.set_num_threads(1)
    print(
        f"{len(plan.methods)} methods x {len(plan.traces)} datasets x {plan.seeds} seeds, {plan.budget.name} budget, "
        f"{jobs} jobs, {plan.protocol} protocol"
    )
    started = time.monotonic()
    bars = MethodBars(plan.methods, len(plan.traces) * plan.seeds)
    try:
        results = run_comparison(
            plan.traces,
            range(plan.seeds),
            plan.methods,
            plan.config,
            plan.budget,
            plan.cache,
            jobs,
            bars.update,
            plan.protocol,
        )
    finally:
        bars.close()
    return results, time.monotonic() - started


def run(args: argparse.Namespace) -> int:
    plan = resolve(args)
    args.out.mkdir(parents=True, exist_ok=True)
    results, wall = execute(plan, args.jobs)
    return report(plan, results, wall, args.jobs, args.out)
