"""Full-pipeline baseline (Table 2): Autopilot's moving-window recommender.

Rzadca et al., "Autopilot: Workload Autoscaling at Google", EuroSys 2020, Sec. 3.2 ("moving window
recommenders"). Usage samples are kept in a histogram (400 buckets, as Autopilot's CPU histograms)
over a moving window of ``N`` samples, each weighted by the exponentially decaying
``w[tau] = 2^(-tau / t_half)`` (``t_half`` the half-life), so limits rise as soon as usage rises but
fall only slowly after it drops. The recommendation is one of the paper's window statistics:

* ``"max"``: ``S_max``, the peak over the window (the highest occupied bucket's boundary) — Autopilot's
  choice for the memory of jobs that cannot tolerate OOMs;
* ``"p98"``, ``"p95"``, ...: ``S_p^j``, the j-th percentile of the decayed histogram of *load-adjusted*
  usage (every bucket weighted by its value too, a percentile of usage rather than of time) — p98 for
  OOM-tolerant memory, p95/p90 for the CPU of serving jobs;
* ``"avg"``: ``S_avg``, the decayed weighted average — the CPU of batch jobs;

and the limit is the statistic plus a safety margin, here ``(1 + AUTOPILOT_MARGIN)`` times it. A
shortage under PIC drops requests, so the default is the OOM-intolerant ``S_max``. Under PIC the
samples are the observations ``y = min(d, a)``: after a shortage the censored sample equals the limit
itself, so ``S_max`` re-provisions ``(1 + margin)`` times the last limit and the limit ratchets up until
demand fits. Window, half-life and margin are module constants (the paper tunes them per job class;
the values here are ours): one diurnal period, 12 h, 10%; durations are converted to ticks with
``step_seconds``. Context is not used; nothing is trained (``series`` is not read).
"""

from __future__ import annotations

import numpy as np

from picrl_core.config import PicRLConfig
from picrl_core.methods.base import Provisioner
from picrl_core.methods.vpa import DEFAULT_STEP_SECONDS, DecayingHistogram, ticks
from picrl_core.series import PreparedSeries

AUTOPILOT_BUCKETS = 400  # histogram buckets over the unit range
AUTOPILOT_WINDOW_S = 24 * 3600.0  # moving window N
AUTOPILOT_HALF_LIFE_S = 12 * 3600.0  # t_half of the sample weights
AUTOPILOT_MARGIN = 0.10  # safety margin on the statistic
AUTOPILOT_STATISTIC = "max"


def _percent(statistic: str) -> float:
    """The percent of a ``"p<percent>"`` statistic, e.g. 98 for ``"p98"``."""
    try:
        percent = float(statistic[1:]) if statistic.startswith("p") else float("nan")
    except ValueError:
        percent = float("nan")
    if not 0 < percent <= 100:
        raise ValueError(f"statistic must be 'max', 'avg' or 'p<percent>' (e.g. 'p98'); got {statistic!r}")
    return percent


class AutopilotProvisioner(Provisioner):
    """``a = min(1, (1 + margin) * S)`` with ``S`` the window statistic of the observations."""

    def __init__(
        self, window: int, half_life: float, statistic: str = AUTOPILOT_STATISTIC, margin: float = AUTOPILOT_MARGIN
    ) -> None:
        self.percent = None if statistic in ("max", "avg") else _percent(statistic)
        self.window = window
        self.half_life = half_life
        self.statistic = statistic
        self.margin = margin
        self.edges = np.linspace(0.0, 1.0, AUTOPILOT_BUCKETS + 1)

    def start(self, history: np.ndarray, history_context: np.ndarray | None) -> np.ndarray:
        history = np.asarray(history, dtype=np.float64)
        if history.ndim != 2 or history.shape[1] < 1:
            raise ValueError(f"history must have shape (services, steps >= 1); got {history.shape}")
        self.histogram = DecayingHistogram(self.edges, history.shape[0], self.half_life, self.window)
        for column in history.T:
            self.histogram.add(column)
        return self.recommendation()

    def act(self, y: np.ndarray, censored: np.ndarray, context: np.ndarray | None) -> np.ndarray:
        self.histogram.add(np.asarray(y, dtype=np.float64))
        return self.recommendation()

    def recommendation(self) -> np.ndarray:
        """The limit for the next tick from the current window."""
        if self.statistic == "max":
            value = self.histogram.peak()
        elif self.percent is None:
            value = self.histogram.average()
        else:
            value = self.histogram.percentile(self.percent / 100.0, load_adjusted=True)
        return np.clip(value * (1.0 + self.margin), 0.0, 1.0)


def fit_autopilot(
    series: PreparedSeries,
    config: PicRLConfig,
    *,
    step_seconds: float = DEFAULT_STEP_SECONDS,
    statistic: str = AUTOPILOT_STATISTIC,
) -> AutopilotProvisioner:
    """The moving-window recommender with its window and half-life in ticks of ``step_seconds``."""
    return AutopilotProvisioner(
        ticks(AUTOPILOT_WINDOW_S, step_seconds), ticks(AUTOPILOT_HALF_LIFE_S, step_seconds), statistic
    )
