"""Phase 1 training (Sec. 3.1, Algorithm 1 line 2) of either kind of predictor."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from picrl_core.config import PredictorConfig
from picrl_core.predictor.kinds import kind_of
from picrl_core.predictor.model import GaussianLSTM, Predictor, PredictorReport


def train_predictor(
    train: np.ndarray,
    val: np.ndarray,
    cfg: PredictorConfig,
    *,
    seed: int,
    train_context: np.ndarray | None = None,
    val_context: np.ndarray | None = None,
    progress: Callable[[dict[str, float]], None] | None = None,
    model_factory: Callable[[PredictorConfig], Predictor] = GaussianLSTM,  # type: ignore[assignment]
    services: int = 1,
) -> tuple[Predictor, PredictorReport]:
    """``theta* = argmin_theta sum NLL(d_i; f_theta(x_i))``, Eq. (3), for the kind ``cfg.kind`` says
    (:func:`~picrl_core.predictor.windowed.train_windowed_predictor`,
    :func:`~picrl_core.predictor.incremental.train_incremental_predictor`). ``model_factory`` substitutes the
    windowed kind's network (the comparison's Phase-1 baselines); the incremental kind carries a Gaussian LSTM only."""
    return kind_of(cfg).train(train, val, cfg, seed=seed, train_context=train_context,  # type: ignore[no-any-return]
                              val_context=val_context, progress=progress, model_factory=model_factory,
                              services=services)
