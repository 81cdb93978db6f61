"""Phase-3 substitution (Table 2): one-sided conformal calibration on the Phase-1 predictor.

PIC-RL's reactive calibrator is replaced by an online conformal upper bound on the *same* Gaussian
LSTM (trained by :func:`~picrl_core.pipeline.phase1_predictor` with the config's budgets); Phase 2 is
omitted, as conformal prediction has no offline RL component. The action is

    a_t = clip(mu_t + q_t, 0, 1),   q_t = the conformal (1 - alpha_t) quantile of recent residuals y - mu,

the split-conformal quantile of Angelopoulos & Bates, "A Gentle Introduction to Conformal
Prediction" (2023), Sec. 1: the ``ceil((n + 1)(1 - alpha))``-th smallest of ``n`` calibration
residuals (``+inf`` when that rank exceeds ``n``). The target miscoverage is the newsvendor's: a
shortage should happen with probability ``alpha = c_over / (c_under + c_over)``, so ``mu + q`` is the
critical-fractile quantile ``c_under / (c_under + c_over)`` of demand (paper: "one-sided (upper)
calibration to match the newsvendor-style asymmetric decision objective").

Calibration set: the residuals of the predictor on the (uncensored) validation split seed every
service's pool of the last :data:`CONFORMAL_WINDOW` residuals; each tick's residual then replaces the
oldest. Under PIC a censored residual is only a lower bound (``d - mu > a - mu``): it enters the pool
as ``+inf``, i.e. above every candidate quantile. That can only raise the quantile, so the one-sided
guarantee the true residuals would give is kept (conservatively). A censored observation below the
action (a soft resource whose requests failed on a hard one, :mod:`picrl_core.resources`) says
nothing about coverage: that service's pool and ``alpha_t`` skip the tick.

Miscoverage is exactly observable under PIC (it *is* the censoring flag ``c_t = 1[d_t > a_t]``), so
``alpha_t`` follows adaptive conformal inference (Gibbs & Candes, "Adaptive Conformal Inference
Under Distribution Shift", NeurIPS 2021, Eq. 2): ``alpha_{t+1} = alpha_t + gamma (alpha - c_t)``,
which drives the long-run shortage rate to ``alpha`` whatever the drift (and undoes the conservatism
of the ``+inf`` residuals). Its step ``gamma`` is chosen on the validation split among :data:`ACI_STEPS`
(:mod:`picrl_core.methods.selection`; candidates calibrated on the training split's residuals there). The
rank is clipped to ``[1, n + 1]`` (``alpha_t >= 1`` would otherwise
ask for an empty set, i.e. provision nothing).

:class:`PredictorFeed` (the predictor's rolling ``[y, c, ctx]`` windows) is shared with
:mod:`picrl_core.methods.thompson`.
"""

from __future__ import annotations

import numpy as np

from picrl_core.calibrator import feedback
from picrl_core.config import PicRLConfig
from picrl_core.controller import _last_window, _shift
from picrl_core.costs import critical_ratio
from picrl_core.methods.base import Provisioner
from picrl_core.methods.selection import Selection, select_on_validation
from picrl_core.pipeline import phase1_predictor
from picrl_core.predictor.model import GaussianLSTM
from picrl_core.predictor.windowed import make_windows, predict_gaussian
from picrl_core.series import PreparedSeries, segment_starts

CONFORMAL_WINDOW = 256  # residuals kept per service (the calibration set size n)
# Candidate gammas of adaptive conformal inference (Gibbs & Candes 2021 use 0.005), chosen on validation.
ACI_STEPS = (0.001, 0.0025, 0.005, 0.01, 0.02)


def context_rows(context: np.ndarray | None, shape: tuple[int, ...], channels: int, name: str) -> np.ndarray:
    """Context as a ``(*shape, channels)`` float32 array (empty when the model reads no context)."""
    if channels == 0:
        return np.zeros((*shape, 0), dtype=np.float32)
    if context is None:
        raise ValueError(f"{name} is required: the predictor was trained with {channels} context channel(s)")
    context = np.asarray(context, dtype=np.float32)
    if context.shape != (*shape, channels):
        raise ValueError(f"{name} must have shape {(*shape, channels)}; got {context.shape}")
    return context


class PredictorFeed:
    """The Phase-1 predictor's input for N services: the last W ``(y, c, ctx)`` rows, oldest first,
    kept exactly as :class:`~picrl_core.controller.PicRLController` keeps them (a short history is
    left-padded with its first value; offline history is uncensored)."""

    def __init__(
        self, model: GaussianLSTM, history: np.ndarray, history_context: np.ndarray | None, chunk: int
    ) -> None:
        history = np.asarray(history, dtype=np.float32)
        if history.ndim != 2 or history.shape[1] < 1:
            raise ValueError(f"history must have shape (services, steps >= 1); got {history.shape}")
        self.model = model
        self.chunk = chunk  # rows per forward pass (OnlineConfig.inference_chunk)
        self.channels = model.cfg.context_channels
        context = context_rows(history_context, history.shape, self.channels, "history_context")
        self.observations, self.context = _last_window(history, context, model.cfg.window)
        self.censored = np.zeros(self.observations.shape, dtype=bool)

    def push(self, y: np.ndarray, censored: np.ndarray, context: np.ndarray | None) -> None:
        """Append this tick's feedback (and context row) to every window."""
        n = self.observations.shape[0]
        row = context_rows(
            None if context is None else np.asarray(context)[:, None, :], (n, 1), self.channels, "context"
        )
        self.observations = _shift(self.observations, np.asarray(y, dtype=np.float32))
        self.censored = _shift(self.censored, np.asarray(censored, dtype=bool))
        self.context = _shift(self.context, row[:, 0, :])

    def predict(self) -> tuple[np.ndarray, np.ndarray]:
        """``(mu, sigma)`` of next-tick demand for every service."""
        windows = np.concatenate(
            [self.observations[:, :, None], self.censored[:, :, None].astype(np.float32), self.context], axis=2
        )
        return predict_gaussian(self.model, windows, self.chunk)


def conformal_quantile(residuals: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Per row of ``residuals`` ``(N, n)``: the ``ceil((n + 1)(1 - alpha))``-th smallest value, ``+inf``
    when that rank exceeds ``n`` (rank clipped to at least 1)."""
    n = residuals.shape[1]
    rank = np.ceil((n + 1) * (1.0 - np.asarray(alpha, dtype=np.float64)) - 1e-9).astype(np.int64)
    rank = np.clip(rank, 1, n + 1)
    ordered = np.sort(residuals, axis=1)
    picked = np.take_along_axis(ordered, np.minimum(rank, n)[:, None] - 1, axis=1)[:, 0]
    return np.where(rank <= n, picked, np.inf)


class ConformalProvisioner(Provisioner):
    """``a = clip(mu + q, 0, 1)`` with ``q`` the ACI-adapted conformal quantile of each service's
    residual pool (censored residuals as ``+inf``)."""

    def __init__(self, model: GaussianLSTM, calibration: np.ndarray, alpha: float, step: float, chunk: int) -> None:
        """``calibration``: the residual pool ``(n,)`` every service starts from, or ``(N, n)``, one per service."""
        self.model = model
        self.chunk = chunk
        self.calibration = np.asarray(calibration, dtype=np.float64)
        self.alpha = alpha
        self.step = step

    def start(self, history: np.ndarray, history_context: np.ndarray | None) -> np.ndarray:
        self.feed = PredictorFeed(self.model, history, history_context, self.chunk)
        n = self.feed.observations.shape[0]
        self.residuals = np.array(np.broadcast_to(self.calibration, (n, self.calibration.shape[-1])))
        self.alpha_t = np.full(n, self.alpha)
        return self._decide()

    def act(self, y: np.ndarray, censored: np.ndarray, context: np.ndarray | None) -> np.ndarray:
        y = np.asarray(y, dtype=np.float64)
        censored = np.asarray(censored, dtype=bool)
        shortage, _ = feedback(y, self.action, censored)
        known = ~censored | shortage  # a lower bound below the action (coupled censoring) updates nothing
        shifted = _shift(self.residuals, np.where(censored, np.inf, y - self.mu))
        self.residuals = np.where(known[:, None], shifted, self.residuals)
        self.alpha_t = np.where(known, self.alpha_t + self.step * (self.alpha - shortage), self.alpha_t)
        self.feed.push(y, censored, context)
        return self._decide()

    def _decide(self) -> np.ndarray:
        self.mu, _ = self.feed.predict()
        self.action = np.clip(self.mu + conformal_quantile(self.residuals, self.alpha_t), 0.0, 1.0)
        return self.action


def split_residuals(
    model: GaussianLSTM,
    values: np.ndarray,
    context: np.ndarray | None,
    config: PicRLConfig,
    window: int = CONFORMAL_WINDOW,
    services: int = 1,
) -> np.ndarray:
    """Residuals ``d - mu`` of the predictor on the last ``window`` (uncensored) windows of a split, for
    each of its ``services`` series: ``(window,)`` for one, ``(services, window)`` for a fleet."""
    width = model.cfg.window
    starts = segment_starts(len(values), services, 0, width + 1).reshape(services, -1)[:, -window:]
    windows, targets = make_windows(
        values, context, width, np.random.default_rng(config.seed), 0.0, starts=starts.ravel()
    )
    mu, _ = predict_gaussian(model, windows)
    residuals = (targets.astype(np.float64) - mu).reshape(starts.shape)
    return residuals[0] if services == 1 else residuals


def fit_conformal(
    series: PreparedSeries,
    config: PicRLConfig,
    *,
    predictor: GaussianLSTM | None = None,
    window: int = CONFORMAL_WINDOW,
    steps: tuple[float, ...] = ACI_STEPS,
) -> ConformalProvisioner:
    """Train the Phase-1 predictor (or take ``predictor``, trained on this series), choose the ACI step
    among ``steps`` on the validation split (calibrated there on the training split's last residuals,
    :mod:`picrl_core.methods.selection`), then calibrate on the validation split's last ``window`` residuals."""
    model = phase1_predictor(series, config) if predictor is None else predictor.eval()
    alpha = 1.0 - critical_ratio(config.cost)
    chunk = config.online.inference_chunk
    on_train = split_residuals(model, series.train, series.train_ctx, config, window, series.services)
    selection: Selection[float] = select_on_validation(
        steps, lambda step: ConformalProvisioner(model, on_train, alpha, step, chunk), series, config
    )
    on_val = split_residuals(model, series.val, series.val_ctx, config, window, series.services)
    return ConformalProvisioner(model, on_val, alpha, selection.chosen, chunk)
