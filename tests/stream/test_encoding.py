"""The encoder's and the decoder's fast paths (issue 17): the same bytes, records and refusals as the full checks."""

from __future__ import annotations

import dataclasses

import numpy as np
import orjson
import pytest

from stream.records import Action, DecodeError, TransitionRecord, UsageEvent, decode_usage, encode_all


def _round_trip(record: Action | TransitionRecord) -> bytes:
    """What to_bytes wrote before the fast path: the payload of the record its decoder makes of it."""
    return orjson.dumps(type(record).from_dict(record._payload())._payload())


ACTION = Action(
    "svc-1",
    5,
    1.5,
    0.3,
    0.2,
    0.1,
    1.2,
    0.4,
    0.01,
    -0.02,
    3,
    0,
    False,
    1.7e9,
    1.7e9 - 0.01,
    phase="control",
    k_sigma=0.12,
    clipped="low",
)


def _transition(rng: np.random.Generator, dtype: type = np.float32) -> TransitionRecord:
    return TransitionRecord(
        "svc-1",
        4,
        (rng.normal(size=12) * 1e3).astype(dtype),
        rng.normal(size=2).astype(dtype),
        -1.3,
        0.5,
        rng.normal(size=12).astype(dtype),
        True,
        0.4,
        2,
        observed=0.3,
        mu=0.2,
        sigma=0.1,
        censor_streak=1,
    )


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


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"mu": float("nan")}, "non_finite"),
        ({"capacity": float("inf")}, "non_finite"),
        ({"sigma": -1.0}, "out_of_range"),
        ({"tick": 3.0}, "wrong_type"),
        ({"tick": 2**53 + 1}, "bad_tick"),
        ({"phase": "later"}, "wrong_type"),
        ({"service": "bad\x00id"}, "bad_service_id"),
    ],
)
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


def test_plain_worker_records_skip_the_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every field of an action or a transition holding plain values has a fast check: none sends the worker's
    records through the decode round trip (an optional field without one made each action cost 3x)."""
    rng = np.random.default_rng(3)
    plain = [ACTION, dataclasses.replace(ACTION, candidate="conformal", weight=0.7), _transition(rng, np.float64)]
    expected = [record.to_bytes() for record in plain]

    def refuse(cls: type, obj: object) -> None:
        raise AssertionError(f"{cls.__name__} took the decode round trip")

    for cls in (Action, TransitionRecord):
        monkeypatch.setattr(cls, "from_dict", classmethod(refuse))
    assert [record.to_bytes() for record in plain] == expected
    assert encode_all(plain[:2]) == expected[:2]


def _records(rng: np.random.Generator) -> list[Action | TransitionRecord]:
    """Actions and transitions with plain values and with values only the round trip takes (numpy scalars and
    vectors, an int where a float goes, a named candidate)."""
    actions = [
        dataclasses.replace(
            ACTION,
            service=f"svc-{i}",
            tick=int(rng.integers(1_000)),
            mu=float(rng.normal()),
            sigma=float(rng.random()),
            candidate=None if rng.random() < 0.5 else "conformal",
            weight=float(rng.random()),
        )
        for i in range(20)
    ]
    transitions = [
        dataclasses.replace(
            _transition(rng, np.float64), features=tuple(_transition(rng, np.float64).features.tolist())
        )
        for _ in range(20)
    ]
    for record in (actions, transitions):
        assert all(type(r) is type(record[0]) for r in record)
    return [*actions, *transitions]


def test_batch_encoding_writes_each_records_bytes() -> None:
    rng = np.random.default_rng(4)
    records = _records(rng)
    actions, transitions = records[:20], records[20:]
    odd = [
        dataclasses.replace(actions[0], mu=np.float64(0.5)),
        dataclasses.replace(actions[1], capacity=2),
        dataclasses.replace(actions[2], tick=np.int64(7)),
        dataclasses.replace(actions[3], candidate=None, weight=1),
    ]
    for batch in (actions, transitions, records, [*actions, *odd], [*transitions, _transition(rng)], odd[:1], []):
        assert encode_all(batch) == [record.to_bytes() for record in batch]


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"mu": float("nan")}, "non_finite"),
        ({"capacity": float("inf")}, "non_finite"),
        ({"sigma": -1.0}, "out_of_range"),
        ({"weight": -0.5}, "out_of_range"),
        ({"tick": 3.0}, "wrong_type"),
        ({"tick": 2**53 + 1}, "bad_tick"),
        ({"phase": "later"}, "wrong_type"),
        ({"candidate": "bad\x00id"}, "bad_service_id"),
        ({"advisory": 1}, "wrong_type"),
    ],
)
def test_batch_encoding_refuses_what_to_bytes_refuses(change: dict, reason: str) -> None:
    actions = _records(np.random.default_rng(5))[:20]
    actions[7] = dataclasses.replace(actions[7], **change)
    with pytest.raises(DecodeError) as refused:
        encode_all(actions)
    assert refused.value.reason == reason


def test_batch_encoding_refuses_a_transition_whose_vectors_differ_in_length() -> None:
    transitions = _records(np.random.default_rng(6))[20:]
    short = transitions[3]
    transitions[3] = dataclasses.replace(short, next_features=short.next_features[:5])
    with pytest.raises(DecodeError) as refused:
        encode_all(transitions)
    assert refused.value.reason == "length_mismatch"
    transitions[3] = dataclasses.replace(short, pre=(1.0, float("inf")))
    with pytest.raises(DecodeError) as refused:
        encode_all(transitions)
    assert refused.value.reason == "non_finite"


def _decoded(raw: bytes) -> UsageEvent | tuple[str, str]:
    try:
        return decode_usage(raw)
    except DecodeError as refused:
        return refused.reason, refused.detail


def test_fast_decoding_gives_the_full_checks_record_or_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoding takes a plain value as it is when its field's fast check accepts it; every value, valid or not,
    decodes to the same record (or the same refusal) as with the full check of every field."""
    rng = np.random.default_rng(2)
    valid = {
        "service": ["svc-1", "svc-\u00e9"],
        "tick": [0, 5],
        "usage": [0.0, 0.25],
        "censored": [False],
        "capacity": [0.5, 1],
        "context": [None, {"duty": 0.4}],
        "produced_at": [0.0, 1.7e9, 7],
    }
    invalid = {
        "service": ["", "bad\x00id", 7, "x" * 300],
        "tick": [-1, 2**53 + 1, 3.0, True, "5"],
        "usage": [0.5, 1, -0.1, 2e18, "0.5", None, False],
        "censored": [True, 0, "false"],
        "capacity": [0.25, -1.0, 1e19, None],
        "context": [{"duty": "x"}, [1.0]],
        "produced_at": [-5.0, None],
    }

    def pick(name: str) -> object:
        options = invalid[name] if rng.random() < 0.1 else valid[name]
        return options[rng.integers(len(options))]

    payloads = [{name: pick(name) for name in valid} for _ in range(400)]
    for payload in payloads[::7]:
        payload.pop(list(valid)[rng.integers(len(valid))])  # missing fields, required or optional
    raws = [orjson.dumps({"schema": 1, "type": "usage", **payload}) for payload in payloads]
    fast = [_decoded(raw) for raw in raws]
    full_checks = {name: dataclasses.replace(spec, fast_decodes=False) for name, spec in UsageEvent._FIELDS.items()}
    monkeypatch.setattr(UsageEvent, "_FIELDS", full_checks)
    assert [_decoded(raw) for raw in raws] == fast
    assert 50 < sum(isinstance(result, UsageEvent) for result in fast) < 350  # both outcomes are covered
