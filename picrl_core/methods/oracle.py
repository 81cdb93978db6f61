"""The hindsight references of Table 2: a base forecast plus the best constant buffer in hindsight.

Neither is a method nor a bound. Both are the only provisioners allowed to read the test split
(``series.test``) in their fit, and both act on a base ``m_t`` computed from the *true* demand, which no
method sees. With ``d_0..d_{T-1}`` the test demand,

    a_t = clip(m_t + b*, 0, 1),   b* = argmin_b sum_{t=0}^{T-1} l(clip(m_t + b, 0, 1), d_t),

``l`` the asymmetric cost Eq. (1). The total is piecewise linear in ``b`` with kinks where some
``m_t + b`` meets ``d_t``, 0 or 1, so ``b*`` is the best of those kinks (:func:`hindsight_buffer`).
Without the clip, ``b*`` is the ``c_under / (c_under + c_over)`` quantile of the residuals ``d_t - m_t``:
the newsvendor on the base forecast with its residuals' distribution known in hindsight. It is the best
*constant* margin on that forecast; a rule whose margin moves with the state (PIC-RL's ``k sigma + m``,
conformal's quantile) can beat it, and on a smooth trace many do.

* ``oracle`` (:func:`fit_oracle`): persistence, ``m_t = d_{t-1}`` (``d_{-1}`` the last validation value,
  the end of the uncensored history the test episode starts from).
* ``oracle-mu`` (:func:`fit_oracle_mu`): PIC-RL's own Phase-1 predictor (the same training, config and
  ``predictor.kind``), ``m_t = mu_t`` read on the *true* history: the predictor started on the last
  validation window and fed ``(d_t, c_t = 0)`` every tick (:func:`~picrl_core.predictor.kinds.forecasts_as_acted`).
  Not the ``mu`` PIC-RL's controller sees under censoring: that one depends on the actions in force, so
  it would change with ``b`` and the kink sweep would not give the argmin; on the true history ``mu`` is
  fixed and the reference isolates the decision from the predictor: how far a constant margin on this
  predictor's uncensored forecast goes.

Online, a reference replays ``series.test`` tick by tick (the loop's demand must be the test split,
one copy per service, as :func:`picrl_core.pipeline.evaluation_inputs` builds it): the history's last
value is checked against the validation split's and every uncensored observation against the test
split, so running one on other demand fails loudly.
"""

from __future__ import annotations

import numpy as np

from picrl_core.config import CostConfig, PicRLConfig
from picrl_core.costs import asymmetric_cost
from picrl_core.methods.base import Provisioner
from picrl_core.pipeline import config_for, train_phase1
from picrl_core.predictor.kinds import forecasts_as_acted
from picrl_core.series import PreparedSeries

TOLERANCE = 1e-9  # an observation further than this from the replayed split is other demand


def hindsight_buffer(base: np.ndarray, demand: np.ndarray, cost: CostConfig) -> float:
    """``b*`` minimising ``f(b) = sum_t l(clip(base_t + b, 0, 1), demand_t)`` (``(T,)`` arrays).

    Term ``t`` has slope 0 in ``b`` below ``-base_t`` (action clipped to 0), ``-c_under`` up to
    ``demand_t - base_t``, ``c_over`` up to ``1 - base_t`` and 0 above (clipped to 1); ``f`` is
    swept along the sorted kinks from its value ``sum_t l(0, demand_t)`` below all of them.
    """
    base = np.asarray(base, dtype=np.float64)
    demand = np.asarray(demand, dtype=np.float64)
    n = base.size
    kinks = np.concatenate([-base, demand - base, 1.0 - base])
    changes = np.repeat([-cost.c_under, cost.c_under + cost.c_over, -cost.c_over], n)
    order = np.argsort(kinks, kind="stable")
    kinks, slope = kinks[order], np.cumsum(changes[order])  # slope[i]: on [kinks[i], kinks[i + 1])
    total = asymmetric_cost(0.0, demand, cost).sum() + np.concatenate([[0.0], np.cumsum(slope[:-1] * np.diff(kinks))])
    return float(kinks[np.argmin(total)])


class HindsightProvisioner(Provisioner):
    """Replays the test split: ``a_t = clip(base_t + b*, 0, 1)`` for every service, ``base`` known in advance."""

    def __init__(self, demand: np.ndarray, base: np.ndarray, buffer: np.ndarray, history_end: np.ndarray) -> None:
        self.demand = np.asarray(demand, dtype=np.float64)  # (T, N): the test split
        self.base = np.asarray(base, dtype=np.float64)  # (T, N): m_t
        self.buffer = np.asarray(buffer, dtype=np.float64)  # (N,): each service's b*
        self.history_end = np.asarray(history_end, dtype=np.float64)  # (N,): the last validation value

    def start(self, history: np.ndarray, history_context: np.ndarray | None) -> np.ndarray:
        history = np.asarray(history, dtype=np.float64)
        if history.ndim != 2 or history.shape[1] < 1:
            raise ValueError(f"history must have shape (services, steps >= 1); got {history.shape}")
        if np.any(np.abs(history[:, -1] - self.history_end) > TOLERANCE):  # broadcast: copies of one service
            raise ValueError(
                "the history does not end where the validation split does; a hindsight reference "
                "only replays the test split"
            )
        self.services = history.shape[0]
        self.tick = 0
        return self._action()

    def act(self, y: np.ndarray, censored: np.ndarray, context: np.ndarray | None) -> np.ndarray:
        if self.tick + 1 >= self.demand.shape[0]:
            raise ValueError(f"the reference knows {self.demand.shape[0]} test ticks; the loop ran longer")
        d = self.demand[self.tick]
        y = np.asarray(y, dtype=np.float64)
        if np.any(~np.asarray(censored, dtype=bool) & (np.abs(y - d) > TOLERANCE)):
            raise ValueError(
                f"tick {self.tick}: the observed demand is not series.test's; a hindsight reference only replays "
                "the test split"
            )
        self.tick += 1
        return self._action()

    def _action(self) -> np.ndarray:
        return np.clip(np.broadcast_to(self.base[self.tick] + self.buffer, (self.services,)), 0.0, 1.0)


def _replay(series: PreparedSeries, base: np.ndarray, config: PicRLConfig) -> HindsightProvisioner:
    """The reference on ``base`` ``(N, T)``, each service of a fleet with its own ``b*`` on the test split."""
    test = series.by_service("test")
    buffer = np.array([hindsight_buffer(m, d, config.cost) for m, d in zip(base, test)])
    return HindsightProvisioner(test.T, base.T, buffer, series.by_service("val")[:, -1])


def fit_oracle(series: PreparedSeries, config: PicRLConfig) -> HindsightProvisioner:
    """Persistence plus the best buffer in hindsight; reads ``series.test`` (and the last validation value)."""
    test = series.by_service("test")
    return _replay(series, np.concatenate([series.by_service("val")[:, -1:], test[:, :-1]], axis=1), config)


def fit_oracle_mu(series: PreparedSeries, config: PicRLConfig) -> HindsightProvisioner:
    """PIC-RL's Phase-1 predictor's ``mu`` on the true history plus the best buffer in hindsight; reads
    ``series.test``. The predictor is :func:`~picrl_core.pipeline.train_phase1` as PIC-RL's
    :func:`~picrl_core.pipeline.train_offline` calls it (shared inside ``shared_training``)."""
    config = config_for(series, config)
    model = train_phase1(series, config)[0].eval()
    window, n = model.cfg.window, series.services
    if series.val.size < n * window:
        raise ValueError(f"the validation split is shorter than the predictor's window ({window})")

    def episode(val: np.ndarray, test: np.ndarray) -> np.ndarray:
        """Each service's last validation window then its test split, services end to end."""
        rows = [values.reshape(n, -1, *values.shape[1:]) for values in (val, test)]
        return np.concatenate([rows[0][:, -window:], rows[1]], axis=1).reshape(-1, *val.shape[1:])

    context = None
    if series.val_ctx is not None and series.test_ctx is not None:
        context = episode(series.val_ctx, series.test_ctx)
    mu, _, _ = forecasts_as_acted(model, episode(series.val, series.test), context, n)
    return _replay(series, mu.reshape(n, -1), config)
