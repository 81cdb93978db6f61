"""The RL state ``s_t`` of Sec. 3.2.2, exactly the three groups the paper lists.

1. Calibration and feedback statistics: margin, bias, recent censoring rate, consecutive censoring
   count, consecutive over-provision count.
2. Sequence statistics: mean and std of recent observations, progress through the episode.
3. Prediction and uncertainty: ``mu_t``, ``sigma_t`` and the censored-demand estimator's mean,
   std, pessimism factor and uncertainty measure.

Counts are divided by ``N_max`` (the pessimism cap) and progress by the policy horizon so every
feature is of order one; the estimator's mean (an unbounded MLE when almost everything is censored)
is clipped to ``[-1, 2]``.
"""

from __future__ import annotations

import numpy as np

from picrl_core.censored_estimator import CensoredDemandEstimate

FEATURE_NAMES: tuple[str, ...] = (
    "margin",
    "bias",
    "censor_rate",
    "censor_streak",
    "over_streak",
    "obs_mean",
    "obs_std",
    "progress",
    "mu",
    "sigma",
    "est_mean",
    "est_std",
    "pessimism",
    "uncertainty",
)


def state_features(
    *,
    margin: np.ndarray,
    bias: np.ndarray,
    observations: np.ndarray,
    censored: np.ndarray,
    censor_streak: np.ndarray,
    over_streak: np.ndarray,
    tick: np.ndarray,
    mu: np.ndarray,
    sigma: np.ndarray,
    estimate: CensoredDemandEstimate,
    n_max: int,
    horizon: int,
) -> np.ndarray:
    """Stack the state features of a batch: ``(B, len(FEATURE_NAMES))`` float32.

    ``observations``/``censored`` are the recent windows ``(B, W)`` of ``y`` and ``c``.
    """
    columns = (
        margin,
        bias,
        censored.mean(axis=1),
        censor_streak / n_max,
        over_streak / n_max,
        observations.mean(axis=1),
        observations.std(axis=1),
        np.minimum(tick / horizon, 1.0),
        mu,
        sigma,
        estimate.mean.clip(-1.0, 2.0),
        estimate.std,
        estimate.pessimism - 1.0,
        estimate.uncertainty,
    )
    features = np.empty((len(margin), len(columns)), dtype=np.float32)
    for i, column in enumerate(columns):  # assignment rounds to float32 as astype does
        features[:, i] = column
    return features
