"""The incremental predictor option: one LSTM cell step per tick on a carried (h, c)."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from picrl_core.artifact import ModelArtifact, load_artifact, save_artifact
from picrl_core.config import PicRLConfig
from picrl_core.controller import PicRLController
from picrl_core.policy import PolicyNetwork, ValueNetwork
from picrl_core.predictor.incremental import advance_memory, evaluate_stream, start_memory
from picrl_core.predictor.kinds import forecasts_as_acted, memory_size
from picrl_core.predictor.model import GaussianLSTM
from picrl_core.predictor.train import train_predictor
from picrl_core.predictor.windowed import make_windows, predict_gaussian
from picrl_core.simulator import simulate
from picrl_core.state_codec import StateCodec


def _incremental(config: PicRLConfig) -> PicRLConfig:
    return replace(config, predictor=replace(config.predictor, kind="incremental"))


@pytest.fixture(scope="module")
def incremental_model(tiny_config: PicRLConfig, diurnal_series: np.ndarray) -> GaussianLSTM:
    model, report = train_predictor(
        diurnal_series[:1600], diurnal_series[1600:2000], _incremental(tiny_config).predictor, seed=0
    )
    assert report.epochs_run >= 1 and np.isfinite(report.val_nll) and report.sigma_scale > 0
    return model


def test_kind_is_checked(tiny_config: PicRLConfig) -> None:
    with pytest.raises(ValueError, match="predictor.kind"):
        replace(tiny_config.predictor, kind="bogus")
    assert memory_size(replace(tiny_config.predictor, kind="windowed")) == 0
    assert memory_size(_incremental(tiny_config).predictor) == 2 * tiny_config.predictor.hidden


def test_one_cell_step_per_tick_equals_reading_the_whole_sequence(
    incremental_model: GaussianLSTM, diurnal_series: np.ndarray
) -> None:
    window = incremental_model.cfg.window
    x = np.zeros((3, window + 20, 2), np.float32)
    for i in range(3):
        x[i, :, 0] = diurnal_series[100 * i : 100 * i + window + 20]
    x[1, ::3, 1] = 1.0  # some censored flags
    mu, sigma, memory = start_memory(incremental_model, x[:, :window], chunk=4)
    for t in range(window, window + 20):
        mu, sigma, memory = advance_memory(incremental_model, x[:, t], memory, chunk=4)
        full_mu, full_sigma, _ = start_memory(incremental_model, x[:, : t + 1], chunk=4)
        np.testing.assert_allclose(mu, full_mu, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(sigma, full_sigma, rtol=1e-5, atol=1e-6)


def test_forecasts_as_acted_read_the_model_as_the_controller_does(
    incremental_model: GaussianLSTM, diurnal_series: np.ndarray
) -> None:
    window, length = incremental_model.cfg.window, 60
    series = diurnal_series[: 2 * length]  # two services end to end
    mu, sigma, target = forecasts_as_acted(incremental_model, series, None, services=2)
    segments = series.reshape(2, length)
    np.testing.assert_array_equal(target, segments[:, window:].ravel())
    rows = np.stack([segments, np.zeros_like(segments)], axis=2).astype(np.float32)
    carried, _, memory = start_memory(incremental_model, rows[:, :window], chunk=4)  # the carried stream
    for t in range(window, window + 5):
        np.testing.assert_allclose(carried, mu.reshape(2, -1)[:, t - window], rtol=1e-5, atol=1e-6)
        carried, _, memory = advance_memory(incremental_model, rows[:, t], memory, chunk=4)
    windowed = copy.deepcopy(incremental_model)
    windowed.cfg = replace(windowed.cfg, kind="windowed")
    starts = np.arange(length - window)
    x, _ = make_windows(segments[0], None, window, np.random.default_rng(0), 0.0, starts=starts)
    read, _ = predict_gaussian(windowed, x)  # each window from a zero state
    np.testing.assert_allclose(
        forecasts_as_acted(windowed, series, None, services=2)[0][: starts.size], read, rtol=1e-5, atol=1e-6
    )
    assert np.all(sigma > 0) and not np.allclose(read, mu[: starts.size])


def test_a_service_decides_the_same_bits_alone_or_in_a_batch(
    tiny_config: PicRLConfig, incremental_model: GaussianLSTM, tiny_policy: PolicyNetwork, diurnal_series: np.ndarray
) -> None:
    config = _incremental(tiny_config)
    window = config.predictor.window
    demand = np.stack([diurnal_series[2000 + 50 * j : 2000 + 50 * j + 60] for j in range(5)], axis=1)
    history = np.stack([diurnal_series[2000 + 50 * j - window : 2000 + 50 * j] for j in range(5)])
    controller = PicRLController(incremental_model, tiny_policy, config, chunk=4)
    together = simulate(controller, demand * 1.05, history, keys=np.arange(5, dtype=np.uint64))
    for j in (0, 3):
        alone = simulate(controller, demand[:, j : j + 1] * 1.05, history[j : j + 1], keys=np.array([j], np.uint64))
        assert np.array_equal(alone.action[:, 0], together.action[:, j])
        assert np.array_equal(alone.mu[:, 0], together.mu[:, j])
    assert together.censored.any()


def test_state_rows_carry_the_memory(
    tiny_config: PicRLConfig, incremental_model: GaussianLSTM, tiny_policy: PolicyNetwork, diurnal_series: np.ndarray
) -> None:
    config = _incremental(tiny_config)
    window = config.predictor.window
    controller = PicRLController(incremental_model, tiny_policy, config, chunk=4)
    state = controller.initial_state(np.arange(2, dtype=np.uint64), np.stack([diurnal_series[:window]] * 2))
    codec = StateCodec.for_config(config)
    windowed = replace(config, predictor=replace(config.predictor, kind="windowed"))
    assert codec.row_bytes == StateCodec.for_config(windowed).row_bytes + 4 * memory_size(config.predictor)
    again = codec.unpack(codec.pack(state))
    y, c = np.array([0.4, 0.9]), np.array([False, True])
    a, _ = controller.step(state, y, c)
    b, _ = controller.step(again, y, c)
    assert np.array_equal(a.memory, b.memory) and np.array_equal(a.action, b.action)


def test_the_artifact_says_which_predictor_it_holds(
    tiny_config: PicRLConfig, incremental_model: GaussianLSTM, tmp_path: Path
) -> None:
    config = _incremental(tiny_config)
    artifact = ModelArtifact(config, incremental_model, PolicyNetwork(config.policy), ValueNetwork(config.policy))
    folder = save_artifact(artifact, tmp_path / "model")
    assert '"predictor": "incremental"' in (folder / "artifact.json").read_text()
    loaded = load_artifact(folder)
    assert loaded.config.predictor.kind == "incremental"
    for name, tensor in incremental_model.state_dict().items():
        assert torch.equal(loaded.predictor.state_dict()[name], tensor), name


def test_training_is_deterministic_and_reports_the_validation_stream(
    tiny_config: PicRLConfig, diurnal_series: np.ndarray
) -> None:
    cfg = replace(_incremental(tiny_config).predictor, epochs=2)
    first, report = train_predictor(diurnal_series[:1600], diurnal_series[1600:2000], cfg, seed=3)
    second, _ = train_predictor(diurnal_series[:1600], diurnal_series[1600:2000], cfg, seed=3)
    for name, tensor in first.state_dict().items():
        assert torch.equal(second.state_dict()[name], tensor), name
    metrics = evaluate_stream(first, diurnal_series[1600:2000], None, cfg.window)
    assert metrics["nll"] == pytest.approx(report.val_nll) and 0 < report.coverage_1sigma < report.coverage_2sigma


def test_only_the_gaussian_lstm_can_be_carried(tiny_config: PicRLConfig, diurnal_series: np.ndarray) -> None:
    class Other(GaussianLSTM):
        pass

    with pytest.raises(ValueError, match="cannot be carried"):
        train_predictor(
            diurnal_series[:1600],
            diurnal_series[1600:2000],
            _incremental(tiny_config).predictor,
            seed=0,
            model_factory=Other,
        )
