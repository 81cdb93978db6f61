"""Nothing a usage message holds raises past the worker's intake: random bytes and well-formed but
wrong records all end up decided or dead-lettered with a known reason (property-based)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from picrl_core.artifact import ModelArtifact
from stream.decisions import REFUSAL_REASONS, DecisionEngine, EngineSettings, Incoming
from stream.intake import INTERNAL_ERROR, Raw, decide, decode_batch
from stream.records import DECODE_REASONS, SCHEMA_VERSION, UsageEvent

REASONS = DECODE_REASONS | REFUSAL_REASONS | {INTERNAL_ERROR}
NUMBERS = st.one_of(st.integers(-10, 2**63 - 1), st.floats(allow_nan=False, allow_infinity=False), st.just(1e300))
JUNK = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=5), st.lists(st.integers(), max_size=2))


@st.composite
def usage_like(draw: st.DrawFn) -> bytes:
    """A usage record whose fields are drawn from plausible and wrong values alike."""
    obj: dict[str, Any] = {
        "schema": draw(st.sampled_from([SCHEMA_VERSION, SCHEMA_VERSION, 3, "1"])),
        "type": "usage",
        "service": draw(st.sampled_from(["a", "b", "c", ""]) | st.text(max_size=3)),
        "tick": draw(st.integers(-2, 40) | st.sampled_from([2**53, 2**53 + 1, 10**6])),
        "usage": draw(NUMBERS | st.floats(0, 50)),
        "censored": draw(st.booleans() | JUNK),
        "capacity": draw(NUMBERS | st.floats(0, 50)),
    }
    if draw(st.booleans()):
        obj["context"] = draw(st.none() | st.dictionaries(st.text(max_size=3), NUMBERS, max_size=2))
    if draw(st.integers(0, 5)) == 0:
        obj[draw(st.sampled_from(list(obj)) | st.text(max_size=4))] = draw(JUNK)
    return json.dumps(obj).encode()  # not orjson: it cannot write the integers beyond 64 bits drawn here


MESSAGES = st.lists(st.one_of(st.binary(max_size=64), usage_like()), min_size=1, max_size=12)


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batches=st.lists(MESSAGES, min_size=1, max_size=4))
def test_random_input_is_decided_or_dead_lettered_never_raised(
    tiny_artifact: ModelArtifact, batches: list[list[bytes]]
) -> None:
    engine = DecisionEngine(tiny_artifact, EngineSettings(max_services=2, max_tick_gap=50))
    rows: dict[str, bytes] = {}
    offset = 0
    for values in batches:
        raws = []
        for value in values:
            raws.append(Raw("t.usage", 0, offset, None, value))
            offset += 1
        incoming, letters = decode_batch(raws, now=1.0)
        outcome, refused = decide(
            engine, incoming, {i.service: rows.get(i.service) for i in incoming}, len(rows), "t.usage", now=1.0
        )
        rows.update(outcome.rows)
        letters += refused
        assert {letter.record.reason for letter in letters} <= REASONS
        assert INTERNAL_ERROR not in {letter.record.reason for letter in letters}, letters
        decoded = [i for i in incoming if isinstance(i, Incoming)]
        decoded_ok = len(decoded) - len(refused) - outcome.redelivered
        assert len(letters) + decoded_ok + outcome.redelivered == len(values)  # every message accounted for once
        holds = [a for a in outcome.actions if a.phase == "hold"]
        assert len(outcome.actions) - len(holds) == decoded_ok  # one decision per applied event
        assert len(holds) <= len(incoming) - len(decoded) + len(refused)  # at most one per refusal
        for action in outcome.actions:
            action.to_bytes()  # every emitted record is one a reader accepts
        for transition in outcome.transitions:
            transition.to_bytes()
    assert len(rows) <= 2


def _feed(engine: DecisionEngine, rows: dict[str, bytes], values: list[bytes], first_offset: int) -> tuple[list, list]:
    raws = [Raw("t.usage", 0, first_offset + n, b"svc", value) for n, value in enumerate(values)]
    incoming, letters = decode_batch(raws, now=1.0)
    outcome, refused = decide(
        engine, incoming, {i.service: rows.get(i.service) for i in incoming}, len(rows), "t.usage", now=1.0
    )
    rows.update(outcome.rows)
    return outcome.actions, letters + refused


def test_a_record_refused_for_its_value_is_answered_with_a_hold(tiny_artifact: ModelArtifact) -> None:
    engine, rows = DecisionEngine(tiny_artifact), {}
    window = engine.window
    warm = [UsageEvent("svc", t, 4.0 + t % 3, False, 10.0).to_bytes() for t in range(window)]
    actions, _ = _feed(engine, rows, warm, 0)
    decided = actions[-1]
    assert decided.phase == "control" and decided.tick == window
    bad = json.dumps(
        {
            "schema": 1,
            "type": "usage",
            "service": "svc",
            "tick": window,
            "usage": 0.5 * decided.capacity,
            "censored": True,
            "capacity": decided.capacity,
        }
    ).encode()  # censored, usage far below capacity
    (hold,), (letter,) = _feed(engine, rows, [bad], window)
    assert letter.record.reason == "censored_usage_mismatch" and (letter.service, letter.tick) == ("svc", window)
    assert hold.phase == "hold" and hold.tick == window + 1 and hold.capacity == decided.capacity
    assert (hold.mu, hold.margin, hold.policy_version) == (decided.mu, decided.margin, decided.policy_version)
    assert _feed(engine, rows, [bad], window) == ([], [letter])  # redelivered: held once
    assert _feed(engine, rows, [bad], window + 1)[0] == []  # another bad record for the tick: held once
    fixed = UsageEvent("svc", window, decided.capacity, True, decided.capacity).to_bytes()
    actions, letters = _feed(engine, rows, [fixed], window + 2)  # too late: the tick was missed
    assert not actions and [letter.record.reason for letter in letters] == ["duplicate_tick"]
    next_bad = bad.replace(b'"tick": %d' % window, b'"tick": %d' % (window + 1))
    later = UsageEvent("svc", window + 2, 5.0, False, hold.capacity).to_bytes()
    held, after_gap = _feed(engine, rows, [next_bad, later], window + 3)[0]  # in one batch, in order
    assert (held.phase, held.tick, held.capacity) == ("hold", window + 2, hold.capacity)
    assert (after_gap.phase, after_gap.tick) == ("control", window + 3)  # the missed ticks moved the clock


def test_identity_refusals_and_unknown_services_get_no_hold(tiny_artifact: ModelArtifact) -> None:
    engine, rows = DecisionEngine(tiny_artifact), {}
    unknown = json.dumps(
        {"schema": 1, "type": "usage", "service": "new", "tick": 0, "usage": -1.0, "censored": False, "capacity": 3.0}
    ).encode()
    no_tick = json.dumps(
        {"schema": 1, "type": "usage", "service": "svc", "tick": -4, "usage": 1.0, "censored": False, "capacity": 3.0}
    ).encode()
    actions, letters = _feed(engine, rows, [unknown, no_tick], 0)
    assert actions == [] and [(letter.service, letter.tick) for letter in letters] == [("new", 0), (None, None)]
