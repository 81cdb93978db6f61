"""Phase 2 (Sec. 3.2.4, Algorithm 1 lines 3-14): offline actor-critic pretraining on simulator rollouts.

Each iteration rolls the current policy out for ``chunks * chunk_len`` steps of episodes that start at
random chunks of the training split (one batch through the vectorised controller, exploring with
counter-based noise), rewards censored steps with the pessimistic surrogate and uncensored ones with
the true cost (the controller's ``step_reward``), and takes one advantage actor-critic step (GAE
advantages). An episode of ``chunk_len`` steps spans ``segments`` iterations (:class:`_Rollouts`):
``chunks * segments`` episodes advance ``chunk_len / segments`` steps per iteration, so the same
transitions come from fewer, wider controller steps (8 segments: 16 steps of 512 services instead of
128 steps of 64; the per-step cost is mostly fixed).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch

from picrl_core.config import PicRLConfig
from picrl_core.controller import PicRLController, Transition
from picrl_core.controller_state import ControllerState
from picrl_core.policy import PolicyNetwork, ValueNetwork, gaussian_log_prob
from picrl_core.predictor.model import GaussianLSTM
from picrl_core.series import segment_starts
from picrl_core.simulator import censor


@dataclass(frozen=True)
class PretrainReport:
    """Learning curves of Phase 2, one entry per iteration."""

    iterations: int
    value_loss: tuple[float, ...]
    mean_reward: tuple[float, ...]
    censor_rate: tuple[float, ...]

    def to_dict(self) -> dict:
        return asdict(self)


def chunk_starts(train: np.ndarray, services: int, window: int, chunk_len: int, who: str) -> tuple[np.ndarray, int]:
    """Rollout chunks of a training split (``services`` series end to end): every start ``s`` whose
    ``window`` uncensored steps before it and ``length`` demand steps lie in one service's series, and
    ``length = min(chunk_len, steps per service - window - 1)``."""
    length = min(chunk_len, train.shape[0] // services - window - 1)
    if length < 8:
        raise ValueError(
            f"the training split ({train.shape[0] // services} steps per service) is too short for "
            f"{who} with window {window}"
        )
    return segment_starts(train.shape[0], services, window, length), length


def _chunks(series: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """``series[start : start + length]`` for each start, stacked as ``(len(starts), length, ...)``."""
    return series[starts[:, None] + np.arange(length)[None, :]]


def gae(
    rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor, discount: float, lam: float
) -> torch.Tensor:
    """Generalised advantage estimates over time axis 0 (the last step bootstraps on ``next_values``)."""
    deltas = rewards + discount * next_values - values
    advantages = torch.zeros_like(deltas)
    running = torch.zeros_like(deltas[0])
    for t in range(deltas.shape[0] - 1, -1, -1):
        running = deltas[t] + discount * lam * running
        advantages[t] = running
    return advantages


class _Rollouts:
    """The rollouts of Phase 2: ``chunks * segments`` episodes of ``length`` steps on the training split,
    each cold-started at a random chunk start (uncensored history, zero calibrator) as in the paper's
    rollouts, played ``length / segments`` steps per iteration. Every iteration still yields
    ``chunks * length`` transitions, but in ``length / segments`` controller steps of ``chunks * segments``
    services instead of ``length`` steps of ``chunks``: the per-step cost is mostly fixed, so Phase 2 runs
    several times faster. The episodes' phases are staggered (the first episode of rollout ``r`` ends
    after ``1 + r mod segments`` segments), so every iteration sees every part of an episode; an episode
    ends only between segments, where the last step bootstraps on the value of its next state as
    before. ``segments = 1`` is the original scheme (fresh chunks every iteration)."""

    def __init__(
        self,
        predictor: GaussianLSTM,
        policy: PolicyNetwork,
        config: PicRLConfig,
        train: np.ndarray,
        train_context: np.ndarray | None,
        length: int,
        draw: Callable[[int], np.ndarray],
    ) -> None:
        cfg = config.pretrain
        segments = max(1, min(cfg.segments, length))
        self.segment = length // segments
        self.episode = self.segment * segments
        self.count = cfg.chunks * segments
        self.window = config.predictor.window
        self.train, self.context, self.draw = train, train_context, draw
        # rollouts need no batch invariance (nothing else replays them): one network pass, no padding rows
        self.controller = PicRLController(predictor, policy, config, explore=True, chunk=self.count)
        self.start = np.zeros(self.count, np.int64)
        self.age = np.zeros(self.count, np.int64)
        self.limit = self.segment * (1 + np.arange(self.count) % segments)
        self.keys = np.zeros(self.count, np.uint64)
        self.next_key = 0
        self.state: ControllerState | None = None

    def _restart(self, rows: np.ndarray) -> None:
        starts = self.draw(rows.size)
        history = starts[:, None] + np.arange(-self.window, 0)[None, :]
        keys = np.arange(self.next_key, self.next_key + rows.size, dtype=np.uint64)
        self.next_key += rows.size
        fresh = self.controller.initial_state(
            keys, self.train[history], None if self.context is None else self.context[history]
        )
        self.start[rows], self.age[rows], self.keys[rows] = starts, 0, keys
        if self.state is None:
            self.state = fresh
        else:
            self.limit[rows] = self.episode
            self.state.put(rows, fresh)

    def advance(self) -> list[Transition]:
        """One segment of every rollout (episodes that ended are restarted first): its transitions, time-major."""
        ended = np.arange(self.count) if self.state is None else np.flatnonzero(self.age >= self.limit)
        if ended.size:
            self._restart(ended)
        steps: list[Transition] = []
        for _ in range(self.segment):
            state = self.state
            assert state is not None
            now = self.start + self.age
            observed, censored = censor(self.train[now], state.action)
            self.state, transition = self.controller.step(
                state, observed, censored, None if self.context is None else self.context[now]
            )
            steps.append(transition)
            self.age += 1
        return steps


def pretrain_policy(
    predictor: GaussianLSTM,
    train: np.ndarray,
    config: PicRLConfig,
    *,
    train_context: np.ndarray | None = None,
    services: int = 1,
    progress: Callable[[dict[str, float]], None] | None = None,
) -> tuple[PolicyNetwork, ValueNetwork, PretrainReport]:
    """Actor-critic pretraining of ``pi_phi`` and ``V_psi`` on rollouts of random chunks of ``train``
    (``services`` series end to end: :func:`chunk_starts`); with ablation A7 (``pretrain=False``) the
    freshly initialised networks are returned untouched."""
    cfg = config.pretrain
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        policy, value = PolicyNetwork(config.policy), ValueNetwork(config.policy)
    if not config.ablation.pretrain or cfg.iterations == 0:
        return policy, value, PretrainReport(0, (), (), ())
    window = config.predictor.window
    every, length = chunk_starts(train, services, window, cfg.chunk_len, "Phase 2")
    rng = np.random.default_rng(config.seed)
    actor_opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr_actor)
    critic_opt = torch.optim.Adam(value.parameters(), lr=cfg.lr_critic)
    rollouts = _Rollouts(
        predictor,
        policy,
        config,
        train,
        train_context,
        length,
        lambda count: every[rng.integers(0, every.size, size=count)],
    )
    curves: dict[str, list[float]] = {"value_loss": [], "mean_reward": [], "censor_rate": []}
    for iteration in range(cfg.iterations):
        steps = rollouts.advance()
        features = torch.from_numpy(np.stack([s.features for s in steps]))
        next_features = torch.from_numpy(np.stack([s.next_features for s in steps]))
        pre = torch.from_numpy(np.stack([s.pre for s in steps]))
        rewards = torch.from_numpy(np.stack([s.reward for s in steps])).float()
        values = value(features)  # one forward serves the advantages (detached) and the critic's loss
        with torch.no_grad():
            advantages = gae(rewards, values.detach(), value(next_features), cfg.discount, cfg.gae_lambda)
            returns = advantages + values.detach()
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        policy.train()
        mean, std = policy(features)
        entropy = (std.log() + 0.5 * math.log(2 * math.pi * math.e)).sum(-1).mean()
        actor_loss = -(gaussian_log_prob(mean, std, pre) * advantages).mean() - cfg.entropy_coef * entropy
        actor_opt.zero_grad()
        actor_loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
        actor_opt.step()
        value_loss = cfg.value_coef * (values - returns).pow(2).mean()
        critic_opt.zero_grad()
        value_loss.backward()
        torch.nn.utils.clip_grad_norm_(value.parameters(), cfg.grad_clip)
        critic_opt.step()
        policy.eval()
        curves["value_loss"].append(value_loss.item())
        curves["mean_reward"].append(float(rewards.mean()))
        curves["censor_rate"].append(float(np.mean([s.censored.mean() for s in steps])))
        if progress is not None:
            progress({"iteration": iteration + 1, **{k: v[-1] for k, v in curves.items()}})
    return (
        policy,
        value,
        PretrainReport(cfg.iterations, *(tuple(curves[k]) for k in ("value_loss", "mean_reward", "censor_rate"))),
    )
