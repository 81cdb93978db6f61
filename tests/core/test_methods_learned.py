"""The learned methods of the comparison (picrl_core.methods: pic_rl, predictors, cql, pensieve, learned)."""

from __future__ import annotations

import inspect
import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from picrl_core.config import PicRLConfig, PredictorConfig
from picrl_core.methods.base import Method, Provisioner, run_pic_loop
from picrl_core.methods.cql import UNIFORM_RANGE, QNetwork, cql_log_sum_exp, pretrain_cql
from picrl_core.methods.learned import METHODS
from picrl_core.methods.pensieve import PensieveProvisioner
from picrl_core.methods.pic_rl import ABLATIONS, PicRLProvisioner
from picrl_core.methods.predictors import (
    AutoCorrelation,
    GaussianAutoformer,
    GaussianInformer,
    GaussianTFT,
    ProbSparseAttention,
    SeriesDecomposition,
)
from picrl_core.pipeline import run_online, train_offline
from picrl_core.policy import N_FEATURES
from picrl_core.predictor.model import GaussianLSTM
from picrl_core.predictor.train import train_predictor
from picrl_core.predictor.windowed import predict_gaussian
from picrl_core.series import PreparedSeries, prepare_series
from picrl_core.synthetic import diurnal

STEPS = 40  # ticks of the PIC loop in these tests
SERVICES = 2


class _Forbidden:
    """Stands for the test split: any use of it fails the test (only the oracle may read it)."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"fit read the test split ({name})")

    def __len__(self) -> int:
        raise AssertionError("fit read the test split (len)")

    def __array__(self, *_: Any, **__: Any) -> np.ndarray:
        raise AssertionError("fit read the test split (as an array)")


class _Spy(Provisioner):
    """Passes everything through and records what the provisioner was given."""

    def __init__(self, inner: Provisioner) -> None:
        self.inner = inner
        self.seen: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (action in force, y, c)
        self._last = np.zeros(0)

    def start(self, history: np.ndarray, history_context: np.ndarray | None) -> np.ndarray:
        self._last = self.inner.start(history, history_context)
        return self._last

    def act(self, y: np.ndarray, censored: np.ndarray, context: np.ndarray | None) -> np.ndarray:
        self.seen.append((self._last.copy(), y.copy(), censored.copy()))
        self._last = self.inner.act(y, censored, context)
        return self._last


@pytest.fixture(scope="module")
def series() -> PreparedSeries:
    prepared = prepare_series(200.0 + 80.0 * diurnal(600, period=48, seed=21), "tiny-diurnal")
    return replace(prepared, test=_Forbidden())  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def loop_inputs() -> tuple[np.ndarray, np.ndarray]:
    """Demand ``(STEPS, 2)`` with bursts to 1.0 (a value no censored feedback may reveal) and history."""
    demand = diurnal(STEPS + 8, period=48, base=0.45, amplitude=0.25, noise=0.03, seed=4)
    demand = np.stack([demand[8:], demand[:-8]], axis=1)
    demand[::7, 0] = 1.0
    history = np.stack([np.linspace(0.3, 0.6, 8), np.linspace(0.6, 0.3, 8)])
    return demand, history


@pytest.mark.parametrize("method", METHODS, ids=[m.name for m in METHODS])
def test_method_fits_acts_in_unit_interval_and_is_deterministic(
    method: Method, series: PreparedSeries, tiny_config: PicRLConfig, loop_inputs: tuple[np.ndarray, np.ndarray]
) -> None:
    demand, history = loop_inputs
    spy = _Spy(method.fit(series, tiny_config))
    result = run_pic_loop(spy, demand, history)
    assert result.actions.shape == (STEPS, SERVICES)
    assert np.all((result.actions >= 0) & (result.actions <= 1))
    assert result.censored.any() and not result.censored.all()
    assert result.censored[::7, 0].any()  # some bursts stayed hidden behind the action
    for a, y, c in spy.seen:  # the provisioner only ever got min(d, a) and 1[d > a]
        assert np.all(y <= a) and np.array_equal(y[c], a[c])
    again = run_pic_loop(method.fit(series, tiny_config), demand, history)
    np.testing.assert_array_equal(again.actions, result.actions)


def test_the_provisioner_interface_never_takes_demand() -> None:
    for method in METHODS:
        assert list(inspect.signature(method.fit).parameters) == ["series", "config"], method.name
        assert method.reference and method.label
    for cls in (Provisioner, PicRLProvisioner, PensieveProvisioner):
        for name in ("start", "act"):
            assert not any("demand" in p for p in inspect.signature(getattr(cls, name)).parameters)
    assert {m.group for m in METHODS} == {
        "pic-rl",
        "phase-1",
        "phase-2",
        "phase-2+3",
        "ablation",
        "reference",
        "multi-resource",
    }
    assert [m.name for m in METHODS] == [
        "pic-rl",
        "pic-rl-fi",
        "pic-rl-per-resource",
        "tft",
        "informer",
        "autoformer",
        "cql",
        "pensieve",
        "a1",
        "a2",
        "a3",
        "a4",
        "a5",
        "a6",
        "a7",
    ]
    # the method reads the coupled censoring flags of a multi-resource fleet; its per-resource variant does not
    assert [m.name for m in METHODS if not m.coupled] == [
        "pic-rl-per-resource",
        "tft",
        "informer",
        "autoformer",
        "cql",
        "pensieve",
    ]


def _flat(config: PicRLConfig) -> dict[tuple[str, str], Any]:
    return {
        (section, name): value
        for section, values in config.to_dict().items()
        if isinstance(values, dict)
        for name, value in values.items()
    }


def test_ablations_flip_exactly_their_switch(tiny_config: PicRLConfig) -> None:
    expected = {
        "a1": {("ablation", "use_uncertainty"): False},
        "a2": {("reward", "use_censored_reward"): False},
        "a3": {("estimator", "impute_window"): False},  # the default's censoring hedge (the paper's: Eq. 9's Psi)
        "a4": {("ablation", "use_k_sigma"): False},
        "a5": {("online", "kl_coef"): 0.0},
        "a6": {("online", "ema_decay"): 0.0},
        "a7": {("ablation", "pretrain"): False},
    }
    full = _flat(tiny_config)
    for ablation in ABLATIONS:
        switched = ablation.switch(tiny_config)
        assert switched.seed == tiny_config.seed
        changed = {key: value for key, value in _flat(switched).items() if full[key] != value}
        assert changed == expected[ablation.name], ablation.name
        assert all(full[key] != value for key, value in expected[ablation.name].items())


def test_pic_rl_provisioner_acts_as_run_online(
    series: PreparedSeries, tiny_config: PicRLConfig, loop_inputs: tuple[np.ndarray, np.ndarray]
) -> None:
    demand, history = loop_inputs
    config = replace(tiny_config, online=replace(tiny_config.online, n_update=4, batch_size=8))
    artifact = train_offline(series, config)
    before = {k: v.clone() for k, v in artifact.policy.state_dict().items()}
    online = run_online(artifact, demand, history)
    provisioner = PicRLProvisioner.from_artifact(artifact)
    result = run_pic_loop(provisioner, demand, history)
    np.testing.assert_array_equal(result.actions, online.trajectory.action)
    assert provisioner.slow is not None and len(provisioner.slow.updates) >= 8
    # the loop gives no feedback after the last tick, so at most the final update is missing
    assert [u.to_dict() for u in provisioner.slow.updates] == [u.to_dict() for u in online.updates][
        : len(provisioner.slow.updates)
    ]
    assert len(online.updates) - len(provisioner.slow.updates) <= 1
    np.testing.assert_array_equal(run_pic_loop(provisioner, demand, history).actions, result.actions)  # fresh start
    frozen = run_pic_loop(PicRLProvisioner.from_artifact(artifact, slow_updates=False), demand, history)
    np.testing.assert_array_equal(
        frozen.actions, run_online(artifact, demand, history, slow_updates=False).trajectory.action
    )
    assert all(torch.equal(before[k], v) for k, v in artifact.policy.state_dict().items())


# --- Phase-1 substitutions ---------------------------------------------------------------------------

PREDICTORS = (GaussianTFT, GaussianInformer, GaussianAutoformer)


@pytest.mark.parametrize("model_class", PREDICTORS, ids=lambda c: c.__name__)
def test_predictor_is_a_drop_in_for_the_lstm(model_class: type[torch.nn.Module]) -> None:
    cfg = PredictorConfig(window=12, hidden=8, context_channels=1, sigma_min=0.01)
    torch.manual_seed(0)
    model = model_class(cfg)
    assert model.input_size == 3 and model.cfg is cfg
    windows = np.random.default_rng(1).random((150, 12, 3)).astype(np.float32)
    mu, sigma = predict_gaussian(model, windows)
    assert mu.shape == sigma.shape == (150,) and np.all(np.isfinite(mu)) and np.all(sigma >= cfg.sigma_min)
    alone_mu, alone_sigma = predict_gaussian(model, windows[7:8])  # batch-invariant
    assert alone_mu[0] == mu[7] and alone_sigma[0] == sigma[7]
    with torch.no_grad():  # train and eval mode compute the same
        x = torch.from_numpy(windows[:20])
        trained = model.train()(x)
        evaluated = model.eval()(x)
    assert all(torch.equal(a, b) for a, b in zip(trained, evaluated))


def test_train_predictor_takes_a_model_factory(diurnal_series: np.ndarray, tiny_config: PicRLConfig) -> None:
    cfg = replace(tiny_config.predictor, kind="windowed")  # a transformer substitutes the windowed LSTM
    train, val = diurnal_series[:600], diurnal_series[600:800]
    model, report = train_predictor(train, val, cfg, seed=3, model_factory=GaussianTFT)
    again, _ = train_predictor(train, val, cfg, seed=3, model_factory=GaussianTFT)
    assert isinstance(model, GaussianTFT) and 1 <= report.epochs_run <= cfg.epochs and math.isfinite(report.val_nll)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    default, _ = train_predictor(train, val, cfg, seed=3)
    explicit, _ = train_predictor(train, val, cfg, seed=3, model_factory=GaussianLSTM)
    assert all(torch.equal(a, b) for a, b in zip(default.state_dict().values(), explicit.state_dict().values()))


def test_probsparse_attention_is_full_attention_when_every_query_is_active() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 6, 4), torch.randn(3, 2, 6, 4), torch.randn(3, 2, 6, 4)
    for causal in (False, True):
        attention = ProbSparseAttention(6, 6, causal)
        attention.n_top = 6
        scores = q @ k.transpose(-2, -1) / 2.0
        if causal:
            scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
        torch.testing.assert_close(attention(q, k, v), torch.softmax(scores, dim=-1) @ v)
    lazy = ProbSparseAttention(6, 6, causal=False)  # with u = 1 the other queries output mean(V)
    lazy.n_top = 1
    out = lazy(q, k, v)
    assert ((out - v.mean(dim=2, keepdim=True)).abs().amax(dim=-1) < 1e-6).sum(dim=-1).eq(5).all()


def test_series_decomposition_and_auto_correlation_match_their_definitions() -> None:
    torch.manual_seed(0)
    x = torch.rand(2, 10, 3)
    seasonal, trend = SeriesDecomposition(5, 10)(x)
    padded = torch.cat([x[:, :1].expand(-1, 2, -1), x, x[:, -1:].expand(-1, 2, -1)], dim=1)
    torch.testing.assert_close(trend, F.avg_pool1d(padded.transpose(1, 2), 5, stride=1).transpose(1, 2))
    torch.testing.assert_close(seasonal + trend, x)
    q, k, v = torch.rand(2, 2, 9, 4), torch.rand(2, 2, 12, 4), torch.rand(2, 2, 12, 4)
    out = AutoCorrelation()(q, k, v)
    keys, values = k[:, :, :9], v[:, :, :9]  # keys and values longer than the queries are cut
    for b in range(2):  # R(tau) = sum_t q_t k_(t - tau) by brute force, the top int(ln 9) = 2 delays
        corr = torch.stack([(q[b] * torch.roll(keys[b], tau, dims=1)).sum(dim=1).mean() for tau in range(9)])
        weights, delays = corr.topk(2)
        expected = sum(w * torch.roll(values[b], -int(d), dims=1) for w, d in zip(torch.softmax(weights, 0), delays))
        torch.testing.assert_close(out[b], expected)


# --- Phase-2 substitution ----------------------------------------------------------------------------


def test_cql_log_sum_exp_is_an_importance_sampling_estimate() -> None:
    """For Q = const over the uniform proposal's box, log int exp Q da = Q + log(box volume)."""
    q = QNetwork(8)
    with torch.no_grad():
        for layer in q.body:
            if isinstance(layer, torch.nn.Linear):
                layer.weight.zero_()
                layer.bias.fill_(0.25)
    features = torch.rand(5, N_FEATURES)
    actions = (torch.rand(5, 7, 2) * 2 - 1) * UNIFORM_RANGE
    log_density = torch.full((5, 7), -2 * math.log(2 * UNIFORM_RANGE))
    estimate = cql_log_sum_exp(q, features, [(actions, log_density), (actions, log_density)])
    torch.testing.assert_close(estimate, torch.full((5,), 0.25 + 2 * math.log(2 * UNIFORM_RANGE)))


def test_cql_pretraining_reports_and_moves_the_policy(
    tiny_predictor: GaussianLSTM, tiny_config: PicRLConfig, diurnal_series: np.ndarray
) -> None:
    policy, value, report = pretrain_cql(tiny_predictor, diurnal_series[:600], tiny_config)
    cfg = tiny_config.pretrain
    assert report.iterations == cfg.iterations and report.transitions == cfg.chunks * cfg.chunk_len
    assert report.mean_reward < 0
    for curve in (report.q_loss, report.cql_gap, report.actor_loss):
        assert len(curve) == cfg.iterations and all(math.isfinite(v) for v in curve)
    initial, _, empty = pretrain_cql(
        tiny_predictor, diurnal_series[:600], replace(tiny_config, pretrain=replace(cfg, iterations=0))
    )
    assert empty.iterations == 0
    moved = max(float((a - b).abs().max()) for a, b in zip(policy.state_dict().values(), initial.state_dict().values()))
    assert moved > 1e-5
    assert report.to_dict()["transitions"] == report.transitions
