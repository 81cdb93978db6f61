"""Phase 1's windowed predictor (``predictor.kind = "windowed"``, the paper's): every tick the LSTM re-reads the
last ``W`` ticks of PIC inputs from a zero state.

Training (:class:`WindowSampler`) samples windows of the training split, re-censors a share of them
(:func:`make_windows`) and minimises the NLL of Eq. (3) of the step after each; validation scores every uncensored
window of the validation split (:func:`windowed_forecasts`), and :func:`calibrate_sigma` scales ``sigma`` on it.
"""

from __future__ import annotations

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from picrl_core.batching import INVARIANT_CHUNK, in_fixed_chunks
from picrl_core.config import PredictorConfig
from picrl_core.predictor.model import (
    Forecast,
    Forecasts,
    GaussianLSTM,
    Predictor,
    PredictorInputError,
    censor_noise_std,
    check_series,
    fit_sigma,
    forecast_metrics,
    gaussian_nll,
    pic_inputs,
)
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


def predict_gaussian(
    model: GaussianLSTM, windows: np.ndarray, chunk: int = INVARIANT_CHUNK
) -> tuple[np.ndarray, np.ndarray]:
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


def windowed_forecasts(
    model: GaussianLSTM, series: np.ndarray, context: np.ndarray | None, window: int, services: int = 1
) -> Forecasts:
    """``(mu, sigma, target)`` on every uncensored window of ``series`` (of ``services`` segments end to
    end, none straddled), built in bounded blocks."""
    series = np.asarray(series, dtype=np.float64)
    context = None if context is None else np.asarray(context, dtype=np.float64)
    check_series(series, context, window, model.cfg.context_channels, "evaluation")
    rng = np.random.default_rng(_VALIDATION_SEED)
    every = segment_starts(len(series), services, 0, window + 1)
    mu, sigma, target = [], [], []
    for lo in range(0, every.size, _EVALUATION_BLOCK):
        starts = every[lo : lo + _EVALUATION_BLOCK]
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


def calibrate_sigma(
    model: Predictor,
    series: np.ndarray,
    context: np.ndarray | None,
    window: int,
    *,
    temperature: bool = True,
    services: int = 1,
) -> float:
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

    def advance(
        self, observations: np.ndarray, censored: np.ndarray, context: np.ndarray, memory: np.ndarray
    ) -> Forecast:
        return self.start(observations, censored, context)


class WindowSampler:
    """:class:`~picrl_core.predictor.model.EpochSampler` of the windowed kind: each epoch at most
    ``max_train_windows`` windows of the training split (:func:`make_windows`; a fleet's ``services`` series end to
    end, no window straddling two), in minibatches of ``batch_size``; the loss is Eq. (3) of each window's next step."""

    def __init__(self, train: np.ndarray, context: np.ndarray | None, cfg: PredictorConfig, services: int) -> None:
        self.train, self.context, self.cfg = train, context, cfg
        self.every = segment_starts(len(train), services, 0, cfg.window + 1)
        self.per_epoch = min(self.every.size, cfg.max_train_windows)
        self.batch = cfg.batch_size

    def draw(self, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        starts = self.every[rng.permutation(self.every.size)[: self.per_epoch]]
        x, t = make_windows(self.train, self.context, self.cfg.window, rng, self.cfg.censor_prob, starts=starts)
        return torch.from_numpy(x), torch.from_numpy(t)

    def loss(self, model: torch.nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        mu, sigma = model(x)
        return gaussian_nll(mu, sigma, t)
