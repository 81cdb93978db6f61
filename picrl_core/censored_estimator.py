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

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cache

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
_LAST_STEP = 1e-6  # relative Newton step taken without a line search, as a row's last
ROWS_PER_THREAD = 4096  # below this many services per thread the estimator runs in the calling thread


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


@dataclass
class _Window:
    """The rows' windows in the form each Newton evaluation reads: the uncensored points as three
    sufficient statistics per row (count, mean, centred sum of squares; the uncensored terms of the
    log-likelihood and its derivatives are exact functions of them), the censored points as a flat list
    ``(row, y)`` in which every row has at least one (Newton solves only such rows). An evaluation then
    costs O(censored points), not O(window)."""

    n_unc: np.ndarray  # (R,) uncensored count
    mean_unc: np.ndarray  # (R,) mean of the uncensored y (0 when none)
    m2_unc: np.ndarray  # (R,) sum of squared deviations of the uncensored y from mean_unc
    row: np.ndarray  # (E,) row of each censored point (ascending, every row present)
    y_cens: np.ndarray  # (E,) censoring threshold y of each censored point
    first: np.ndarray = field(init=False)  # (R,) index of each row's first censored point
    # per-row constants of every evaluation, computed once per window
    has_unc: np.ndarray = field(init=False)  # (R,) n_unc > 0
    n_mean: np.ndarray = field(init=False)  # (R,) n_unc * mean_unc
    n_mean2: np.ndarray = field(init=False)  # (R,) n_unc * mean_unc * mean_unc

    def __post_init__(self) -> None:
        self.first = np.searchsorted(self.row, np.arange(self.n_unc.shape[0]))  # rows ascending, each present
        self.has_unc = self.n_unc > 0
        self.n_mean = self.n_unc * self.mean_unc
        self.n_mean2 = self.n_mean * self.mean_unc

    def per_row(self, values: np.ndarray) -> np.ndarray:
        """Each row's sum of ``values`` (one per censored point), as contiguous segment sums."""
        return np.add.reduceat(values, self.first)

    @staticmethod
    def of(y: np.ndarray, unc: np.ndarray, cens: np.ndarray) -> _Window:
        n_unc = _row_sum(unc).astype(np.float64)
        mean_unc = _row_sum(np.where(unc, y, 0.0)) / np.maximum(n_unc, 1.0)
        m2_unc = _row_sum(np.where(unc, (y - mean_unc[:, None]) ** 2, 0.0))
        row, col = np.nonzero(cens)
        return _Window(n_unc, mean_unc, m2_unc, row, y[row, col])

    def rows(self, keep: np.ndarray) -> _Window:
        """The sub-window of the rows where ``keep`` (boolean, (R,)) holds, rows renumbered."""
        number = np.cumsum(keep) - 1
        entries = keep[self.row]
        return _Window(
            self.n_unc[keep], self.mean_unc[keep], self.m2_unc[keep], number[self.row[entries]], self.y_cens[entries]
        )


@dataclass
class _Point:
    """The log-likelihood in Olsen's parameters at ``(delta, gamma)`` per row, with its gradient and minus
    its Hessian ``[[a, b], [b, c]]`` (positive definite)."""

    f: np.ndarray
    g_delta: np.ndarray
    g_gamma: np.ndarray
    a: np.ndarray
    b: np.ndarray
    c: np.ndarray


def _evaluate(delta: np.ndarray, gamma: np.ndarray, w: _Window) -> _Point:
    """``f = sum_unc [log gamma - v^2/2] + sum_cens log(1 - Phi(v))`` with ``v = gamma*y - delta`` (the
    constant ``-n_unc log sqrt(2 pi)`` dropped), its score and information. Called under :func:`_newton`'s
    ``np.errstate``: a trial step may leave the region ``gamma > 0``, where ``f`` is ``-inf``.

    Censored terms have ``d/dv = -lambda(v)`` and ``d^2/dv^2 = -lambda'(v)``; ``dv/d(delta, gamma) = (-1, y)``.
    Uncensored sums come from the sufficient statistics: with ``u = gamma*mean_unc - delta``,
    ``sum v = n u``, ``sum v^2 = gamma^2 m2 + n u^2``, ``sum v y = gamma m2 + mean_unc n u``, ``sum y = n mean_unc``,
    ``sum y^2 = m2 + n mean_unc^2`` (centred, so nothing cancels when ``gamma`` is large).
    """
    v = gamma[w.row] * w.y_cens - delta[w.row]
    log_sf, lam, dlam = censored_normal_terms(v)
    per_row = w.per_row
    n, ybar, m2, n_ybar = w.n_unc, w.mean_unc, w.m2_unc, w.n_mean
    u = gamma * ybar - delta
    log_gamma = np.where(w.has_unc, np.where(gamma > 0, np.log(gamma), -np.inf), 0.0)
    gamma2 = gamma * gamma
    f = n * log_gamma - 0.5 * (gamma2 * m2 + n * u * u) + per_row(log_sf)
    lam_y, dlam_y = lam * w.y_cens, dlam * w.y_cens
    return _Point(
        f=f,
        g_delta=n * u + per_row(lam),
        g_gamma=n / gamma - (gamma * m2 + n_ybar * u) - per_row(lam_y),
        a=n + per_row(dlam),
        b=-(n_ybar + per_row(dlam_y)),
        c=n / gamma2 + m2 + w.n_mean2 + per_row(dlam_y * w.y_cens),
    )


def _newton_step(point: _Point, gamma: np.ndarray, gamma_max: float) -> tuple[np.ndarray, np.ndarray]:
    """The Newton direction ``(p_delta, p_gamma)`` at ``point``; at the sigma floor with the likelihood still
    asking for a smaller sigma, Newton in delta only."""
    det = point.a * point.c - point.b * point.b
    p_d = (point.c * point.g_delta - point.b * point.g_gamma) / det
    p_g = (point.a * point.g_gamma - point.b * point.g_delta) / det
    pinned = (gamma >= gamma_max) & (p_g > 0)
    if not pinned.any():
        return p_d, p_g
    return np.where(pinned, point.g_delta / point.a, p_d), np.where(pinned, 0.0, p_g)


def _relative_move(d0: np.ndarray, g0: np.ndarray, p_d: np.ndarray, p_g: np.ndarray) -> np.ndarray:
    """How far the step ``(p_d, p_g)`` moves ``(d0, g0)``, relative (the convergence tests' measure)."""
    return np.maximum(np.abs(p_d) / (1.0 + np.abs(d0)), np.abs(p_g) / g0)


def _newton(
    delta: np.ndarray, gamma: np.ndarray, window: _Window, iterations: int, gamma_max: float
) -> tuple[np.ndarray, np.ndarray, _Point]:
    """Damped Newton ascent on the concave Olsen log-likelihood with ``0 < gamma <= gamma_max``, each row
    until its step is below ``_STEP_TOLERANCE``, its Newton decrement is within rounding of 0, or its next step
    is below ``_LAST_STEP`` (then taken without a line search: quadratic convergence leaves it ~1e-12 from the
    optimum); returns ``(delta, gamma, the log-likelihood's point at the last evaluated iterate)``: the information
    the standard error reads needs no evaluation of its own."""
    delta, gamma = delta.copy(), gamma.copy()
    with np.errstate(divide="ignore", invalid="ignore"):  # once (~1 us a context): a trial may leave gamma > 0
        rows = np.arange(delta.shape[0])  # the rows still iterating, and their window and current point
        w = window
        point = _evaluate(delta, gamma, w)
        direction = _newton_step(point, gamma, gamma_max)  # at the rows' iterates; then the last iteration's next step
        final: _Point | None = None  # the points of rows that stopped before others (allocated when the first do)
        for _ in range(iterations):
            d0, g0 = delta[rows], gamma[rows]
            p_d, p_g = direction
            slope = point.g_delta * p_d + point.g_gamma * p_g  # >= 0: ascent direction (twice the Newton decrement)
            # Within rounding of the optimum f cannot resolve the gain: take the plain Newton step, stop.
            flat = slope <= _FLAT_SLOPE * (1.0 + np.abs(point.f))
            # The first trial stops at the sigma floor rather than crossing it: a clipped step leaves the
            # Newton direction, fails the Armijo test and would be halved many times over.
            step = np.where(p_g > 0, np.minimum(1.0, (gamma_max - g0) / p_g), 1.0)
            # The first trial for every row at once (flat rows are accepted as they are; their trial is unused).
            trial = _evaluate(d0 + step * p_d, np.minimum(g0 + step * p_g, gamma_max), w)
            accepted = flat | (trial.f >= point.f + _ARMIJO * step * slope)
            if accepted.all():
                new_point = trial
            else:
                new_point = _Point(
                    **{
                        name: np.where(accepted, getattr(trial, name), getattr(point, name))
                        for name in _Point.__dataclass_fields__
                    }
                )
                step[~accepted] *= 0.5
                for _ in range(_BACKTRACKS - 1):
                    todo = ~accepted
                    if not todo.any():
                        break
                    s = step[todo]
                    trial = _evaluate(
                        d0[todo] + s * p_d[todo], np.minimum(g0[todo] + s * p_g[todo], gamma_max), w.rows(todo)
                    )
                    ok = trial.f >= point.f[todo] + _ARMIJO * s * slope[todo]
                    at = todo.nonzero()[0]
                    for name in _Point.__dataclass_fields__:
                        getattr(new_point, name)[at[ok]] = getattr(trial, name)[ok]
                    accepted[at[ok]] = True
                    step[at[~ok]] *= 0.5
            step = np.where(accepted, step, 0.0)
            d1 = d0 + step * p_d
            g1 = np.minimum(g0 + step * p_g, gamma_max)
            moved = _relative_move(d0, g0, d1 - d0, g1 - g0)
            # Inside Newton's quadratic region (the next step below _LAST_STEP) the full next step needs no line search
            # and leaves the row within ~_LAST_STEP^2 of the optimum: take it unevaluated and stop there.
            next_d, next_g = _newton_step(new_point, g1, gamma_max)
            last = accepted & ~flat & (_relative_move(d1, g1, next_d, next_g) < _LAST_STEP)
            delta[rows] = np.where(last, d1 + next_d, d1)
            gamma[rows] = np.where(last, np.minimum(g1 + next_g, gamma_max), g1)
            going = ~((moved < _STEP_TOLERANCE) | flat | last)
            if going.all():  # a row going on was not last: it moved to (d1, g1), where (next_d, next_g) is its step
                point, direction = new_point, (next_d, next_g)
                continue
            if final is None:
                if not going.any():  # every row stops at once (none stopped before): their points are new_point
                    return delta, gamma, new_point
                final = _Point(**{name: np.empty(delta.shape) for name in _Point.__dataclass_fields__})
            stopped = ~going
            for name in _Point.__dataclass_fields__:
                getattr(final, name)[rows[stopped]] = getattr(new_point, name)[stopped]
            if not going.any():
                break
            rows, w = rows[going], w.rows(going)
            point = _Point(**{name: getattr(new_point, name)[going] for name in _Point.__dataclass_fields__})
            direction = next_d[going], next_g[going]
        else:  # out of iterations: the rows still going end at their last iterate's point
            if final is None:
                return delta, gamma, point
            for name in _Point.__dataclass_fields__:
                getattr(final, name)[rows] = getattr(point, name)
    return delta, gamma, final


def _standard_error_of_mean(delta: np.ndarray, gamma: np.ndarray, point: _Point) -> np.ndarray:
    """``sqrt(Var(m))`` from the observed information ``point`` at the estimate: the inverse of minus the
    Hessian in ``(delta, gamma)``, carried to ``m = delta/gamma`` by the delta method (``= s/sqrt(n)`` without
    censoring)."""
    a, b, c = point.a, point.b, point.c
    j_d, j_g = 1.0 / gamma, -delta / gamma**2
    variance = (c * j_d * j_d - 2.0 * b * j_d * j_g + a * j_g * j_g) / (a * c - b * b)
    return np.sqrt(np.maximum(variance, 0.0))


def _check_window(y: np.ndarray, censored: np.ndarray, valid: np.ndarray, n_consecutive: np.ndarray) -> None:
    if y.ndim != 2:
        raise EstimatorInputError(f"y must be a (services, window) array; got shape {y.shape}")
    for name, arr in (("censored", censored), ("valid", valid)):
        if arr.shape != y.shape:
            raise EstimatorInputError(f"{name} has shape {arr.shape} but y has shape {y.shape}")
    if n_consecutive.shape != (y.shape[0],):
        raise EstimatorInputError(
            f"n_consecutive must have shape ({y.shape[0]},) (one count per service); got {n_consecutive.shape}"
        )
    if not np.isfinite(y[valid]).all():
        raise EstimatorInputError("y has non-finite values at valid positions (mark them invalid instead)")


def estimate_censored_demand(
    y: ArrayLike,
    censored: ArrayLike,
    n_consecutive: ArrayLike,
    estimator: EstimatorConfig,
    reward: RewardConfig,
    valid: ArrayLike | None = None,
    start: tuple[ArrayLike, ArrayLike] | None = None,
    threads: int = 1,
) -> CensoredDemandEstimate:
    """Tobit MLE of ``N(m, s^2)`` demand from each service's recent ``(y, c)`` window.

    ``y``, ``censored`` (and ``valid``, default all ``True``): ``(B, W)`` with the oldest entry first;
    only the last ``estimator.window`` columns and the ``valid`` entries are used (``valid`` marks
    the filled part of a window that is still filling up). ``n_consecutive``: ``(B,)`` current
    consecutive-censoring counts, turned into ``pessimism = Psi(n)`` by
    :func:`~picrl_core.reward.pessimism_factor`.

    ``start``: optional ``(mean, std)`` per service to start Newton from (warm start: the previous
    tick's estimate, whose window differs by one point, so Newton needs one or two iterations instead of
    up to ``estimator.iterations``); rows whose start is not finite or has ``std <= 0`` start from the
    window's sample mean and std (cold start). Both stop at the same convergence test, so they agree
    within it (``tests/core/test_censored_estimator.py`` measures the difference on the bundled traces).

    ``threads``: with at least ``2 * ROWS_PER_THREAD`` services, row blocks solved on that many threads
    at once (the same bits).
    """
    y = np.asarray(y, dtype=np.float64)
    censored = np.asarray(censored, dtype=bool)
    valid = np.ones(y.shape, dtype=bool) if valid is None else np.asarray(valid, dtype=bool)
    n_consecutive = np.asarray(n_consecutive)
    _check_window(y, censored, valid, n_consecutive)
    if threads < 2 or y.shape[0] < 2 * ROWS_PER_THREAD:
        return _estimate(y, censored, valid, n_consecutive, estimator, reward, start)
    # Every row is solved on its own, so row blocks on several threads give the same bits as one call (numpy and
    # torch release the GIL inside their array loops; torch itself should run one thread, or its thread team
    # oversubscribes the cores).
    starts = None if start is None else tuple(np.asarray(v, dtype=np.float64).reshape(-1) for v in start)
    bounds = np.linspace(0, y.shape[0], min(threads, y.shape[0] // ROWS_PER_THREAD) + 1).astype(int)
    blocks = [slice(lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])]
    parts = list(
        _pool(len(blocks)).map(
            lambda b: _estimate(
                y[b],
                censored[b],
                valid[b],
                n_consecutive[b],
                estimator,
                reward,
                None if starts is None else (starts[0][b], starts[1][b]),
            ),
            blocks,
        )
    )
    return CensoredDemandEstimate(
        *(np.concatenate([getattr(p, f) for p in parts]) for f in CensoredDemandEstimate.__dataclass_fields__)
    )


@cache
def _pool(workers: int) -> ThreadPoolExecutor:
    """A pool of ``workers`` threads for the estimator's row blocks (one per thread count asked for, kept for the
    process)."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="picrl-estimator")


def _estimate(
    y: np.ndarray,
    censored: np.ndarray,
    valid: np.ndarray,
    n_consecutive: np.ndarray,
    estimator: EstimatorConfig,
    reward: RewardConfig,
    start: tuple[ArrayLike, ArrayLike] | None,
) -> CensoredDemandEstimate:
    """:func:`estimate_censored_demand` on checked arrays, in the calling thread."""
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

    identified = n_cens < n_valid  # at least one uncensored point
    tobit = (n_cens > 0) & identified
    uncertainty = np.full(mean.shape, UNCERTAINTY_CAP)
    # Nothing censored: the information of n Gaussian points at the (floored) std gives s / sqrt(n)
    plain = identified & ~tobit
    if plain.any():  # masked steps cost ~1 us each even on an empty mask; in steady state windows are censored
        uncertainty[plain] = np.minimum(std[plain] / np.sqrt(n_valid[plain]), UNCERTAINTY_CAP)
    if tobit.any():
        start_mean, start_std = mean[tobit], std[tobit]
        if start is not None:
            warm_mean = np.asarray(start[0], dtype=np.float64).reshape(-1)[tobit]
            warm_std = np.asarray(start[1], dtype=np.float64).reshape(-1)[tobit]
            warm = np.isfinite(warm_mean) & np.isfinite(warm_std) & (warm_std > 0)
            start_mean = np.where(warm, warm_mean, start_mean)
            start_std = np.where(warm, np.maximum(warm_std, floor), start_std)
        delta, gamma, point = _newton(
            start_mean / start_std,
            1.0 / start_std,
            _Window.of(y[tobit], unc[tobit], cens[tobit]),
            estimator.iterations,
            1.0 / floor,
        )
        mean[tobit], std[tobit] = delta / gamma, 1.0 / gamma
        uncertainty[tobit] = np.minimum(_standard_error_of_mean(delta, gamma, point), UNCERTAINTY_CAP)

    all_censored = (n_valid > 0) & ~identified
    if all_censored.any():
        highest = np.where(valid, y, -np.inf).max(axis=1, initial=-np.inf)
        mean = np.where(all_censored, highest + std, mean)
    empty = n_valid == 0
    if empty.any():
        mean[empty], std[empty] = 0.0, floor
    return CensoredDemandEstimate(
        mean=mean, std=std, pessimism=pessimism_factor(n_consecutive, reward), uncertainty=uncertainty
    )
