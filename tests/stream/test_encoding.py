"""The encoder's and the decoder's fast paths (issue 17): the same bytes, records and refusals as the full checks."""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import orjson
import pytest

from stream.records import _SLOW, Action, DecodeError, TransitionRecord, UsageEvent, decode_usage, encode_all


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


def _as_lists(transition: TransitionRecord) -> TransitionRecord:
    """The transition as the worker builds it: its vectors as lists of Python floats (``tolist()``)."""
    return dataclasses.replace(
        transition,
        features=list(np.asarray(transition.features, dtype=np.float64).tolist()),
        pre=list(np.asarray(transition.pre, dtype=np.float64).tolist()),
        next_features=list(np.asarray(transition.next_features, dtype=np.float64).tolist()),
    )


def test_plain_worker_records_skip_the_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every field of an action or a transition holding plain values has a fast check: none sends the worker's
    records through the decode round trip (an optional field without one made each action cost 3x), and a batch of
    them is encoded column by column, never record by record."""
    rng = np.random.default_rng(3)
    plain = [ACTION, dataclasses.replace(ACTION, candidate="conformal", weight=0.7), _transition(rng, np.float64)]
    expected = [_round_trip(record) for record in plain]
    transitions = [_as_lists(_transition(rng, np.float64)) for _ in range(5)]
    expected_transitions = [_round_trip(record) for record in transitions]

    def refuse(cls: type, obj: object) -> None:
        raise AssertionError(f"{cls.__name__} took the decode round trip")

    for cls in (Action, TransitionRecord):
        monkeypatch.setattr(cls, "from_dict", classmethod(refuse))
    assert [record.to_bytes() for record in plain] == expected

    def one_by_one(record: object) -> bytes:
        raise AssertionError("a batch of plain records was encoded record by record")

    monkeypatch.setattr(Action, "to_bytes", one_by_one)
    monkeypatch.setattr(TransitionRecord, "to_bytes", one_by_one)
    assert encode_all(plain[:2]) == expected[:2]
    assert encode_all(transitions) == expected_transitions


def _records(rng: np.random.Generator) -> list[Action | TransitionRecord]:
    """Plain actions (half with a named candidate) and plain transitions (their vectors as the worker builds them)."""
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
    transitions = [_as_lists(_transition(rng, np.float64)) for _ in range(20)]
    return [*actions, *transitions]


def test_batch_encoding_writes_each_records_bytes() -> None:
    """The bytes of the decode round trip, for plain batches and for batches holding values only the round trip
    takes (numpy scalars and vectors, an int where a float goes, tuples and lists mixed)."""
    rng = np.random.default_rng(4)
    records = _records(rng)
    actions, transitions = records[:20], records[20:]
    odd = [
        dataclasses.replace(actions[0], mu=np.float64(0.5)),
        dataclasses.replace(actions[1], capacity=2),
        dataclasses.replace(actions[2], tick=np.int64(7)),
        dataclasses.replace(actions[3], candidate=None, weight=1),
    ]
    mixed = [*transitions[:3], dataclasses.replace(transitions[3], pre=tuple(transitions[3].pre))]
    batches = (actions, transitions, records, [*actions, *odd], [*transitions, _transition(rng)], mixed, odd[:1], [])
    for batch in batches:
        assert encode_all(batch) == [_round_trip(record) for record in batch]


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


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"next_features": [1.0] * 5}, "length_mismatch"),
        ({"pre": [1.0, float("inf")]}, "non_finite"),
        ({"pre": [1.0, 2.0, 3.0]}, "wrong_type"),
        ({"features": [float("nan")] * 12}, "non_finite"),
        ({"censor_streak": -1}, "out_of_range"),
    ],
)
def test_batch_encoding_refuses_a_transition_to_bytes_refuses(change: dict, reason: str) -> None:
    """Plain lists of floats take the column check, so its finiteness and length checks and the record's own
    cross-field check (``_check``) are what refuse these."""
    transitions = _records(np.random.default_rng(6))[20:]
    transitions[3] = dataclasses.replace(transitions[3], **change)
    with pytest.raises(DecodeError) as refused:
        encode_all(transitions)
    assert refused.value.reason == reason


TRICKY = [
    0.5,
    -0.0,
    0.0,
    1.0,
    float("nan"),
    float("inf"),
    -float("inf"),
    sys.float_info.max,
    -1.0,
    1e19,
    0,
    1,
    -1,
    2**53 + 1,
    2**63,
    True,
    False,
    np.float64(0.5),
    np.int64(3),
    np.bool_(True),
    "svc-1",
    "control",
    "none",
    "bad\x00id",
    "",
    None,
    [0.5, 1.0],
    (0.5, float("nan")),
    [0.5],
    [1, 2],
]


@pytest.mark.parametrize("record", [Action, TransitionRecord, UsageEvent])
def test_each_fields_column_check_accepts_no_value_its_own_check_refuses(record: type) -> None:
    """``fast_all`` of a column is ``fast`` of each value where it accepts the column, and it refuses any column
    holding a value ``fast`` refuses."""
    rng = np.random.default_rng(7)
    for name, spec in record._FIELDS.items():
        for _ in range(200):
            column = [TRICKY[i] for i in rng.integers(len(TRICKY), size=int(rng.integers(1, 4)))]
            one_by_one = [spec.fast(value) for value in column]
            together = spec.fast_all(column)
            if any(value is _SLOW for value in one_by_one):
                assert together is _SLOW, (name, column)
            elif together is not _SLOW:
                assert together == one_by_one or orjson.dumps(together) == orjson.dumps(one_by_one), (name, column)


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
