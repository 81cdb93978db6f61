"""The order rules of picrl_core.rules: one chosen per config, each the quantile its module states."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from picrl_core.config import PicRLConfig
from picrl_core.orders.choice import order_rule
from picrl_core.orders.gaussian import GaussianOrder
from picrl_core.orders.hurdle import HurdleOrder
from picrl_core.orders.repeat_mixture import RepeatMixtureOrder
from picrl_core.repeats import repeat_quantile

PAPER = Path(__file__).resolve().parents[2] / "configs" / "paper.json"


def _merged(base: dict, preset: dict) -> dict:
    return {k: _merged(base.get(k, {}), v) if isinstance(v, dict) else v for k, v in {**base, **preset}.items()}


def test_the_default_orders_on_the_hurdle_around_the_repeat_mixture_and_the_paper_on_the_gaussian() -> None:
    default = PicRLConfig()
    rule = order_rule(default)
    assert type(rule) is HurdleOrder and rule.acts_on_repeat
    paper = PicRLConfig.from_dict(_merged(default.to_dict(), json.loads(PAPER.read_text())))
    assert type(order_rule(paper)) is GaussianOrder and not order_rule(paper).acts_on_repeat
    plain = replace(default, estimator=replace(default.estimator, idle_hurdle=False))
    assert type(order_rule(plain)) is RepeatMixtureOrder
    gaussian_hurdle = order_rule(replace(default, estimator=replace(default.estimator, act_on_repeat=False)))
    assert type(gaussian_hurdle) is HurdleOrder and not gaussian_hurdle.acts_on_repeat


def test_each_rule_orders_its_quantile() -> None:
    config = replace(PicRLConfig(), estimator=replace(PicRLConfig().estimator, window=4))
    rng = np.random.default_rng(0)
    planned, sigma = rng.uniform(0.2, 0.8, 6), rng.uniform(0.02, 0.1, 6)
    share, last_seen, fresh = np.full(6, 0.6), planned - 0.01, np.ones(6, bool)
    busy = rng.uniform(0.1, 0.9, (6, 4)).astype(np.float32)
    idle = np.zeros((6, 4), np.float32)  # every tick seen at the floor
    censored = np.zeros((6, 4), bool)
    args = (planned, sigma, share, last_seen, fresh)
    assert np.array_equal(GaussianOrder(config).order(*args, busy, censored), planned)
    mixture = repeat_quantile(planned, sigma, share, last_seen, fresh, order_rule(config).fractile)
    assert not np.array_equal(mixture, planned)
    assert np.array_equal(RepeatMixtureOrder(config).order(*args, busy, censored), mixture)
    hurdle = HurdleOrder(config, RepeatMixtureOrder(config))
    assert np.array_equal(hurdle.order(*args, busy, censored), mixture)  # never idle: the continuous part's order
    assert np.array_equal(hurdle.order(*args, idle, censored), np.zeros(6))  # always idle: the floor
    assert np.array_equal(hurdle.pending_idle(idle, censored), np.ones(6))
    assert GaussianOrder(config).pending_idle(idle, censored) is None
    gaussian_hurdle = HurdleOrder(config, GaussianOrder(config))
    assert np.array_equal(gaussian_hurdle.order(*args, busy, censored), planned)  # the repeat share left out
