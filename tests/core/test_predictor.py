"""Phase 1 Gaussian LSTM predictor: windows, Eq. (3) loss, training, calibration and inference."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from picrl_core.config import PredictorConfig
from picrl_core.predictor.model import GaussianLSTM, PredictorInputError, censor_noise_std, gaussian_nll
from picrl_core.predictor.train import train_predictor
from picrl_core.predictor.windowed import calibrate_sigma, evaluate_predictor, make_windows, predict_gaussian

SMALL = PredictorConfig(  # the windowed LSTM's Phase 1 (the incremental one has its own test file)
    window=16, hidden=16, epochs=8, batch_size=128, lr=5e-3, patience=3, max_train_windows=1500, kind="windowed"
)


def noisy_sine(n: int, seed: int, noise: float = 0.03) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return np.clip(0.5 + 0.3 * np.sin(2 * np.pi * t / 48) + noise * rng.standard_normal(n), 0.0, 1.0)


@pytest.fixture(scope="module")
def sine() -> tuple[np.ndarray, np.ndarray]:
    series = noisy_sine(2600, seed=3)
    return series[:2000], series[2000:]


@pytest.fixture(scope="module")
def trained(sine: tuple[np.ndarray, np.ndarray]):
    train, val = sine
    records: list[dict[str, float]] = []
    model, report = train_predictor(train, val, SMALL, seed=7, progress=records.append)
    return model, report, records


def test_gaussian_nll_matches_hand_computation() -> None:
    mu = torch.tensor([0.5, 0.2])
    sigma = torch.tensor([0.1, 0.4])
    d = torch.tensor([0.7, 0.2])
    expected = ((math.log(0.1) + 0.5 * 2.0**2) + math.log(0.4)) / 2
    assert gaussian_nll(mu, sigma, d).item() == pytest.approx(expected, rel=1e-6)


def test_uncensored_windows_hold_demand_context_and_next_step_target() -> None:
    d = np.linspace(0.0, 1.0, 30)
    ctx = np.stack([np.arange(30.0), -np.arange(30.0)], axis=1)
    x, target = make_windows(d, ctx, 5, np.random.default_rng(0), 0.0)
    assert x.shape == (25, 5, 4) and x.dtype == np.float32 and target.dtype == np.float32
    for s in (0, 11, 24):
        np.testing.assert_allclose(x[s, :, 0], d[s : s + 5], rtol=1e-6)
        np.testing.assert_allclose(x[s, :, 2:], ctx[s : s + 5])
        assert target[s] == pytest.approx(d[s + 5])
    assert not x[:, :, 1].any()


def test_censored_windows_hold_threshold_below_demand() -> None:
    d = noisy_sine(400, seed=1)
    demand = np.lib.stride_tricks.sliding_window_view(d[:-1], 16)
    x, _ = make_windows(d, None, 16, np.random.default_rng(5), 1.0)
    y, c = x[:, :, 0], x[:, :, 1].astype(bool)
    assert 0.3 < c.mean() < 0.7  # symmetric threshold noise censors about half the steps
    assert np.all(y[c] < demand[c])  # censored: y = a < d
    np.testing.assert_allclose(y[~c], demand[~c], rtol=1e-6)  # uncensored: y = d
    assert np.all(demand[c] - y[c] < 0.5)  # thresholds are d + small noise


def test_censor_noise_is_drawn_per_window_from_the_papers_range() -> None:
    stds = censor_noise_std(np.zeros((500, 16)), np.random.default_rng(0))
    assert stds.shape == (500,) and np.all((stds >= 0.01) & (stds <= 0.1))


def test_censor_prob_sets_share_of_censored_windows_and_rng_determines_output() -> None:
    d = noisy_sine(3000, seed=2)
    x, _ = make_windows(d, None, 16, np.random.default_rng(9), 0.3)
    share = x[:, :, 1].any(axis=1).mean()
    assert 0.25 < share < 0.35
    again, _ = make_windows(d, None, 16, np.random.default_rng(9), 0.3)
    other, _ = make_windows(d, None, 16, np.random.default_rng(10), 0.3)
    np.testing.assert_array_equal(x, again)
    assert not np.array_equal(x, other)


def test_training_learns_the_sine_and_lowers_nll(trained, sine) -> None:
    model, report, _ = trained
    train, val = sine
    assert report.val_mae < 0.5 * val.std()
    torch.manual_seed(7)
    initial = evaluate_predictor(GaussianLSTM(SMALL), val, None, SMALL.window)
    assert report.val_nll < initial["nll"] - 0.3
    assert evaluate_predictor(model, val, None, SMALL.window)["nll"] == pytest.approx(report.val_nll)


def test_progress_is_called_once_per_epoch_and_report_serialises(trained) -> None:
    _, report, records = trained
    assert len(records) == report.epochs_run == len(report.history)
    assert [r["epoch"] for r in records] == list(range(1, report.epochs_run + 1))
    assert set(records[0]) == {"epoch", "train_nll", "val_nll", "val_mae"}
    data = json.loads(json.dumps(report.to_dict()))
    assert data["best_epoch"] == report.best_epoch and len(data["history"]) == report.epochs_run


def test_early_stopping_restores_best_epoch(sine) -> None:
    train, val = sine
    cfg = replace(SMALL, epochs=30, patience=2, lr=2e-2, calibrate_sigma=False)
    model, report = train_predictor(train, val, cfg, seed=1)
    val_nlls = [h["val_nll"] for h in report.history]
    assert report.epochs_run < cfg.epochs  # stopped early
    assert report.best_epoch == int(np.argmin(val_nlls)) + 1 < report.epochs_run
    assert report.epochs_run - report.best_epoch == cfg.patience
    assert evaluate_predictor(model, val, None, cfg.window)["nll"] == pytest.approx(min(val_nlls), rel=1e-9)


def test_same_seed_same_model_different_seed_different(sine) -> None:
    train, val = sine
    cfg = replace(SMALL, epochs=2)
    torch_state = torch.get_rng_state()
    a, rep_a = train_predictor(train, val, cfg, seed=11)
    assert torch.equal(torch.get_rng_state(), torch_state)  # global torch RNG untouched
    b, rep_b = train_predictor(train, val, cfg, seed=11)
    c, _ = train_predictor(train, val, cfg, seed=12)
    for pa, pb in zip(a.state_dict().values(), b.state_dict().values()):
        assert torch.equal(pa, pb)
    assert rep_a == rep_b
    x, _ = make_windows(val, None, cfg.window, np.random.default_rng(0), 0.3)
    mu_a, sigma_a = predict_gaussian(a, x)
    mu_b, sigma_b = predict_gaussian(b, x)
    mu_c, _ = predict_gaussian(c, x)
    np.testing.assert_array_equal(mu_a, mu_b)
    np.testing.assert_array_equal(sigma_a, sigma_b)
    assert not np.allclose(mu_a, mu_c)


def test_sigma_temperature_is_the_nll_optimal_scale_on_validation_and_is_saved(sine) -> None:
    """``T = sqrt(mean(z^2))`` minimises the NLL of ``T * sigma``: calibrating never raises the validation NLL,
    a second calibration finds the same T (it starts from the raw sigma), and the scale travels in the
    model's state dict."""
    train, val = sine
    raw, raw_report = train_predictor(train, val, replace(SMALL, calibrate_sigma=False), seed=3)
    model, report = train_predictor(train, val, SMALL, seed=3)
    assert raw_report.sigma_scale == 1.0 and report.sigma_scale != 1.0
    assert report.val_nll <= raw_report.val_nll
    assert abs(report.coverage_1sigma - 0.68) <= abs(raw_report.coverage_1sigma - 0.68) + 0.02
    scale = float(model.head.sigma_scale)
    assert calibrate_sigma(model, val, None, SMALL.window) == pytest.approx(scale, rel=1e-6)
    assert model.state_dict()["head.sigma_scale"].item() == pytest.approx(scale)
    for (name, a), b in zip(model.state_dict().items(), raw.state_dict().values()):
        if name != "head.sigma_scale":
            torch.testing.assert_close(a, b)  # the temperature changes nothing else


def test_calibrated_on_gaussian_noise_around_a_constant() -> None:
    rng = np.random.default_rng(4)
    series = 0.5 + 0.05 * rng.standard_normal(4000)
    cfg = replace(SMALL, epochs=10, max_train_windows=3000)
    _, report = train_predictor(series[:3000], series[3000:], cfg, seed=0)
    assert 0.55 <= report.coverage_1sigma <= 0.8
    assert 0.88 <= report.coverage_2sigma <= 0.99
    assert report.val_mae < 0.06  # E|noise| = 0.04 for the ideal predictor


def test_predict_gaussian_batches_agree_and_return_float64(trained, sine) -> None:
    model, _, _ = trained
    x, _ = make_windows(sine[1], None, SMALL.window, np.random.default_rng(0), 0.5)
    mu, sigma = predict_gaussian(model, x[:50])
    assert mu.dtype == np.float64 and sigma.dtype == np.float64 and mu.shape == sigma.shape == (50,)
    assert np.all(sigma >= SMALL.sigma_min)
    mu0, sigma0 = predict_gaussian(model, x[:0])
    assert mu0.shape == sigma0.shape == (0,)
    for i in (0, 17, 49):
        mu1, sigma1 = predict_gaussian(model, x[i : i + 1])
        np.testing.assert_allclose(mu1, mu[i : i + 1], atol=1e-6)
        np.testing.assert_allclose(sigma1, sigma[i : i + 1], atol=1e-6)
    assert all(p.grad is None for p in model.parameters())


def test_context_channels_are_used(sine) -> None:
    train, val = sine
    cfg = replace(SMALL, context_channels=1, epochs=1)
    model, report = train_predictor(
        train, val, cfg, seed=0, train_context=train[:, None] ** 2, val_context=val[:, None] ** 2
    )
    assert model.input_size == 3 and math.isfinite(report.val_nll)


@pytest.mark.parametrize(
    ("train", "val", "kwargs", "message"),
    [
        (np.zeros(17), np.zeros(40), {}, "at least window \\+ 2"),
        (np.zeros(40), np.zeros(40), {"train_context": np.zeros((40, 1))}, "context_channels=0"),
        (np.full(40, np.nan), np.zeros(40), {}, "NaN"),
        (np.zeros((40, 2)), np.zeros(40), {}, "one-dimensional"),
    ],
)
def test_bad_training_inputs_raise_clear_errors(train, val, kwargs, message) -> None:
    with pytest.raises(PredictorInputError, match=message):
        train_predictor(train, val, SMALL, seed=0, **kwargs)


def test_context_shape_mismatch_and_missing_context_raise() -> None:
    cfg = replace(SMALL, context_channels=2)
    with pytest.raises(PredictorInputError, match="context missing"):
        train_predictor(np.zeros(40), np.zeros(40), cfg, seed=0)
    with pytest.raises(PredictorInputError, match=r"shape \(40, 2\)"):
        train_predictor(
            np.zeros(40), np.zeros(40), cfg, seed=0, train_context=np.zeros((39, 2)), val_context=np.zeros((40, 2))
        )


def test_predict_gaussian_rejects_wrong_channel_count() -> None:
    model = GaussianLSTM(SMALL)
    with pytest.raises(PredictorInputError, match="batch, steps, 2"):
        predict_gaussian(model, np.zeros((3, 16, 3), dtype=np.float32))
    with pytest.raises(ValueError):
        make_windows(np.zeros(40), None, 16, np.random.default_rng(0), 1.5)
