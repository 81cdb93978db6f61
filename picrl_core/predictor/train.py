"""Phase 1 training (Sec. 3.1, Algorithm 1 line 2) of either kind of predictor, in stages: the splits, the model,
the epochs with early stopping, the temperature of sigma and the report."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from picrl_core.config import PredictorConfig
from picrl_core.predictor.kinds import kind_of
from picrl_core.predictor.model import (
    EpochSampler,
    Forecasts,
    GaussianLSTM,
    Predictor,
    PredictorInputError,
    PredictorReport,
    check_series,
    fit_sigma,
    forecast_metrics,
)

Progress = Callable[[dict[str, float]], None]


def train_predictor(
    train: np.ndarray,
    val: np.ndarray,
    cfg: PredictorConfig,
    *,
    seed: int,
    train_context: np.ndarray | None = None,
    val_context: np.ndarray | None = None,
    progress: Progress | None = None,
    model_factory: Callable[[PredictorConfig], Predictor] = GaussianLSTM,
    services: int = 1,
) -> tuple[Predictor, PredictorReport]:
    """``theta* = argmin_theta sum NLL(d_i; f_theta(x_i))``, Eq. (3), for the kind ``cfg.kind`` says.

    Adam on each epoch's freshly re-sampled and re-censored training inputs (the kind's
    :class:`~picrl_core.predictor.model.EpochSampler`), early stopping on the validation NLL after ``cfg.patience``
    epochs without improvement; the best epoch's weights are restored and, with ``cfg.calibrate_sigma``, its
    ``sigma`` is temperature-scaled on the validation split (:func:`~picrl_core.predictor.model.fit_sigma`), the
    validation split read as the controller reads the kind. Deterministic under ``seed``; the global torch RNG is
    left untouched. ``progress`` receives ``{"epoch", "train_nll", "val_nll", "val_mae"}`` once per epoch. A fleet's
    splits hold ``services`` series end to end. ``model_factory`` substitutes the windowed kind's network (the
    comparison's Phase-1 baselines train by the same loop); a kind that carries memory carries a Gaussian LSTM's."""
    kind = kind_of(cfg)
    splits = _Splits.checked(train, val, train_context, val_context, cfg)
    sampler = kind.sampler(splits.train, splits.train_context, cfg, services)
    model = _new_model(model_factory, cfg, seed, carried=kind.memory_size(cfg) > 0)

    def forecasts() -> Forecasts:
        return kind.forecasts(model, splits.val, splits.val_context, cfg.window, services)

    history, best_epoch = _fit(model, sampler, forecasts, cfg, seed, progress)
    scale = fit_sigma(model, forecasts, cfg.calibrate_sigma)
    final = forecast_metrics(forecasts())
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
    return model.eval(), report


@dataclass(frozen=True)
class _Splits:
    """The training and validation splits (and their context) as float64 arrays the predictor can use."""

    train: np.ndarray
    val: np.ndarray
    train_context: np.ndarray | None
    val_context: np.ndarray | None

    @classmethod
    def checked(
        cls,
        train: np.ndarray,
        val: np.ndarray,
        train_context: np.ndarray | None,
        val_context: np.ndarray | None,
        cfg: PredictorConfig,
    ) -> _Splits:
        splits = cls(
            np.asarray(train, dtype=np.float64),
            np.asarray(val, dtype=np.float64),
            None if train_context is None else np.asarray(train_context, dtype=np.float64),
            None if val_context is None else np.asarray(val_context, dtype=np.float64),
        )
        check_series(splits.train, splits.train_context, cfg.window, cfg.context_channels, "training")
        check_series(splits.val, splits.val_context, cfg.window, cfg.context_channels, "validation")
        if cfg.epochs < 1 or cfg.batch_size < 1 or cfg.max_train_windows < 1 or cfg.patience < 1:
            raise PredictorInputError("predictor epochs, batch_size, max_train_windows and patience must all be >= 1")
        return splits


def _new_model(
    model_factory: Callable[[PredictorConfig], Predictor], cfg: PredictorConfig, seed: int, carried: bool
) -> Predictor:
    """The network at its initial weights, drawn under ``seed`` without touching the global torch RNG."""
    if carried and model_factory is not GaussianLSTM:
        raise PredictorInputError(
            f"the {cfg.kind} predictor is a Gaussian LSTM; "
            f"{getattr(model_factory, '__name__', model_factory)} cannot be carried"
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return model_factory(cfg)


def _fit(
    model: torch.nn.Module,
    sampler: EpochSampler,
    forecasts: Callable[[], Forecasts],
    cfg: PredictorConfig,
    seed: int,
    progress: Progress | None,
) -> tuple[list[dict[str, float]], int]:
    """Adam epochs until ``cfg.epochs`` or ``cfg.patience`` epochs without a better validation NLL; the best epoch's
    weights restored. Returns each epoch's record and the best epoch (1-based)."""
    rng = np.random.default_rng(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    history: list[dict[str, float]] = []
    best_nll, best_epoch, best_state = math.inf, 0, copy.deepcopy(model.state_dict())
    for epoch in range(1, cfg.epochs + 1):
        train_nll = _epoch(model, optimizer, sampler, rng)
        if not math.isfinite(train_nll):
            raise FloatingPointError(f"predictor training diverged at epoch {epoch} (NLL {train_nll})")
        val = forecast_metrics(forecasts())
        record = {"epoch": epoch, "train_nll": train_nll, "val_nll": val["nll"], "val_mae": val["mae"]}
        history.append(record)
        if progress is not None:
            progress(dict(record))
        if val["nll"] < best_nll:
            best_nll, best_epoch, best_state = val["nll"], epoch, copy.deepcopy(model.state_dict())
        elif epoch - best_epoch >= cfg.patience:
            break
    model.load_state_dict(best_state)
    model.zero_grad(set_to_none=True)
    return history, best_epoch


def _epoch(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, sampler: EpochSampler, rng: np.random.Generator
) -> float:
    """One Adam pass over a fresh draw of training inputs in minibatches; their mean NLL (Eq. 3)."""
    x, t = sampler.draw(rng)
    total = 0.0
    for lo in range(0, sampler.per_epoch, sampler.batch):
        rows = slice(lo, lo + sampler.batch)
        loss = sampler.loss(model, x[rows], t[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        total += loss.item() * len(x[rows])
    return total / sampler.per_epoch
