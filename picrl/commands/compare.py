"""``picrl compare``: PIC-RL against every baseline and ablation under the same PIC loop (Tables 2-3)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

from picrl.commands.source import load_trace
from picrl.comparison.figures import plot_ablation_bars, plot_cumulative_regret, plot_resources, plot_trajectories
from picrl.comparison.growth_table import growth_means, markdown_growth, write_growth_csv
from picrl.comparison.recommendation import cached_summaries, markdown_recommendation, recommend
from picrl.comparison.runner import (
    FULL,
    PROTOCOLS,
    QUICK,
    CellCache,
    CellResult,
    run_comparison,
    scored_demand,
    test_series,
)
from picrl.comparison.tables import (
    full_information_pairs,
    idle_shares,
    markdown_censoring_cost,
    markdown_fleet,
    markdown_resources,
    markdown_table2,
    markdown_table3,
    summarise,
    table2_methods,
    table3_methods,
    write_csv,
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
        "reference), table3.md/.csv (ablations), fleet.md (for a fleet: the spread of regret over its services), "
        "resources.md and resources.png (for services provisioned several resources: each resource's regret "
        "and shortages; resources-<dataset>.png when there are several such datasets), results.json and figures "
        "(trajectories.png, ablation_bars.png, cumulative_regret.png) to --out. Finished cells are "
        "cached, so a rerun (or a run with more seeds or methods) trains only what is new. It ends with a "
        "recommendation (recommendation.md): per dataset, the method with the lowest mean validation regret "
        "(each cell's trained method run on the validation episode; the test split plays no part, references are "
        "not candidates), its margin over the next, and whether the other budget (--quick or not) agrees, read "
        "from the cache when a run with the other budget and the same options left its cells there.",
        epilog="methods:\n"
        + "\n".join(f"  {name:<13} {m.label} [{m.group}]: {m.reference}" for name, m in REGISTRY.items()),
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
    source.add_argument("--time-column", help="time column of --trace (seconds or ISO 8601)")
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
        default="clipped",
        help="clipped (default; the paper's Table 2): test demand clipped to the training range, every action "
        "in [0, 1] of it. growth (what the stream does): the test demand unclipped, each service starting in "
        "its training range, growing it when outgrown and lowering its floor when underused, as a worker does; "
        "metrics in training-range and "
        "native units, and growth.md/.csv (shortfall above the training peak, ticks to catch up, "
        "over-provisioning cost). Hindsight references do not run under growth; multi-resource data runs clipped",
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


def _protocol_methods(methods: list[str], protocol: str, all_methods: bool) -> list[str]:
    """Under the growth protocol "all" leaves out the hindsight references (they replay the clipped test split)."""
    if protocol != "growth" or not all_methods:
        return methods
    kept = [m for m in methods if REGISTRY[m].group != "hindsight"]
    if len(kept) < len(methods):
        print(f"growth protocol: {', '.join(m for m in methods if m not in kept)} left out (hindsight references)")
    return kept


def _growth_outputs(results: list[CellResult], methods: list[str], out: Path) -> list[Path]:
    """growth.md and growth.csv when cells ran under the growth protocol (printed too); the files written."""
    means = growth_means(results)
    if not means:
        return []
    table = markdown_growth(means, methods)
    (out / "growth.md").write_text(table)
    print("Growth: demand above the training peak (mean over seeds; native units unless said)\n")
    print(table)
    return [out / "growth.md", write_growth_csv(out / "growth.csv", means, methods)]


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


def run(args: argparse.Namespace) -> int:
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
    methods = _protocol_methods(methods, args.protocol, "all" in args.methods)
    config = _base_config(args.config)
    series = {name: test_series(trace, budget) for name, trace in traces.items()}
    for name, prepared in series.items():
        for note in prepared.notes:
            print(f"note ({name}): {note}")
    cache = CellCache((args.cache or default_cache()) / "compare", traces, config, budget, args.protocol)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(1)
    print(
        f"{len(methods)} methods x {len(traces)} datasets x {seeds} seeds, {budget.name} budget, {args.jobs} jobs, "
        f"{args.protocol} protocol"
    )
    started = time.monotonic()
    bars = MethodBars(methods, len(traces) * seeds)
    try:
        results = run_comparison(
            traces, range(seeds), methods, config, budget, cache, args.jobs, bars.update, args.protocol
        )
    finally:
        bars.close()
    wall = time.monotonic() - started
    datasets = list(traces)
    summaries = summarise(results)
    table2, table3 = markdown_table2(summaries, methods, datasets), markdown_table3(summaries, methods, datasets)
    written = []
    if table2_methods(methods):
        (args.out / "table2.md").write_text(table2)
        written += [
            args.out / "table2.md",
            write_csv(args.out / "table2.csv", summaries, table2_methods(methods), datasets),
        ]
        print("\nTable 2: test-split MAE, regret and shortage rate (mean ± std over seeds; lowest regret in bold)\n")
        print(table2)
    if full_information_pairs(methods):
        censoring = markdown_censoring_cost(summaries, methods, datasets)
        (args.out / "censoring_cost.md").write_text(censoring)
        written.append(args.out / "censoring_cost.md")
        print("Cost of censoring: regret under PIC over the same method's full-information regret\n")
        print(censoring)
    if len(table3_methods(methods)) > 1:
        (args.out / "table3.md").write_text(table3)
        written += [
            args.out / "table3.md",
            write_csv(args.out / "table3.csv", summaries, table3_methods(methods), datasets),
        ]
        print("Table 3: ablations (ΔMAE relative to PIC-RL Full)\n")
        print(table3)
    written += _growth_outputs(results, methods, args.out)
    demands = {name: scored_demand(traces[name], s, budget, args.protocol) for name, s in series.items()}
    multi = [n for n in datasets if series[n].resources]
    sections = []
    for name in multi:
        table = (
            markdown_resources(results, name, methods, series[name].resources)
            + "\n"
            + idle_shares(demands[name], series[name].resources)
        )
        sections.append(f"### {name}\n\n{table}")
        print(f"Resources of {name} (mean over seeds)\n")
        print(table)
        drawn = [m for m in ("pic-rl", "pic-rl-per-resource") if m in methods] or table2_methods(methods)[:2]
        path = args.out / ("resources.png" if len(multi) == 1 else f"resources-{name}.png")
        figure = plot_resources(results, demands[name], series[name].resources, name, path, drawn)
        written += [figure] if figure else []
    if sections:
        (args.out / "resources.md").write_text("\n".join(sections))
        written.append(args.out / "resources.md")
    fleets = [name for name in datasets if series[name].services > 1 and not series[name].resources]
    if fleets and table2_methods(methods):
        spread = "".join(
            f"### {name} ({series[name].services} services)\n\n"
            f"{markdown_fleet(results, demands[name], name, methods, config.cost)}\n"
            for name in fleets
        )
        (args.out / "fleet.md").write_text(spread)
        written.append(args.out / "fleet.md")
        print("Fleets: regret of each service, pooled over seeds\n")
        print(spread)
    figure_dataset = "genai-mem" if "genai-mem" in traces else datasets[0]
    written += [
        p
        for p in (
            plot_trajectories(results, demands[figure_dataset], figure_dataset, 0, args.out / "trajectories.png"),
            plot_ablation_bars(summaries, methods, datasets, args.out / "ablation_bars.png"),
            plot_cumulative_regret(results, demands, methods, config.cost, args.out / "cumulative_regret.png"),
        )
        if p is not None
    ]
    other_budget = FULL if budget is QUICK else QUICK
    other = cached_summaries(CellCache(cache.root, traces, config, other_budget, args.protocol), datasets, methods)
    advice = {d: recommend(summaries, methods, d) for d in datasets}
    recommendation = markdown_recommendation(
        advice, {d: recommend(other, methods, d) for d in datasets}, budget, other_budget
    )
    (args.out / "recommendation.md").write_text(recommendation)
    written.append(args.out / "recommendation.md")
    failed = [r for r in results if r.error]
    report = {
        "command": " ".join(["picrl", *sys.argv[1:]]) if sys.argv[0].endswith("picrl") else " ".join(sys.argv),
        "wall_seconds": wall,
        "jobs": args.jobs,
        "seeds": seeds,
        "protocol": args.protocol,
        "budget": budget.__dict__,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
        "config": config.to_dict(),
        "datasets": {
            name: {
                "test_ticks": int(s.by_service("test").shape[1]),
                "services": s.services,
                "step_seconds": traces[name].step_seconds,
                "notes": list(s.notes),
            }
            for name, s in series.items()
        },
        "methods": {
            m: {"label": REGISTRY[m].label, "group": REGISTRY[m].group, "reference": REGISTRY[m].reference}
            for m in methods
        },
        "cells": [
            {
                "dataset": r.cell.dataset,
                "seed": r.cell.seed,
                "method": r.cell.method,
                "metrics": r.metrics,
                "seconds": r.fit_and_run_seconds,
                "cached": r.cached,
                "error": r.error,
            }
            for r in results
        ],
        "summary": [
            {"method": s.method, "dataset": s.dataset, "seeds": s.n, "failed": s.failed, "mean": s.mean, "std": s.std}
            for s in summaries.values()
        ],
        "recommendation": {d: None if r is None else asdict(r) for d, r in advice.items()},
    }
    (args.out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    written.append(args.out / "results.json")
    computed = sum(not r.cached for r in results)
    print(f"{len(results)} cells ({computed} computed, {len(results) - computed} from the cache) in {wall:.0f} s")
    print("written: " + ", ".join(str(p) for p in written))
    print("\n" + recommendation)
    for result in failed:
        print(
            f"\nFAILED {result.cell.method} on {result.cell.dataset} seed {result.cell.seed}:\n{result.error}",
            file=sys.stderr,
        )
    return 1 if failed else 0
