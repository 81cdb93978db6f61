"""The predictor's slow loop (picrl_core.predictor.refit): the censored NLL, the replay, the KL/EMA tie, the gate."""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy.stats import norm

from picrl_core.artifact import ModelArtifact
from picrl_core.config import PicRLConfig, PolicyConfig, PredictorConfig, RefitConfig
from picrl_core.noise import held_out, service_key
from picrl_core.pipeline import online_controller
from picrl_core.policy import PolicyNetwork, ValueNetwork, gaussian_kl
from picrl_core.predictor.model import GaussianLSTM
from picrl_core.predictor.refit import (
    PredictorRefit,
    PredictorReplay,
    censored_nll,
    censored_nll_terms,
    held_out_nll,
    improves,
    sequence_forecasts,
)
from picrl_core.simulator import simulate
from picrl_core.synthetic import linear_drift, stationary_gaussian
from stream.records import TransitionRecord
from stream.trainer_replay import is_held_out


def test_the_censored_nll_is_scipys_tobit_likelihood_far_into_both_tails() -> None:
    rng = np.random.default_rng(0)
    mu, sigma = rng.uniform(0, 1, 400), rng.uniform(0.01, 0.3, 400)
    z = np.concatenate([rng.normal(0, 3, 396), [-40.0, -9.0, 9.0, 38.0]])
    y, censored = mu + z * sigma, rng.random(400) < 0.5
    terms = censored_nll_terms(*(torch.from_numpy(v) for v in (mu, sigma, y, censored))).numpy()
    expected = np.where(censored, -norm.logsf(y, mu, sigma), -norm.logpdf(y, mu, sigma))
    np.testing.assert_allclose(terms, expected, rtol=1e-10, atol=1e-12)
    mask = rng.random(400) < 0.7
    mean = censored_nll(*(torch.from_numpy(v) for v in (mu, sigma, y, censored, mask)))
    assert float(mean) == pytest.approx(expected[mask].mean(), rel=1e-12)


def test_the_censored_nll_has_finite_gradients_in_the_tails() -> None:
    mu = torch.tensor([0.0, 0.0, 0.0, 0.0], dtype=torch.float64, requires_grad=True)
    sigma = torch.full((4,), 0.01, dtype=torch.float64, requires_grad=True)
    y = torch.tensor([0.5, -0.5, 0.5, -0.5], dtype=torch.float64)  # z = +-50
    censored = torch.tensor([True, True, False, False])
    censored_nll(mu, sigma, y, censored, torch.ones(4, dtype=torch.bool)).backward()
    assert torch.isfinite(mu.grad).all() and torch.isfinite(sigma.grad).all()
    assert mu.grad[0] < 0  # a censored tick far above the forecast pulls mu up


def test_the_hold_out_rule_is_the_trainers() -> None:
    for tick in range(30):
        records = [
            TransitionRecord(f"s{k}", tick, (0.0,), (0.0, 0.0), 0.0, 0.0, (0.0,), False, 0.0, 0) for k in range(3)
        ]
        keyed = np.array([service_key(r.service) for r in records], np.uint64)
        assert held_out(keyed, np.full(3, tick), 10).tolist() == [is_held_out(r, 10) for r in records]


def _replay(ticks: int, capacity: int = 64, every: int = 10) -> PredictorReplay:
    replay = PredictorReplay(RefitConfig(ticks=capacity, holdout_every=every), channels=2)
    for t in range(ticks):
        replay.add(
            np.array([0, 1], np.uint64),
            np.array([t, t]),
            np.array([[t, 0], [1000 + t, 0]], np.float32),
            np.array([t + 0.5, 1000 + t + 0.5]),
            np.array([t % 3 == 0, False]),
        )
    return replay


def test_a_replayed_input_is_paired_with_the_next_ticks_feedback() -> None:
    runs = _replay(40).draw(8, 50, np.random.default_rng(0))
    assert runs is not None and runs.inputs.shape == (50, 8, 2)
    tick = runs.inputs[:, :, 0] % 1000
    np.testing.assert_array_equal(runs.y.numpy() % 1000, (tick + 1.5).numpy())
    first = runs.inputs[:, :, 0] < 1000  # service 0's rows (key 0: held out at ticks 0, 10, ...)
    np.testing.assert_array_equal(runs.censored[first].numpy(), ((tick + 1) % 3 == 0)[first].numpy())
    np.testing.assert_array_equal(runs.held_out[first].numpy(), ((tick + 1) % 10 == 0)[first].numpy())


def test_the_replay_keeps_each_services_newest_contiguous_ticks() -> None:
    replay = _replay(200, capacity=64)
    whole = replay.whole(0)
    assert len(whole) == 1 and whole[0].inputs.shape == (2, 63, 2)
    np.testing.assert_array_equal(
        whole[0].inputs[0, :, 0].numpy(), np.arange(136, 199)
    )  # 64 ticks; the newest has no target yet
    replay.add(np.array([0], np.uint64), np.array([205]), np.zeros((1, 2), np.float32), np.zeros(1), np.zeros(1, bool))
    assert [runs.inputs.shape[:2] for runs in replay.whole(0)] == [(1, 63)]  # the gap restarted service 0's run
    assert replay.draw(64, 4, np.random.default_rng(0)) is None  # no run holds 65 ticks


def _predictor(kind: str = "windowed") -> GaussianLSTM:
    torch.manual_seed(0)
    return GaussianLSTM(PredictorConfig(window=8, hidden=8, kind=kind))


def _filled(predictor: GaussianLSTM, demand: np.ndarray, cfg: RefitConfig) -> PredictorReplay:
    """A replay of one service fed ``demand``, capped at 0.5 (censored above), as the window reads it."""
    replay = PredictorReplay(cfg, 2)
    y, censored = np.minimum(demand, 0.5), demand > 0.5
    inputs = np.stack([y, censored], axis=1).astype(np.float32)
    for t in range(len(demand)):
        replay.add(np.zeros(1, np.uint64), np.array([t]), inputs[t : t + 1], y[t : t + 1], censored[t : t + 1])
    return replay


@pytest.mark.parametrize("kind", ["windowed", "incremental"])
def test_the_forecasts_of_a_sequence_are_what_the_model_reads_at_each_step(kind: str) -> None:
    model = _predictor(kind)
    x = torch.from_numpy(np.random.default_rng(0).random((3, 20, 2)).astype(np.float32))
    mu, sigma = sequence_forecasts(model, x)
    assert mu.shape == (3, 13)
    # output 5 is the forecast after step 5 + W - 1 = 12: the window of steps 5 .. 12, or the stream up to 12
    expected = model(x[:, 5:13] if kind == "windowed" else x[:, :13])
    torch.testing.assert_close(mu[:, 5], expected[0])
    torch.testing.assert_close(sigma[:, 5], expected[1])


def test_the_refit_learns_the_censored_level_and_its_ema_and_kl_tie_it_to_the_acting_predictor() -> None:
    predictor = _predictor()
    demand = stationary_gaussian(600, mean=0.45, std=0.1, seed=1)
    cfg = RefitConfig(ticks=600, sequences=8, gradient_steps=4, lr=2e-2, kl_coef=0.0, ema_decay=0.9)
    replay = _filled(predictor, demand, cfg)
    start = held_out_nll(predictor, replay)
    refit = PredictorRefit(predictor, cfg, seed=0)
    before = copy.deepcopy(refit.acting)
    refit.update(replay)
    for acting, old, learned in zip(refit.acting.parameters(), before.parameters(), refit.learner.parameters()):
        torch.testing.assert_close(acting, 0.9 * old + 0.1 * learned)  # the EMA
    for _ in range(30):
        refit.update(replay)
    assert held_out_nll(refit.acting, replay) < start - 0.05  # it learnt from the censored replay
    _assert_untouched(predictor, _predictor())

    def moved(kl_coef: float) -> float:
        """How far five refits from ``predictor`` move the acting predictor (no EMA): KL to ``predictor``."""
        tied = PredictorRefit(predictor, replace(cfg, kl_coef=kl_coef, ema_decay=0.0), seed=0)
        for _ in range(5):
            tied.update(replay)
        x = replay.whole(0)[0].inputs
        new, old = sequence_forecasts(tied.acting, x), sequence_forecasts(predictor, x)
        with torch.no_grad():
            return float(gaussian_kl(*(v[..., None] for v in (*new, *old))).mean())

    assert moved(10.0) < 0.5 * moved(0.0)  # the KL holds the refit near the acting predictor


def _assert_untouched(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name


def test_the_gate_publishes_only_below_the_parent_by_the_threshold() -> None:
    assert improves(1.0, 1.02, 0.01)
    assert improves(1.0, 1.01, 0.01)
    assert not improves(1.0, 1.005, 0.01)
    assert not improves(None, 1.0, 0.0) and not improves(1.0, None, 0.0)


def _artifact(refit: RefitConfig) -> ModelArtifact:
    config = PicRLConfig(
        predictor=PredictorConfig(window=8, hidden=8, kind="windowed"), policy=PolicyConfig(hidden=8), refit=refit
    )
    config = replace(config, online=replace(config.online, n_update=16))
    torch.manual_seed(0)
    return ModelArtifact(
        config, GaussianLSTM(config.predictor), PolicyNetwork(config.policy), ValueNetwork(config.policy)
    )


@pytest.mark.parametrize("threshold", [0.0, 1e9])
def test_the_slow_loop_acts_with_a_refitted_predictor_only_once_it_passes_the_gate(threshold: float) -> None:
    artifact = _artifact(RefitConfig(enabled=True, ticks=256, sequences=4, lr=5e-3, threshold=threshold))
    kept = copy.deepcopy(artifact.predictor)
    demand = linear_drift(400, start=0.3, end=0.7, seed=2)[:, None]
    controller, slow = online_controller(artifact.predictor, artifact.policy, artifact.value, artifact.config)
    assert slow is not None and controller.predictor is slow.predictor and slow.predictor is not artifact.predictor
    simulate(controller, demand, demand[:8].T, on_step=lambda t, state, transition: slow.observe(transition, state))
    _assert_untouched(artifact.predictor, kept)  # the artifact's predictor is never modified
    if threshold > 0:
        assert slow.predictor_versions == []
        _assert_untouched(controller.predictor, kept)
    else:
        assert slow.predictor_versions and all(new <= old for _, new, old in slow.predictor_versions)
        assert any(not torch.equal(a, b) for a, b in zip(controller.predictor.parameters(), kept.parameters()))
