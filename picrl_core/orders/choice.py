"""The order rule of a config, chosen once when a controller is built."""

from __future__ import annotations

from picrl_core.config import PicRLConfig
from picrl_core.orders.gaussian import GaussianOrder
from picrl_core.orders.hurdle import HurdleOrder
from picrl_core.orders.order import OrderRule
from picrl_core.orders.repeat_mixture import RepeatMixtureOrder


def order_rule(config: PicRLConfig) -> OrderRule:
    """The rule of ``config``: the hurdle (``estimator.idle_hurdle``) around the repeat mixture
    (``estimator.act_on_repeat``) or the Gaussian order, else that continuous part alone (the paper's preset: the
    Gaussian order)."""
    busy: OrderRule = RepeatMixtureOrder(config) if config.estimator.act_on_repeat else GaussianOrder(config)
    return HurdleOrder(config, busy) if config.estimator.idle_hurdle else busy
