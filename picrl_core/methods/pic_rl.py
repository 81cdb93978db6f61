"""PIC-RL as a provisioner of the comparison, and its ablations A1-A7 (paper Table 3).

:class:`PicRLProvisioner` is Phase 3 of Algorithm 1 behind the :class:`Provisioner` interface: the
one :class:`~picrl_core.controller.PicRLController` (predict, plan, act, fast calibrator update)
plus the slow loop of :func:`picrl_core.pipeline.online_controller`, exactly as ``run_online``
drives them. Every ablation is the same implementation under a config with one switch flipped
(:data:`ABLATIONS`); the Phase-1 and Phase-2 substitutions reuse the provisioner too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from picrl_core.artifact import ModelArtifact
from picrl_core.config import PicRLConfig
from picrl_core.controller import PicRLController
from picrl_core.controller_state import ControllerState
from picrl_core.methods.base import Provisioner
from picrl_core.methods.growth import FollowsRange
from picrl_core.pipeline import SlowLoop, online_controller, train_offline
from picrl_core.policy import PolicyNetwork, ValueNetwork
from picrl_core.resources import Resource, impute_served_share, unobserved
from picrl_core.series import PreparedSeries


class PicRLProvisioner(Provisioner, FollowsRange):
    """Algorithm 1, Phase 3: ``a = clip(mu + k sigma + m + b, 0, 1)`` from the censored feedback only,
    with the KL-regularised slow policy refinement when ``slow_updates``.

    Service ``i`` of a run is keyed ``i`` (as in :func:`~picrl_core.simulator.simulate`), so its
    exploration noise, and every action, equals ``run_online``'s; ``keys`` and ``start_tick`` key it as a
    stream worker does instead. :meth:`start` begins a fresh run from the trained networks, which are never
    modified. Under the growth protocol (:mod:`picrl_core.methods.growth`) :meth:`moved` carries the state
    over to a grown range as the worker does.
    """

    def __init__(
        self,
        predictor: torch.nn.Module,
        policy: PolicyNetwork,
        value: ValueNetwork,
        config: PicRLConfig,
        *,
        slow_updates: bool = True,
        resources: tuple[Resource, ...] = (),
        keys: np.ndarray | None = None,
        start_tick: int = 0,
    ) -> None:
        self.predictor = predictor
        self.policy = policy
        self.value = value
        self.config = config
        self.slow_updates = slow_updates
        self.resources = resources  # several: the rows are resource-major and the coupled flags are imputed
        self.controller: PicRLController | None = None
        self.slow: SlowLoop | None = None
        self._state: ControllerState | None = None
        self.keys, self.start_tick = keys, start_tick

    @classmethod
    def from_artifact(
        cls, artifact: ModelArtifact, *, slow_updates: bool = True, resources: tuple[Resource, ...] = ()
    ) -> PicRLProvisioner:
        return cls(
            *artifact.networks(),
            artifact.config,
            slow_updates=slow_updates,
            resources=resources,
        )

    def start(self, history: np.ndarray, history_context: np.ndarray | None) -> np.ndarray:
        self.controller, self.slow = online_controller(
            self.predictor, self.policy, self.value, self.config, self.slow_updates
        )
        keys = np.arange(history.shape[0], dtype=np.uint64) if self.keys is None else self.keys
        self._state = self.controller.initial_state(keys, history, history_context, self.start_tick)
        return self._state.action.copy()

    def moved(self, low: np.ndarray, high: np.ndarray, new_low: np.ndarray, new_high: np.ndarray) -> np.ndarray:
        if self.controller is None or self._state is None:
            raise RuntimeError("start() must be called before moved()")
        self._state = self.controller.rescale(self._state, low, high, new_low, new_high)
        return self._state.action.copy()

    def act(self, y: np.ndarray, censored: np.ndarray, context: np.ndarray | None) -> np.ndarray:
        if self.controller is None or self._state is None:
            raise RuntimeError("start() must be called before act()")
        missing = None
        if len(self.resources) > 1:  # a hard shortage's served share, estimated from this controller's forecast
            pending, shape = self._state, (len(self.resources), -1)
            y_r, censored_r, action_r = (np.reshape(v, shape) for v in (y, censored, pending.action))
            missing = unobserved(y_r, censored_r, action_r, self.resources).ravel()
            y, censored = (
                part.ravel()
                for part in impute_served_share(
                    y_r,
                    censored_r,
                    action_r,
                    np.reshape(pending.mu, shape),
                    np.reshape(pending.sigma, shape),
                    self.resources,
                )
            )
        self._state, transition = self.controller.step(self._state, y, censored, context, missing)
        if self.slow is not None:
            self.slow.observe(transition)
        return self._state.action.copy()


def fit_pic_rl(series: PreparedSeries, config: PicRLConfig) -> PicRLProvisioner:
    """Phases 1-2 (:func:`~picrl_core.pipeline.train_offline`) on the training split, then Phase 3; on a
    multi-resource fleet the joint controller, which reads the coupled flags through
    :func:`~picrl_core.resources.impute_served_share`."""
    return PicRLProvisioner.from_artifact(train_offline(series, config), resources=series.resources)


def fit_pic_rl_per_resource(series: PreparedSeries, config: PicRLConfig) -> PicRLProvisioner:
    """:func:`fit_pic_rl` with every resource learned on its own, as a per-resource autoscaler does."""
    return PicRLProvisioner.from_artifact(train_offline(series, config))


@dataclass(frozen=True)
class Ablation:
    """One row of Table 3: PIC-RL with a single component switched off by its config field."""

    name: str  # "a1" .. "a7"
    label: str  # table label
    switch: Callable[[PicRLConfig], PicRLConfig]

    def fit(self, series: PreparedSeries, config: PicRLConfig) -> PicRLProvisioner:
        return fit_pic_rl(series, self.switch(config))


ABLATIONS: tuple[Ablation, ...] = (
    Ablation("a1", "A1: w/o Uncert.", lambda c: replace(c, ablation=replace(c.ablation, use_uncertainty=False))),
    Ablation("a2", "A2: w/o CensRwd", lambda c: replace(c, reward=replace(c.reward, use_censored_reward=False))),
    # the censoring hedge: Eq. 9's Psi in the paper, the window's E-step in the default (config.EstimatorConfig)
    Ablation(
        "a3",
        "A3: w/o Pessimism",
        lambda c: replace(
            c, reward=replace(c.reward, use_pessimism=False), estimator=replace(c.estimator, impute_window=False)
        ),
    ),
    Ablation("a4", "A4: w/o k*sigma", lambda c: replace(c, ablation=replace(c.ablation, use_k_sigma=False))),
    Ablation("a5", "A5: w/o KL", lambda c: replace(c, online=replace(c.online, kl_coef=0.0))),
    Ablation("a6", "A6: w/o EMA", lambda c: replace(c, online=replace(c.online, ema_decay=0.0))),
    Ablation("a7", "A7: w/o Pretrain", lambda c: replace(c, ablation=replace(c.ablation, pretrain=False))),
)
