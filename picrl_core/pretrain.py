"""Phase 2 (Sec. 3.2.4, Algorithm 1 lines 3-14): offline actor-critic pretraining on simulator rollouts.

Each iteration rolls the current policy out over ``chunks`` random chunks of the training split at
once (one batch through the vectorised controller, exploring with counter-based noise), rewards
censored steps with the pessimistic surrogate and uncensored ones with the true cost (the
controller's ``step_reward``), and takes one advantage actor-critic step (GAE advantages).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np
import torch

from picrl_core.batching import INVARIANT_CHUNK
from picrl_core.config import PicRLConfig
from picrl_core.controller import ControllerState, PicRLController, Transition
from picrl_core.policy import PolicyNetwork, ValueNetwork, gaussian_log_prob
from picrl_core.predictor import GaussianLSTM
from picrl_core.series import segment_starts
from picrl_core.simulator import simulate


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
        raise ValueError(f"the training split ({train.shape[0] // services} steps per service) is too short for "
                         f"{who} with window {window}")
    return segment_starts(train.shape[0], services, window, length), length


def _chunks(series: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """``series[start : start + length]`` for each start, stacked as ``(len(starts), length, ...)``."""
    return series[starts[:, None] + np.arange(length)[None, :]]


def gae(rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor, discount: float,
        lam: float) -> torch.Tensor:
    """Generalised advantage estimates over time axis 0 (the last step bootstraps on ``next_values``)."""
    deltas = rewards + discount * next_values - values
    advantages = torch.zeros_like(deltas)
    running = torch.zeros_like(deltas[0])
    for t in range(deltas.shape[0] - 1, -1, -1):
        running = deltas[t] + discount * lam * running
        advantages[t] = running
    return advantages


def pretrain_policy(predictor: GaussianLSTM, train: np.ndarray, config: PicRLConfig, *,
                    train_context: np.ndarray | None = None, services: int = 1,
                    progress: Callable[[dict[str, float]], None] | None = None
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
    controller = PicRLController(predictor, policy, config, explore=True, chunk=INVARIANT_CHUNK)
    curves: dict[str, list[float]] = {"value_loss": [], "mean_reward": [], "censor_rate": []}
    for iteration in range(cfg.iterations):
        starts = every[rng.integers(0, every.size, size=cfg.chunks)]
        history_starts = starts - window
        steps: list[Transition] = []

        def collect(_: int, __: ControllerState, transition: Transition) -> None:
            steps.append(transition)

        # the simulator takes demand/context time-major (T, B, ...) and history service-major (B, H, ...)
        context = None if train_context is None else np.swapaxes(_chunks(train_context, starts, length), 0, 1)
        history_context = None if train_context is None else _chunks(train_context, history_starts, window)
        simulate(controller, np.swapaxes(_chunks(train, starts, length), 0, 1), _chunks(train, history_starts, window),
                 context=context, history_context=history_context,
                 keys=np.arange(cfg.chunks, dtype=np.uint64) + np.uint64(iteration * cfg.chunks), on_step=collect)
        features = torch.from_numpy(np.stack([s.features for s in steps]))
        next_features = torch.from_numpy(np.stack([s.next_features for s in steps]))
        pre = torch.from_numpy(np.stack([s.pre for s in steps]))
        rewards = torch.from_numpy(np.stack([s.reward for s in steps])).float()
        with torch.no_grad():
            advantages = gae(rewards, value(features), value(next_features), cfg.discount, cfg.gae_lambda)
            returns = advantages + value(features)
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        policy.train()
        mean, std = policy(features)
        entropy = (std.log() + 0.5 * math.log(2 * math.pi * math.e)).sum(-1).mean()
        actor_loss = -(gaussian_log_prob(mean, std, pre) * advantages).mean() - cfg.entropy_coef * entropy
        actor_opt.zero_grad()
        actor_loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
        actor_opt.step()
        value_loss = cfg.value_coef * (value(features) - returns).pow(2).mean()
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
    return policy, value, PretrainReport(cfg.iterations, *(tuple(curves[k]) for k in ("value_loss", "mean_reward", "censor_rate")))
