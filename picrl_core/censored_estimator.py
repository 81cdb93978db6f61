"""Censored-demand estimator of the state (Sec. 3.2.2): Tobit maximum likelihood on the recent window.

Each service ``b`` has a window of PIC observations ``(y_bt, c_bt)``: ``y = d`` when ``c = 0`` and
``y = a < d`` when ``c = 1``. Under ``d ~ N(m, s^2)`` the log-likelihood is

    sum_{c=0} [log phi((y - m)/s) - log s] + sum_{c=1} log(1 - Phi((y - m)/s)),

whose maximiser corrects the downward bias of averaging the observations (Proposition 1). It is
maximised by damped Newton in Olsen's parameters ``delta = m/s``, ``gamma = 1/s``, where the Tobit
log-likelihood is globally concave (Olsen 1978), so every Newton direction is an ascent direction
and the backtracking line search always succeeds; the maximiser is the same as in ``(m, log s)``.
All services are solved together (no Python loop over services), from the sample mean/std of the
window, for at most ``EstimatorConfig.iterations`` iterations; a service stops iterating once its
step is below 1e-10 (relative), so its result depends on its own window only and is deterministic.

Edge cases (no NaN ever comes out):

* no censored point: the closed-form Gaussian MLE (sample mean, population std);
* every point censored: the MLE does not exist (the likelihood grows as ``m -> inf``); the estimate
  is ``std = max(sample std, sigma_floor)``, ``mean = max(y) + std`` (demand exceeded every
  threshold) and the uncertainty is :data:`UNCERTAINTY_CAP`;
* no valid point at all: ``mean = 0``, ``std = sigma_floor``, uncertainty :data:`UNCERTAINTY_CAP`;
* the std never goes below ``EstimatorConfig.sigma_floor`` (a single uncensored value, or censoring
  thresholds all below identical uncensored values, would otherwise send it to 0).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from picrl_core.config import EstimatorConfig, RewardConfig
from picrl_core.mills import censored_normal_terms
from picrl_core.reward import pessimism_factor

# Demand is normalised to [0, 1] (Sec. 2): a standard error of the mean above 1 carries no
# information, so the uncertainty feature is clipped to [0, UNCERTAINTY_CAP] and set to the cap
# when the window cannot identify the mean (empty or fully censored).
UNCERTAINTY_CAP = 1.0
_STEP_TOLERANCE = 1e-10  # relative Newton step below which a service has converged
_BACKTRACKS = 30  # step halvings tried before a service gives up on an iteration
_ARMIJO = 1e-4
_FLAT_SLOPE = 1e-9  # Newton decrement (relative to |f|) below which the line search is skipped


class EstimatorInputError(ValueError):
    """A window the estimator cannot read: wrong shapes or non-finite valid observations."""


@dataclass(frozen=True)
class CensoredDemandEstimate:
    """Per-service ``(B,)`` float64 features for the policy state (Sec. 3.2.2).

    ``mean``/``std``: Tobit estimate of the demand distribution; ``pessimism``: ``Psi(n)`` of the
    current consecutive-censoring count (Eq. 9); ``uncertainty``: standard error of ``mean`` from
    the observed information, in ``[0, UNCERTAINTY_CAP]`` (grows with the censored share).
    """

    mean: np.ndarray
    std: np.ndarray
    pessimism: np.ndarray
    uncertainty: np.ndarray


def _row_sum(values: np.ndarray) -> np.ndarray:
    return values.sum(axis=1)


def _evaluate(delta: np.ndarray, gamma: np.ndarray, y: np.ndarray, unc: np.ndarray,
              cens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(f, v, lambda(v), lambda'(v))`` at ``(delta, gamma)``, with ``v = gamma*y - delta`` and the
    Mills terms on censored entries (0 elsewhere); ``f`` is the per-row Tobit log-likelihood in
    Olsen's parameters, ``sum_unc [log gamma - v^2/2] + sum_cens log(1 - Phi(v))`` (the constant
    ``-n_unc log sqrt(2 pi)`` dropped). ``y`` is 0 on unused entries."""
    v = gamma[:, None] * y - delta[:, None]
    log_sf, lam, dlam = (np.zeros_like(v) for _ in range(3))
    log_sf[cens], lam[cens], dlam[cens] = censored_normal_terms(v[cens])
    with np.errstate(divide="ignore", invalid="ignore"):
        log_gamma = np.where(gamma > 0, np.log(gamma), -np.inf)
    f = _row_sum(unc) * log_gamma - 0.5 * _row_sum(np.where(unc, v * v, 0.0)) + _row_sum(log_sf)
    return f, v, lam, dlam


def _score_and_information(v: np.ndarray, lam: np.ndarray, dlam: np.ndarray, gamma: np.ndarray,
                           y: np.ndarray, unc: np.ndarray) -> tuple[np.ndarray, ...]:
    """Gradient ``(g_delta, g_gamma)`` and minus the Hessian ``[[a, b], [b, c]]`` (positive definite).

    Uncensored terms ``log gamma - v^2/2``; censored terms ``log(1 - Phi(v))`` with
    ``d/dv = -lambda(v)`` and ``d^2/dv^2 = -lambda'(v)``; ``dv/d(delta, gamma) = (-1, y)``.
    """
    residual = np.where(unc, v, 0.0) + lam  # generalised residual
    curvature = unc + dlam
    n_unc = _row_sum(unc)
    g_delta = _row_sum(residual)
    g_gamma = n_unc / gamma - _row_sum(residual * y)
    a = _row_sum(curvature)
    b = -_row_sum(curvature * y)
    c = n_unc / gamma**2 + _row_sum(curvature * y * y)
    return g_delta, g_gamma, a, b, c


def _newton(delta: np.ndarray, gamma: np.ndarray, y: np.ndarray, unc: np.ndarray, cens: np.ndarray,
            iterations: int, gamma_max: float) -> tuple[np.ndarray, np.ndarray]:
    """Damped Newton ascent on the concave Olsen log-likelihood with ``0 < gamma <= gamma_max``."""
    delta, gamma = delta.copy(), gamma.copy()
    f, v, lam, dlam = _evaluate(delta, gamma, y, unc, cens)  # per-row state, updated in place
    active = np.ones(delta.shape, dtype=bool)
    for _ in range(iterations):
        rows = np.flatnonzero(active)
        if rows.size == 0:
            break
        d0, g0, f0 = delta[rows], gamma[rows], f[rows]
        yr, ur, cr = y[rows], unc[rows], cens[rows]
        grad_d, grad_g, a, b, c = _score_and_information(v[rows], lam[rows], dlam[rows], g0, yr, ur)
        det = a * c - b * b
        p_d = (c * grad_d - b * grad_g) / det
        p_g = (a * grad_g - b * grad_d) / det
        # At the sigma floor with the likelihood still asking for a smaller sigma: Newton in delta only.
        pinned = (g0 >= gamma_max) & (p_g > 0)
        p_d = np.where(pinned, grad_d / a, p_d)
        p_g = np.where(pinned, 0.0, p_g)
        slope = grad_d * p_d + grad_g * p_g  # >= 0: ascent direction (twice the Newton decrement)
        # Within rounding of the optimum f cannot resolve the gain: take the plain Newton step, stop.
        flat = slope <= _FLAT_SLOPE * (1.0 + np.abs(f0))
        # The first trial stops at the sigma floor rather than crossing it: a clipped step leaves the
        # Newton direction, fails the Armijo test and would be halved many times over.
        with np.errstate(divide="ignore", invalid="ignore"):
            step = np.where(p_g > 0, np.minimum(1.0, (gamma_max - g0) / p_g), 1.0)
        accepted = flat.copy()
        for _ in range(_BACKTRACKS):
            todo = np.flatnonzero(~accepted)
            if todo.size == 0:
                break
            s = step[todo]
            f_t, v_t, lam_t, dlam_t = _evaluate(d0[todo] + s * p_d[todo],
                                                np.minimum(g0[todo] + s * p_g[todo], gamma_max),
                                                yr[todo], ur[todo], cr[todo])
            ok = f_t >= f0[todo] + _ARMIJO * s * slope[todo]
            done = rows[todo[ok]]
            f[done], v[done], lam[done], dlam[done] = f_t[ok], v_t[ok], lam_t[ok], dlam_t[ok]
            accepted[todo[ok]] = True
            step[todo[~ok]] *= 0.5
        step = np.where(accepted, step, 0.0)
        d1 = d0 + step * p_d
        g1 = np.minimum(g0 + step * p_g, gamma_max)
        moved = np.maximum(np.abs(d1 - d0) / (1.0 + np.abs(d0)), np.abs(g1 - g0) / g0)
        delta[rows], gamma[rows] = d1, g1
        active[rows[(moved < _STEP_TOLERANCE) | flat]] = False
    return delta, gamma


def _standard_error_of_mean(mean: np.ndarray, std: np.ndarray, y: np.ndarray, unc: np.ndarray,
                            cens: np.ndarray) -> np.ndarray:
    """``sqrt(Var(m))`` from the observed information: the inverse of minus the Hessian in
    ``(delta, gamma)``, carried to ``m = delta/gamma`` by the delta method (``= s/sqrt(n)`` without
    censoring)."""
    gamma = 1.0 / std
    delta = mean * gamma
    _, v, lam, dlam = _evaluate(delta, gamma, y, unc, cens)
    _, _, a, b, c = _score_and_information(v, lam, dlam, gamma, y, unc)
    j_d, j_g = 1.0 / gamma, -delta / gamma**2
    variance = (c * j_d * j_d - 2.0 * b * j_d * j_g + a * j_g * j_g) / (a * c - b * b)
    return np.sqrt(np.maximum(variance, 0.0))


def _check_window(y: np.ndarray, censored: np.ndarray, valid: np.ndarray,
                  n_consecutive: np.ndarray) -> None:
    if y.ndim != 2:
        raise EstimatorInputError(f"y must be a (services, window) array; got shape {y.shape}")
    for name, arr in (("censored", censored), ("valid", valid)):
        if arr.shape != y.shape:
            raise EstimatorInputError(f"{name} has shape {arr.shape} but y has shape {y.shape}")
    if n_consecutive.shape != (y.shape[0],):
        raise EstimatorInputError(f"n_consecutive must have shape ({y.shape[0]},) (one count per "
                                  f"service); got {n_consecutive.shape}")
    if not np.all(np.isfinite(y[valid])):
        raise EstimatorInputError("y has non-finite values at valid positions (mark them invalid instead)")


def estimate_censored_demand(y: ArrayLike, censored: ArrayLike, n_consecutive: ArrayLike,
                             estimator: EstimatorConfig, reward: RewardConfig,
                             valid: ArrayLike | None = None) -> CensoredDemandEstimate:
    """Tobit MLE of ``N(m, s^2)`` demand from each service's recent ``(y, c)`` window.

    ``y``, ``censored`` (and ``valid``, default all ``True``): ``(B, W)`` with the oldest entry first;
    only the last ``estimator.window`` columns and the ``valid`` entries are used (``valid`` marks
    the filled part of a window that is still filling up). ``n_consecutive``: ``(B,)`` current
    consecutive-censoring counts, turned into ``pessimism = Psi(n)`` by
    :func:`~picrl_core.reward.pessimism_factor`.
    """
    y = np.asarray(y, dtype=np.float64)
    censored = np.asarray(censored, dtype=bool)
    valid = np.ones(y.shape, dtype=bool) if valid is None else np.asarray(valid, dtype=bool)
    n_consecutive = np.asarray(n_consecutive)
    _check_window(y, censored, valid, n_consecutive)
    window = slice(max(y.shape[1] - estimator.window, 0), None)
    valid = valid[:, window]
    y = np.where(valid, y[:, window], 0.0)
    cens = valid & censored[:, window]
    unc = valid & ~cens

    n_valid = _row_sum(valid)
    n_cens = _row_sum(cens)
    count = np.maximum(n_valid, 1)
    sample_mean = _row_sum(y) / count
    sample_std = np.sqrt(_row_sum(np.where(valid, (y - sample_mean[:, None]) ** 2, 0.0)) / count)
    floor = estimator.sigma_floor
    std = np.maximum(sample_std, floor)  # closed form where nothing is censored; start otherwise
    mean = sample_mean.copy()

    tobit = np.flatnonzero((n_cens > 0) & (n_cens < n_valid))
    if tobit.size:
        delta, gamma = _newton(mean[tobit] / std[tobit], 1.0 / std[tobit], y[tobit], unc[tobit],
                               cens[tobit], estimator.iterations, 1.0 / floor)
        mean[tobit], std[tobit] = delta / gamma, 1.0 / gamma

    identified = n_cens < n_valid  # at least one uncensored point
    uncertainty = np.full(mean.shape, UNCERTAINTY_CAP)
    uncertainty[identified] = np.minimum(_standard_error_of_mean(
        mean[identified], std[identified], y[identified], unc[identified], cens[identified]),
        UNCERTAINTY_CAP)

    all_censored = (n_valid > 0) & ~identified
    highest = np.max(np.where(valid, y, -np.inf), axis=1, initial=-np.inf)
    mean = np.where(all_censored, highest + std, mean)
    empty = n_valid == 0
    mean[empty], std[empty] = 0.0, floor
    return CensoredDemandEstimate(mean=mean, std=std, pessimism=pessimism_factor(n_consecutive, reward),
                                  uncertainty=uncertainty)
