"""Phase 1's windowed predictor (``predictor.kind = "windowed"``, the paper's): every tick the LSTM re-reads the
last ``W`` ticks of PIC inputs from a zero state.

Training (:func:`train_windowed_predictor`) samples windows of the training split, re-censors a share of them
(:func:`make_windows`) and minimises the NLL of Eq. (3) of the step after each; validation scores every uncensored
window of the validation split (:func:`windowed_forecasts`), and :func:`calibrate_sigma` scales ``sigma`` on it.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Callable

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from picrl_core.batching import INVARIANT_CHUNK, in_fixed_chunks
from picrl_core.config import PredictorConfig
from picrl_core.predictor.model import (Forecast, Forecasts, GaussianLSTM, Predictor, PredictorInputError,
                                        PredictorReport, censor_noise_std, check_series, fit_sigma, forecast_metrics,
                                        gaussian_nll, pic_inputs)
from picrl_core.series import segment_starts

# Windows built at once when evaluating a whole series: bounds the memory of the window copies.
_EVALUATION_BLOCK = 65_536
# Seed of the (uncensored, so in fact randomness-free) validation windows.
_VALIDATION_SEED = 0


def make_windows(
    d: np.ndarray,
    context: np.ndarray | None,
    window: int,
    rng: np.random.Generator,
    censor_prob: float,
    *,
    starts: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Training windows that mimic online PIC inputs, from a fully observed series.

    Window ``i`` covers steps ``s .. s+window-1`` (``s = starts[i]``, default every start) and its
    target is ``d[s + window]``. A ``censor_prob`` share of windows is censored under a synthetic
    threshold ``a_t = clip(d_t + eps_t, 0, 1)`` with ``eps_t ~ N(0, s_w)`` and ``s_w`` drawn per window
    (:func:`censor_noise_std`; clipped like the online action): ``y = min(d, a)``,
    ``c = 1[d > a]``. Other windows are uncensored (``y = d``, ``c = 0``).

    Returns ``X`` (N, window, 2 + C) float32 with channels ``[y, c, ctx...]`` and ``target`` (N,)
    float32. Deterministic given ``rng``.
    """
    if not 0.0 <= censor_prob <= 1.0:
        raise PredictorInputError(f"censor_prob must lie in [0, 1], got {censor_prob}")
    d = np.asarray(d, dtype=np.float64)
    ctx = None if context is None else np.asarray(context, dtype=np.float32)
    channels = 0 if ctx is None else ctx.shape[-1]
    check_series(d, ctx, window, channels, "training")
    n_all = len(d) - window
    idx = np.arange(n_all) if starts is None else np.asarray(starts, dtype=np.int64)
    if idx.size and (idx.min() < 0 or idx.max() >= n_all):
        raise PredictorInputError(f"window starts must lie in [0, {n_all - 1}]")
    demand = sliding_window_view(d[:-1], window)[idx]  # (N, W) copy
    n = len(idx)
    censored_window = rng.random(n) < censor_prob
    noise_std = censor_noise_std(demand, rng)
    threshold = np.clip(demand + rng.standard_normal((n, window)) * noise_std[:, None], 0.0, 1.0)
    cens = censored_window[:, None] & (demand > threshold)
    x = np.empty((n, window, 2 + channels), dtype=np.float32)
    x[:, :, 0] = np.where(cens, threshold, demand)
    x[:, :, 1] = cens
    if ctx is not None:
        x[:, :, 2:] = sliding_window_view(ctx[:-1], window, axis=0)[idx].transpose(0, 2, 1)
    return x, d[idx + window].astype(np.float32)


def predict_gaussian(model: GaussianLSTM, windows: np.ndarray,
                     chunk: int = INVARIANT_CHUNK) -> tuple[np.ndarray, np.ndarray]:
    """Batched inference: ``windows`` (B, W, 2 + C) -> ``(mu, sigma)`` as float64 (B,), any B >= 0.
    Batch-invariant for a fixed ``chunk``: a row's result does not depend on the other rows (see
    ``picrl_core.batching``)."""
    windows = np.asarray(windows)
    if windows.ndim != 3 or windows.shape[2] != model.input_size:
        raise PredictorInputError(
            f"predictor windows must have shape (batch, steps, {model.input_size}), got {windows.shape}"
        )
    if windows.shape[0] == 0:
        return np.empty(0), np.empty(0)
    device = next(model.parameters()).device

    def forward(chunk: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mu, sigma = model(torch.from_numpy(chunk.astype(np.float32, copy=False)).to(device))
        return mu.cpu().numpy(), sigma.cpu().numpy()

    with torch.inference_mode():
        mu, sigma = in_fixed_chunks(forward, windows, chunk)
    return mu.astype(np.float64), sigma.astype(np.float64)


def windowed_forecasts(model: GaussianLSTM, series: np.ndarray, context: np.ndarray | None,
                       window: int, services: int = 1) -> Forecasts:
    """``(mu, sigma, target)`` on every uncensored window of ``series`` (of ``services`` segments end to
    end, none straddled), built in bounded blocks."""
    series = np.asarray(series, dtype=np.float64)
    context = None if context is None else np.asarray(context, dtype=np.float64)
    check_series(series, context, window, model.cfg.context_channels, "evaluation")
    rng = np.random.default_rng(_VALIDATION_SEED)
    every = segment_starts(len(series), services, 0, window + 1)
    mu, sigma, target = [], [], []
    for lo in range(0, every.size, _EVALUATION_BLOCK):
        starts = every[lo:lo + _EVALUATION_BLOCK]
        x, t = make_windows(series, context, window, rng, 0.0, starts=starts)
        m, s = predict_gaussian(model, x)
        mu.append(m)
        sigma.append(s)
        target.append(t.astype(np.float64))
    return np.concatenate(mu), np.concatenate(sigma), np.concatenate(target)


def evaluate_predictor(
    model: GaussianLSTM, series: np.ndarray, context: np.ndarray | None, window: int, services: int = 1
) -> dict[str, float]:
    """NLL (Eq. 3), MAE of ``mu`` and 1/2-sigma coverage on every uncensored window of ``series``."""
    return forecast_metrics(windowed_forecasts(model, series, context, window, services))


def calibrate_sigma(model: Predictor, series: np.ndarray, context: np.ndarray | None, window: int, *,
                    temperature: bool = True, services: int = 1) -> float:
    """:func:`~picrl_core.predictor.model.fit_sigma` on the windows of ``series`` (the validation split)."""
    return fit_sigma(model, lambda: windowed_forecasts(model, series, context, window, services), temperature)


class WindowedForecaster:
    """:class:`~picrl_core.predictor.model.Forecaster` of the windowed predictor: every tick reads the whole window
    (:func:`predict_gaussian`, batch-invariant for a fixed ``chunk``); it carries no memory (``M = 0``)."""

    def __init__(self, model: GaussianLSTM, chunk: int = INVARIANT_CHUNK) -> None:
        self.model, self.chunk = model, chunk

    @staticmethod
    def memory_size(cfg: PredictorConfig) -> int:
        return 0

    def start(self, observations: np.ndarray, censored: np.ndarray, context: np.ndarray) -> Forecast:
        windows = pic_inputs(observations, censored, context)
        mu, sigma = predict_gaussian(self.model, windows, self.chunk)
        return mu, sigma, np.zeros((windows.shape[0], 0), np.float32)

    def advance(self, observations: np.ndarray, censored: np.ndarray, context: np.ndarray,
                memory: np.ndarray) -> Forecast:
        return self.start(observations, censored, context)


def train_windowed_predictor(
    train: np.ndarray,
    val: np.ndarray,
    cfg: PredictorConfig,
    *,
    seed: int,
    train_context: np.ndarray | None = None,
    val_context: np.ndarray | None = None,
    progress: Callable[[dict[str, float]], None] | None = None,
    model_factory: Callable[[PredictorConfig], Predictor] = GaussianLSTM,  # type: ignore[assignment]
    services: int = 1,
) -> tuple[Predictor, PredictorReport]:
    """Phase 1 / Algorithm 1 line 2 for the windowed kind: ``theta* = argmin_theta sum NLL(d_i; f_theta(x_i))``,
    Eq. (3).

    Adam on minibatches of at most ``cfg.max_train_windows`` windows per epoch (re-sampled and
    re-censored every epoch), early stopping on the validation NLL after ``cfg.patience`` epochs
    without improvement; the best epoch's weights are restored and, with ``cfg.calibrate_sigma``, its
    ``sigma`` is temperature-scaled on the validation split (:func:`calibrate_sigma`). Deterministic under ``seed``; the
    global torch RNG is left untouched. ``progress`` receives ``{"epoch", "train_nll", "val_nll",
    "val_mae"}`` once per epoch. ``model_factory`` builds the model from ``cfg`` (the Gaussian LSTM;
    the Phase-1 substitutions of the comparison pass theirs and train by the same loop). A fleet's
    splits hold ``services`` series end to end; no window straddles two.
    """
    train = np.asarray(train, dtype=np.float64)
    val = np.asarray(val, dtype=np.float64)
    train_context = None if train_context is None else np.asarray(train_context, dtype=np.float64)
    val_context = None if val_context is None else np.asarray(val_context, dtype=np.float64)
    check_series(train, train_context, cfg.window, cfg.context_channels, "training")
    check_series(val, val_context, cfg.window, cfg.context_channels, "validation")
    if cfg.epochs < 1 or cfg.batch_size < 1 or cfg.max_train_windows < 1 or cfg.patience < 1:
        raise PredictorInputError(
            "predictor epochs, batch_size, max_train_windows and patience must all be >= 1"
        )

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_factory(cfg)
    rng = np.random.default_rng(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    every = segment_starts(len(train), services, 0, cfg.window + 1)
    per_epoch = min(every.size, cfg.max_train_windows)

    history: list[dict[str, float]] = []
    best_nll, best_epoch, best_state = math.inf, 0, copy.deepcopy(model.state_dict())
    for epoch in range(1, cfg.epochs + 1):
        starts = every[rng.permutation(every.size)[:per_epoch]]
        x_np, t_np = make_windows(train, train_context, cfg.window, rng, cfg.censor_prob, starts=starts)
        x, t = torch.from_numpy(x_np), torch.from_numpy(t_np)
        total = 0.0
        for lo in range(0, per_epoch, cfg.batch_size):
            mu, sigma = model(x[lo : lo + cfg.batch_size])
            loss = gaussian_nll(mu, sigma, t[lo : lo + cfg.batch_size])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.item() * len(mu)
        train_nll = total / per_epoch
        if not math.isfinite(train_nll):
            raise FloatingPointError(f"predictor training diverged at epoch {epoch} (NLL {train_nll})")
        val_metrics = evaluate_predictor(model, val, val_context, cfg.window, services)
        record = {"epoch": epoch, "train_nll": train_nll}
        record |= {"val_nll": val_metrics["nll"], "val_mae": val_metrics["mae"]}
        history.append(record)
        if progress is not None:
            progress(dict(record))
        if val_metrics["nll"] < best_nll:
            best_nll, best_epoch, best_state = val_metrics["nll"], epoch, copy.deepcopy(model.state_dict())
        elif epoch - best_epoch >= cfg.patience:
            break

    model.load_state_dict(best_state)
    model.zero_grad(set_to_none=True)
    scale = calibrate_sigma(model, val, val_context, cfg.window, temperature=cfg.calibrate_sigma, services=services)
    final = evaluate_predictor(model, val, val_context, cfg.window, services)
    report = PredictorReport(
        epochs_run=len(history),
        best_epoch=best_epoch,
        history=tuple(history),
        val_nll=final["nll"],
        val_mae=final["mae"],
        coverage_1sigma=final["coverage_1sigma"],
        coverage_2sigma=final["coverage_2sigma"],
        sigma_scale=scale,
    )
    return model, report
