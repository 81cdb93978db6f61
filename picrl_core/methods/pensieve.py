"""Phase-2+3 substitution: a Pensieve-style actor-critic controller (Mao et al., "Neural adaptive
video streaming with Pensieve", SIGCOMM 2017) in place of PIC-RL's decision module.

Pensieve's networks read the last ``k = 8`` values of each input sequence through its own 1D-CNN
(kernel 4) and each scalar through a dense layer, merge them in a hidden layer, and the actor and
the critic are separate networks of that shape trained by advantage actor-critic on parallel
simulator rollouts with an entropy bonus (A3C, here synchronous). Adapted at the interface only:

* state: the sequences ``y`` and ``c`` of the last ``k`` steps and the scalars ``(mu_t, sigma_t)``
  of the Phase-1 predictor (kept) and the previous action (Pensieve's "last bitrate");
* action: continuous, a Gaussian over a pre-squash buffer ``u`` (Pensieve's softmax over bitrates
  has no counterpart): ``a_t = clip(mu_t + MAX_BUFFER * tanh(u_t), 0, 1)``;
* reward: ``-l(a_t, y_t)``, Eq. (1) on what is observed. That is the true cost on uncensored steps
  (``y = d``) and the naive observed cost 0 on censored ones (``y = a``): Pensieve has no censoring
  model (no surrogate, no pessimism, no calibrator);
* training: the same rollout budget as Phase 2 (``iterations`` x ``chunks`` chunks of ``chunk_len``
  steps of the training split, run in the PIC loop :func:`~picrl_core.methods.base.run_pic_loop`),
  GAE advantages with Phase 2's discount and lambda, Adam at Phase 2's learning rates;
* online: the trained actor acts deterministically (its mean), without updates, as Pensieve is
  deployed; there is no calibrator and no slow KL-regularised loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

from picrl_core.batching import INVARIANT_CHUNK, in_fixed_chunks
from picrl_core.config import PicRLConfig
from picrl_core.controller import _last_window, _shift
from picrl_core.costs import asymmetric_cost
from picrl_core.methods.base import Provisioner, run_pic_loop
from picrl_core.noise import counter_normal
from picrl_core.pipeline import config_for, phase1_predictor
from picrl_core.policy import gaussian_log_prob
from picrl_core.predictor.windowed import predict_gaussian
from picrl_core.pretrain import _chunks, chunk_starts, gae
from picrl_core.series import PreparedSeries

HISTORY = 8  # past steps each 1D-CNN reads (Pensieve: k = 8 chunks), at most the predictor window
KERNEL = 4  # 1D-CNN kernel size (Pensieve: 4)
MAX_BUFFER = 0.5  # the buffer u added to mu_t lies in (-MAX_BUFFER, MAX_BUFFER)
N_SCALARS = 3  # mu_t, sigma_t, previous action


class PensieveNetwork(nn.Module):
    """Pensieve's network: a 1D-CNN per sequence (``y``, ``c``: a grouped convolution), a dense layer
    over the scalars, a merged hidden layer and a linear output."""

    def __init__(self, history: int, hidden: int) -> None:
        super().__init__()
        if history < KERNEL:
            raise ValueError(f"Pensieve needs a predictor window of at least {KERNEL} steps; got {history}")
        self.conv = nn.Conv1d(2, 2 * hidden, KERNEL, groups=2)
        self.scalars = nn.Linear(N_SCALARS, hidden)
        self.merge = nn.Linear(2 * hidden * (history - KERNEL + 1) + hidden, hidden)
        self.out = nn.Linear(hidden, 1)

    def forward(self, sequences: torch.Tensor, scalars: torch.Tensor) -> torch.Tensor:
        """``sequences`` ``(B, 2, k)``, ``scalars`` ``(B, 3)`` -> ``(B,)``."""
        merged = torch.cat([torch.relu(self.conv(sequences)).flatten(1), torch.relu(self.scalars(scalars))], dim=1)
        return self.out(torch.relu(self.merge(merged))).squeeze(-1)


class PensieveActor(nn.Module):
    """Gaussian policy over the pre-squash buffer: mean from a :class:`PensieveNetwork` (small output
    layer, so it starts near ``a = mu_t``), state-independent log-std."""

    def __init__(self, history: int, hidden: int, init_log_std: float) -> None:
        super().__init__()
        self.body = PensieveNetwork(history, hidden)
        self.log_std = nn.Parameter(torch.tensor(init_log_std))
        with torch.no_grad():
            self.body.out.weight.mul_(0.1)
            self.body.out.bias.zero_()

    def forward(self, sequences: torch.Tensor, scalars: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = self.body(sequences, scalars)
        return mean, self.log_std.clamp(-5.0, 1.0).exp().expand_as(mean)


class PensieveProvisioner(Provisioner):
    """The Pensieve controller in the PIC loop for N services; with ``explore`` it samples the buffer
    with counter-based noise keyed on ``(seed, first_key + i, tick)`` and, given a ``record`` list,
    appends the ``(sequences, scalars, pre)`` of every decision (for training)."""

    def __init__(
        self,
        predictor: torch.nn.Module,
        actor: PensieveActor,
        config: PicRLConfig,
        *,
        explore: bool = False,
        first_key: int = 0,
        record: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None,
    ) -> None:
        self.predictor = predictor.eval()
        self.actor = actor
        self.config = config
        self.explore = explore
        self.first_key = first_key
        self.record = record
        self.history = min(HISTORY, config.predictor.window)
        # training rollouts are large batches; deployed, the config's acting chunk (as PicRLController)
        self.chunk = INVARIANT_CHUNK if record is not None else config.online.inference_chunk
        self._keys = np.zeros(0, np.uint64)
        self._tick = 0
        self._observations = self._censored = self._context = self._last = np.zeros(0)

    def start(self, history: np.ndarray, history_context: np.ndarray | None) -> np.ndarray:
        history = np.asarray(history, dtype=np.float32)
        n = history.shape[0]
        context = (
            np.zeros((*history.shape, 0), np.float32)
            if history_context is None
            else np.asarray(history_context, dtype=np.float32)
        )
        self._observations, self._context = _last_window(history, context, self.config.predictor.window)
        self._censored = np.zeros_like(self._observations, dtype=bool)
        self._last = history[:, -1].astype(np.float64)  # the offline logs were provisioned exactly
        self._keys = np.uint64(self.first_key) + np.arange(n, dtype=np.uint64)
        self._tick = 0
        return self._decide()

    def act(self, y: np.ndarray, censored: np.ndarray, context: np.ndarray | None) -> np.ndarray:
        n = self._observations.shape[0]
        row = np.zeros((n, 0), np.float32) if context is None else np.asarray(context, dtype=np.float32)
        self._observations = _shift(self._observations, np.asarray(y, dtype=np.float32))
        self._censored = _shift(self._censored, np.asarray(censored, dtype=bool))
        self._context = _shift(self._context, row)
        self._tick += 1
        return self._decide()

    def _decide(self) -> np.ndarray:
        censored = self._censored.astype(np.float32)
        windows = np.concatenate([self._observations[:, :, None], censored[:, :, None], self._context], axis=2)
        mu, sigma = predict_gaussian(self.predictor, windows, self.chunk)
        recent = slice(-self.history, None)
        sequences = np.stack([self._observations[:, recent], censored[:, recent]], axis=1)
        scalars = np.stack([mu, sigma, self._last], axis=1).astype(np.float32)

        def forward(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            mean, std = self.actor(
                torch.from_numpy(rows[:, :-N_SCALARS].reshape(-1, 2, self.history)),
                torch.from_numpy(rows[:, -N_SCALARS:]),
            )
            return mean.numpy(), std.numpy()

        with torch.inference_mode():
            mean, std = in_fixed_chunks(
                forward, np.concatenate([sequences.reshape(len(mu), -1), scalars], axis=1), self.chunk
            )
        pre = mean
        if self.explore:
            noise = counter_normal(self.config.seed, self._keys, np.full(len(mu), self._tick), 1)[:, 0]
            pre = mean + std * noise.astype(np.float32)
        if self.record is not None:
            self.record.append((sequences, scalars, pre.astype(np.float32)))
        self._last = np.clip(mu + MAX_BUFFER * np.tanh(pre.astype(np.float64)), 0.0, 1.0)
        return self._last.copy()


@dataclass(frozen=True)
class PensieveReport:
    """Learning curves of the Pensieve training, one entry per iteration."""

    iterations: int
    value_loss: tuple[float, ...]
    mean_reward: tuple[float, ...]  # naive observed reward (0 on censored steps)
    censor_rate: tuple[float, ...]

    def to_dict(self) -> dict:
        return asdict(self)


def train_pensieve(
    predictor: torch.nn.Module,
    train: np.ndarray,
    config: PicRLConfig,
    *,
    train_context: np.ndarray | None = None,
    services: int = 1,
    progress: Callable[[dict[str, float]], None] | None = None,
) -> tuple[PensieveActor, PensieveNetwork, PensieveReport]:
    """Synchronous advantage actor-critic on exploring rollouts of the Pensieve controller over
    ``chunks`` random chunks of the training split per iteration (Phase 2's budget and settings)."""
    cfg, window = config.pretrain, config.predictor.window
    history = min(HISTORY, window)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        actor = PensieveActor(history, config.policy.hidden, config.policy.init_log_std)
        critic = PensieveNetwork(history, config.policy.hidden)
    every, length = chunk_starts(train, services, window, cfg.chunk_len, "Pensieve")
    rng = np.random.default_rng(config.seed)
    actor_opt = torch.optim.Adam(actor.parameters(), lr=cfg.lr_actor)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=cfg.lr_critic)
    curves: dict[str, list[float]] = {"value_loss": [], "mean_reward": [], "censor_rate": []}
    for iteration in range(cfg.iterations):
        starts = every[rng.integers(0, every.size, size=cfg.chunks)]
        record: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        agent = PensieveProvisioner(
            predictor, actor, config, explore=True, first_key=iteration * cfg.chunks, record=record
        )
        context = None if train_context is None else np.swapaxes(_chunks(train_context, starts, length), 0, 1)
        history_context = None if train_context is None else _chunks(train_context, starts - window, window)
        loop = run_pic_loop(
            agent,
            np.swapaxes(_chunks(train, starts, length), 0, 1),
            _chunks(train, starts - window, window),
            context=context,
            history_context=history_context,
        )
        rewards = torch.from_numpy(-asymmetric_cost(loop.actions, loop.observed, config.cost)).float()  # (T, B)
        sequences, scalars, pre = (torch.from_numpy(np.stack(part)) for part in zip(*record))
        steps, batch = rewards.shape
        values = critic(sequences.flatten(0, 1), scalars.flatten(0, 1)).view(steps, batch)
        with torch.no_grad():  # the last decision has no successor state in the loop: it only bootstraps
            advantages = gae(rewards[:-1], values[:-1], values[1:], cfg.discount, cfg.gae_lambda)
            returns = advantages + values[:-1]
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        mean, std = actor(sequences[:-1].flatten(0, 1), scalars[:-1].flatten(0, 1))
        log_prob = gaussian_log_prob(mean[:, None], std[:, None], pre[:-1].reshape(-1, 1))
        entropy = (std.log() + 0.5 * math.log(2 * math.pi * math.e)).mean()
        actor_loss = -(log_prob * advantages.flatten()).mean() - cfg.entropy_coef * entropy
        actor_opt.zero_grad()
        actor_loss.backward()
        torch.nn.utils.clip_grad_norm_(actor.parameters(), cfg.grad_clip)
        actor_opt.step()
        value_loss = cfg.value_coef * (values[:-1] - returns).pow(2).mean()
        critic_opt.zero_grad()
        value_loss.backward()
        torch.nn.utils.clip_grad_norm_(critic.parameters(), cfg.grad_clip)
        critic_opt.step()
        curves["value_loss"].append(value_loss.item())
        curves["mean_reward"].append(float(rewards.mean()))
        curves["censor_rate"].append(float(loop.censored.mean()))
        if progress is not None:
            progress({"iteration": iteration + 1, **{k: v[-1] for k, v in curves.items()}})
    report = PensieveReport(cfg.iterations, *(tuple(curves[k]) for k in ("value_loss", "mean_reward", "censor_rate")))
    return actor, critic, report


def fit_pensieve(series: PreparedSeries, config: PicRLConfig) -> PensieveProvisioner:
    """Phase 1 (Gaussian LSTM, kept), then the Pensieve controller trained and deployed in place of
    Phases 2 and 3."""
    config = config_for(series, config)
    predictor = phase1_predictor(series, config)
    actor, _, _ = train_pensieve(
        predictor, series.train, config, train_context=series.train_ctx, services=series.services
    )
    return PensieveProvisioner(predictor, actor, config)
