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
:mod:`picrl_core.methods.thompson`. The provisioner is the deployable rule of :mod:`picrl_core.rules.conformal` (its
residual pool in float32), so the comparison scores what a worker runs.
"""

from __future__ import annotations

import numpy as np

from picrl_core.config import PicRLConfig
from picrl_core.controller import _last_window, _shift
from picrl_core.costs import critical_ratio
from picrl_core.methods.deployed import RuleProvisioner
from picrl_core.methods.selection import Selection, select_on_validation
from picrl_core.pipeline import phase1_predictor
from picrl_core.predictor.model import GaussianLSTM
from picrl_core.predictor.windowed import make_windows, predict_gaussian
from picrl_core.rules.conformal import ConformalRule
from picrl_core.rules.feed import context_rows
from picrl_core.series import PreparedSeries, segment_starts

CONFORMAL_WINDOW = 256  # residuals kept per service (the calibration set size n)
# Candidate gammas of adaptive conformal inference (Gibbs & Candes 2021 use 0.005), chosen on validation.
ACI_STEPS = (0.001, 0.0025, 0.005, 0.01, 0.02)


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


class ConformalProvisioner(RuleProvisioner):
    """The deployable :class:`~picrl_core.rules.conformal.ConformalRule` for services in ``[low, high]``: the very
    rule a worker runs (``picrl worker --method conformal``)."""

    def __init__(
        self,
        model: GaussianLSTM,
        calibration: np.ndarray,
        alpha: float,
        step: float,
        chunk: int,
        low: float | np.ndarray = 0.0,
        high: float | np.ndarray = 1.0,
    ) -> None:
        """``calibration``: the residual pool ``(n,)`` every service starts from, or ``(N, n)``, one per service."""
        super().__init__(ConformalRule(model, calibration, alpha, step, chunk), low, high)


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
    low, high = series.scaler.low, series.scaler.high
    return ConformalProvisioner(model, on_val, alpha, selection.chosen, chunk, low, high)
