"""Phase-2 substitution: Conservative Q-Learning (Kumar et al., "Conservative Q-learning for offline
reinforcement learning", NeurIPS 2020) in place of the actor-critic pretraining.

Offline data: the freshly initialised policy (the one Phase 2 would start from) is rolled out once,
exploring, through the PIC controller over random chunks of the training split (the same
controller, simulator, rewards and chunk sampling as :func:`~picrl_core.pretrain.pretrain_policy`:
pessimistic surrogate on censored steps, true cost otherwise). On that fixed data set, CQL(H) on a
SAC backbone (the reference implementation's set-up):

* twin Q-networks over (state features ``s_t``, pre-squash ``(eta, k)``), Polyak-averaged targets,
  soft Bellman targets ``r + gamma (min_i Q'_i(s', a') - alpha_ent log pi(a'|s'))``, ``a' ~ pi(s')``;
* the CQL(H) regulariser ``alpha * (E_s log sum_a exp Q(s, a) - E_(s,a)~D Q(s, a))``, the log-sum-exp
  estimated by importance sampling over uniform actions and actions of the current policy at
  ``s`` and ``s'`` (Kumar et al., Appendix F);
* the actor (a :class:`~picrl_core.policy.PolicyNetwork`) maximises ``min_i Q_i(s, a) - alpha_ent
  log pi(a|s)`` with reparametrised samples.

The value network that Phase 3's slow learner starts from is fitted from Q, not by TD:
``V(s) = E_{a ~ pi(s)} min_i Q_i(s, a)`` (regressed on the batch states at every step). Phase 1
(the Gaussian LSTM) and Phase 3 (calibrator and KL-regularised slow updates) are kept.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

from picrl_core.batching import INVARIANT_CHUNK
from picrl_core.config import PicRLConfig
from picrl_core.controller import PicRLController, Transition
from picrl_core.controller_state import ControllerState
from picrl_core.methods.pic_rl import PicRLProvisioner
from picrl_core.pipeline import train_offline
from picrl_core.policy import N_FEATURES, N_OUTPUTS, PolicyNetwork, ValueNetwork, _mlp, gaussian_log_prob
from picrl_core.pretrain import _chunks, chunk_starts
from picrl_core.series import PreparedSeries
from picrl_core.simulator import simulate

ITERATIONS_PER_ROLLOUT = 10  # data set: one rollout of `pretrain.chunks` chunks per 10 Phase-2 iterations
STEPS_PER_ITERATION = 4  # CQL gradient steps per Phase-2 iteration
BATCH_SIZE = 256
CQL_WEIGHT = 5.0  # alpha of the CQL(H) regulariser (Kumar et al., Gym tasks)
ACTION_SAMPLES = 10  # actions per state and proposal in the log-sum-exp estimate (reference: 10)
TARGET_RATE = 0.005  # Polyak rate of the target Q-networks (SAC)
UNIFORM_RANGE = 4.0  # uniform proposal over [-4, 4]^2 in pre-squash space (sigmoid(4) = 0.98)


class QNetwork(nn.Module):
    """``Q(s, a)`` over the state features and the pre-squash action ``(eta, k)``."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.body = _mlp(N_FEATURES + N_OUTPUTS, hidden, 1)

    def forward(self, features: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
        """``features`` ``(..., F)`` and ``pre`` ``(..., 2)`` (broadcast) -> ``(...)``."""
        features = features.expand(*pre.shape[:-1], features.shape[-1])
        return self.body(torch.cat([features, pre], dim=-1)).squeeze(-1)


@dataclass(frozen=True)
class CQLReport:
    """Learning curves of the CQL pretraining, one entry per Phase-2 iteration."""

    iterations: int
    transitions: int  # size of the offline data set
    mean_reward: float  # of the data set (unscaled)
    q_loss: tuple[float, ...]
    cql_gap: tuple[float, ...]  # log-sum-exp Q minus data Q (what the regulariser pushes down)
    actor_loss: tuple[float, ...]

    def to_dict(self) -> dict:
        return asdict(self)


def collect_offline_data(
    predictor: torch.nn.Module,
    policy: PolicyNetwork,
    train: np.ndarray,
    config: PicRLConfig,
    train_context: np.ndarray | None,
    series_count: int = 1,
) -> dict[str, torch.Tensor]:
    """One exploring rollout of ``policy`` through the PIC controller over
    ``chunks * max(1, iterations // ITERATIONS_PER_ROLLOUT)`` random chunks of the training split, all
    services stepped together; returns ``features``, ``pre``, ``reward`` and ``next_features`` rows."""
    cfg, window = config.pretrain, config.predictor.window
    every, length = chunk_starts(train, series_count, window, cfg.chunk_len, "Phase 2")
    services = cfg.chunks * max(1, cfg.iterations // ITERATIONS_PER_ROLLOUT)
    starts = every[np.random.default_rng(config.seed).integers(0, every.size, size=services)]
    steps: list[Transition] = []

    def collect(_: int, __: ControllerState, transition: Transition) -> None:
        steps.append(transition)

    context = None if train_context is None else np.swapaxes(_chunks(train_context, starts, length), 0, 1)
    history_context = None if train_context is None else _chunks(train_context, starts - window, window)
    controller = PicRLController(predictor, policy, config, explore=True, chunk=INVARIANT_CHUNK)
    simulate(
        controller,
        np.swapaxes(_chunks(train, starts, length), 0, 1),
        _chunks(train, starts - window, window),
        context=context,
        history_context=history_context,
        keys=np.arange(services, dtype=np.uint64),
        on_step=collect,
    )
    return {
        name: torch.from_numpy(np.concatenate([getattr(s, name) for s in steps]))
        for name in ("features", "pre", "reward", "next_features")
    }


def cql_log_sum_exp(
    q: QNetwork, features: torch.Tensor, proposals: list[tuple[torch.Tensor, torch.Tensor]]
) -> torch.Tensor:
    """``log sum_a exp Q(s, a)`` by importance sampling: ``logsumexp_j (Q(s, a_j) - log p(a_j))`` over
    the samples ``a_j`` of each proposal ``(actions (B, N, 2), log densities (B, N))``, minus
    ``log(number of samples)``."""
    weighted = torch.cat([q(features[:, None], actions) - log_density for actions, log_density in proposals], dim=1)
    return torch.logsumexp(weighted, dim=1) - math.log(weighted.shape[1])


def pretrain_cql(
    predictor: torch.nn.Module,
    train: np.ndarray,
    config: PicRLConfig,
    *,
    train_context: np.ndarray | None = None,
    services: int = 1,
    progress: Callable[[dict[str, float]], None] | None = None,
) -> tuple[PolicyNetwork, ValueNetwork, CQLReport]:
    """CQL(H) pretraining of ``pi_phi`` (and ``V_psi`` fitted from Q) on offline PIC rollouts, with the
    interface of :func:`~picrl_core.pretrain.pretrain_policy`. Rewards are divided by their std on
    the data set so the regulariser weight keeps its usual scale against the TD error."""
    cfg = config.pretrain
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        policy, value = PolicyNetwork(config.policy), ValueNetwork(config.policy)
        q_nets = nn.ModuleList([QNetwork(config.policy.hidden), QNetwork(config.policy.hidden)])
    if cfg.iterations == 0:
        return policy, value, CQLReport(0, 0, 0.0, (), (), ())
    data = collect_offline_data(predictor, policy, train, config, train_context, services)
    reward_scale = float(data["reward"].std()) or 1.0
    rewards = (data["reward"] / reward_scale).float()
    targets = copy.deepcopy(q_nets).requires_grad_(False)
    q_opt = torch.optim.Adam(q_nets.parameters(), lr=cfg.lr_critic)
    actor_opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr_actor)
    value_opt = torch.optim.Adam(value.parameters(), lr=cfg.lr_critic)
    generator = torch.Generator().manual_seed(config.seed)
    temperature = cfg.entropy_coef
    uniform_log_density = -N_OUTPUTS * math.log(2.0 * UNIFORM_RANGE)
    n = rewards.shape[0]

    def sample(features: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``count`` reparametrised policy samples per state: ``(B, count, 2)`` and their log-densities."""
        mean, std = policy(features)
        noise = torch.randn((features.shape[0], count, N_OUTPUTS), generator=generator)
        actions = mean[:, None] + std[:, None] * noise
        return actions, gaussian_log_prob(mean[:, None], std[:, None], actions)

    curves: dict[str, list[float]] = {"q_loss": [], "cql_gap": [], "actor_loss": []}
    policy.train()
    for iteration in range(cfg.iterations):
        for _ in range(STEPS_PER_ITERATION):
            rows = torch.randint(n, (min(BATCH_SIZE, n),), generator=generator)
            s, a, r, s2 = data["features"][rows], data["pre"][rows], rewards[rows], data["next_features"][rows]
            with torch.no_grad():
                next_actions, next_log_prob = sample(s2, 1)
                next_q = torch.minimum(*(t(s2[:, None], next_actions) for t in targets))
                target = r + cfg.discount * (next_q - temperature * next_log_prob)[:, 0]
                uniform = torch.rand((s.shape[0], ACTION_SAMPLES, N_OUTPUTS), generator=generator) * 2.0 - 1.0
                proposals = [
                    (uniform * UNIFORM_RANGE, torch.full(uniform.shape[:2], uniform_log_density)),
                    sample(s, ACTION_SAMPLES),
                    sample(s2, ACTION_SAMPLES),
                ]
            td = sum(((q(s, a) - target) ** 2).mean() for q in q_nets)
            gaps = [(cql_log_sum_exp(q, s, proposals) - q(s, a)).mean() for q in q_nets]
            q_loss = td + CQL_WEIGHT * sum(gaps)
            q_opt.zero_grad()
            q_loss.backward()
            torch.nn.utils.clip_grad_norm_(q_nets.parameters(), cfg.grad_clip)
            q_opt.step()

            actions, log_prob = sample(s, 1)
            q_new = torch.minimum(*(q(s[:, None], actions) for q in q_nets))
            actor_loss = (temperature * log_prob - q_new).mean()
            actor_opt.zero_grad()
            actor_loss.backward()
            torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.grad_clip)
            actor_opt.step()

            value_loss = (value(s) - reward_scale * q_new.detach().mean(dim=1)).pow(2).mean()
            value_opt.zero_grad()
            value_loss.backward()
            torch.nn.utils.clip_grad_norm_(value.parameters(), cfg.grad_clip)
            value_opt.step()
            with torch.no_grad():
                for target_param, param in zip(targets.parameters(), q_nets.parameters()):
                    target_param.lerp_(param, TARGET_RATE)
        curves["q_loss"].append(q_loss.item())
        curves["cql_gap"].append(float(sum(g.item() for g in gaps)) / len(gaps))
        curves["actor_loss"].append(actor_loss.item())
        if progress is not None:
            progress({"iteration": iteration + 1, **{k: v[-1] for k, v in curves.items()}})
    policy.eval()
    report = CQLReport(
        cfg.iterations,
        n,
        float(data["reward"].mean()),
        *(tuple(curves[k]) for k in ("q_loss", "cql_gap", "actor_loss")),
    )
    return policy, value, report


def fit_cql(series: PreparedSeries, config: PicRLConfig) -> PicRLProvisioner:
    """Phase 1 (Gaussian LSTM), CQL in place of Phase 2, then Phase 3 unchanged."""
    return PicRLProvisioner.from_artifact(train_offline(series, config, pretrainer=pretrain_cql))
