"""Phase 3 slow loop (Algorithm 1, lines 31-35): replay buffer and KL-regularised policy refinement.

Every ``N_update`` transitions the learner takes a few clipped importance-weighted actor-critic
steps on replayed transitions, penalised by ``KL(pi_new || pi_old)`` to the policy before the
update (vieillard2020leverage); the acting policy then moves to an exponential moving average of
the learner's parameters. The same learner runs inline in the embedded runner and in the stream's
trainer worker.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

from picrl_core.config import PicRLConfig
from picrl_core.controller import Transition
from picrl_core.policy import PolicyNetwork, ValueNetwork, gaussian_kl, gaussian_log_prob

_RATIO_CLIP = 0.2
_SCORE_WEIGHT_CAP = 10.0


class ReplayBuffer:
    """Bounded FIFO of transitions (oldest overwritten), stored as preallocated arrays."""

    def __init__(self, capacity: int, n_features: int) -> None:
        if capacity < 1:
            raise ValueError(f"replay capacity must be >= 1; got {capacity}")
        self.capacity = capacity
        self._features = np.zeros((capacity, n_features), np.float32)
        self._next_features = np.zeros((capacity, n_features), np.float32)
        self._pre = np.zeros((capacity, 2), np.float32)
        self._log_prob = np.zeros(capacity, np.float32)
        self._reward = np.zeros(capacity, np.float32)
        self._size = 0
        self._cursor = 0
        self.added = 0  # transitions ever added

    def __len__(self) -> int:
        return self._size

    def add(self, transition: Transition) -> None:
        n = transition.reward.shape[0]
        for lo in range(0, n, self.capacity):  # a batch larger than the buffer keeps its newest rows
            self._add_rows(transition, slice(lo, min(lo + self.capacity, n)))

    def _add_rows(self, tr: Transition, rows: slice) -> None:
        count = rows.stop - rows.start
        index = (self._cursor + np.arange(count)) % self.capacity
        self._features[index] = tr.features[rows]
        self._next_features[index] = tr.next_features[rows]
        self._pre[index] = tr.pre[rows]
        self._log_prob[index] = tr.log_prob[rows]
        self._reward[index] = tr.reward[rows]
        self._cursor = int((self._cursor + count) % self.capacity)
        self._size = min(self._size + count, self.capacity)
        self.added += count

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
        return self._rows(rng.integers(0, self._size, size=min(batch_size, self._size)))

    def contents(self) -> dict[str, torch.Tensor]:
        """Every transition held, as tensors (for validation)."""
        return self._rows(np.arange(self._size))

    def _rows(self, index: np.ndarray) -> dict[str, torch.Tensor]:
        return {
            name: torch.from_numpy(getattr(self, f"_{name}")[index])
            for name in ("features", "next_features", "pre", "log_prob", "reward")
        }


@dataclass(frozen=True)
class SlowUpdateStats:
    """One slow update: how far the acting policy moved and how the losses looked."""

    update: int
    transitions_seen: int
    kl_to_parent: float  # KL(acting_new || acting_old) on the replayed states
    actor_loss: float
    value_loss: float

    def to_dict(self) -> dict:
        return asdict(self)


class SlowPolicyLearner:
    """KL-regularised actor-critic refinement from replay with an EMA acting policy."""

    def __init__(self, policy: PolicyNetwork, value: ValueNetwork, config: PicRLConfig) -> None:
        self.config = config
        self.learner = copy.deepcopy(policy).train()
        self.acting = copy.deepcopy(policy).eval()
        self.value = copy.deepcopy(value).train()
        cfg = config.online
        self._actor_opt = torch.optim.Adam(self.learner.parameters(), lr=cfg.lr)
        self._critic_opt = torch.optim.Adam(self.value.parameters(), lr=cfg.lr)
        self._rng = np.random.default_rng(config.seed + 1)
        self.updates = 0

    def update(self, buffer: ReplayBuffer) -> SlowUpdateStats:
        """One slow update from ``buffer``; moves ``self.acting`` (in place) and returns its stats."""
        cfg = self.config.online
        reference = copy.deepcopy(self.learner).eval()
        previous_acting = copy.deepcopy(self.acting)
        actor_loss = value_loss = torch.zeros(())
        batch: dict[str, torch.Tensor] = {}
        for _ in range(cfg.gradient_steps):
            batch = buffer.sample(cfg.batch_size, self._rng)
            with torch.no_grad():
                target = batch["reward"] + cfg.discount * self.value(batch["next_features"])
            estimate = self.value(batch["features"])
            value_loss = (estimate - target).pow(2).mean()
            self._critic_opt.zero_grad()
            value_loss.backward()
            self._critic_opt.step()
            advantage = target - estimate.detach()
            advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
            mean, std = self.learner(batch["features"])
            ratio = (gaussian_log_prob(mean, std, batch["pre"]) - batch["log_prob"]).clamp(max=10.0).exp()
            clipped = torch.minimum(ratio * advantage, ratio.clamp(1 - _RATIO_CLIP, 1 + _RATIO_CLIP) * advantage)
            with torch.no_grad():
                ref_mean, ref_std = reference(batch["features"])
            kl = gaussian_kl(mean, std, ref_mean, ref_std).mean()
            actor_loss = -clipped.mean() + cfg.kl_coef * kl
            self._actor_opt.zero_grad()
            actor_loss.backward()
            self._actor_opt.step()
        with torch.no_grad():
            for acting, learned in zip(self.acting.parameters(), self.learner.parameters()):
                acting.mul_(cfg.ema_decay).add_(learned, alpha=1.0 - cfg.ema_decay)
            new_mean, new_std = self.acting(batch["features"])
            old_mean, old_std = previous_acting(batch["features"])
            kl_to_parent = float(gaussian_kl(new_mean, new_std, old_mean, old_std).mean())
        self.updates += 1
        return SlowUpdateStats(self.updates, buffer.added, kl_to_parent, actor_loss.item(), value_loss.item())


def off_policy_score(policy: PolicyNetwork, batch: dict[str, torch.Tensor]) -> float:
    """Validation score of ``policy`` on held-out replayed transitions: the self-normalised
    importance-sampling estimate of its mean one-step reward (higher is better),
    ``sum_i w_i r_i / sum_i w_i`` with ``w_i = pi(pre_i | s_i) / b(pre_i | s_i)`` capped at 10,
    ``b`` the behaviour policy that acted. Policies are compared on the same transitions."""
    if batch["reward"].numel() == 0:
        raise ValueError("no held-out transitions to score the policy on")
    with torch.no_grad():
        mean, std = policy(batch["features"])
        log_ratio = gaussian_log_prob(mean, std, batch["pre"]) - batch["log_prob"]
        weights = log_ratio.clamp(max=math.log(_SCORE_WEIGHT_CAP)).exp()
        return float((weights * batch["reward"]).sum() / weights.sum().clamp(min=1e-12))
