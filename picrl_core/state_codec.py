"""Fixed-size binary rows for :class:`ControllerState`: one numpy structured record per service.

A stream worker keeps each service's state in a changelog-backed table; packing a batch into a
structured array (and back) is one ``tobytes``/``frombuffer`` per batch instead of a Python object
per field. The row layout depends only on the window ``W``, the context channels ``C`` and the
feature count ``F``; its size is :attr:`StateCodec.row_bytes` (364 bytes for W=32, C=0; 620 with the
incremental predictor's memory).
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from picrl_core.config import PicRLConfig
from picrl_core.controller_state import ControllerState
from picrl_core.policy import N_FEATURES, N_OUTPUTS
from picrl_core.predictor.kinds import memory_size


class StateCodec:
    """Converts controller states of one model shape to structured rows and back (``memory``: the
    predictor's floats per service, :func:`~picrl_core.predictor.kinds.memory_size`)."""

    @classmethod
    def for_config(cls, config: PicRLConfig) -> StateCodec:
        """The codec of the states a controller of ``config`` keeps."""
        return cls(config.predictor.window, config.predictor.context_channels, memory=memory_size(config.predictor))

    def __init__(self, window: int, context_channels: int, n_features: int = N_FEATURES, memory: int = 0) -> None:
        self.dtype = np.dtype(
            [
                ("keys", "<u8"),
                ("tick", "<i8"),
                ("observations", "<f4", (window,)),
                ("censored", "?", (window,)),
                ("context", "<f4", (window, context_channels)),
                ("margin", "<f8"),
                ("bias", "<f8"),
                ("censor_streak", "<i8"),
                ("over_streak", "<i8"),
                ("action", "<f8"),
                ("mu", "<f8"),
                ("sigma", "<f8"),
                ("eta", "<f8"),
                ("k", "<f8"),
                ("pre", "<f4", (N_OUTPUTS,)),
                ("log_prob", "<f4"),
                ("features", "<f4", (n_features,)),
                ("est_mean", "<f8"),
                ("est_std", "<f8"),
                ("memory", "<f4", (memory,)),
                ("temperature", "<f8"),
                ("escape", "<f8"),
                ("repeat_share", "<f8"),
                ("last_seen", "<f8"),
            ]
        )
        missing = {f.name for f in fields(ControllerState)} ^ set(self.dtype.names or ())
        if missing:
            raise TypeError(f"state row layout and ControllerState differ in {sorted(missing)}")

    @property
    def row_bytes(self) -> int:
        return self.dtype.itemsize

    def pack(self, state: ControllerState, out: np.ndarray | None = None) -> np.ndarray:
        """The ``(B,)`` structured rows of ``state`` (written into ``out`` when given)."""
        rows = np.empty(len(state), dtype=self.dtype) if out is None else out
        for name in self.dtype.names or ():
            rows[name] = getattr(state, name)
        return rows

    def unpack(self, rows: np.ndarray) -> ControllerState:
        """The controller state held by ``(B,)`` structured rows (copies, native byte order)."""
        if rows.dtype != self.dtype:
            raise ValueError(f"rows have layout {rows.dtype}, expected {self.dtype}")
        return ControllerState(
            **{
                name: np.array(rows[name], dtype=rows.dtype[name].base.newbyteorder("="))
                for name in self.dtype.names or ()
            }
        )
