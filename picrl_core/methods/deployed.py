"""A deployable rule (:mod:`picrl_core.rules.base`) as a provisioner of the comparison.

The comparison scores the very rule a stream worker runs: :class:`RuleProvisioner` holds its states for the run's
services and steps them as the worker does, so a method's decisions in the simulator equal the stream's bit for
bit. Service ``i`` is keyed ``i`` unless ``keys`` key it as a worker does (a rule that draws random numbers draws
them per key and tick).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from picrl_core.methods.base import Provisioner
from picrl_core.methods.growth import FollowsRange
from picrl_core.rules.base import DeployableRule


class RuleProvisioner(Provisioner, FollowsRange):
    """``rule`` for N services, each starting in the native range ``[low, high]``."""

    def __init__(
        self,
        rule: DeployableRule,
        low: np.ndarray | float,
        high: np.ndarray | float,
        *,
        keys: np.ndarray | None = None,
        start_tick: int = 0,
    ) -> None:
        self.rule = rule
        self.low, self.high = low, high
        self.keys, self.start_tick = keys, start_tick
        self._state: Any = None

    @property
    def state(self) -> Any:
        """The rule's states of the run's services (None before :meth:`start`)."""
        return self._state

    def start(self, history: np.ndarray, history_context: np.ndarray | None) -> np.ndarray:
        n = history.shape[0]
        keys = np.arange(n, dtype=np.uint64) if self.keys is None else self.keys
        low = np.broadcast_to(np.asarray(self.low, np.float64), (n,))
        high = np.broadcast_to(np.asarray(self.high, np.float64), (n,))
        self._state = self.rule.initial_state(keys, history, low, high, history_context, self.start_tick)
        return np.array(self._state.action)

    def act(self, y: np.ndarray, censored: np.ndarray, context: np.ndarray | None) -> np.ndarray:
        if self._state is None:
            raise RuntimeError("start() must be called before act()")
        self._state, _ = self.rule.step(self._state, y, censored, context)
        return np.array(self._state.action)

    def moved(self, low: np.ndarray, high: np.ndarray, new_low: np.ndarray, new_high: np.ndarray) -> np.ndarray:
        if self._state is None:
            raise RuntimeError("start() must be called before moved()")
        self._state = self.rule.rescale(self._state, low, high, new_low, new_high)
        return np.array(self._state.action)
