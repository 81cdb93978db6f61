"""The per-service state of the controller (:class:`ControllerState`) and how it moves to a new scaling range.

A batch of services is a struct of arrays, one row per service. :func:`rescale_state` carries it from one
per-service ``[low, high]`` range of :mod:`picrl_core.scaling` to another: levels move affinely, spreads scale with
the span, the rest does not depend on the unit.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np


@dataclass
class ControllerState:
    """Per-service state of a batch of B services (struct of arrays, fixed size per service).

    The window fields hold the last W observations ``y``, censoring flags ``c`` and context rows,
    oldest first. The decision fields describe the action pending for tick ``tick``.
    """

    keys: np.ndarray  # (B,) uint64 service keys (exploration noise is keyed on them)
    tick: np.ndarray  # (B,) int64 tick the pending action applies to
    observations: np.ndarray  # (B, W) float32
    censored: np.ndarray  # (B, W) bool
    context: np.ndarray  # (B, W, C) float32 (C may be 0)
    margin: np.ndarray  # (B,) float64, fast calibrator variable m_t
    bias: np.ndarray  # (B,) float64, slow calibrator variable b_t
    censor_streak: np.ndarray  # (B,) int64 consecutive censored steps
    over_streak: np.ndarray  # (B,) int64 consecutive over-provisioned steps
    action: np.ndarray  # (B,) float64 a_t in [0, 1]
    mu: np.ndarray  # (B,) float64 predicted demand mean for tick
    sigma: np.ndarray  # (B,) float64 predicted demand std for tick
    eta: np.ndarray  # (B,) float64 calibrator step multiplier chosen for tick
    k: np.ndarray  # (B,) float64 risk-buffer coefficient chosen for tick
    pre: np.ndarray  # (B, 2) float32 pre-squash policy sample (for replay log-probs)
    log_prob: np.ndarray  # (B,) float32 behaviour log-probability of ``pre``
    features: np.ndarray  # (B, F) float32 state s_t the decision was made from
    est_mean: np.ndarray  # (B,) float64 censored-demand estimate (mean) of this window: the next tick's warm start
    est_std: np.ndarray  # (B,) float64 censored-demand estimate (std), likewise
    memory: np.ndarray  # (B, M) float32 the incremental predictor's (h, c) after this window (M = 0 when windowed)
    temperature: np.ndarray  # (B,) float64 the service's online scale of sigma (calibrator.online_scale; else 1)
    escape: np.ndarray  # (B,) float64 the censoring-streak escape e_t added to the action (calibrator.escape; else 0)
    repeat_share: np.ndarray  # (B,) float64 running share of seen ticks that repeated the last seen demand (repeats)
    last_seen: np.ndarray  # (B,) float64 the last demand seen uncensored

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    def take(self, index: np.ndarray | slice) -> ControllerState:
        """The sub-batch of services at ``index`` (copies)."""
        return ControllerState(**{f.name: getattr(self, f.name)[index].copy() for f in fields(self)})

    def put(self, index: np.ndarray, other: ControllerState) -> None:
        """Overwrite the services at ``index`` with the services of ``other`` (in place, in order)."""
        for f in fields(self):
            getattr(self, f.name)[index] = getattr(other, f.name)

    @staticmethod
    def concat(states: list[ControllerState]) -> ControllerState:
        return ControllerState(
            **{f.name: np.concatenate([getattr(s, f.name) for s in states]) for f in fields(ControllerState)}
        )


# How each ControllerState field moves with the range: levels are affine in the native unit, spreads
# (standard deviations, calibrator offsets) scale with the span, the rest does not depend on it (the
# features and the policy sample stay as the decision saw them: the replay transition is built from them).
LEVEL_FIELDS = ("observations", "action", "mu", "est_mean", "last_seen")
SPREAD_FIELDS = ("sigma", "margin", "bias", "est_std", "escape")
# estimates may lie outside [0, 1], and the last seen demand is compared with the next one as it comes; a moved range
# clips observations and actions
_UNCLIPPED_LEVELS = ("mu", "est_mean", "last_seen")
UNIT_FREE_FIELDS = (
    "keys",
    "tick",
    "censored",
    "context",
    "censor_streak",
    "over_streak",
    "eta",
    "k",
    "pre",
    "log_prob",
    "features",
    "memory",
    "temperature",
    "repeat_share",
)
# ``memory`` (the incremental predictor's LSTM state) is not rescaled here: no affine map carries an LSTM's hidden
# state to other units. PicRLController.rescale reads it again from the rescaled window.


def rescale_state(
    state: ControllerState, low: np.ndarray, high: np.ndarray, new_low: np.ndarray, new_high: np.ndarray
) -> ControllerState:
    """``state`` (per service, in ``[low, high]``) expressed in ``[new_low, new_high]``: the same native
    history, prediction, calibrator offsets and capacity in force. The observations and the action of a service
    whose range moves are clipped to ``[0, 1]`` (the new range may be narrower); a service whose range stays is
    left as it is, bit for bit, whatever else is in the batch (its window may hold an imputed demand above 1,
    ``controller.impute_shortage``)."""
    low, high = np.asarray(low, np.float64), np.asarray(high, np.float64)
    new_low, new_high = np.asarray(new_low, np.float64), np.asarray(new_high, np.float64)
    ratio = (high - low) / (new_high - new_low)
    shift = (low - new_low) / (new_high - new_low)
    stays = (low == new_low) & (high == new_high)
    changes = {}
    for name in LEVEL_FIELDS:
        value = getattr(state, name)
        per_service = (slice(None),) + (None,) * (value.ndim - 1)
        moved = value * ratio[per_service] + shift[per_service]
        if name not in _UNCLIPPED_LEVELS:
            moved = np.where(stays[per_service], value, np.clip(moved, 0.0, 1.0))
        changes[name] = moved.astype(value.dtype)
    for name in SPREAD_FIELDS:
        value = getattr(state, name)
        changes[name] = (value * ratio).astype(value.dtype)
    return replace(state, **changes)
