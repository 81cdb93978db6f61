"""Fixtures of the stream tests: a tiny trained model (native units) saved as an artifact folder."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from picrl.datasets import Trace
from picrl.workloads import copies_of
from picrl_core.artifact import ModelArtifact, save_artifact
from picrl_core.config import PicRLConfig
from picrl_core.deployable import DEPLOYABLE, train_model
from picrl_core.pipeline import train_offline
from picrl_core.resources import GPU_POD
from picrl_core.series import prepare_series
from picrl_core.synthetic import diurnal
from producers.workload import Workload

WINDOW = 8
PIC_RL_FAMILY = ("pic-rl", "tft", "informer", "autoformer")  # PIC-RL's controller, its predictor substituted


def tiny_stream_config() -> PicRLConfig:
    base = PicRLConfig(seed=0)
    return replace(
        base,
        predictor=replace(base.predictor, window=WINDOW, hidden=8, epochs=2, batch_size=128, max_train_windows=800),
        estimator=replace(base.estimator, window=WINDOW),
        policy=replace(base.policy, hidden=16, horizon=64),
        pretrain=replace(base.pretrain, iterations=2, chunks=4, chunk_len=16),
        online=replace(base.online, n_update=16, buffer_size=256, batch_size=32, gradient_steps=2),
    )


@pytest.fixture(scope="session")
def native_trace() -> Trace:
    """1,200 steps of diurnal demand in GiB (10-60), with a duty-cycle context channel in %."""
    demand = 10.0 + 50.0 * diurnal(1200, period=48, base=0.45, amplitude=0.25, noise=0.03, seed=5)
    duty = np.clip(100.0 * diurnal(1200, period=48, base=0.5, amplitude=0.3, noise=0.05, seed=6), 0, 100)
    return Trace("synthetic-gib", demand, duty[:, None], ("duty_pct",), 60.0, "GiB", "tests")


@pytest.fixture(scope="session")
def tiny_artifact(native_trace: Trace) -> ModelArtifact:
    series = prepare_series(native_trace.values, native_trace.name)
    return train_offline(series, tiny_stream_config())


@pytest.fixture(scope="session")
def rule_artifacts(native_trace: Trace) -> dict[str, ModelArtifact]:
    """Every deployable method but PIC-RL's own controller and its predictor variants, fitted on the trace (tiny
    budgets), by name."""
    series = prepare_series(native_trace.values, native_trace.name)
    return {
        name: train_model(name, series, tiny_stream_config(), native_trace.step_seconds)
        for name in DEPLOYABLE
        if name not in PIC_RL_FAMILY
    }


@pytest.fixture(scope="session")
def variant_artifact(native_trace: Trace) -> Callable[[str], ModelArtifact]:
    """A PIC-RL predictor variant (``tft``, ``informer``, ``autoformer``) trained on the trace, each once, at the
    smallest budget (one epoch and iteration, no Phase-3 selection on validation)."""
    series = prepare_series(native_trace.values, native_trace.name)
    base = tiny_stream_config()
    config = replace(
        base,
        predictor=replace(base.predictor, epochs=1),
        pretrain=replace(base.pretrain, iterations=1),
        calibrator=replace(base.calibrator, select_scale_rate=False, start_from_validation=False),
    )
    return cache(lambda name: train_model(name, series, config, native_trace.step_seconds))


@pytest.fixture(scope="session")
def tiny_context_artifact(native_trace: Trace) -> ModelArtifact:
    series = prepare_series(native_trace.values, native_trace.name, native_trace.context, native_trace.context_names)
    return train_offline(series, tiny_stream_config())


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_artifact: ModelArtifact, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_artifact(tiny_artifact, tmp_path_factory.mktemp("model") / "tiny")


def two_resource_workload(trace: Trace, services: int, ticks: int, seed: int = 3) -> Workload:
    """``services`` pods provisioned GPU memory and GPU compute (``GPU_POD``), resource-major ``(T, 2 * N)``:
    memory from shifted copies of the trace, compute (in %) from other copies, so their peaks differ."""
    memory = copies_of(trace, services, ticks, start=900, seed=seed)
    compute = copies_of(trace, services, ticks, start=600, seed=seed + 5)
    return Workload(
        tuple(f"pod-{j}" for j in range(services)),
        np.hstack([memory.demand, compute.demand * 1.5]),
        None,
        (),
        "GiB | %",
        GPU_POD,
    )
