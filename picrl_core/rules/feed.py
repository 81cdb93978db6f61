"""The Phase-1 predictor's input kept in a record rule's state: the last ``W`` rows of ``(y, c, context)``.

A rule that orders around the windowed predictor's forecast (conformal, censored SGD on ``mu``, Thompson sampling)
keeps these fields per service, exactly as :class:`~picrl_core.controller.PicRLController` keeps its window (a short
history left-padded with its first value; the offline history uncensored), and reads ``(mu, sigma)`` from them with
:func:`~picrl_core.predictor.windowed.predict_gaussian` (batch-invariant). Levels move with a range as
:func:`~picrl_core.controller_state.rescale_state` moves the controller's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from picrl_core.predictor.model import GaussianLSTM
from picrl_core.predictor.windowed import predict_gaussian


def feed_fields(window: int, channels: int) -> list[tuple[Any, ...]]:
    """The record fields of the predictor's window."""
    return [
        ("observations", "<f4", (window,)),
        ("censored", "?", (window,)),
        ("context", "<f4", (window, channels)),
    ]


def start_feed(state: np.recarray, history: np.ndarray, context: np.ndarray | None, channels: int) -> None:
    """The window from the uncensored history ``(B, H)`` and its context ``(B, H, C)``."""
    window = state.observations.shape[1]
    history = np.asarray(history, dtype=np.float32)
    rows = context_rows(context, history.shape, channels)
    missing = window - history.shape[1]
    if missing > 0:
        history = np.concatenate([np.repeat(history[:, :1], missing, axis=1), history], axis=1)
        rows = np.concatenate([np.repeat(rows[:, :1], missing, axis=1), rows], axis=1)
    state.observations = history[:, -window:]
    state.censored = False
    state.context = rows[:, -window:]


def push_feed(state: np.recarray, y: np.ndarray, censored: np.ndarray, context: np.ndarray | None) -> None:
    """Append this tick's ``(y, c)`` and context row to every window."""
    n, channels = state.observations.shape[0], state.context.shape[2]
    row = context_rows(None if context is None else np.asarray(context)[:, None, :], (n, 1), channels)
    state.observations = np.concatenate([state.observations[:, 1:], np.asarray(y, np.float32)[:, None]], axis=1)
    state.censored = np.concatenate([state.censored[:, 1:], np.asarray(censored, bool)[:, None]], axis=1)
    state.context = np.concatenate([state.context[:, 1:], row], axis=1)


def predict_feed(model: GaussianLSTM, state: np.recarray, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """``(mu, sigma)`` of the next demand of every service."""
    windows = np.concatenate(
        [state.observations[:, :, None], state.censored[:, :, None].astype(np.float32), state.context], axis=2
    )
    return predict_gaussian(model, windows, chunk)


def move_feed(state: np.recarray, ratio: np.ndarray, shift: np.ndarray) -> None:
    """The window in a new range (``x ratio + shift``), clipped to ``[0, 1]``."""
    moved = state.observations * ratio[:, None] + shift[:, None]
    state.observations = np.clip(moved, 0.0, 1.0).astype(np.float32)


def range_move(
    low: np.ndarray, high: np.ndarray, new_low: np.ndarray, new_high: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(ratio, shift)`` taking a level in ``[low, high]`` to ``[new_low, new_high]`` (a spread: ``x ratio``)."""
    span = new_high - new_low
    return (high - low) / span, (low - new_low) / span


def context_rows(
    context: np.ndarray | None, shape: tuple[int, ...], channels: int, name: str = "context"
) -> np.ndarray:
    """Context as a ``(*shape, channels)`` float32 array (empty when the model reads no context)."""
    if channels == 0:
        return np.zeros((*shape, 0), dtype=np.float32)
    if context is None:
        raise ValueError(f"{name} is required: the predictor was trained with {channels} context channel(s)")
    context = np.asarray(context, dtype=np.float32)
    if context.shape != (*shape, channels):
        raise ValueError(f"{name} must have shape {(*shape, channels)}; got {context.shape}")
    return context
