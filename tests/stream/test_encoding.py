"""The encoder's fast path (issue 17): the same bytes as the decode round trip, and the same refusals."""
from __future__ import annotations

import dataclasses

import numpy as np
import orjson
import pytest

from stream.records import Action, DecodeError, TransitionRecord


def _round_trip(record: Action | TransitionRecord) -> bytes:
    """What to_bytes wrote before the fast path: the payload of the record its decoder makes of it."""
    return orjson.dumps(type(record).from_dict(record._payload())._payload())


ACTION = Action("svc-1", 5, 1.5, 0.3, 0.2, 0.1, 1.2, 0.4, 0.01, -0.02, 3, 0, False, 1.7e9, 1.7e9 - 0.01,
                phase="control", k_sigma=0.12, clipped="low")


def _transition(rng: np.random.Generator, dtype: type = np.float32) -> TransitionRecord:
    return TransitionRecord("svc-1", 4, (rng.normal(size=12) * 1e3).astype(dtype), rng.normal(size=2).astype(dtype),
                            -1.3, 0.5, rng.normal(size=12).astype(dtype), True, 0.4, 2, observed=0.3, mu=0.2,
                            sigma=0.1, censor_streak=1)


def test_fast_encoding_writes_the_bytes_of_the_round_trip() -> None:
    rng = np.random.default_rng(0)
    assert ACTION.to_bytes() == _round_trip(ACTION)
    for dtype in (np.float32, np.float64):
        for _ in range(50):
            transition = _transition(rng, dtype)
            assert transition.to_bytes() == _round_trip(transition)
    numpy_scalars = dataclasses.replace(ACTION, tick=np.int64(5), mu=np.float64(0.2), advisory=np.bool_(False))
    assert numpy_scalars.to_bytes() == _round_trip(numpy_scalars) == ACTION.to_bytes()
    as_tuples = dataclasses.replace(_transition(rng, np.float64), features=tuple(float(x) for x in range(12)))
    assert as_tuples.to_bytes() == _round_trip(as_tuples)


@pytest.mark.parametrize("change, reason", [
    ({"mu": float("nan")}, "non_finite"), ({"capacity": float("inf")}, "non_finite"),
    ({"sigma": -1.0}, "out_of_range"), ({"tick": 3.0}, "wrong_type"), ({"tick": 2**53 + 1}, "bad_tick"),
    ({"phase": "later"}, "wrong_type"), ({"service": "bad\x00id"}, "bad_service_id"),
])
def test_fast_encoding_refuses_what_a_reader_would(change: dict, reason: str) -> None:
    with pytest.raises(DecodeError) as refused:
        dataclasses.replace(ACTION, **change).to_bytes()
    assert refused.value.reason == reason


def test_fast_encoding_refuses_non_finite_vectors_and_mismatched_lengths() -> None:
    rng = np.random.default_rng(1)
    transition = _transition(rng)
    with pytest.raises(DecodeError) as refused:
        dataclasses.replace(transition, pre=np.array([np.inf, 1.0], dtype=np.float32)).to_bytes()
    assert refused.value.reason == "non_finite"
    with pytest.raises(DecodeError) as refused:
        dataclasses.replace(transition, next_features=transition.next_features[:5]).to_bytes()
    assert refused.value.reason == "length_mismatch"
