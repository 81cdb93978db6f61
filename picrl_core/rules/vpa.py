"""The Kubernetes VPA recommender as a deployable rule (:mod:`picrl_core.methods.vpa` says the method): ``a = (1 +
margin) p90`` of each service's decaying histogram of observations, at least the OOM bump right after a shortage.

The record keeps the histogram's bucket weights (VPA's exponential buckets over ``[0, 1]`` of the range: 82 of them,
656 B). On a moved range each bucket's weight moves to the bucket holding its end in the new range (VPA re-bins
nothing; a grown range is the stream's), so the histogram keeps its mass and its decay.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from picrl_core.artifact import ModelArtifact
from picrl_core.rules.base import RecordRule
from picrl_core.rules.feed import range_move

VPA_TARGET_PERCENTILE = 0.9  # target-cpu/memory-percentile
VPA_SAFETY_MARGIN = 0.15  # recommendation-margin-fraction
VPA_OOM_BUMP_RATIO = 1.2  # DefaultOOMBumpUpRatio
VPA_OOM_MIN_BUMP = 0.01  # DefaultOOMMinBumpUp (100 MiB) as a share of the unit range
VPA_FIRST_BUCKET = 0.001  # first bucket width (CPU histogram: 0.001 cores)
VPA_BUCKET_GROWTH = 0.05  # DefaultHistogramBucketSizeGrowth
VPA_MAX_VALUE = 1.0  # top of the range; the last bucket is open-ended


def exponential_edges(first: float, growth: float, top: float) -> np.ndarray:
    """Bucket edges ``first * ((1 + growth)^k - 1) / growth`` for ``k = 0..B``, as VPA's
    ``NewExponentialHistogramOptions(top, first, 1 + growth)``: ``B - 1`` buckets up to ``top``, then the
    open last one (given the next edge, so its end is finite)."""
    count = int(np.ceil(np.log(top * growth / first + 1.0) / np.log1p(growth))) + 1
    return first * ((1.0 + growth) ** np.arange(count + 1) - 1.0) / growth


VPA_EDGES = exponential_edges(VPA_FIRST_BUCKET, VPA_BUCKET_GROWTH, VPA_MAX_VALUE)


def oom_bump(y: np.ndarray) -> np.ndarray:
    """VPA's post-OOM need ``max(used * OOMBumpUpRatio, used + OOMMinBumpUp)``."""
    return np.maximum(y * VPA_OOM_BUMP_RATIO, y + VPA_OOM_MIN_BUMP)


def bucket_of(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The bucket of each value (outside the edges: the first or the last)."""
    return np.clip(np.searchsorted(edges, values, side="right") - 1, 0, edges.size - 2)


def percentile(weights: np.ndarray, edges: np.ndarray, level: float) -> np.ndarray:
    """VPA's ``Percentile``: the end of the first bucket whose cumulative weight reaches ``level`` of the total (the
    start of the open last bucket)."""
    cumulative = np.cumsum(weights, axis=1)
    bucket = np.argmax(cumulative >= level * cumulative[:, -1:], axis=1)
    last = weights.shape[1] - 1
    return np.where(bucket < last, edges[np.minimum(bucket + 1, last)], edges[last])


class VPARule(RecordRule):
    """The VPA target per service; ``half_life`` in ticks."""

    method = "vpa"

    def __init__(self, half_life: float) -> None:
        self.half_life = half_life
        self.decay = 2.0 ** (-1.0 / half_life)
        super().__init__()

    @classmethod
    def from_artifact(cls, artifact: ModelArtifact) -> VPARule:
        """The rule of a ``picrl train --method vpa`` model (its half-life in ticks of the trace's step)."""
        return cls(float(artifact.parameters["half_life"]))

    def parameters(self) -> dict[str, Any]:
        return {"half_life": self.half_life}

    def fields(self) -> list[tuple[Any, ...]]:
        return [("weights", "<f8", (VPA_EDGES.size - 1,))]

    def start(
        self, state: np.recarray, history: np.ndarray, low: np.ndarray, high: np.ndarray, context: np.ndarray | None
    ) -> None:
        for column in history.T:
            self._add(state, column)
        state.order = self._target(state)
        state.mu = state.order

    def advance(self, state: np.recarray, y: np.ndarray, censored: np.ndarray, context: np.ndarray | None) -> None:
        sample = np.where(censored, oom_bump(y), y)
        self._add(state, sample)
        target = self._target(state)
        state.order = np.where(censored, np.maximum(target, sample), target)
        state.mu = target

    def moved(
        self, state: np.recarray, low: np.ndarray, high: np.ndarray, new_low: np.ndarray, new_high: np.ndarray
    ) -> None:
        ratio, shift = range_move(low, high, new_low, new_high)
        target = bucket_of(VPA_EDGES[1:][None, :] * ratio[:, None] + shift[:, None], VPA_EDGES)
        weights = np.zeros_like(np.asarray(state.weights))
        np.add.at(weights, (np.arange(len(state))[:, None].repeat(target.shape[1], axis=1), target), state.weights)
        state.weights = weights
        state.order = self._target(state)
        state.mu = state.order

    def _add(self, state: np.recarray, values: np.ndarray) -> None:
        """One sample per service: every weight decays, the sample's bucket gains 1."""
        hit = np.arange(VPA_EDGES.size - 1)[None, :] == bucket_of(values, VPA_EDGES)[:, None]
        state.weights = state.weights * self.decay + hit

    def _target(self, state: np.recarray) -> np.ndarray:
        """``(1 + margin) p90``, within ``[0, 1]``."""
        p90 = percentile(np.asarray(state.weights), VPA_EDGES, VPA_TARGET_PERCENTILE)
        return np.clip(p90 * (1.0 + VPA_SAFETY_MARGIN), 0.0, 1.0)
