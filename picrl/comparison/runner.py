"""The comparison of Tables 2 and 3: every (dataset, seed, method) cell trained and run under the PIC loop.

A cell is :func:`picrl_core.methods.evaluation.run_on_test_split` of one registry method on one
dataset with one seed. Cells of the same (dataset, seed) form a group that one process runs inside
:func:`~picrl_core.training_memo.shared_training`, so the offline phases the methods have in common
(the Phase-1 LSTM, PIC-RL's Phase 2 for A5/A6) are trained once per group. ``--jobs`` groups run in
parallel processes, longest first. Each finished cell is written to the cache
(``<cache>/compare/<dataset>/<method>-seed<k>-<key>.{json,npz}``, ``key`` a digest of the trace, the
config, the budget, the protocol and the ``picrl_core`` source), so a rerun neither retrains nor reruns it.

Two protocols: ``product``, the default (unclipped native demand, each service's range kept by the worker's
rules, :func:`~picrl_core.methods.evaluation.run_growth_test_split`), and ``paper``, the paper's preset (test
demand clipped to the training range, :func:`~picrl_core.methods.evaluation.run_on_test_split`; Table 2); a
multi-resource fleet runs the paper's under either (:func:`dataset_protocol`).
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import queue
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

import picrl_core
from picrl.datasets import Trace, prepare_trace
from picrl_core.config import PicRLConfig
from picrl_core.methods import REGISTRY
from picrl_core.methods.evaluation import TestSplitRun, run_growth_test_split, run_on_test_split
from picrl_core.series import PreparedSeries, native_splits
from picrl_core.training_memo import shared_training


@dataclass(frozen=True)
class Budget:
    """Training budgets and test length of a comparison run (the same for every method)."""

    name: str
    predictor_epochs: int
    predictor_windows: int  # training windows per epoch
    pretrain_iterations: int
    pretrain_chunks: int
    test_ticks: int | None  # None: the whole test split
    inference_chunk: int = 1  # every cell acts for one service: no padding to a 128-row chunk
    select_scale_rate: bool = True  # PIC-RL's temperature rate chosen on validation (5 validation runs per model)

    def apply(self, config: PicRLConfig) -> PicRLConfig:
        return replace(
            config,
            calibrator=replace(
                config.calibrator, select_scale_rate=config.calibrator.select_scale_rate and self.select_scale_rate
            ),
            predictor=replace(config.predictor, epochs=self.predictor_epochs, max_train_windows=self.predictor_windows),
            pretrain=replace(config.pretrain, iterations=self.pretrain_iterations, chunks=self.pretrain_chunks),
            online=replace(config.online, inference_chunk=self.inference_chunk),
        )


# The full run: the default predictor (40 epochs at most, early stopping) on 8,000 training windows per epoch (all
# of GenAI's 833; a sample of DLRM's 26,752 each epoch, against 20,000 for `picrl train`), and Phase 2 with 32
# rollout chunks per iteration for 30 iterations (256 episodes of 128 steps side by side, 4,096 transitions per
# actor-critic step). 32 chunks, not the 128 of the runs until 25 Nov: the transformer substitutions roll their
# predictor out over every episode of every step, so Phase 2 was 70-80% of the comparison's time; at 32 chunks it
# costs a quarter, and the validation regret of the trained controllers was the same within seed noise
# (benchmarks/offline_training.py --budget compare --chunks 32 / 128; docs/performance.md, "`picrl compare`").
FULL = Budget(
    "full", predictor_epochs=40, predictor_windows=8_000, pretrain_iterations=30, pretrain_chunks=32, test_ticks=None
)
# A look in under 3 minutes: a few epochs, the first 300 test ticks, Phase 2 as 2 iterations of 128 chunks
# (one full network chunk; 8 x 32 chunks rolled out as many chunks but padded each step to 128 rows: 2.3x slower),
# and the temperature's rate left at its configured value instead of 5 validation runs per PIC-RL-style model.
QUICK = Budget(
    "quick",
    predictor_epochs=4,
    predictor_windows=2_000,
    pretrain_iterations=2,
    pretrain_chunks=128,
    test_ticks=300,
    select_scale_rate=False,
)


Protocol = Literal["product", "paper"]
PROTOCOLS: tuple[Protocol, ...] = ("product", "paper")


def dataset_protocol(trace: Trace, protocol: Protocol) -> Protocol:
    """The protocol ``trace``'s cells run under: ``protocol``, except the paper's for a multi-resource trace
    (the product protocol is defined for services of one resource)."""
    return "paper" if trace.resources else protocol


@dataclass(frozen=True)
class Cell:
    dataset: str
    seed: int
    method: str


@dataclass
class CellResult:
    """What a finished cell left in the cache (arrays are ``(T,)``); ``error`` when it failed."""

    cell: Cell
    metrics: dict[str, float] | None
    fit_and_run_seconds: float
    cached: bool
    actions: np.ndarray | None = None
    censored: np.ndarray | None = None
    error: str | None = None


def test_series(trace: Trace, budget: Budget) -> PreparedSeries:
    """The trace (or fleet) split and scaled as in the paper, with the test split cut to the budget's length."""
    series = prepare_trace(trace)
    if budget.test_ticks is None:
        return series
    cut = slice(0, budget.test_ticks)
    return replace(
        series,
        test=series.by_service("test")[:, cut].ravel(),
        test_ctx=None if series.test_ctx is None else series.test_ctx[cut],
    )


def native_test(trace: Trace, budget: Budget) -> np.ndarray:
    """The test split of a one-resource trace (or fleet) in native units, unclipped, ``(T, N)``
    (:func:`~picrl_core.series.native_splits`), cut to the budget's length."""
    test = native_splits(trace.values, trace.name)[2]
    return test if budget.test_ticks is None else test[: budget.test_ticks]


def native_validation(trace: Trace) -> np.ndarray:
    """The validation split of a one-resource trace (or fleet) in native units, unclipped, ``(T, N)``."""
    return native_splits(trace.values, trace.name)[1]


def scored_demand(trace: Trace, series: PreparedSeries, budget: Budget, protocol: Protocol) -> np.ndarray:
    """The test demand a dataset's cells are scored on, ``(T,)`` or ``(T, N)`` for a fleet: the scaled test split,
    clipped to the training range (the paper's protocol), or under the product's unclipped in units of the
    training range (``(x - L) / (H - L)``, as :func:`~picrl_core.methods.evaluation.growth_episode` scores it)."""
    if dataset_protocol(trace, protocol) == "paper":
        return series.test if series.services == 1 else series.by_service("test").T
    demand = (native_test(trace, budget) - series.scaler.low) / (series.scaler.high - series.scaler.low)
    return demand[:, 0] if series.services == 1 else demand


def _core_digest() -> str:
    """Digest of the algorithm's source: a cached cell is reused only while ``picrl_core`` is unchanged."""
    digest = hashlib.sha256()
    root = Path(picrl_core.__file__).parent
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


class CellCache:
    """Finished cells on disk: metrics and timing as JSON, actions and censoring flags as ``.npz``."""

    def __init__(
        self, root: Path, traces: dict[str, Trace], config: PicRLConfig, budget: Budget, protocol: Protocol = "product"
    ) -> None:
        self.root = root
        base = hashlib.sha256(_core_digest().encode())
        base.update(json.dumps({"config": config.to_dict(), "budget": asdict(budget)}, sort_keys=True).encode())
        self._keys = {}
        for name, trace in traces.items():
            digest = base.copy()
            if dataset_protocol(trace, protocol) != "paper":  # the paper's cells keep their keys
                digest.update(protocol.encode())
            trace.feed(digest.update)
            if trace.resources:  # the same columns under another observation rule are other cells
                digest.update(json.dumps([trace.resources, trace.oom_kills]).encode())
            self._keys[name] = digest.hexdigest()[:16]

    def _stem(self, cell: Cell) -> Path:
        return self.root / cell.dataset / f"{cell.method}-seed{cell.seed}-{self._keys[cell.dataset]}"

    def load(self, cell: Cell) -> CellResult | None:
        stem = self._stem(cell)
        try:
            record = json.loads(stem.with_suffix(".json").read_text())
            with np.load(stem.with_suffix(".npz"), allow_pickle=False) as arrays:
                actions, censored = arrays["actions"], arrays["censored"]
        except (OSError, ValueError, KeyError):  # absent, or a half-written / corrupt entry: recompute it
            return None
        return CellResult(cell, record["metrics"], record["seconds"], True, actions, censored)

    def store(self, result: CellResult) -> None:
        stem = self._stem(result.cell)
        stem.parent.mkdir(parents=True, exist_ok=True)
        np.savez(stem.with_suffix(".npz"), actions=result.actions, censored=result.censored)
        stem.with_suffix(".json").write_text(
            json.dumps({"metrics": result.metrics, "seconds": result.fit_and_run_seconds}) + "\n"
        )


Report = Callable[[CellResult], None]


def run_group(
    trace: Trace,
    seed: int,
    methods: Sequence[str],
    config: PicRLConfig,
    budget: Budget,
    cache: CellCache,
    report: Report,
    protocol: Protocol = "product",
) -> None:
    """Run (or load) every method's cell of one (dataset, seed) under ``protocol`` (:func:`dataset_protocol`);
    identical offline phases train once."""
    torch.set_num_threads(1)
    series = test_series(trace, budget)
    cell_config = replace(budget.apply(config), seed=seed)
    product = dataset_protocol(trace, protocol) == "product"
    native = (native_test(trace, budget), native_validation(trace)) if product else None

    def evaluate(name: str) -> TestSplitRun:
        if native is None:
            return run_on_test_split(REGISTRY[name], series, cell_config, trace.step_seconds)
        return run_growth_test_split(REGISTRY[name], series, *native, cell_config, trace.step_seconds)

    with shared_training():
        for name in methods:
            cell = Cell(trace.name, seed, name)
            result = cache.load(cell)
            if result is None:
                started = time.perf_counter()
                try:
                    run = evaluate(name)
                except Exception:  # one failing method must not take the whole comparison down
                    result = CellResult(
                        cell, None, time.perf_counter() - started, False, error=traceback.format_exc(limit=4)
                    )
                else:
                    result = CellResult(
                        cell,
                        run.metrics.to_dict() | run.extra | _validation(run.validation_regret),
                        time.perf_counter() - started,
                        False,
                        run.actions,
                        run.censored,
                    )
                    cache.store(result)
            report(result)


def _validation(regret: float | None) -> dict[str, float]:
    """``val_regret``: the cell's regret on the validation episode, what ``picrl compare`` recommends by."""
    return {} if regret is None else {"val_regret": regret}


def _group_in_worker(
    trace: Trace,
    seed: int,
    methods: Sequence[str],
    config: PicRLConfig,
    budget: Budget,
    cache: CellCache,
    events: Any,
    protocol: Protocol,
) -> None:
    """:func:`run_group` in a pool process; each finished cell goes to ``events`` (without its arrays,
    which the parent reads from the cache)."""

    def report(result: CellResult) -> None:
        events.put(replace(result, actions=None, censored=None))

    run_group(trace, seed, methods, config, budget, cache, report, protocol)


def run_comparison(
    traces: dict[str, Trace],
    seeds: Sequence[int],
    methods: Sequence[str],
    config: PicRLConfig,
    budget: Budget,
    cache: CellCache,
    jobs: int,
    report: Report,
    protocol: Protocol = "product",
) -> list[CellResult]:
    """Every cell of ``traces x seeds x methods`` under ``protocol``; ``report`` sees each as it finishes.
    Results come back with their arrays (read from the cache), in plan order."""
    groups = sorted(
        ((name, seed) for name in traces for seed in seeds), key=lambda g: -len(traces[g[0]].values)
    )  # longest traces first: better packing
    done: dict[Cell, CellResult] = {}

    def collect(result: CellResult) -> None:
        done[result.cell] = result
        report(result)

    if jobs <= 1:
        for name, seed in groups:
            run_group(traces[name], seed, methods, config, budget, cache, collect, protocol)
    else:
        context = multiprocessing.get_context("spawn")  # no fork of a process holding torch threads
        with context.Manager() as manager, ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
            events = manager.Queue()
            pending = {
                pool.submit(_group_in_worker, traces[name], seed, methods, config, budget, cache, events, protocol)
                for name, seed in groups
            }
            while pending:
                finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                _drain(events, collect)
                for future in finished:
                    future.result()  # a crashed worker process is an error of the run, not of a cell
            _drain(events, collect)
    ordered = []
    for name, seed in groups:
        for method in methods:
            result = done[Cell(name, seed, method)]
            if result.error is None and result.actions is None:  # computed in a worker: arrays from the cache
                stored = cache.load(result.cell)
                result = (
                    replace(result, error="its cache entry could not be read back")
                    if stored is None
                    else replace(result, actions=stored.actions, censored=stored.censored)
                )
            ordered.append(result)
    return ordered


def _drain(events: Any, collect: Report) -> None:
    while True:
        try:
            collect(events.get_nowait())
        except queue.Empty:
            return
