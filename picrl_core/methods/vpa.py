"""Operator baseline (Table 2): the Kubernetes Vertical Pod Autoscaler recommender.

Follows the VPA recommender of kubernetes/autoscaler (``vertical-pod-autoscaler/pkg/recommender``):

* usage samples go into a decaying histogram (``util/decaying_histogram.go``) whose sample weights
  halve every 24 hours (``DefaultCPUHistogramDecayHalfLife = DefaultMemoryHistogramDecayHalfLife =
  24h``, ``model/aggregations_config.go``), over exponential buckets growing by 5% each
  (``DefaultHistogramBucketSizeGrowth = 0.05``);
* the target is the histogram's 90th percentile (``--target-cpu-percentile`` /
  ``--target-memory-percentile`` = 0.9), read as the *end* of the bucket that reaches it
  (``util/histogram.go: Percentile``), plus a 15% safety margin
  (``--recommendation-margin-fraction`` = 0.15, ``logic/recommender.go``);
* after an OOM the container's need is recorded as ``max(used * 1.2, used + min_bump)``
  (``DefaultOOMBumpUpRatio = 1.2``, ``DefaultOOMMinBumpUp = 100 MiB``; ``model/container.go:
  RecordOOM``), which becomes the window's peak, so the restarted container gets at least that.

Mapping to PIC: a sample per tick, the observation ``y``; a censored tick (``d > a``, demand hit the
limit) is the OOM: its sample is the bumped ``max(1.2 y, y + VPA_OOM_MIN_BUMP)`` and the next action
is at least that bumped value. Demand lives in ``[0, 1]``, so the absolute constants become shares of
the range: first bucket ``VPA_FIRST_BUCKET`` (VPA: 0.001 cores of a 1000-core range) and minimum
bump ``VPA_OOM_MIN_BUMP`` (:mod:`picrl_core.rules.vpa`, the deployable rule a worker runs). The 24 h half-life
is converted to ticks with ``step_seconds``
(traces: GenAI 57 s, DLRM 60 s). Context is not used; nothing is trained (``series`` is not read).

:class:`DecayingHistogram` is shared with :mod:`picrl_core.methods.autopilot`.
"""

from __future__ import annotations

import numpy as np

from picrl_core.config import PicRLConfig
from picrl_core.methods.deployed import RuleProvisioner
from picrl_core.rules.vpa import VPARule, percentile
from picrl_core.series import PreparedSeries

DEFAULT_STEP_SECONDS = 60.0  # seconds per tick (DLRM: 60 s; pass 57 s for the GenAI traces)
VPA_HALF_LIFE_S = 24 * 3600.0  # DefaultCPU/MemoryHistogramDecayHalfLife


def ticks(seconds: float, step_seconds: float) -> int:
    """A duration in ticks of ``step_seconds`` (at least 1)."""
    if step_seconds <= 0:
        raise ValueError(f"step_seconds must be positive, got {step_seconds}")
    return max(1, round(seconds / step_seconds))


class DecayingHistogram:
    """One histogram per service over fixed bucket ``edges``; a sample of age ``tau`` ticks weighs
    ``2^(-tau / half_life)``. With ``window``, only the last ``window`` samples count (a ring buffer
    removes the oldest). Values outside the edges fall into the first/last bucket."""

    def __init__(self, edges: np.ndarray, services: int, half_life: float, window: int | None = None) -> None:
        self.edges = np.asarray(edges, dtype=np.float64)
        buckets = self.edges.size - 1
        self.decay = 2.0 ** (-1.0 / half_life)
        self.weights = np.zeros((services, buckets))
        self.counts = np.zeros((services, buckets), dtype=np.int64)
        self.window = window
        self.ring = np.zeros((services, window or 0), dtype=np.int64)
        self.added = 0
        self.rows = np.arange(services)

    def add(self, values: np.ndarray) -> None:
        """One sample per service ``(N,)``."""
        bucket = np.clip(np.searchsorted(self.edges, values, side="right") - 1, 0, self.weights.shape[1] - 1)
        self.weights *= self.decay
        if self.window:
            slot = self.added % self.window
            if self.added >= self.window:
                old = self.ring[:, slot]
                self.weights[self.rows, old] = np.maximum(self.weights[self.rows, old] - self.decay**self.window, 0.0)
                self.counts[self.rows, old] -= 1
            self.ring[:, slot] = bucket
        self.weights[self.rows, bucket] += 1.0
        self.counts[self.rows, bucket] += 1
        self.added += 1

    def percentile(self, level: float, *, load_adjusted: bool = False) -> np.ndarray:
        """VPA's ``Percentile``: the end of the first bucket whose cumulative weight reaches ``level`` of
        the total (the start of the open last bucket). ``load_adjusted`` weighs each bucket by its value
        (its end) too, Autopilot's percentile of usage rather than of time."""
        weights = self.weights * self.edges[1:] if load_adjusted else self.weights
        return percentile(weights, self.edges, level)

    def average(self) -> np.ndarray:
        """Weighted mean of the bucket ends."""
        return (self.weights @ self.edges[1:]) / np.maximum(self.weights.sum(axis=1), 1e-300)

    def peak(self) -> np.ndarray:
        """End of the highest bucket holding a sample (in the window)."""
        occupied = self.counts > 0
        highest = self.weights.shape[1] - 1 - np.argmax(occupied[:, ::-1], axis=1)
        return self.edges[highest + 1]


class VPAProvisioner(RuleProvisioner):
    """The deployable :class:`~picrl_core.rules.vpa.VPARule`: the very rule a worker runs (``picrl worker --method
    vpa``)."""

    def __init__(self, half_life: float) -> None:
        super().__init__(VPARule(half_life), 0.0, 1.0)


def fit_vpa(
    series: PreparedSeries, config: PicRLConfig, *, step_seconds: float = DEFAULT_STEP_SECONDS
) -> VPAProvisioner:
    """The VPA recommender with its 24 h half-life expressed in ticks of ``step_seconds``."""
    return VPAProvisioner(ticks(VPA_HALF_LIFE_S, step_seconds))
