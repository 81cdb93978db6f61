"""Nothing a usage message holds raises past the worker's intake: random bytes and well-formed but
wrong records all end up decided or dead-lettered with a known reason (property-based)."""
from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from picrl_core.artifact import ModelArtifact
from stream.decisions import REFUSAL_REASONS, DecisionEngine, EngineSettings
from stream.intake import INTERNAL_ERROR, Raw, decide, decode_batch
from stream.records import DECODE_REASONS, SCHEMA_VERSION

REASONS = DECODE_REASONS | REFUSAL_REASONS | {INTERNAL_ERROR}
NUMBERS = st.one_of(st.integers(-10, 2**63 - 1), st.floats(allow_nan=False, allow_infinity=False), st.just(1e300))
JUNK = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=5), st.lists(st.integers(), max_size=2))


@st.composite
def usage_like(draw: st.DrawFn) -> bytes:
    """A usage record whose fields are drawn from plausible and wrong values alike."""
    obj: dict[str, Any] = {
        "schema": draw(st.sampled_from([SCHEMA_VERSION, SCHEMA_VERSION, 2, "1"])), "type": "usage",
        "service": draw(st.sampled_from(["a", "b", "c", ""]) | st.text(max_size=3)),
        "tick": draw(st.integers(-2, 40) | st.sampled_from([2**53, 2**53 + 1, 10**6])),
        "usage": draw(NUMBERS | st.floats(0, 50)), "censored": draw(st.booleans() | JUNK),
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
def test_random_input_is_decided_or_dead_lettered_never_raised(tiny_artifact: ModelArtifact,
                                                                batches: list[list[bytes]]) -> None:
    engine = DecisionEngine(tiny_artifact, EngineSettings(max_services=2, max_tick_gap=50))
    rows: dict[str, bytes] = {}
    offset = 0
    for values in batches:
        raws = []
        for value in values:
            raws.append(Raw("t.usage", 0, offset, None, value))
            offset += 1
        incoming, letters = decode_batch(raws, now=1.0)
        outcome, refused = decide(engine, incoming, {i.event.service: rows.get(i.event.service) for i in incoming},
                                  len(rows), "t.usage", now=1.0)
        rows.update(outcome.rows)
        letters += refused
        assert {letter.record.reason for letter in letters} <= REASONS
        assert INTERNAL_ERROR not in {letter.record.reason for letter in letters}, letters
        decoded_ok = len(incoming) - len(refused) - outcome.redelivered
        assert len(letters) + decoded_ok + outcome.redelivered == len(values)  # every message accounted for once
        assert len(outcome.actions) == decoded_ok  # one action per applied event
        for action in outcome.actions:
            action.to_bytes()  # every emitted record is one a reader accepts
        for transition in outcome.transitions:
            transition.to_bytes()
    assert len(rows) <= 2
