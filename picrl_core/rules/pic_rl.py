"""PIC-RL as a deployable rule: the one vectorised controller (:mod:`picrl_core.controller`) behind the interface of
:mod:`picrl_core.rules.base`; its state is a :class:`~picrl_core.controller_state.ControllerState` packed by the
:class:`~picrl_core.state_codec.StateCodec`. The predictor variants (TFT, Informer, Autoformer in the LSTM's place)
are this rule with another network in the artifact."""

from __future__ import annotations

import copy

import numpy as np

from picrl_core.artifact import ModelArtifact
from picrl_core.controller import PicRLController, Transition
from picrl_core.controller_state import ControllerState
from picrl_core.policy import PolicyNetwork
from picrl_core.rules.base import DeployableRule
from picrl_core.state_codec import StateCodec


class PicRLRule(DeployableRule):
    """Algorithm 1's Phase 3 with the artifact's networks (its policy copied: hot swaps never touch the artifact)."""

    learns_policy = True

    def __init__(self, artifact: ModelArtifact) -> None:
        predictor, policy, _ = artifact.networks()
        self.method = artifact.method
        self.controller = PicRLController(predictor, copy.deepcopy(policy), artifact.config)
        self._codec = StateCodec.for_config(artifact.config)  # the incremental predictor's memory rides in the row

    @property
    def codec(self) -> StateCodec:
        return self._codec

    def set_policy(self, policy: PolicyNetwork) -> None:
        """Act with ``policy`` from the next decision on."""
        self.controller.set_policy(policy)

    def initial_state(
        self,
        keys: np.ndarray,
        history: np.ndarray,
        low: np.ndarray,
        high: np.ndarray,
        history_context: np.ndarray | None = None,
        start_tick: int | np.ndarray = 0,
    ) -> ControllerState:
        return self.controller.initial_state(keys, history, history_context, start_tick)

    def step(
        self,
        state: ControllerState,
        y: np.ndarray,
        censored: np.ndarray,
        context: np.ndarray | None = None,
        missing: np.ndarray | None = None,
    ) -> tuple[ControllerState, Transition]:
        return self.controller.step(state, y, censored, context, missing)

    def unclipped(self, state: ControllerState) -> np.ndarray:
        return self.controller.unclipped(state)

    def rescale(
        self, state: ControllerState, low: np.ndarray, high: np.ndarray, new_low: np.ndarray, new_high: np.ndarray
    ) -> ControllerState:
        return self.controller.rescale(state, low, high, new_low, new_high)
