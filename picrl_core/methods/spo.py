"""Full-pipeline baseline (Table 2): SPO+ decision-focused training of a point predictor.

Elmachtoub & Grigas, "Smart 'Predict, then Optimize'", Management Science 68(1), 2022. A point
prediction ``p`` of next-tick demand is turned into the decision ``w*(p) = argmin_{w in [0,1]} l(w, p)
= clip(p, 0, 1)`` (provision what is predicted), with ``l`` the asymmetric cost Eq. (1); the SPO loss
is the excess cost of that decision, ``l(w*(p), d) - z*(d)`` with ``z*(d) = min_w l(w, d) = 0``.

SPO+ for this piecewise-linear cost. E&G derive SPO+ by bounding the SPO loss, for any ``alpha >= 0``, by
evaluating the decision objective at the worst feasible ``w`` relative to the predicted problem:

    l(w*(p), d) - z*(d)  <=  max_{w in [0,1]} { l(w, d) - alpha * l(w, p) } + alpha * z*(p) - z*(d),

because ``w*(p)`` is one of the ``w`` and ``l(w*(p), p) = z*(p)``; they take ``alpha = 2``. (Their
further step, replacing ``z*(p)`` by ``l(w*(d), p)``, is only needed to make a *concave* ``z*``
convex in a linear problem; here ``z*(p) = c_under (p - 1)_+ + c_over (-p)_+`` is already convex, so
the bound is used as it stands.) For ``p, d`` in ``[0, 1]``: ``l(w, d) <= l(p, d) + max(c_u, c_o)|w - p|``
and ``alpha * l(w, p) >= alpha * min(c_u, c_o)|w - p|``, so whenever ``alpha >= max(c_u, c_o) /
min(c_u, c_o)`` — ``alpha = 2`` for the paper's ``c_under = 2, c_over = 1``; we take ``alpha = max(2,
that ratio)`` — the maximum is attained at ``w = p`` and

    SPO+(p, d) = l(p, d) = c_under (d - p)_+ + c_over (p - d)_+,

the surrogate is *tight*: decision-focused training of the point predictor minimises the asymmetric
cost of provisioning the prediction (a pinball loss at the critical fractile c_u / (c_u + c_o)),
convex and piecewise linear in ``p``, with subgradient ``-c_under`` where ``d > p`` and ``c_over``
where ``d < p``. :func:`spo_plus_loss` is that loss, extended linearly outside ``[0, 1]`` (there it is
still an upper bound of the SPO loss, stays convex and keeps a gradient back into the range).

Hypothesis class: E&G's linear model, here on the window of the last ``W`` demand values (and their
context rows): ``p = y_last + theta . x + beta``, starting at persistence (``theta = beta = 0``).
Trained offline on the training split's windows (uncensored logs; the censoring channel of the Phase-1
inputs is dropped) by Adam on minibatches of the Phase-1 ``batch_size``, at most the Phase-1
``max_train_windows`` windows per epoch, for at most :data:`SPO_EPOCHS` epochs with early stopping on
the validation SPO+ loss after :data:`SPO_PATIENCE` epochs without improvement, at rate :data:`SPO_LR`
(a linear model is cheap, so it gets its own, longer budget: the Phase-1 epochs are sized for an LSTM).
Online it provisions ``clip(p, 0, 1)`` from the observed window, censored values taken as observed: the
loss assumed fully observed labels, which is how it drifts under PIC.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import torch

from picrl_core.config import CostConfig, PicRLConfig
from picrl_core.controller import _last_window, _shift
from picrl_core.methods.base import Provisioner
from picrl_core.predictor.windowed import make_windows
from picrl_core.rules.feed import context_rows
from picrl_core.series import PreparedSeries, segment_starts

SPO_EPOCHS = 60
SPO_PATIENCE = 5
SPO_LR = 5e-3


def spo_plus_loss(p: torch.Tensor, d: torch.Tensor, cost: CostConfig) -> torch.Tensor:
    """Mean SPO+ loss of predictions ``p`` for demand ``d``: ``c_under (d - p)_+ + c_over (p - d)_+``."""
    gap = d - p
    return (cost.c_under * torch.clamp(gap, min=0.0) + cost.c_over * torch.clamp(-gap, min=0.0)).mean()


class LinearDemandModel(torch.nn.Module):
    """``p = y_last + theta . x + beta`` over a window ``x`` of ``W`` values and ``W x C`` context."""

    def __init__(self, window: int, channels: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(window * (1 + channels), 1)
        with torch.no_grad():
            self.linear.weight.zero_()
            self.linear.bias.zero_()

    def forward(self, y: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """``y`` (B, W) and ``context`` (B, W, C) -> ``p`` (B,)."""
        x = torch.cat([y, context.reshape(context.shape[0], -1)], dim=1)
        return y[:, -1] + self.linear(x)[:, 0]


def _split(windows: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Phase-1 windows ``[y, c, ctx]`` -> ``(y, ctx)`` tensors (the censoring channel is dropped)."""
    return torch.from_numpy(windows[:, :, 0].copy()), torch.from_numpy(windows[:, :, 2:].copy())


def train_spo(series: PreparedSeries, config: PicRLConfig) -> LinearDemandModel:
    """Minimise the SPO+ loss over the training windows; keep the epoch with the best validation loss."""
    cfg = config.predictor
    width = cfg.window
    channels = 0 if series.train_ctx is None else series.train_ctx.shape[1]
    rng = np.random.default_rng(config.seed)
    val_x, val_t = make_windows(
        series.val,
        series.val_ctx,
        width,
        rng,
        0.0,
        starts=segment_starts(len(series.val), series.services, 0, width + 1),
    )
    val_y, val_ctx = _split(val_x)
    val_target = torch.from_numpy(val_t)
    every = segment_starts(len(series.train), series.services, 0, width + 1)
    per_epoch = min(every.size, cfg.max_train_windows)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = LinearDemandModel(width, channels)
    optimizer = torch.optim.Adam(model.parameters(), lr=SPO_LR)
    best_loss, best_epoch, best_state = math.inf, 0, copy.deepcopy(model.state_dict())
    for epoch in range(1, SPO_EPOCHS + 1):
        x, t = make_windows(
            series.train, series.train_ctx, width, rng, 0.0, starts=every[rng.permutation(every.size)[:per_epoch]]
        )
        y, ctx = _split(x)
        target = torch.from_numpy(t)
        for lo in range(0, per_epoch, cfg.batch_size):
            batch = slice(lo, lo + cfg.batch_size)
            loss = spo_plus_loss(model(y[batch], ctx[batch]), target[batch], config.cost)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            val_loss = spo_plus_loss(model(val_y, val_ctx), val_target, config.cost).item()
        if val_loss < best_loss:
            best_loss, best_epoch, best_state = val_loss, epoch, copy.deepcopy(model.state_dict())
        elif epoch - best_epoch >= SPO_PATIENCE:
            break
    model.load_state_dict(best_state)
    return model.eval()


class SPOProvisioner(Provisioner):
    """Provision the SPO+-trained prediction from the observed window: ``a = clip(p, 0, 1)``."""

    def __init__(self, model: LinearDemandModel, window: int, channels: int) -> None:
        self.model = model
        self.window = window
        self.channels = channels

    def start(self, history: np.ndarray, history_context: np.ndarray | None) -> np.ndarray:
        history = np.asarray(history, dtype=np.float32)
        if history.ndim != 2 or history.shape[1] < 1:
            raise ValueError(f"history must have shape (services, steps >= 1); got {history.shape}")
        context = context_rows(history_context, history.shape, self.channels, "history_context")
        self.observations, self.context = _last_window(history, context, self.window)
        return self._decide()

    def act(self, y: np.ndarray, censored: np.ndarray, context: np.ndarray | None) -> np.ndarray:
        n = self.observations.shape[0]
        row = context_rows(
            None if context is None else np.asarray(context)[:, None, :], (n, 1), self.channels, "context"
        )
        self.observations = _shift(self.observations, np.asarray(y, dtype=np.float32))
        self.context = _shift(self.context, row[:, 0, :])
        return self._decide()

    def _decide(self) -> np.ndarray:
        with torch.inference_mode():
            p = self.model(torch.from_numpy(self.observations), torch.from_numpy(self.context)).numpy()
        return np.clip(p.astype(np.float64), 0.0, 1.0)


def fit_spo(series: PreparedSeries, config: PicRLConfig) -> SPOProvisioner:
    """SPO+ training on the training split, then the online provisioner."""
    channels = 0 if series.train_ctx is None else series.train_ctx.shape[1]
    return SPOProvisioner(train_spo(series, config), config.predictor.window, channels)
