"""Phase 2 actor-critic pretraining and the Phase 3 slow loop (picrl_core.pretrain, picrl_core.online)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from picrl_core.config import PicRLConfig
from picrl_core.controller import Transition
from picrl_core.online import ReplayBuffer, SlowPolicyLearner, off_policy_score
from picrl_core.policy import N_FEATURES, PolicyNetwork, ValueNetwork, gaussian_log_prob
from picrl_core.predictor.model import GaussianLSTM
from picrl_core.pretrain import PretrainReport, gae, pretrain_policy

Pretrained = tuple[tuple[PolicyNetwork, ValueNetwork, PretrainReport], list[dict[str, float]]]


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _assert_same(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = _state(a), _state(b)
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


def _max_change(a: torch.nn.Module, b: torch.nn.Module) -> float:
    sa, sb = _state(a), _state(b)
    return max(float((sa[k] - sb[k]).abs().max()) for k in sa)


# --- GAE -------------------------------------------------------------------------------------------


def test_gae_matches_hand_computation() -> None:
    rewards = torch.tensor([1.0, 2.0, 3.0])
    values = torch.tensor([0.5, 1.0, 1.5])
    next_values = torch.tensor([1.0, 1.5, 2.0])
    # deltas: 1 + 0.9*1 - 0.5 = 1.4, 2 + 0.9*1.5 - 1 = 2.35, 3 + 0.9*2 - 1.5 = 3.3; gamma*lambda = 0.72
    # A2 = 3.3, A1 = 2.35 + 0.72*3.3 = 4.726, A0 = 1.4 + 0.72*4.726 = 4.80272
    expected = torch.tensor([4.80272, 4.726, 3.3])
    torch.testing.assert_close(gae(rewards, values, next_values, 0.9, 0.8), expected)
    # lambda = 0: one-step TD errors; a batch axis is carried along unchanged
    batch = gae(
        torch.stack([rewards, 2 * rewards], 1),
        torch.stack([values, values], 1),
        torch.stack([next_values, next_values], 1),
        0.9,
        0.0,
    )
    torch.testing.assert_close(batch[:, 0], torch.tensor([1.4, 2.35, 3.3]))
    torch.testing.assert_close(batch[:, 1], torch.tensor([2.4, 4.35, 6.3]))


# --- Phase 2 ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pretrained(tiny_predictor: GaussianLSTM, tiny_config: PicRLConfig, diurnal_series: np.ndarray) -> Pretrained:
    records: list[dict[str, float]] = []
    result = pretrain_policy(tiny_predictor, diurnal_series[:1600], tiny_config, progress=records.append)
    return result, records


def test_pretrain_reports_every_iteration(pretrained: Pretrained, tiny_config: PicRLConfig) -> None:
    (_, _, report), records = pretrained
    n = tiny_config.pretrain.iterations
    assert report.iterations == n
    for curve in (report.value_loss, report.mean_reward, report.censor_rate):
        assert len(curve) == n and all(math.isfinite(v) for v in curve)
    assert all(v >= 0 for v in report.value_loss)
    assert all(v <= 0 for v in report.mean_reward)  # rewards are negative costs
    assert all(0 <= v <= 1 for v in report.censor_rate)
    assert [r["iteration"] for r in records] == list(range(1, n + 1))
    assert records[-1]["value_loss"] == report.value_loss[-1]
    assert report.to_dict()["iterations"] == n


def test_pretrain_is_deterministic_and_learns(
    pretrained: Pretrained, tiny_predictor: GaussianLSTM, tiny_config: PicRLConfig, diurnal_series: np.ndarray
) -> None:
    (policy, value, report), _ = pretrained
    again_policy, again_value, again_report = pretrain_policy(tiny_predictor, diurnal_series[:1600], tiny_config)
    _assert_same(policy, again_policy)
    _assert_same(value, again_value)
    assert again_report == report
    untouched_config = replace(tiny_config, ablation=replace(tiny_config.ablation, pretrain=False))
    initial_policy, initial_value, empty = pretrain_policy(tiny_predictor, diurnal_series[:1600], untouched_config)
    assert _max_change(policy, initial_policy) > 1e-4
    assert _max_change(value, initial_value) > 1e-4
    assert empty.iterations == 0 and empty.value_loss == ()


def test_ablation_a7_returns_the_seeded_initial_networks(
    tiny_predictor: GaussianLSTM, tiny_config: PicRLConfig, diurnal_series: np.ndarray
) -> None:
    config = replace(tiny_config, seed=5, ablation=replace(tiny_config.ablation, pretrain=False))
    policy, value, _ = pretrain_policy(tiny_predictor, diurnal_series[:1600], config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        fresh_policy, fresh_value = PolicyNetwork(config.policy), ValueNetwork(config.policy)
    _assert_same(policy, fresh_policy)
    _assert_same(value, fresh_value)


def test_pretrain_rejects_a_too_short_training_split(tiny_predictor: GaussianLSTM, tiny_config: PicRLConfig) -> None:
    with pytest.raises(ValueError, match="too short for Phase 2"):
        pretrain_policy(tiny_predictor, np.full(12, 0.5), tiny_config)


# --- replay buffer ---------------------------------------------------------------------------------


def _transition(rewards: np.ndarray, seed: int = 0, policy: PolicyNetwork | None = None) -> Transition:
    """Transitions with random states; rows are tagged by their reward. With a ``policy``, ``pre``
    is sampled from it (and ``log_prob`` is its behaviour log-density)."""
    rng = np.random.default_rng(seed)
    n = len(rewards)
    features = rng.normal(size=(n, N_FEATURES)).astype(np.float32)
    pre = rng.normal(size=(n, 2)).astype(np.float32)
    log_prob = np.zeros(n, np.float32)
    if policy is not None:
        with torch.no_grad():
            mean, std = policy(torch.from_numpy(features))
            sample = mean + std * torch.from_numpy(pre)
            log_prob = gaussian_log_prob(mean, std, sample).numpy()
        pre = sample.numpy()
    return Transition(
        features=features,
        pre=pre,
        log_prob=log_prob,
        reward=np.asarray(rewards, np.float64),
        next_features=rng.normal(size=(n, N_FEATURES)).astype(np.float32),
        censored=np.zeros(n, bool),
        action=np.zeros(n),
    )


def _held(buffer: ReplayBuffer) -> set[float]:
    """The reward tags of the rows the buffer holds (union of many uniform samples)."""
    rng = np.random.default_rng(0)
    return {r for _ in range(200) for r in buffer.sample(len(buffer), rng)["reward"].tolist()}


def test_replay_buffer_keeps_the_newest_rows() -> None:
    buffer = ReplayBuffer(5, N_FEATURES)
    buffer.add(_transition(np.arange(3.0)))
    assert len(buffer) == 3 and buffer.added == 3
    assert _held(buffer) == {0.0, 1.0, 2.0}
    buffer.add(_transition(np.arange(3.0, 7.0)))  # wraps around: the two oldest rows are overwritten
    assert len(buffer) == 5 and buffer.added == 7
    assert _held(buffer) == {2.0, 3.0, 4.0, 5.0, 6.0}
    buffer.add(_transition(np.arange(7.0, 19.0)))  # one batch larger than the capacity
    assert len(buffer) == 5 and buffer.added == 19
    assert _held(buffer) == {14.0, 15.0, 16.0, 17.0, 18.0}


def test_replay_sample_shapes_and_row_consistency() -> None:
    buffer = ReplayBuffer(64, N_FEATURES)
    source = _transition(np.arange(40.0), seed=3)
    buffer.add(source)
    batch = buffer.sample(16, np.random.default_rng(1))
    assert batch["features"].shape == (16, N_FEATURES) and batch["next_features"].shape == (16, N_FEATURES)
    assert batch["pre"].shape == (16, 2) and batch["log_prob"].shape == (16,) and batch["reward"].shape == (16,)
    rows = batch["reward"].numpy().astype(int)  # the reward tags the source row: fields stay aligned
    np.testing.assert_array_equal(batch["features"].numpy(), source.features[rows])
    np.testing.assert_array_equal(batch["next_features"].numpy(), source.next_features[rows])
    np.testing.assert_array_equal(batch["pre"].numpy(), source.pre[rows])
    assert buffer.sample(1000, np.random.default_rng(1))["reward"].shape == (40,)  # at most what it holds
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(0, N_FEATURES)


# --- slow learner ----------------------------------------------------------------------------------


def _learner_setup(config: PicRLConfig, seed: int = 0) -> tuple[SlowPolicyLearner, PolicyNetwork, ReplayBuffer]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy, value = PolicyNetwork(config.policy), ValueNetwork(config.policy)
    buffer = ReplayBuffer(512, N_FEATURES)
    probe = _transition(np.zeros(512), seed=seed, policy=policy)
    # a clear learning signal: reward prefers pre-squash (eta, k) near (-1, 1.5)
    buffer.add(replace(probe, reward=-((probe.pre[:, 0] + 1.0) ** 2) - (probe.pre[:, 1] - 1.5) ** 2))
    return SlowPolicyLearner(policy, value, config), policy, buffer


def _online(config: PicRLConfig, **changes: float) -> PicRLConfig:
    return replace(config, online=replace(config.online, lr=1e-2, gradient_steps=8, batch_size=64, **changes))


def test_slow_update_returns_finite_stats(tiny_config: PicRLConfig) -> None:
    learner, policy, buffer = _learner_setup(_online(tiny_config))
    first = learner.update(buffer)
    second = learner.update(buffer)
    assert (first.update, second.update) == (1, 2) and learner.updates == 2
    assert first.transitions_seen == 512
    for stats in (first, second):
        assert all(math.isfinite(v) for v in (stats.kl_to_parent, stats.actor_loss, stats.value_loss))
        assert stats.kl_to_parent >= 0
    assert set(first.to_dict()) == {"update", "transitions_seen", "kl_to_parent", "actor_loss", "value_loss"}
    assert _max_change(learner.acting, policy) > 0  # the acting policy moved ...
    _assert_same(policy, _learner_setup(_online(tiny_config))[1])  # ... but the caller's policy did not


def test_acting_policy_is_an_ema_of_the_learner(tiny_config: PicRLConfig) -> None:
    learner, policy, buffer = _learner_setup(_online(tiny_config, ema_decay=0.0))
    learner.update(buffer)
    _assert_same(learner.acting, learner.learner)
    assert _max_change(learner.acting, policy) > 1e-3

    frozen, policy, buffer = _learner_setup(_online(tiny_config, ema_decay=1.0))
    stats = frozen.update(buffer)
    _assert_same(frozen.acting, policy)
    assert stats.kl_to_parent == 0.0
    assert _max_change(frozen.learner, policy) > 1e-3  # the learner itself did move

    decay = 0.75
    half, policy, buffer = _learner_setup(_online(tiny_config, ema_decay=decay))
    half.update(buffer)
    acting, learned, before = _state(half.acting), _state(half.learner), _state(policy)
    for name in acting:
        torch.testing.assert_close(acting[name], decay * before[name] + (1 - decay) * learned[name])


def test_kl_penalty_keeps_the_update_close_to_the_parent(tiny_config: PicRLConfig) -> None:
    for seed in (0, 1):
        free = _learner_setup(_online(tiny_config, kl_coef=0.0, ema_decay=0.0), seed)
        tied = _learner_setup(_online(tiny_config, kl_coef=100.0, ema_decay=0.0), seed)
        kl_free = free[0].update(free[2]).kl_to_parent
        kl_tied = tied[0].update(tied[2]).kl_to_parent
        assert kl_tied < 0.1 * kl_free


def test_off_policy_score_prefers_the_policy_that_acts_where_reward_is_high(tiny_config: PicRLConfig) -> None:
    learner, policy, buffer = _learner_setup(_online(tiny_config))
    batch = buffer.contents()
    assert batch["reward"].shape == (512,)
    behaviour = off_policy_score(policy, batch)  # the behaviour policy itself: weights 1, plain mean
    assert behaviour == pytest.approx(float(batch["reward"].mean()), rel=1e-5)
    for _ in range(15):
        learner.update(buffer)
    assert off_policy_score(learner.acting, batch) > behaviour
    with pytest.raises(ValueError, match="no held-out"):
        off_policy_score(policy, ReplayBuffer(4, N_FEATURES).contents())
