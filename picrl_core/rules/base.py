"""What every deployable decision rule is: per-service state in fixed-size records, one vectorised step per tick.

A worker (``stream.decisions``) and the comparison's simulator (:class:`~picrl_core.methods.deployed.RuleProvisioner`)
drive the very same :class:`DeployableRule`, so their decisions are equal bit for bit:

* :meth:`~DeployableRule.initial_state`: a batch of services' states from their uncensored history (in ``[0, 1]`` of
  each service's range) and their first orders;
* :meth:`~DeployableRule.step`: learn from the feedback ``(y_t, c_t)`` of the actions in force and order for the next
  tick;
* :meth:`~DeployableRule.rescale`: carry the states to new ranges (growth, an operator's range).

A state exposes, per service, ``keys``, ``tick``, ``action`` (the order in ``[0, 1]``), ``censor_streak`` and the
breakdown an action record carries (``mu``, ``sigma``, ``k``, ``eta``, ``margin``, ``bias``, ``escape``; zeros where a
rule has none), and packs into a fixed-size row with :attr:`~DeployableRule.codec`. Every step is elementwise per
service, so a service's decisions do not depend on the batch it comes in. A rule whose state is a plain record
(every rule but PIC-RL's controller) derives from :class:`RecordRule`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Protocol

import numpy as np

# the fields every rule's state carries (ControllerState's names), with their record types
HEADER: list[tuple[str, str]] = [
    ("keys", "<u8"),
    ("tick", "<i8"),
    ("action", "<f8"),
    ("censor_streak", "<i8"),
    ("mu", "<f8"),
    ("sigma", "<f8"),
    ("k", "<f8"),
    ("eta", "<f8"),
    ("margin", "<f8"),
    ("bias", "<f8"),
    ("escape", "<f8"),
    ("order", "<f8"),  # the order before its clip (a record rule's own: ControllerState has none)
]


class Codec(Protocol):
    """Packs a batch's states into structured rows of :attr:`dtype` and back."""

    dtype: np.dtype

    def pack(self, state: Any, out: np.ndarray | None = None) -> np.ndarray: ...

    def unpack(self, rows: np.ndarray) -> Any: ...


class DeployableRule(ABC):
    """One method's decisions for any number of services (the module docstring)."""

    method: str  # the registry name it deploys (picrl_core.deployable)
    learns_policy: bool = False  # True: it acts with a policy network the slow loop refines (replay, versions)

    @property
    @abstractmethod
    def codec(self) -> Codec:
        """The fixed-size row a service's state packs into."""

    @abstractmethod
    def initial_state(
        self,
        keys: np.ndarray,
        history: np.ndarray,
        low: np.ndarray,
        high: np.ndarray,
        history_context: np.ndarray | None = None,
        start_tick: int | np.ndarray = 0,
    ) -> Any:
        """States from the uncensored history ``(B, H)`` in ``[0, 1]`` of each service's native range ``[low, high]``
        (and its context ``(B, H, C)``), ordering for ``start_tick``."""

    @abstractmethod
    def step(
        self,
        state: Any,
        y: np.ndarray,
        censored: np.ndarray,
        context: np.ndarray | None = None,
        missing: np.ndarray | None = None,
    ) -> tuple[Any, Any]:
        """Feedback ``(y_t, c_t)`` for the pending actions -> the states ordering for the next tick, and what a
        replay buffer keeps of the step (None for a rule that learns no policy)."""

    @abstractmethod
    def unclipped(self, state: Any) -> np.ndarray:
        """The pending orders before their clip to ``[0, 1]``."""

    @abstractmethod
    def rescale(self, state: Any, low: np.ndarray, high: np.ndarray, new_low: np.ndarray, new_high: np.ndarray) -> Any:
        """``state`` (in ``[low, high]`` per service) carried to ``[new_low, new_high]``."""

    def choice(self, state: Any) -> tuple[list[str], np.ndarray] | None:
        """The candidate each service's pending action is and its weight, for a rule that chooses among several
        (None: the rule is its one candidate)."""
        return None

    def set_policy(self, policy: Any) -> None:
        """Act with ``policy`` from the next decision on (a rule that learns one)."""
        raise ValueError(f"{self.method} acts with no policy network: it takes no policy version")

    def parameters(self) -> dict[str, Any]:
        """The fitted parameters a model artifact records (JSON values)."""
        return {}


class RecordCodec:
    """The codec of a :class:`RecordRule`: its state is already the row."""

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = dtype

    def pack(self, state: np.recarray, out: np.ndarray | None = None) -> np.ndarray:
        rows = np.asarray(state).view(np.ndarray).view(self.dtype)
        if out is None:
            return rows.copy()
        out[...] = rows
        return out

    def unpack(self, rows: np.ndarray) -> np.recarray:
        if rows.dtype != self.dtype:
            raise ValueError(f"rows have layout {rows.dtype}, expected {self.dtype}")
        return np.array(rows, dtype=self.dtype).view(np.recarray)


class RecordRule(DeployableRule):
    """A rule whose state is one record per service: :data:`HEADER` and the rule's own fields (:meth:`fields`). It
    keeps the header's ``keys``, ``tick`` (the tick the order is for), ``censor_streak`` (the feedback's, before
    :meth:`advance`) and ``action = clip(order, 0, 1)``; a rule says how it
    starts (:meth:`start`), learns and orders (:meth:`advance`) and carries its fields to a new range
    (:meth:`moved`), each setting ``order`` and the breakdown in place on the record."""

    def __init__(self) -> None:
        self._codec = RecordCodec(np.dtype(HEADER + self.fields()))

    @property
    def codec(self) -> RecordCodec:
        return self._codec

    @abstractmethod
    def fields(self) -> list[tuple[Any, ...]]:
        """The rule's own record fields (numpy structured dtype entries)."""

    @abstractmethod
    def start(
        self, state: np.recarray, history: np.ndarray, low: np.ndarray, high: np.ndarray, context: np.ndarray | None
    ) -> None:
        """Fill the rule's fields from the history ``(B, H)`` in ``[low, high]`` (and its context ``(B, H, C)``); set
        ``order`` and the breakdown."""

    @abstractmethod
    def advance(self, state: np.recarray, y: np.ndarray, censored: np.ndarray, context: np.ndarray | None) -> None:
        """Learn from ``(y, c)`` for ``state.action`` (and this tick's context ``(B, C)``); set the next ``order`` and
        the breakdown."""

    @abstractmethod
    def moved(
        self, state: np.recarray, low: np.ndarray, high: np.ndarray, new_low: np.ndarray, new_high: np.ndarray
    ) -> None:
        """Carry the rule's fields and ``order`` to the new ranges."""

    def initial_state(
        self,
        keys: np.ndarray,
        history: np.ndarray,
        low: np.ndarray,
        high: np.ndarray,
        history_context: np.ndarray | None = None,
        start_tick: int | np.ndarray = 0,
    ) -> np.recarray:
        history = np.asarray(history, dtype=np.float64)
        if history.ndim != 2 or history.shape[1] < 1:
            raise ValueError(f"history must have shape (services, steps >= 1); got {history.shape}")
        n = history.shape[0]
        state = np.zeros(n, dtype=self.codec.dtype).view(np.recarray)
        state.keys = np.asarray(keys, dtype=np.uint64)
        state.tick = np.broadcast_to(np.asarray(start_tick, dtype=np.int64), (n,))
        self.start(state, history, *_per_service(n, low, high), history_context)
        state.action = np.clip(state.order, 0.0, 1.0)
        return state

    def step(
        self,
        state: np.recarray,
        y: np.ndarray,
        censored: np.ndarray,
        context: np.ndarray | None = None,
        missing: np.ndarray | None = None,
    ) -> tuple[np.recarray, None]:
        if missing is not None and np.any(missing):
            raise ValueError(f"{self.method} decides one resource per service: no tick goes unobserved")
        new = state.copy()
        censored = np.asarray(censored, dtype=bool)
        new.censor_streak = np.where(censored, state.censor_streak + 1, 0)
        new.tick = state.tick + 1  # the tick the next order is for
        self.advance(new, np.asarray(y, dtype=np.float64), censored, context)
        new.action = np.clip(new.order, 0.0, 1.0)
        return new, None

    def unclipped(self, state: np.recarray) -> np.ndarray:
        return np.array(state.order)

    def rescale(
        self, state: np.recarray, low: np.ndarray, high: np.ndarray, new_low: np.ndarray, new_high: np.ndarray
    ) -> np.recarray:
        n = len(state)
        (low, high), (new_low, new_high) = _per_service(n, low, high), _per_service(n, new_low, new_high)
        new = state.copy()
        self.moved(new, low, high, new_low, new_high)
        new.action = np.clip(new.order, 0.0, 1.0)
        stays = (low == new_low) & (high == new_high)  # left as it is, bit for bit
        new[stays] = state[stays]
        return new


def _per_service(n: int, low: np.ndarray | float, high: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """``low`` and ``high`` as ``(n,)`` float64 arrays."""
    return (
        np.broadcast_to(np.asarray(low, np.float64), (n,)).copy(),
        np.broadcast_to(np.asarray(high, np.float64), (n,)).copy(),
    )
