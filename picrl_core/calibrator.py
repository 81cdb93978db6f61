"""Phase 3 fast loop: the event-driven reactive calibrator, Eq. (12) and Algorithm 1."""

from __future__ import annotations

import numpy as np

from picrl_core.config import CalibratorConfig, CostConfig, PicRLConfig
from picrl_core.mills import inverse_mills_ratio

# Feedback above the action by less than this (scaled units) is rounding, not a shortage: a stream worker's
# usage goes through its service's native unit and back (to_unit(from_unit(a)) can exceed a by ~1e-16, and
# uncensored usage is accepted up to 1e-9 above capacity, relative).
SHORTAGE_TOLERANCE = 1e-6


def feedback(y: np.ndarray, action: np.ndarray, censored: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(short, over)`` of the action in force from its feedback: ``short = 1[d > a]`` is the censoring flag
    under PIC (a censored observation sits at the capacity), and ``y > a`` under full information (the
    reference run reveals ``y = d`` and no flag); ``over = 1[d < a]``, uncensored and below the action.
    A censored observation *below* the capacity (a soft resource whose requests failed on a hard one,
    :mod:`picrl_core.resources`) is a lower bound that says neither: both are False."""
    y = np.asarray(y, dtype=np.float64)
    censored = np.asarray(censored, dtype=bool)
    short = (censored & (y >= action - SHORTAGE_TOLERANCE)) | (y > action + SHORTAGE_TOLERANCE)
    return short, ~short & ~censored & (action > y)


def over_weights(cfg: CalibratorConfig, cost: CostConfig) -> tuple[float, float]:
    """How much one over-provisioned step lowers ``(m, b)`` relative to how much a shortage raises them.

    ``"paper"`` (Eq. 12 as printed): ``(1, gamma)``. The margin then settles where shortages and
    over-provisioned steps are equally frequent (a 50% shortage rate) while the bias settles at
    ``gamma / (1 + gamma)``: the two drift against each other.
    ``"pinball"``: ``(c_over / c_under, c_over / c_under)``, the stochastic (sub)gradient of the
    asymmetric cost Eq. (1) in the action, which is computable under PIC because ``1[d > a]`` is the
    censoring flag (the censored newsvendor step of Huh & Rusmevichientong, Math. of OR 2009). Both
    variables then settle at the shortage rate ``c_over / (c_under + c_over)``, the critical fractile.
    """
    if cfg.rule == "paper":
        return 1.0, cfg.gamma
    ratio = cost.c_over / cost.c_under
    return ratio, ratio


def calibrate(
    margin: np.ndarray,
    bias: np.ndarray,
    eta: np.ndarray,
    shortage: np.ndarray,
    over_provisioned: np.ndarray,
    cfg: CalibratorConfig,
    cost: CostConfig,
    scale: np.ndarray | float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """One reactive-calibrator step for a batch of services, Eq. (12) with the weights of :func:`over_weights`:

        m_{t+1} = m_t + eta_t * delta_m * s_t * [1(short_t) - w_m * 1(over_t)]
        b_{t+1} = b_t + eta_t * delta_b * [1(short_t) - w_b * 1(over_t)]

    ``short_t = 1[d_t > a_t]`` (the censoring flag under PIC), ``over_t = 1[d_t < a_t]`` (not short and
    ``a_t > y_t``). ``s_t`` is the margin's unit: 1 in the paper; the predicted ``sigma_t`` when
    ``cfg.margin_in_sigma`` (the margin then corrects the quantile in standardized units, so its step is
    as large as the uncertainty it corrects). Both stay within their
    configured bounds so a long streak cannot run them away.
    """
    w_margin, w_bias = over_weights(cfg, cost)
    short = shortage.astype(np.float64)
    over = over_provisioned.astype(np.float64)
    margin = margin + eta * cfg.delta_m * scale * (short - w_margin * over)
    bias = bias + eta * cfg.delta_b * (short - w_bias * over)
    return margin.clip(-cfg.margin_limit, cfg.margin_limit), bias.clip(-cfg.bias_limit, cfg.bias_limit)


def track_temperature(
    temperature: np.ndarray,
    y: np.ndarray,
    mu: np.ndarray,
    sigma: np.ndarray,
    censored: np.ndarray,
    cfg: CalibratorConfig,
    gaussian_share: np.ndarray | None = None,
) -> np.ndarray:
    """One online EM step of each service's temperature ``T`` of the predicted std, from the feedback of the
    forecast ``(mu_t, sigma_t)`` (``sigma_t`` already multiplied by ``T_t``) under the Tobit likelihood of the
    censored-demand estimator:

        z_t = (y_t - mu_t) / sigma_t
        u_t = z_t^2                                  (uncensored: y_t = d_t)
        u_t = E[Z^2 | Z > z_t] = 1 + z_t lambda(z_t)   (censored: d_t >= y_t, lambda the inverse Mills ratio)
        T_{t+1}^2 = T_t^2 (1 - rho + rho u_t)

    ``T^2`` is an exponential average (weight ``rho = scale_rate``) of the squared standardized residual,
    with a censored tick counted at its conditional expectation instead of the lower bound it shows, so
    shortages do not teach the scale that the forecast was sharper than it was (Proposition 1 for the
    spread). A service whose demand holds flat gets a small ``T`` (its margin steps and ``k sigma`` shrink
    to its real residuals, so it stops sawing around the level); a volatile one a large ``T``. Kept within
    ``[scale_min, scale_max]``.

    ``gaussian_share`` ``r_t`` (``calibrator.scale_skips_repeats``): the tick's posterior responsibility of the
    Gaussian part of the repeat mixture (:mod:`picrl_core.repeats`), the EM step of that mixture's scale,
    ``T_{t+1}^2 = T_t^2 (1 - rho r_t + rho r_t u_t)``: a tick the repeat explains leaves ``T`` where it is."""
    z = (np.asarray(y, np.float64) - mu) / sigma
    second = np.where(censored, 1.0 + z * inverse_mills_ratio(z), z * z)
    rate = cfg.scale_rate if gaussian_share is None else cfg.scale_rate * gaussian_share
    return (temperature * np.sqrt(1.0 - rate + rate * second)).clip(cfg.scale_min, cfg.scale_max)


def reactive_step(
    margin: np.ndarray,
    bias: np.ndarray,
    eta: np.ndarray,
    shortage: np.ndarray,
    over_provisioned: np.ndarray,
    sigma: np.ndarray,
    config: PicRLConfig,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`calibrate` as PIC-RL's Phase 3 applies it after the feedback of ``a_t``: the margin in units
    of the ``sigma_t`` that action was planned with when ``margin_in_sigma``."""
    cal = config.calibrator
    unit = sigma if cal.margin_in_sigma else 1.0
    return calibrate(margin, bias, eta, shortage, over_provisioned, cal, config.cost, unit)


def escape_step(
    escape: np.ndarray,
    shortage: np.ndarray,
    seen: np.ndarray,
    censor_streak: np.ndarray,
    sigma: np.ndarray,
    cfg: CalibratorConfig,
) -> np.ndarray:
    """The censoring-streak escape ``e_t``, added to the action of Eq. (11): an exponential search for a demand level
    the censoring hides (the unbounded search of Bentley & Yao, Inf. Process. Lett. 1976):

        e_{t+1} = min(e_t + s delta_m sigma_t r^(n_t - 2), escape_limit)   a shortage, the n-th in a row, n >= 2
        e_{t+1} = e_t / 2                                                the demand was seen (uncensored, not short)
        e_{t+1} = e_t                                                    otherwise (a lower bound below the action)

    with ``s = escape_start`` margin steps as the first step (4 by default; the paper has no escape) and each step
    ``r = escape_growth`` times the last (2: doubling). :func:`release_escape` may change the seen case.

    A lone shortage is the calibrator's designed one-in-three event, and the margin answers it; ``n`` in a row have
    probability ``(1/3)^n`` under a calibrated forecast, so a streak says the forecast is off by an unknown amount.
    The forecast's own remedies (the LSTM reading ``y = a`` with its flag, the temperature's E-step, margin steps
    in units of ``sigma_t``) each move in steps of ``sigma_t``: a service that held flat for hours has a tiny one,
    and a jump of ``G`` above it keeps it short for ``O(G / sigma_t)`` ticks (Proposition 1's trap, slowed, not
    escaped). Growing from a few of the margin's own steps ``s delta_m sigma_t`` reaches any ``G`` in
    ``O(log_r(G / (s delta_m sigma_t)))`` ticks, overshooting by at most the last step, while the short streaks a
    calibrated forecast with correlated errors has add a few margin steps; once the demand is seen the search is over,
    and :func:`release_escape` hands the level over to the forecast."""
    n = np.minimum(censor_streak, 64).astype(np.float64)
    unit = cfg.escape_start * cfg.delta_m * (sigma if cfg.margin_in_sigma else 1.0)
    grown = np.minimum(escape + unit * np.power(cfg.escape_growth, n - 2.0), cfg.escape_limit)
    return np.where(shortage & (censor_streak >= 2), grown, np.where(seen, 0.5 * escape, escape))


def release_escape(
    escape: np.ndarray, previous: np.ndarray, seen: np.ndarray, y: np.ndarray, mu: np.ndarray, cfg: CalibratorConfig
) -> np.ndarray:
    """The escape in force for the next action after a tick whose demand ``y_t`` was seen, at the new forecast
    ``mu_{t+1}``, by ``calibrator.escape_release`` (``escape``: :func:`escape_step`'s, ``previous``: ``e_t``):

        "halve"      e_{t+1} = e_t / 2                                   (escape_step's own)
        "hold"       e_{t+1} = max(e_t / 2, min(e_t, y_t - mu_{t+1}))
        "handover"   e_{t+1} = clip(y_t - mu_{t+1}, 0, e_t)

    The search found a level the forecast has not reached yet (an LSTM takes a few ticks to follow a jump it saw
    once); halving from there can drop the action below the demand just seen and start a new censoring streak.
    Held, the action's centre stays at that demand until the forecast takes over, never above where the search
    left it; handed over, it also drops at once to the demand when that fell back. Other ticks keep ``escape``."""
    if cfg.escape_release == "halve":
        return escape
    above = np.minimum(previous, np.asarray(y, np.float64) - mu)
    released = np.maximum(escape, above) if cfg.escape_release == "hold" else np.maximum(above, 0.0)
    return np.where(seen, released, escape)
