"""Wire records: exact round trips, every refusal reason by a crafted input, and fuzzing that the
decoders raise nothing but DecodeError whatever the bytes."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import MISSING
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stream.records import (
    DECODE_REASONS,
    MAX_ID_LENGTH,
    MAX_QUANTITY,
    MAX_TICK,
    SCHEMA_VERSION,
    Action,
    DeadLetter,
    DecodeError,
    PolicyVersion,
    ResourceAction,
    ResourceDecision,
    ResourceUsage,
    ResourceUsageEvent,
    TransitionRecord,
    UsageEvent,
    decode_action,
    decode_dead_letter,
    decode_policy,
    decode_transition,
    decode_usage,
    usage_identity,
)

FUZZ = settings(max_examples=300, deadline=None, database=None)
WEIGHTS = b"\x08\x00\x00\x00\x00\x00\x00\x00{}      \x00\xff"  # any bytes: the record does not parse them

USAGE = UsageEvent("web-frontend", 12, 3.25, False, 4.0, {"duty_cycle": 0.4}, 1_700_000_000.5)
CENSORED = UsageEvent("db/primary", 0, 8.0, True, 8.0)
ACTION = Action(
    "web-frontend", 13, 5.5, 0.55, 0.42, 0.07, 1.8, 1.2, 0.03, -0.01, 4, 2, False, 1_700_000_001.0, 1_700_000_000.5
)
TRANSITION = TransitionRecord(
    "web-frontend", 12, (0.1, 0.2, -0.3), (0.25, -1.5), -1.37, -0.8, (0.2, -0.3, 0.4), True, 0.6, 4
)
POLICY = PolicyVersion("default", 5, 4, 0.012, 0.91, 1_700_000_002.0, WEIGHTS)
ROOT_POLICY = PolicyVersion("default", 0, None, 0.0, 0.5, 1_700_000_000.0, b"", accepted_by_trainer=False)
LETTER = DeadLetter(
    "negative_usage",
    "usage: expected a number >= 0, got -1",
    "picrl.usage",
    3,
    1234,
    b'{"usage": -1}\xff',
    1_700_000_003.0,
)

POD = ResourceUsageEvent(
    "pod-7",
    40,
    {"gpu_mem": ResourceUsage(12.0, 12.0, True), "gpu_compute": ResourceUsage(31.5, 80.0, False)},
    {"duty_cycle": 0.4},
    1.5,
)
POD_ACTION = ResourceAction(
    "pod-7",
    41,
    {
        "gpu_mem": ResourceDecision(13.5, 0.61, 0.52, 0.04, 0.43, 0.1, 0.02, 0.0, 1),
        "gpu_compute": ResourceDecision(40.0, 0.4, 0.35, 0.05, 0.43, 0.1, 0.0, 0.0, 0, 0.02, "low"),
    },
    3,
    False,
    1_700_000_001.0,
    1_700_000_000.5,
    "control",
)

DECODERS: list[tuple[Any, Callable[[bytes], Any]]] = [
    (USAGE, decode_usage),
    (CENSORED, decode_usage),
    (ACTION, decode_action),
    (TRANSITION, decode_transition),
    (POLICY, decode_policy),
    (ROOT_POLICY, decode_policy),
    (LETTER, decode_dead_letter),
    (POD, decode_usage),
    (POD_ACTION, decode_action),
]
DECODER_OF = {type(record): decode for record, decode in DECODERS}
DEFAULTS = {
    cls: {field.name: field.default for field in dataclasses.fields(cls) if field.default is not MISSING}
    for cls in DECODER_OF
}
DROP = object()


def _id(item: Any) -> str:
    return item.__name__ if callable(item) else type(item).__name__


def wire(record: Any, **changes: Any) -> bytes:
    """The record's JSON with fields replaced or dropped, written by the stdlib encoder so that NaN
    literals and integers beyond 64 bits can be produced."""
    payload = orjson.loads(record.to_bytes())
    for key, value in changes.items():
        if value is DROP:
            del payload[key]
        else:
            payload[key] = value
    return json.dumps(payload).encode()


def payload(record: Any, **changes: Any) -> dict[str, Any]:
    return {**orjson.loads(record.to_bytes()), **changes}


# ---------------------------------------------------------------- round trips and wire format


@pytest.mark.parametrize(("record", "decode"), DECODERS, ids=_id)
def test_round_trip_is_exact(record: Any, decode: Callable[[bytes], Any]) -> None:
    raw = record.to_bytes()
    decoded = decode(raw)
    assert decoded == record
    assert type(decoded) is type(record)
    assert decoded.to_bytes() == raw


def test_wire_format_is_plain_json_with_schema_type_and_base64() -> None:
    doc = json.loads(POLICY.to_bytes())
    assert doc["schema"] == SCHEMA_VERSION == 1
    assert doc["type"] == "policy"
    assert base64.b64decode(doc["weights"]) == WEIGHTS
    assert doc["parent"] == 4 and doc["accepted_by_trainer"] is True
    assert json.loads(LETTER.to_bytes())["raw"] == base64.b64encode(LETTER.raw).decode()
    assert json.loads(TRANSITION.to_bytes())["pre"] == [0.25, -1.5]
    assert {json.loads(record.to_bytes())["type"] for record, _ in DECODERS} == {
        "usage",
        "action",
        "transition",
        "policy",
        "deadletter",
    }


def test_fields_with_defaults_may_be_absent() -> None:
    event = decode_usage(wire(USAGE, context=DROP, produced_at=DROP))
    assert event.context is None and event.produced_at == 0.0
    assert decode_policy(wire(POLICY, accepted_by_trainer=DROP)).accepted_by_trainer is True


def test_integers_are_accepted_for_floats_and_become_floats() -> None:
    event = decode_usage(wire(USAGE, usage=3, capacity=4, produced_at=0))
    assert (event.usage, event.capacity) == (3.0, 4.0)
    assert type(event.usage) is float and type(event.capacity) is float


def test_numpy_values_from_the_controller_encode_to_plain_json() -> None:
    action = Action(
        "s",
        np.int64(7),
        np.float32(2.5),
        np.float64(0.25),
        np.float32(0.1),
        np.float32(0.02),
        np.float32(1.5),
        np.float32(1.0),
        0.0,
        0.0,
        np.int64(1),
        np.int64(0),
        np.bool_(True),
        1.0,
        1.0,
    )
    decoded = decode_action(action.to_bytes())
    assert decoded.tick == 7 and type(decoded.tick) is int
    assert decoded.mu == float(np.float32(0.1)) and decoded.advisory is True
    transition = TransitionRecord(
        "s",
        1,
        np.array([0.5, 1.5], np.float32),
        np.array([0.1, 0.2]),
        -1.0,
        0.5,
        np.array([1.5, 2.5], np.float32),
        False,
        1.0,
        0,
    )
    assert decode_transition(transition.to_bytes()).features == (0.5, 1.5)


def test_usage_boundaries_follow_min_d_a() -> None:
    assert decode_usage(wire(USAGE, usage=4.0, capacity=4.0)).usage == 4.0  # d == a: not censored
    assert decode_usage(wire(USAGE, usage=4.0 * (1 + 5e-10), capacity=4.0)).capacity == 4.0
    assert decode_usage(wire(CENSORED, usage=8.0 * (1 - 5e-7))).censored is True
    assert decode_usage(wire(USAGE, usage=0.0, capacity=0.0)).usage == 0.0
    assert decode_usage(wire(CENSORED, usage=0.0, capacity=0.0)).censored is True


@pytest.mark.parametrize(("usage", "capacity"), [(70.187, 70.18734), (70.188, 70.18734), (7.93, 8.0), (8.07, 8.0)])
def test_censored_usage_within_one_percent_of_capacity_is_accepted(usage: float, capacity: float) -> None:
    assert decode_usage(wire(CENSORED, usage=usage, capacity=capacity)).censored is True  # rounded, sampled under


@pytest.mark.parametrize(
    ("raw", "identity"),
    [
        (wire(CENSORED, usage=4.0), ("db/primary", 0)),  # refused for its value
        (wire(USAGE, usage=-1.0), ("web-frontend", 12)),
        (wire(USAGE, capacity="lots"), ("web-frontend", 12)),
        (wire(USAGE, service=""), None),  # refused for its identity
        (wire(USAGE, tick=-1), None),
        (wire(USAGE, schema=3), None),
        (wire(ACTION), None),
        (b"{not json", None),
        (b"[1, 2]", None),
    ],
)
def test_usage_identity_is_read_only_from_usage_records_with_a_valid_service_and_tick(
    raw: bytes, identity: tuple[str, int] | None
) -> None:
    assert usage_identity(raw) == identity


def test_service_id_limits() -> None:
    assert decode_usage(wire(USAGE, service="s" * MAX_ID_LENGTH)).service == "s" * MAX_ID_LENGTH
    assert decode_usage(wire(USAGE, service="サービス-α 1")).service == "サービス-α 1"


def test_decode_error_is_a_value_error_with_a_closed_reason_set() -> None:
    error = DecodeError("bad_tick", "tick: expected an integer >= 0, got -1")
    assert isinstance(error, ValueError)
    assert (error.reason, error.detail) == ("bad_tick", "tick: expected an integer >= 0, got -1")
    assert str(error) == "bad_tick: tick: expected an integer >= 0, got -1"
    with pytest.raises(ValueError, match="not a decode reason"):
        DecodeError("oops", "x")  # type: ignore[arg-type]


def test_to_bytes_refuses_what_the_decoder_would_dead_letter() -> None:
    with pytest.raises(DecodeError) as caught:
        Action("s", 1, 5.0, 0.5, math.nan, 0.1, 1.0, 1.0, 0.0, 0.0, 0, 0, False, 1.0, 1.0).to_bytes()
    assert caught.value.reason == "non_finite" and "mu" in caught.value.detail
    with pytest.raises(DecodeError) as caught:
        UsageEvent("s", 1, 5.0, False, 4.0).to_bytes()
    assert caught.value.reason == "usage_above_capacity"
    with pytest.raises(DecodeError) as caught:
        PolicyVersion("p", 1, None, 0.0, 0.0, 0.0, "not bytes").to_bytes()  # type: ignore[arg-type]
    assert caught.value.reason == "wrong_type" and "weights" in caught.value.detail


# ---------------------------------------------------------------- every reason, by a crafted input

REASON_CASES: list[tuple[str, Callable[[], Any], str, str]] = [
    ("not_utf8", lambda: decode_usage(b"\xff\xfe{}"), "malformed_json", "value"),
    ("truncated", lambda: decode_usage(USAGE.to_bytes()[:-3]), "malformed_json", "value"),
    ("nan_literal", lambda: decode_usage(wire(USAGE, usage=math.nan)), "malformed_json", "value"),
    (
        "overflow_literal",
        lambda: decode_action(wire(ACTION, mu=1e308).replace(b"1e+308", b"1e400")),
        "malformed_json",
        "value",
    ),
    ("tombstone", lambda: decode_policy(None), "malformed_json", "value"),  # type: ignore[arg-type]
    ("array", lambda: decode_usage(b"[1, 2]"), "not_an_object", "value"),
    ("null", lambda: decode_policy(b"null"), "not_an_object", "value"),
    ("schema_3", lambda: decode_usage(wire(USAGE, schema=3)), "unknown_schema_version", "schema"),
    ("schema_str", lambda: decode_usage(wire(USAGE, schema="1")), "unknown_schema_version", "schema"),
    ("schema_bool", lambda: decode_usage(wire(USAGE, schema=True)), "unknown_schema_version", "schema"),
    ("schema_float", lambda: decode_usage(wire(USAGE, schema=1.0)), "unknown_schema_version", "schema"),
    ("action_as_usage", lambda: decode_usage(ACTION.to_bytes()), "wrong_record_type", "type"),
    ("type_case", lambda: decode_usage(wire(USAGE, type="Usage")), "wrong_record_type", "type"),
    ("no_schema", lambda: decode_usage(wire(USAGE, schema=DROP)), "missing_field", "schema"),
    ("no_type", lambda: decode_policy(wire(POLICY, type=DROP)), "missing_field", "type"),
    ("no_service", lambda: decode_usage(wire(USAGE, service=DROP)), "missing_field", "service"),
    ("no_parent", lambda: decode_policy(wire(POLICY, parent=DROP)), "missing_field", "parent"),
    ("extra_key", lambda: decode_usage(wire(USAGE, demand=5.0)), "unknown_field", "demand"),
    ("tick_bool", lambda: decode_usage(wire(USAGE, tick=True)), "wrong_type", "tick"),
    ("tick_float", lambda: decode_usage(wire(USAGE, tick=3.0)), "wrong_type", "tick"),
    ("tick_u64_overflow", lambda: decode_usage(wire(USAGE, tick=2**64)), "wrong_type", "tick"),
    ("usage_bool", lambda: decode_usage(wire(USAGE, usage=False)), "wrong_type", "usage"),
    ("usage_nan_string", lambda: decode_usage(wire(USAGE, usage="nan")), "wrong_type", "usage"),
    ("usage_null", lambda: decode_usage(wire(USAGE, usage=None)), "wrong_type", "usage"),
    ("censored_int", lambda: decode_usage(wire(USAGE, censored=0)), "wrong_type", "censored"),
    ("service_int", lambda: decode_usage(wire(USAGE, service=5)), "wrong_type", "service"),
    ("context_list", lambda: decode_usage(wire(USAGE, context=[0.4])), "wrong_type", "context"),
    ("context_str", lambda: decode_usage(wire(USAGE, context={"duty": "0.4"})), "wrong_type", "context"),
    ("pre_length", lambda: decode_transition(wire(TRANSITION, pre=[1.0])), "wrong_type", "pre"),
    ("features_str", lambda: decode_transition(wire(TRANSITION, features="0.1,0.2")), "wrong_type", "features"),
    (
        "feature_bool",
        lambda: decode_transition(wire(TRANSITION, features=[0.1, True, 0.2])),
        "wrong_type",
        "features[1]",
    ),
    ("weights_list", lambda: decode_policy(wire(POLICY, weights=[1, 2])), "wrong_type", "weights"),
    ("advisory_str", lambda: decode_action(wire(ACTION, advisory="false")), "wrong_type", "advisory"),
    ("from_dict_nan", lambda: UsageEvent.from_dict(payload(USAGE, usage=math.nan)), "non_finite", "usage"),
    ("from_dict_inf", lambda: Action.from_dict(payload(ACTION, sigma=math.inf)), "non_finite", "sigma"),
    ("capacity_negative", lambda: decode_usage(wire(USAGE, usage=0.0, capacity=-1.0)), "out_of_range", "capacity"),
    ("sigma_negative", lambda: decode_action(wire(ACTION, sigma=-0.1)), "out_of_range", "sigma"),
    ("kl_negative", lambda: decode_policy(wire(POLICY, kl_to_parent=-1e-3)), "out_of_range", "kl_to_parent"),
    ("version_i64", lambda: decode_policy(wire(POLICY, version=2**63)), "out_of_range", "version"),
    ("offset_negative", lambda: decode_dead_letter(wire(LETTER, offset=-1)), "out_of_range", "offset"),
    ("produced_negative", lambda: decode_usage(wire(USAGE, produced_at=-1.0)), "out_of_range", "produced_at"),
    ("usage_negative", lambda: decode_usage(wire(USAGE, usage=-0.5)), "negative_usage", "usage"),
    ("tick_negative", lambda: decode_usage(wire(USAGE, tick=-1)), "bad_tick", "tick"),
    ("tick_i64", lambda: decode_action(wire(ACTION, tick=2**63)), "bad_tick", "tick"),
    ("tick_beyond_2_53", lambda: decode_usage(wire(USAGE, tick=2**53 + 1)), "bad_tick", "tick"),
    ("usage_tick_2_53", lambda: decode_usage(wire(USAGE, tick=2**53)), "bad_tick", "tick"),  # answered for 2**53 + 1
    ("usage_huge", lambda: decode_usage(wire(CENSORED, usage=1e19, capacity=1e19)), "out_of_range", "usage"),
    ("phase_unknown", lambda: decode_action(wire(ACTION, phase="boost")), "wrong_type", "phase"),
    ("service_empty", lambda: decode_usage(wire(USAGE, service="")), "bad_service_id", "service"),
    ("service_long", lambda: decode_usage(wire(USAGE, service="s" * (MAX_ID_LENGTH + 1))), "bad_service_id", "service"),
    ("service_newline", lambda: decode_action(wire(ACTION, service="web\nfrontend")), "bad_service_id", "service"),
    ("service_nul", lambda: decode_usage(wire(USAGE, service="web\x00")), "bad_service_id", "service"),
    ("service_bidi", lambda: decode_usage(wire(USAGE, service="web\u202e")), "bad_service_id", "service"),
    ("policy_name", lambda: decode_policy(wire(POLICY, name="")), "bad_policy_name", "name"),
    ("weights_garbage", lambda: decode_policy(wire(POLICY, weights="not base64!")), "bad_base64", "weights"),
    ("raw_unpadded", lambda: decode_dead_letter(wire(LETTER, raw="QQ")), "bad_base64", "raw"),
    ("parent_same", lambda: decode_policy(wire(POLICY, parent=5)), "bad_parent", "parent"),
    ("parent_newer", lambda: decode_policy(wire(POLICY, parent=9)), "bad_parent", "parent"),
    (
        "next_features_short",
        lambda: decode_transition(wire(TRANSITION, next_features=[0.1])),
        "length_mismatch",
        "next_features",
    ),
    ("above_capacity", lambda: decode_usage(wire(USAGE, usage=4.0 * (1 + 1e-8))), "usage_above_capacity", "usage"),
    ("censored_below", lambda: decode_usage(wire(CENSORED, usage=4.0)), "censored_usage_mismatch", "usage"),
    ("censored_above", lambda: decode_usage(wire(CENSORED, usage=8.0 * 1.02)), "censored_usage_mismatch", "usage"),
    (
        "resource_upper",
        lambda: decode_usage(wire(POD, resources={"GPU": {"usage": 1.0, "capacity": 2.0, "censored": False}})),
        "bad_resource_name",
        "resources key",
    ),
    (
        "resource_long",
        lambda: decode_usage(wire(POD, resources={"m" * 33: {"usage": 1.0, "capacity": 2.0, "censored": False}})),
        "bad_resource_name",
        "resources key",
    ),
    ("resources_empty", lambda: decode_usage(wire(POD, resources={})), "wrong_type", "resources"),
    ("resource_list", lambda: decode_usage(wire(POD, resources=[1.0])), "wrong_type", "resources"),
    (
        "resource_extra",
        lambda: decode_usage(
            wire(POD, resources={"gpu_mem": {"usage": 1.0, "capacity": 2.0, "censored": False, "limit": 3.0}})
        ),
        "unknown_field",
        "'limit'",
    ),
    (
        "resource_no_flag",
        lambda: decode_usage(wire(POD, resources={"gpu_mem": {"usage": 1.0, "capacity": 2.0}})),
        "missing_field",
        "censored",
    ),
    (
        "resource_negative",
        lambda: decode_usage(wire(POD, resources={"gpu_mem": {"usage": -1.0, "capacity": 2.0, "censored": False}})),
        "negative_usage",
        "resources['gpu_mem'].usage",
    ),
    (
        "resource_above",
        lambda: decode_usage(wire(POD, resources={"gpu_mem": {"usage": 3.0, "capacity": 2.0, "censored": False}})),
        "usage_above_capacity",
        "resources['gpu_mem'].usage",
    ),
    ("resources_on_schema_1", lambda: decode_usage(wire(POD, schema=1)), "unknown_field", "resources"),
    ("usage_on_schema_2", lambda: decode_usage(wire(USAGE, schema=2)), "unknown_field", "usage"),
    (
        "action_resource_clip",
        lambda: decode_action(
            wire(POD_ACTION, resources={"gpu_mem": {**payload(POD_ACTION)["resources"]["gpu_mem"], "clipped": "maybe"}})
        ),
        "wrong_type",
        "clipped",
    ),
]


@pytest.mark.parametrize(
    ("case", "reason", "field"), [case[1:] for case in REASON_CASES], ids=[case[0] for case in REASON_CASES]
)
def test_each_reason_is_raised_with_its_code_and_the_field(case: Callable[[], Any], reason: str, field: str) -> None:
    with pytest.raises(DecodeError) as caught:
        case()
    assert caught.value.reason == reason
    assert field in caught.value.detail


def test_the_cases_cover_the_whole_closed_set_of_reasons() -> None:
    assert {case[2] for case in REASON_CASES} == DECODE_REASONS


FIXED_JUNK = [None, True, 0, -1, 1.5, -0.5, 2**64, 2**63, "", "x", "nan", [], [1.0], [1.0, "x"], {}, {"a": None}]


@pytest.mark.parametrize(("record", "decode"), DECODERS, ids=_id)
def test_every_field_with_every_junk_value_decodes_or_raises_decode_error(
    record: Any, decode: Callable[[bytes], Any]
) -> None:
    for key in orjson.loads(record.to_bytes()):
        for junk in FIXED_JUNK:
            try:
                decoded = decode(wire(record, **{key: junk}))
            except DecodeError as error:
                assert error.reason in DECODE_REASONS
                assert key in error.detail or error.reason in ("unknown_schema_version", "wrong_record_type")
            else:
                assert decode(decoded.to_bytes()) == decoded


# ---------------------------------------------------------------- property tests

ANY_DECODER = st.sampled_from([decode_usage, decode_action, decode_transition, decode_policy, decode_dead_letter])
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=12),
    st.lists(JSONISH, max_size=3),
    st.dictionaries(st.text(max_size=8), JSONISH, max_size=3),
)
SERVICE_IDS = st.text(st.characters(exclude_categories=("Cc", "Cf", "Cs")), min_size=1, max_size=MAX_ID_LENGTH)
AMOUNTS = st.floats(min_value=0.0, allow_infinity=False)
FINITE = st.floats(allow_nan=False, allow_infinity=False)


QUANTITIES = st.floats(min_value=0.0, max_value=MAX_QUANTITY)


@st.composite
def usage_events(draw: st.DrawFn) -> UsageEvent:
    capacity = draw(QUANTITIES)
    censored = draw(st.booleans())
    usage = capacity if censored else draw(st.floats(min_value=0.0, max_value=capacity))
    context = draw(st.none() | st.dictionaries(st.text(st.characters(exclude_categories=("Cs",))), FINITE, max_size=3))
    return UsageEvent(
        draw(SERVICE_IDS), draw(st.integers(0, MAX_TICK - 1)), usage, censored, capacity, context, draw(AMOUNTS)
    )


@st.composite
def near_valid(draw: st.DrawFn) -> tuple[Any, dict[str, Any], bool]:
    """A valid record (3 times in 8 a usage event) and its object with up to two entries replaced by junk
    or dropped, plus sometimes an extra key; also the record it must decode to if it was left intact
    (optional fields dropped become their defaults)."""
    record = draw(st.sampled_from([None, None, None, ACTION, TRANSITION, POLICY, ROOT_POLICY, LETTER]))
    record = draw(usage_events()) if record is None else record
    obj = orjson.loads(record.to_bytes())
    intact = True
    for key in draw(st.lists(st.sampled_from(sorted(obj)), max_size=2, unique=True)):
        if draw(st.booleans()):
            junk = draw(JUNK)
            intact = intact and junk == obj[key] and type(junk) is type(obj[key])
            obj[key] = junk
        else:
            del obj[key]
            if key in DEFAULTS[type(record)]:  # absent means the default
                record = dataclasses.replace(record, **{key: DEFAULTS[type(record)][key]})
            else:
                intact = False
    extra = draw(st.dictionaries(st.text(max_size=8), JUNK, max_size=1)) if draw(st.integers(0, 3)) == 0 else {}
    return record, {**obj, **extra}, intact and not extra


@FUZZ
@given(raw=st.binary(max_size=256), decode=ANY_DECODER)
def test_arbitrary_bytes_decode_or_raise_decode_error_only(raw: bytes, decode: Callable[[bytes], Any]) -> None:
    try:
        decode(raw)
    except DecodeError as error:
        assert error.reason in DECODE_REASONS


@FUZZ
@given(obj=JSONISH, decode=ANY_DECODER)
def test_arbitrary_json_values_raise_decode_error_only(obj: Any, decode: Callable[[bytes], Any]) -> None:
    with pytest.raises(DecodeError):  # no random value is a complete valid record
        decode(json.dumps(obj).encode())


@FUZZ
@given(case=near_valid())
def test_near_valid_objects_decode_to_a_valid_record_or_raise_decode_error(
    case: tuple[Any, dict[str, Any], bool],
) -> None:
    record, obj, intact = case
    cls, decode = type(record), DECODER_OF[type(record)]
    outcomes = []
    for attempt in (lambda: decode(json.dumps(obj).encode()), lambda: cls.from_dict(obj)):
        try:
            outcomes.append(attempt())
        except DecodeError as error:
            assert error.reason in DECODE_REASONS
            outcomes.append(None)
    assert outcomes[0] == outcomes[1]  # the bytes path and the dict path accept exactly the same objects
    decoded = outcomes[0]
    if intact:
        assert decoded == record
    if isinstance(decoded, UsageEvent):
        assert decoded.tick >= 0 and 0.0 <= decoded.usage and math.isfinite(decoded.capacity)
        assert decoded.usage <= decoded.capacity * (1 + 1e-9)
    if decoded is not None:
        assert decode(decoded.to_bytes()) == decoded


@FUZZ
@given(event=usage_events())
def test_well_formed_usage_events_round_trip_exactly(event: UsageEvent) -> None:
    raw = event.to_bytes()
    decoded = decode_usage(raw)
    assert decoded == event
    assert decoded.to_bytes() == raw
