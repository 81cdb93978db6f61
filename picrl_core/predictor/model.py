"""Phase 1 (Sec. 3.1), what both kinds of predictor share: the Gaussian LSTM, its head and its NLL, Eq. (3).

The predictor reads the online PIC inputs, channels ``[y, c, ctx_1..ctx_C]`` where ``y_t = min(d_t, a_t)`` is the
observation and ``c_t = 1[d_t > a_t]`` the censoring indicator, and predicts the demand of the next step as a
Gaussian ``(mu, sigma)``. Training uses a fully observed historical series; a share of its inputs is re-censored
under synthetic provisioning thresholds (:func:`censor_noise_std`) so the model has seen censored inputs before it
meets them online. The two kinds (``predictor.kind``, :mod:`picrl_core.predictor.kinds`) differ in how the LSTM
reads them: :mod:`~picrl_core.predictor.windowed` re-reads a window from a zero state every tick,
:mod:`~picrl_core.predictor.incremental` carries its ``(h, c)``; both act through one :class:`Forecaster`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Protocol, TypeVar

import numpy as np
import torch

from picrl_core.config import PredictorConfig

# Std of the per-step noise of the synthetic provisioning threshold, drawn per window from this range (in the
# series' scaled units).
_CENSOR_NOISE_RANGE = (0.01, 0.1)
# Predicted std at initialisation (demand lives in [0, 1]); keeps the first NLL gradients moderate.
_INITIAL_SIGMA = 0.1

# ``(mu, sigma)`` float64 ``(B,)`` for the next tick and the predictor's memory float32 ``(B, M)`` after the newest
# row (``M = 0`` for a predictor that carries none).
Forecast = tuple[np.ndarray, np.ndarray, np.ndarray]
# ``(mu, sigma, target)`` float64 of every point of a fully observed series that a prediction reaches.
Forecasts = tuple[np.ndarray, np.ndarray, np.ndarray]


class PredictorInputError(ValueError):
    """A series, context or window array the predictor cannot use."""


def gaussian_head(hidden: int, cfg: PredictorConfig) -> torch.nn.Linear:
    """The Gaussian output layer ``h -> (mu offset, pre-softplus sigma)``: small weights, zero mean
    offset and a sigma bias that starts the predicted std near ``_INITIAL_SIGMA``. It carries two buffers
    that :func:`fit_sigma` sets on the validation split, so a saved model holds them: the
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


def gaussian_output(
    head: torch.nn.Linear, h: torch.Tensor, level: torch.Tensor, sigma_min: float
) -> tuple[torch.Tensor, torch.Tensor]:
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
            raise PredictorInputError("predictor config needs window, hidden and layers >= 1 and context_channels >= 0")
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
    """Outcome of :func:`~picrl_core.predictor.train.train_predictor`; validation metrics are those of the
    restored best epoch (after the temperature ``sigma_scale``)."""

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


class EpochSampler(Protocol):
    """A kind's training inputs for :func:`~picrl_core.predictor.train.train_predictor`: each epoch ``draw`` re-samples
    and re-censors ``per_epoch`` rows of the training split, taken in minibatches of ``batch`` rows whose ``loss`` is
    the NLL of Eq. (3)."""

    per_epoch: int
    batch: int

    def draw(self, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]: ...

    def loss(self, model: torch.nn.Module, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor: ...


class Forecaster(Protocol):
    """Phase 1 as the controller runs it, whichever kind: ``start`` reads a window of PIC inputs from a cold start,
    ``advance`` takes the window after one more tick with the memory ``start`` or the last ``advance`` returned.
    ``observations`` ``(B, W)`` float32, ``censored`` ``(B, W)`` bool, ``context`` ``(B, W, C)`` float32."""

    def start(self, observations: np.ndarray, censored: np.ndarray, context: np.ndarray) -> Forecast: ...

    def advance(
        self, observations: np.ndarray, censored: np.ndarray, context: np.ndarray, memory: np.ndarray
    ) -> Forecast: ...


def pic_inputs(observations: np.ndarray, censored: np.ndarray, context: np.ndarray) -> np.ndarray:
    """The predictor's input rows ``[y, c, ctx...]`` ``(B, W, 2 + C)`` float32 of a window."""
    return np.concatenate([observations[:, :, None], censored[:, :, None].astype(np.float32), context], axis=2)


def check_series(d: np.ndarray, context: np.ndarray | None, window: int, channels: int, name: str) -> None:
    """Refuse (:class:`PredictorInputError`) a series ``d`` that is not 1-D, finite and longer than ``window + 1``,
    or a ``context`` that does not hold ``channels`` finite columns per step."""
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
            raise PredictorInputError(f"{name} context missing: the predictor config has context_channels={channels}")
        if context.shape != (len(d), channels):
            raise PredictorInputError(f"{name} context must have shape ({len(d)}, {channels}), got {context.shape}")
        if not np.all(np.isfinite(context)):
            raise PredictorInputError(f"{name} context contains NaN or infinite values")


def censor_noise_std(demand: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Per row of ``demand`` ``(..., L)``, the std ``(...)`` of the synthetic threshold's noise, drawn uniformly
    from ``_CENSOR_NOISE_RANGE`` (the paper's range, in scaled units)."""
    return rng.uniform(*_CENSOR_NOISE_RANGE, size=demand.shape[:-1])


def forecast_metrics(forecasts: Forecasts) -> dict[str, float]:
    """NLL (Eq. 3), MAE of ``mu`` and the shares of targets within 1 and 2 ``sigma`` of ``mu``."""
    m, s, t = forecasts
    z = np.abs(t - m) / s
    return {
        "nll": float(np.mean(np.log(s) + 0.5 * z**2)),
        "mae": float(np.mean(np.abs(t - m))),
        "coverage_1sigma": float(np.mean(z <= 1.0)),
        "coverage_2sigma": float(np.mean(z <= 2.0)),
    }


def fit_sigma(model: torch.nn.Module, forecasts: Callable[[], Forecasts], temperature: bool = True) -> float:
    """Held-out calibration of the predicted std, stored in the model's head; returns the temperature.
    ``forecasts()`` predicts the validation split with the head's temperature reset to 1.

    With ``temperature``, temperature scaling (Kuleshov et al., ICML 2018, for regression): ``T =
    sqrt(mean(((d - mu) / sigma)^2))`` is the scale that minimises the Gaussian NLL Eq. (3) of ``T * sigma``
    (else ``T = 1``). Always: ``residual_rms = sqrt(mean((d - mu)^2))``, the NLL-optimal *constant* std."""
    with torch.no_grad():
        model.head.sigma_scale.fill_(1.0)
        m, s, t = forecasts()
        scale = float(np.sqrt(np.mean(((t - m) / s) ** 2))) if temperature else 1.0
        model.head.sigma_scale.fill_(max(scale, 1e-6))
        model.head.residual_rms.fill_(max(float(np.sqrt(np.mean((t - m) ** 2))), model.cfg.sigma_min))
    return scale
