"""Shared fixtures of the picrl_core tests: a tiny PIC-RL config and a tiny trained predictor.

Every size is cut down (window 8, hidden 8/16, a few epochs and iterations) so a whole test file
runs in seconds on two cores; the package-scoped predictor is trained once for all files. Torch runs
single-threaded here: on tensors this small, intra-op threads only add synchronisation, and on a
busy machine they make a closed-loop run more than ten times slower.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from picrl_core.config import PicRLConfig
from picrl_core.policy import PolicyNetwork, ValueNetwork
from picrl_core.predictor.model import GaussianLSTM
from picrl_core.predictor.train import train_predictor
from picrl_core.synthetic import diurnal

PERIOD = 48  # diurnal period of the fixture series, in steps


@pytest.fixture(scope="package")
def tiny_config() -> PicRLConfig:
    """PicRLConfig with every phase shrunk to test size (derive variants with ``replace``)."""
    base = PicRLConfig(seed=0)
    return replace(
        base,
        predictor=replace(
            base.predictor, window=8, hidden=8, epochs=3, batch_size=128, patience=2, max_train_windows=1500
        ),
        estimator=replace(base.estimator, window=8),
        policy=replace(base.policy, hidden=16, horizon=64),
        pretrain=replace(base.pretrain, iterations=3, chunks=4, chunk_len=16),
        online=replace(base.online, n_update=16, buffer_size=256, batch_size=32, gradient_steps=2),
    )


@pytest.fixture(scope="package")
def diurnal_series() -> np.ndarray:
    """2,400 steps of seeded diurnal demand in [0, 1] with a 48-step period."""
    return diurnal(2400, period=PERIOD, base=0.45, amplitude=0.25, noise=0.03, seed=11)


@pytest.fixture(scope="package")
def tiny_predictor(tiny_config: PicRLConfig, diurnal_series: np.ndarray) -> GaussianLSTM:
    """A Gaussian LSTM trained for a few epochs on the first 1,600 steps of ``diurnal_series``."""
    model, _ = train_predictor(
        diurnal_series[:1600], diurnal_series[1600:2000], tiny_config.predictor, seed=tiny_config.seed
    )
    return model.eval()


@pytest.fixture()
def tiny_policy(tiny_config: PicRLConfig) -> PolicyNetwork:
    """A freshly initialised (untrained) policy network, seeded."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        return PolicyNetwork(tiny_config.policy)


@pytest.fixture()
def tiny_value(tiny_config: PicRLConfig) -> ValueNetwork:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(2)
        return ValueNetwork(tiny_config.policy)
