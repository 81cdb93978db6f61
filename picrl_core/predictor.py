"""Phase 1 (Sec. 3.1): uncertainty-aware Gaussian LSTM demand predictor trained by NLL, Eq. (3).

The predictor reads a window of the online PIC inputs, channels ``[y, c, ctx_1..ctx_C]`` where
``y_t = min(d_t, a_t)`` is the observation and ``c_t = 1[d_t > a_t]`` the censoring indicator, and
predicts the demand of the next step as a Gaussian ``(mu, sigma)``. Training uses a fully observed
historical series; a share of the training windows is re-censored under synthetic provisioning
thresholds so the model has seen censored inputs before it meets them online.
"""
from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TypeVar

import numpy as np
import torch
from numpy.lib.stride_tricks import sliding_window_view

from picrl_core.batching import INVARIANT_CHUNK, in_fixed_chunks
from picrl_core.config import PredictorConfig
from picrl_core.series import segment_starts

# Std of the per-step noise of the synthetic provisioning threshold, drawn per window from this range (in the
# series' scaled units).
_CENSOR_NOISE_RANGE = (0.01, 0.1)
# Predicted std at initialisation (demand lives in [0, 1]); keeps the first NLL gradients moderate.
_INITIAL_SIGMA = 0.1
# Windows built at once when evaluating a whole series: bounds the memory of the window copies.
_EVALUATION_BLOCK = 65_536
# Seed of the (uncensored, so in fact randomness-free) validation windows.
_VALIDATION_SEED = 0


class PredictorInputError(ValueError):
    """A series, context or window array the predictor cannot use."""


def gaussian_head(hidden: int, cfg: PredictorConfig) -> torch.nn.Linear:
    """The Gaussian output layer ``h -> (mu offset, pre-softplus sigma)``: small weights, zero mean
    offset and a sigma bias that starts the predicted std near ``_INITIAL_SIGMA``. It carries two buffers
    that :func:`calibrate_sigma` sets on the validation split, so a saved model holds them: the
    temperature ``sigma_scale`` (1 until calibrated) and ``residual_rms``, the constant std that fits the
    validation residuals best (what ablation A1 acts with instead of ``sigma_t``)."""
    head = torch.nn.Linear(hidden, 2)
    with torch.no_grad():
        head.weight.mul_(0.1)
        head.bias[0] = 0.0
        head.bias[1] = math.log(math.expm1(max(_INITIAL_SIGMA - cfg.sigma_min, 1e-3)))
    head.register_buffer("sigma_scale", torch.ones(()))
    head.register_buffer("residual_rms", torch.full((), cfg.sigma_min))
    return head


def gaussian_output(head: torch.nn.Linear, h: torch.Tensor, level: torch.Tensor,
                    sigma_min: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Features ``h`` ``(B, H)`` -> ``mu = level + out[:, 0]``, ``sigma = T * (softplus(out[:, 1]) + sigma_min)``
    with ``out = head(h)`` and ``T`` the head's temperature ``sigma_scale``."""
    out = torch.nn.functional.linear(h, head.weight, head.bias)  # head(h) without the module call's overhead
    return level + out[:, 0], (torch.nn.functional.softplus(out[:, 1]) + sigma_min) * head.sigma_scale


class GaussianLSTM(torch.nn.Module):
    """LSTM with a Gaussian head: window (B, W, 2 + C) -> ``(mu, sigma)``, each (B,).

    ``mu = y_last + head_mu(h)`` is a residual on the last observation, and the head starts with
    small weights, so an untrained model predicts roughly "the last observation" — a sane start for
    a demand series. ``sigma = softplus(head_sigma(h)) + sigma_min`` starts near ``_INITIAL_SIGMA``.
    The model has no dropout or normalisation layers, so train and eval mode compute the same.
    """

    def __init__(self, cfg: PredictorConfig) -> None:
        super().__init__()
        if cfg.window < 1 or cfg.hidden < 1 or cfg.layers < 1 or cfg.context_channels < 0:
            raise PredictorInputError(
                "predictor config needs window, hidden and layers >= 1 and context_channels >= 0"
            )
        if cfg.sigma_min <= 0:
            raise PredictorInputError(f"predictor sigma_min must be positive, got {cfg.sigma_min}")
        self.cfg = cfg
        self.input_size = 2 + cfg.context_channels
        self.lstm = torch.nn.LSTM(self.input_size, cfg.hidden, cfg.layers, batch_first=True)
        self.head = gaussian_head(cfg.hidden, cfg)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, (h_n, _) = self.lstm(x)
        return gaussian_output(self.head, h_n[-1], x[:, -1, 0], self.cfg.sigma_min)


# Any Phase-1 model with GaussianLSTM's interface (``cfg``, ``input_size``, window -> (mu, sigma)).
Predictor = TypeVar("Predictor", bound=torch.nn.Module)


def gaussian_nll(mu: torch.Tensor, sigma: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """Eq. (3): ``mean(log sigma + 0.5 ((d - mu) / sigma)^2)`` (the constant log sqrt(2 pi) dropped)."""
    return (torch.log(sigma) + 0.5 * ((d - mu) / sigma) ** 2).mean()


@dataclass(frozen=True)
class PredictorReport:
    """Outcome of :func:`train_predictor`; validation metrics are those of the restored best epoch
    (after the temperature ``sigma_scale``)."""

    epochs_run: int
    best_epoch: int  # 1-based, as ``history[i]["epoch"]``
    history: tuple[dict[str, float], ...]
    val_nll: float
    val_mae: float
    coverage_1sigma: float  # share of validation targets within mu +- sigma
    coverage_2sigma: float  # share of validation targets within mu +- 2 sigma
    sigma_scale: float = 1.0  # temperature of sigma fitted on validation (1: not calibrated)

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["history"] = [dict(h) for h in self.history]
        return data


def _check_series(d: np.ndarray, context: np.ndarray | None, window: int, channels: int, name: str) -> None:
    if d.ndim != 1:
        raise PredictorInputError(f"{name} series must be one-dimensional, got shape {d.shape}")
    if len(d) < window + 2:
        raise PredictorInputError(
            f"{name} series has {len(d)} steps; the predictor needs at least window + 2 = {window + 2}"
        )
    if not np.all(np.isfinite(d)):
        raise PredictorInputError(f"{name} series contains NaN or infinite values")
    if channels == 0 and context is not None:
        raise PredictorInputError(f"{name} context given but the predictor config has context_channels=0")
    if channels > 0:
        if context is None:
            raise PredictorInputError(
                f"{name} context missing: the predictor config has context_channels={channels}"
            )
        if context.shape != (len(d), channels):
            raise PredictorInputError(
                f"{name} context must have shape ({len(d)}, {channels}), got {context.shape}"
            )
        if not np.all(np.isfinite(context)):
            raise PredictorInputError(f"{name} context contains NaN or infinite values")


def censor_noise_std(demand: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Per row of ``demand`` ``(..., L)``, the std ``(...)`` of the synthetic threshold's noise, drawn uniformly
    from ``_CENSOR_NOISE_RANGE`` (the paper's range, in scaled units)."""
    return rng.uniform(*_CENSOR_NOISE_RANGE, size=demand.shape[:-1])


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
    _check_series(d, ctx, window, channels, "training")
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


def _predict_series(model: GaussianLSTM, series: np.ndarray, context: np.ndarray | None,
                    window: int, services: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(mu, sigma, target)`` on every uncensored window of ``series`` (of ``services`` segments end to
    end, none straddled), built in bounded blocks."""
    series = np.asarray(series, dtype=np.float64)
    context = None if context is None else np.asarray(context, dtype=np.float64)
    _check_series(series, context, window, model.cfg.context_channels, "evaluation")
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
    m, s, t = _predict_series(model, series, context, window, services)
    z = np.abs(t - m) / s
    return {
        "nll": float(np.mean(np.log(s) + 0.5 * z**2)),
        "mae": float(np.mean(np.abs(t - m))),
        "coverage_1sigma": float(np.mean(z <= 1.0)),
        "coverage_2sigma": float(np.mean(z <= 2.0)),
    }


def calibrate_sigma(model: Predictor, series: np.ndarray, context: np.ndarray | None, window: int, *,
                    temperature: bool = True, services: int = 1) -> float:
    """Held-out calibration of the predicted std on the windows of ``series`` (the validation split),
    stored in the model's head; returns the temperature.

    With ``temperature``, temperature scaling (Kuleshov et al., ICML 2018, for regression): ``T =
    sqrt(mean(((d - mu) / sigma)^2))`` is the scale that minimises the Gaussian NLL Eq. (3) of ``T * sigma``
    (else ``T = 1``). Always: ``residual_rms = sqrt(mean((d - mu)^2))``, the NLL-optimal *constant* std."""
    with torch.no_grad():
        model.head.sigma_scale.fill_(1.0)
        m, s, t = _predict_series(model, series, context, window, services)
        scale = float(np.sqrt(np.mean(((t - m) / s) ** 2))) if temperature else 1.0
        model.head.sigma_scale.fill_(max(scale, 1e-6))
        model.head.residual_rms.fill_(max(float(np.sqrt(np.mean((t - m) ** 2))), model.cfg.sigma_min))
    return scale


def train_predictor(
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
    """Phase 1 / Algorithm 1 line 2: ``theta* = argmin_theta sum NLL(d_i; f_theta(x_i))``, Eq. (3).

    Adam on minibatches of at most ``cfg.max_train_windows`` windows per epoch (re-sampled and
    re-censored every epoch), early stopping on the validation NLL after ``cfg.patience`` epochs
    without improvement; the best epoch's weights are restored and, with ``cfg.calibrate_sigma``, its
    ``sigma`` is temperature-scaled on the validation split (:func:`calibrate_sigma`). Deterministic under ``seed``; the
    global torch RNG is left untouched. ``progress`` receives ``{"epoch", "train_nll", "val_nll",
    "val_mae"}`` once per epoch. ``model_factory`` builds the model from ``cfg`` (the Gaussian LSTM;
    the Phase-1 substitutions of the comparison pass theirs and train by the same loop). A fleet's
    splits hold ``services`` series end to end; no window straddles two.
    """
    if cfg.kind == "incremental":  # the carried LSTM trains on sequences (its own module); a Gaussian LSTM only
        from picrl_core.incremental_predictor import train_incremental_predictor

        if model_factory is not GaussianLSTM:
            raise PredictorInputError("the incremental predictor is a Gaussian LSTM; "
                                      f"{getattr(model_factory, '__name__', model_factory)} cannot be carried")

        return train_incremental_predictor(train, val, cfg, seed=seed, train_context=train_context,  # type: ignore[return-value]
                                           val_context=val_context, progress=progress, services=services)
    train = np.asarray(train, dtype=np.float64)
    val = np.asarray(val, dtype=np.float64)
    train_context = None if train_context is None else np.asarray(train_context, dtype=np.float64)
    val_context = None if val_context is None else np.asarray(val_context, dtype=np.float64)
    _check_series(train, train_context, cfg.window, cfg.context_channels, "training")
    _check_series(val, val_context, cfg.window, cfg.context_channels, "validation")
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
