"""Inverse Mills ratio of the standard normal, the quantity behind the surrogate reward (Sec. 3.2.3).

For ``Z ~ N(0, 1)`` the (upper-tail) inverse Mills ratio is ``lambda(z) = phi(z) / (1 - Phi(z))``,
so that ``E[Z | Z > z] = lambda(z)``. Proposition 2 rests on ``0 < lambda'(z) < 1`` for every real
``z`` (Baricz 2008, ``baricz2008mills``), with ``lambda'(z) = lambda(z) (lambda(z) - z)``.

Everything comes from one pass over the array, elementwise (no dependence on the other elements,
so a service's value never depends on the batch it is computed in):

* ``lambda(z) = sqrt(2/pi) / erfcx(z / sqrt(2))`` with torch's scaled complementary error function
  (``erfcx(x) = exp(x^2) erfc(x)``, finite where ``1 - Phi`` under- or overflows);
* ``log(1 - Phi(z)) = log(erfcx(z / sqrt(2))) - z^2/2 - log 2`` for ``z >= -1`` (the erfcx at hand;
  no cancellation there, finite where ``1 - Phi`` underflows) and ``log1p(-Phi(z))`` with ``Phi(z) =
  erfc(-z / sqrt(2)) / 2`` below, where ``1 - Phi`` rounds to 1 (value ``~ -phi(z)/|z|``);
* ``lambda(z) - z``: the plain difference below ``z = 3``; from ``z = 3`` on, where it would cancel
  (``~ 1/z``), Laplace's continued fraction ``lambda(z) - z = 1/(z + 2/(z + 3/(z + ...)))``
  (45 levels, evaluated bottom-up; truncation error ~1e-14 at ``z = 3``, less beyond), and
  ``lambda = z + (lambda - z)`` there.

Measured against 50-digit mpmath on ``[-37, 40]``: relative error ~2e-13 for ``lambda`` (the worst
near ``z = -37``, from rounding ``z^2/2`` inside the exponential), < 2e-12 for ``lambda(z) - z``
and ``lambda'``, < 2e-11 for ``1 - lambda'``. Below ``z ~ -37.5`` the true ``lambda(z) ~ phi(z)``
is under the smallest normal double (2.2e-308): it underflows gracefully to subnormals and then 0,
and so does ``lambda'`` (0 < lambda' holds in floating point only down to there). Every function is
finite for finite input.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numpy.typing import ArrayLike

_TAIL_START = 3.0  # from here on lambda(z) - z comes from the continued fraction (no cancellation)
_FRACTION_LEVELS = 45
_SQRT_HALF = math.sqrt(0.5)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_LOG_2 = math.log(2.0)
_LOG_SF_FROM_ERFCX = -1.0  # log(1 - Phi(z)) from erfcx from here up, from erfc below


def _tail_gap(w: np.ndarray) -> np.ndarray:
    """``lambda(w) - w`` for ``w >= 3`` by Laplace's continued fraction (bottom-up)."""
    t = np.zeros_like(w)
    for k in range(_FRACTION_LEVELS, 0, -1):
        t += w
        np.divide(k, t, out=t)
    return t


def _scaled(z: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``z`` as float64, its values flat and contiguous, and ``erfcx(z / sqrt 2) = (1 - Phi(z)) / phi(z) / sqrt(pi/2)``
    of them: the one pass every term below starts from."""
    z = np.asarray(z, dtype=np.float64)
    flat = np.ascontiguousarray(z.reshape(-1))
    # the scaling in numpy (the same IEEE product as torch's)
    return z, flat, torch.special.erfcx(torch.from_numpy(flat * _SQRT_HALF)).numpy()


def _ratio_terms(flat: np.ndarray, scaled: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(lambda(z), lambda(z) - z)`` of :func:`_scaled`'s ``flat`` values (NaN stays NaN)."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        lam = _SQRT_2_OVER_PI / scaled
        gap = lam - flat
        upper = (flat >= _TAIL_START).nonzero()[0]
        if upper.size:
            w = flat[upper]
            gap[upper] = tail = _tail_gap(w)
            lam[upper] = w + tail
    return lam, gap


def _log_survival(flat: np.ndarray, scaled: np.ndarray) -> np.ndarray:
    """``log(1 - Phi(z))`` of :func:`_scaled`'s ``flat`` values (NaN stays NaN)."""
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        # 1 - Phi(z) = erfc(z/sqrt 2)/2 = erfcx(z/sqrt 2) exp(-z^2/2)/2: exact from the erfcx already at hand
        # where nothing cancels (z >= _LOG_SF_FROM_ERFCX); below, log1p(-Phi(z)) (there log(1 - Phi) -> 0 while
        # log erfcx and z^2/2 grow alike).
        log_sf = np.log(scaled) - 0.5 * flat * flat - _LOG_2
        lower = (~(flat >= _LOG_SF_FROM_ERFCX)).nonzero()[0]  # NaN too
        if lower.size:  # log(1 - q) with q = Phi(z) = erfc(-z/sqrt 2)/2 <= 0.16 (torch's log_ndtr is slow there)
            log_sf[lower] = np.log1p(-0.5 * torch.special.erfc(torch.from_numpy(flat[lower] * -_SQRT_HALF)).numpy())
    return log_sf


def _mills_terms(z: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(lambda(z), lambda(z) - z, log(1 - Phi(z)))`` as float64 arrays of ``z``'s shape (NaN stays NaN); each
    function below computes only the terms it returns."""
    z, flat, scaled = _scaled(z)
    lam, gap = _ratio_terms(flat, scaled)
    return lam.reshape(z.shape), gap.reshape(z.shape), _log_survival(flat, scaled).reshape(z.shape)


def inverse_mills_ratio(z: ArrayLike) -> np.ndarray:
    """``lambda(z) = phi(z) / (1 - Phi(z)) = E[Z | Z > z]`` for ``Z ~ N(0, 1)`` (Proposition 2).

    Relative error < 1e-12 wherever the value is a normal double (``z > -37.5``); finite for all
    finite ``z`` (``~ z`` for large ``z``, ``~ phi(z)`` down to 0 for very negative ``z``).
    """
    z, flat, scaled = _scaled(z)
    return _ratio_terms(flat, scaled)[0].reshape(z.shape)


def inverse_mills_gap(z: ArrayLike) -> np.ndarray:
    """``lambda(z) - z = E[Z - z | Z > z] > 0``, without the cancellation of the plain difference.

    For large ``z`` it is ``~ 1/z`` (continued fraction); it is the standardised expected shortage
    that the surrogate reward's gap ``mu + sigma * lambda((a - mu)/sigma) - a`` is ``sigma`` times.
    """
    z, flat, scaled = _scaled(z)
    return _ratio_terms(flat, scaled)[1].reshape(z.shape)


def _derivative(z: ArrayLike, lam: np.ndarray, gap: np.ndarray) -> np.ndarray:
    """``lambda' = lambda * (lambda - z)``, with its limits 1 and 0 at ``z = +inf`` and ``-inf``."""
    infinite = np.isinf(z)
    if not infinite.any():  # the product is then all there is (no inf * 0 in it)
        return np.asarray(lam * gap)
    with np.errstate(invalid="ignore"):
        derivative = lam * gap
    return np.where(infinite, np.asarray(z, dtype=np.float64) > 0, derivative)


def inverse_mills_ratio_derivative(z: ArrayLike) -> np.ndarray:
    """``lambda'(z) = lambda(z) (lambda(z) - z)``, which lies in ``(0, 1)`` (``baricz2008mills``).

    The factor ``lambda(z) - z`` comes from :func:`inverse_mills_gap`, so ``1 - lambda'(z)``
    (``~ 1/z^2``) keeps its precision for large ``z`` instead of collapsing to 0 or below.
    """
    z, flat, scaled = _scaled(z)
    lam, gap = _ratio_terms(flat, scaled)
    return _derivative(z, lam.reshape(z.shape), gap.reshape(z.shape))


def censored_normal_terms(z: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(log(1 - Phi(z)), lambda(z), lambda'(z))`` from one evaluation: a right-censored standard
    normal observation's log-likelihood and (up to sign) its first and second derivatives in ``z``."""
    lam, gap, log_sf = _mills_terms(z)
    return log_sf, lam, _derivative(z, lam, gap)


def log_normal_survival(z: ArrayLike) -> np.ndarray:
    """``log(1 - Phi(z))``, the log-likelihood of a right-censored standard normal observation.

    Accurate both where ``1 - Phi(z)`` underflows (large ``z``) and where it rounds to 1 (very
    negative ``z``; there the value is ``~ -phi(z)/|z|``, not 0).
    """
    z, flat, scaled = _scaled(z)
    return _log_survival(flat, scaled).reshape(z.shape)


def mean_above(mu: ArrayLike, sigma: ArrayLike, bound: ArrayLike) -> np.ndarray:
    """``E[D | D > bound]`` for ``D ~ N(mu, sigma^2)``: ``mu + sigma lambda((bound - mu) / sigma)``, the Tobit
    E-step of a right-censored observation, never below ``bound`` (rounding far in the tail)."""
    mu, sigma, bound = (np.asarray(v, dtype=np.float64) for v in (mu, sigma, bound))
    return np.maximum(mu + sigma * inverse_mills_ratio((bound - mu) / sigma), bound)
