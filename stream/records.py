"""Versioned wire records of picrl's Kafka topics, and the strict decoder that guards them.

Every value is one JSON object (orjson, never pickle) carrying ``"schema": <version>`` and
``"type": <record name>``; ``bytes`` fields travel base64-encoded. Schema 1 (:data:`SCHEMA_VERSION`) is every
record of a service provisioned one resource; schema 2 (:data:`RESOURCES_SCHEMA_VERSION`) is the usage and
action records of a service provisioned several at once (``picrl_core.resources``), with a ``resources`` map
``{name: {usage, capacity, censored}}`` (``{name: {capacity, mu, ...}}`` on an action) in place of the
single resource's fields. Topics carry raw bytes and the
workers decode them here, so that bad input becomes a :class:`DecodeError` with a stable
machine-readable ``reason`` (routed to ``picrl.deadletter``) instead of a crashed worker.

A usage event is the PIC observation of the paper (section 2): after provisioning ``a_t`` the
cluster reports ``y_t = min(d_t, a_t)`` and ``c_t = 1[d_t > a_t]``, so ``y_t <= a_t`` always and
``y_t = a_t`` whenever ``c_t = 1``; events breaking either are physically impossible and refused.

Reasons (the closed set :data:`DECODE_REASONS`):

    malformed_json            not bytes, not UTF-8, not JSON (NaN/Infinity literals, overflowing numbers)
    not_an_object             JSON, but not an object
    unknown_schema_version    ``schema`` is not exactly an integer version of that record (1; 2 for usage/action)
    wrong_record_type         ``type`` names another record
    missing_field             a field without a default is absent
    unknown_field             a key this schema does not define
    wrong_type                a value of the wrong JSON type (bool is never a number, "nan" is not a number)
    non_finite                NaN or +-inf in a number field (in-process values)
    out_of_range              a number outside its range (usage and capacity at most 1e18), an integer
                              beyond signed 64 bits
    negative_usage            usage below zero
    bad_tick                  tick negative or beyond 2**53 (a usage record's beyond 2**53 - 1: it is answered
                              for tick + 1)
    bad_service_id            service id empty, longer than MAX_ID_LENGTH, or with control/format characters
    bad_resource_name         a resource name empty, longer than MAX_RESOURCE_LENGTH, or not [a-z0-9_]
    bad_policy_name           policy name, same rules as a service id
    bad_base64                a bytes field that is not valid base64
    bad_parent                a policy version whose parent is not older than itself
    length_mismatch           transition features and next_features of different lengths
    usage_above_capacity      uncensored usage above the capacity in force (beyond a relative 1e-9)
    censored_usage_mismatch   censored usage that differs from the capacity by more than 1% of it

On a schema-2 usage record the last two hold per resource, where ``censored`` is the resource's own
monitor flag (it ran at its limit on the load it was given).

A censored report within 1% of the capacity (``CENSORED_USAGE_RTOL``) is accepted as censored:
telemetry rounds, and a gauge sampled at a limit reads just under it. The worker then takes the
capacity itself as the observation (``y_t = a_t``), whatever usage says.

A usage record refused for its values whose ``service`` and ``tick`` are valid (:func:`usage_identity`)
still names the tick it reports: the worker answers it with a hold (``stream.decisions``).
"""

from __future__ import annotations

import base64
import math
import sys
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, fields
from functools import cache
from itertools import chain
from operator import attrgetter
from typing import Any, ClassVar, Literal, NoReturn, Self, TypeVar, cast, get_args

import numpy as np
import orjson

SCHEMA_VERSION = 1
RESOURCES_SCHEMA_VERSION = 2
MAX_ID_LENGTH = 200
MAX_RESOURCE_LENGTH = 32
MAX_TICK = 2**53  # ticks stay exact integers in every JSON reader, and tick + 1 never overflows
MAX_QUANTITY = 1e18  # usage and capacity: far above any real unit, and their ranges stay finite
USAGE_ABOVE_CAPACITY_RTOL = 1e-9
CENSORED_USAGE_RTOL = 0.01
_INT64_MAX = 2**63 - 1
_VALID_IDS_KEPT = 100_000  # service ids remembered as valid by the encoder's fast check (then forgotten at once)
_SHOWN_CHARS = 80
_FORBIDDEN_ID_CATEGORIES = frozenset({"Cc", "Cf", "Cs"})  # control, format (e.g. bidi overrides), surrogate

DecodeReason = Literal[
    "malformed_json",
    "not_an_object",
    "unknown_schema_version",
    "wrong_record_type",
    "missing_field",
    "unknown_field",
    "wrong_type",
    "non_finite",
    "out_of_range",
    "negative_usage",
    "bad_tick",
    "bad_service_id",
    "bad_resource_name",
    "bad_policy_name",
    "bad_base64",
    "bad_parent",
    "length_mismatch",
    "usage_above_capacity",
    "censored_usage_mismatch",
]
DECODE_REASONS: frozenset[str] = frozenset(get_args(DecodeReason))


class DecodeError(ValueError):
    """A message value that is not a valid record: ``reason`` is a code from :data:`DECODE_REASONS`,
    ``detail`` names the offending field and value for a human."""

    def __init__(self, reason: DecodeReason, detail: str) -> None:
        if reason not in DECODE_REASONS:
            raise ValueError(f"{reason!r} is not a decode reason; known: {sorted(DECODE_REASONS)}")
        super().__init__(reason, detail)
        self.reason: DecodeReason = reason
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


def _fail(reason: DecodeReason, name: str, expected: str, value: Any) -> NoReturn:
    raise DecodeError(reason, f"{name}: expected {expected}, got {_show(value)}")


# ---------------------------------------------------------------- field specs
# A field spec turns one JSON value into the Python value the record holds (or raises DecodeError);
# it also accepts the numpy scalars and 1-D arrays the controller produces, so records built from
# controller outputs encode without manual conversion.

Decoder = Callable[[str, Any], Any]
_SLOW = object()  # a fast check's answer: "not sure this value decodes to itself; take the full round trip"
_FLOAT_MAX = sys.float_info.max
_FLOAT_DTYPES = (np.dtype(np.float64), np.dtype(np.float32))  # tolist() gives float() of each item, as decoding does


def _slow(_value: Any) -> Any:
    return _SLOW


def _all_of(kind: type, column: list[Any]) -> bool:
    """Whether every value of ``column`` is exactly of type ``kind`` (no subclass: a bool is no int here)."""
    return set(map(type, column)) <= {kind}


@dataclass(frozen=True, slots=True)
class _Field:
    decode: Decoder
    encode: Callable[[str, Any], Any] = lambda _name, value: value
    #: the value to serialise when ``value`` certainly decodes to a value equal to it (the same JSON), else _SLOW;
    #: it lets :meth:`_Record.to_bytes` skip the decode round trip for the plain values the worker emits
    fast: Callable[[Any], Any] = _slow
    #: whether what ``fast`` accepts is also what ``decode`` returns for it (so decoding may take it as it is)
    fast_decodes: bool = True
    #: ``fast`` over a whole column of values at once: the values to serialise, or _SLOW when any one is not
    #: certain (None: ``fast`` value by value). It never accepts a value ``fast`` refuses; it may refuse more (its
    #: batch is then encoded record by record)
    fast_column: Callable[[list[Any]], Any] | None = None

    def fast_all(self, column: list[Any]) -> Any:
        """``fast`` of every value of ``column`` (a list), or _SLOW when any of them is _SLOW."""
        if self.fast_column is not None:
            return self.fast_column(column)
        values = [self.fast(value) for value in column]
        return _SLOW if any(value is _SLOW for value in values) else values


def _as_float(name: str, value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        _fail("wrong_type", name, "a number", value)
    try:
        number = float(value)
    except OverflowError:
        _fail("non_finite", name, "a finite number", value)
    if not math.isfinite(number):
        _fail("non_finite", name, "a finite number", value)
    return number


def _number(
    minimum: float | None = None, reason: DecodeReason = "out_of_range", maximum: float | None = None
) -> _Field:
    def decode(name: str, value: Any) -> float:
        number = _as_float(name, value)
        if minimum is not None and number < minimum:
            _fail(reason, name, f"a number >= {minimum:g}", value)
        if maximum is not None and number > maximum:
            _fail("out_of_range", name, f"a number <= {maximum:g}", value)
        return number

    low = -_FLOAT_MAX if minimum is None else minimum
    high = _FLOAT_MAX if maximum is None else maximum

    def fast(value: Any) -> Any:  # a finite float within the bounds (NaN fails every comparison)
        return value if type(value) is float and low <= value <= high else _SLOW

    def fast_column(column: list[Any]) -> Any:
        if not _all_of(float, column):
            return _SLOW
        values = np.array(column, dtype=np.float64)
        return column if ((values >= low) & (values <= high)).all() else _SLOW

    return _Field(decode, fast=fast, fast_column=fast_column)


def _integer(minimum: int = 0, reason: DecodeReason = "out_of_range", maximum: int = _INT64_MAX) -> _Field:
    def decode(name: str, value: Any) -> int:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            _fail("wrong_type", name, "an integer", value)
        number = int(value)
        if not minimum <= number <= maximum:
            _fail(reason, name, f"an integer in [{minimum}, {maximum}]", value)
        return number

    def fast(value: Any) -> Any:
        return value if type(value) is int and minimum <= value <= maximum else _SLOW

    def fast_column(column: list[Any]) -> Any:
        if not _all_of(int, column):
            return _SLOW
        return column if not column or (minimum <= min(column) and max(column) <= maximum) else _SLOW

    return _Field(decode, fast=fast, fast_column=fast_column)


def _decode_flag(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        _fail("wrong_type", name, "true or false", value)
    return bool(value)


def _decode_text(name: str, value: Any) -> str:
    if not isinstance(value, str):
        _fail("wrong_type", name, "a string", value)
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            _fail("wrong_type", name, "valid Unicode text (no lone surrogates)", value)
    return value


def _identifier(reason: DecodeReason) -> _Field:
    def decode(name: str, value: Any) -> str:
        text = _decode_text(name, value)
        if not 0 < len(text) <= MAX_ID_LENGTH:
            _fail(reason, name, f"1 to {MAX_ID_LENGTH} characters", value)
        if any(unicodedata.category(char) in _FORBIDDEN_ID_CATEGORIES for char in text):
            _fail(reason, name, "no control or format characters", value)
        return text

    valid: set[str] = set()  # identifiers seen valid (a worker's services, encoded again every tick)

    def fast(value: Any) -> Any:
        if type(value) is not str:
            return _SLOW
        if value not in valid:
            try:
                decode("", value)
            except DecodeError:
                return _SLOW
            if len(valid) >= _VALID_IDS_KEPT:
                valid.clear()
            valid.add(value)
        return value

    return _Field(decode, fast=fast)


def _numbers(length: int | None = None) -> _Field:
    expected = "a list of numbers" if length is None else f"a list of {length} numbers"

    def decode(name: str, value: Any) -> tuple[float, ...]:
        if isinstance(value, np.ndarray):
            if value.ndim != 1:
                _fail("wrong_type", name, expected, value)
        elif not isinstance(value, (list, tuple)):
            _fail("wrong_type", name, expected, value)
        if length is not None and len(value) != length:
            _fail("wrong_type", name, expected, value)
        return tuple(_as_float(f"{name}[{index}]", item) for index, item in enumerate(value))

    def fast(value: Any) -> Any:  # a 1-D float array (as a list of the same floats) or a list/tuple of floats
        if type(value) is np.ndarray:
            if (
                value.ndim != 1
                or value.dtype not in _FLOAT_DTYPES
                or (length is not None and value.shape[0] != length)
                or not np.isfinite(value).all()
            ):
                return _SLOW
            return value.tolist()
        if type(value) not in (tuple, list) or (length is not None and len(value) != length):
            return _SLOW
        for item in value:
            if type(item) is not float or not -_FLOAT_MAX <= item <= _FLOAT_MAX:
                return _SLOW
        return value

    def fast_column(column: list[Any]) -> Any:  # lists or tuples of finite floats (not the arrays ``fast`` takes)
        if not set(map(type, column)) <= {tuple, list}:
            return _SLOW
        if length is not None and set(map(len, column)) - {length}:
            return _SLOW
        items = list(chain.from_iterable(column))
        return column if _all_of(float, items) and np.isfinite(np.array(items, dtype=np.float64)).all() else _SLOW

    return _Field(decode, fast=fast, fast_decodes=False, fast_column=fast_column)  # decoding gives a tuple


def _decode_channels(name: str, value: Any) -> dict[str, float] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        _fail("wrong_type", name, "an object of numbers or null", value)
    return {_decode_text(f"{name} key", key): _as_float(f"{name}[{key!r}]", item) for key, item in value.items()}


def _choice(*allowed: str) -> _Field:
    def decode(name: str, value: Any) -> str:
        if value not in allowed or not isinstance(value, str):
            _fail("wrong_type", name, "one of " + ", ".join(map(repr, allowed)), value)
        return value

    def fast_column(column: list[Any]) -> Any:
        return column if _all_of(str, column) and set(column) <= set(allowed) else _SLOW

    return _Field(
        decode, fast=lambda value: value if type(value) is str and value in allowed else _SLOW, fast_column=fast_column
    )


def _optional(spec: _Field) -> _Field:
    def fast_column(column: list[Any]) -> Any:
        checked = spec.fast_all([value for value in column if value is not None])
        if checked is _SLOW:
            return _SLOW
        present = iter(checked)
        return [None if value is None else next(present) for value in column]

    return _Field(
        lambda name, value: None if value is None else spec.decode(name, value),
        fast=lambda value: None if value is None else spec.fast(value),
        fast_decodes=spec.fast_decodes,
        fast_column=fast_column,
    )


def _decode_blob(name: str, value: Any) -> bytes:
    if not isinstance(value, str):
        _fail("wrong_type", name, "a base64 string", value)
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:  # binascii.Error, or non-ASCII text
        _fail("bad_base64", name, "valid base64", value)


def _encode_blob(name: str, value: Any) -> str:
    if not isinstance(value, (bytes, bytearray, memoryview)):
        _fail("wrong_type", name, "bytes", value)
    return base64.b64encode(value).decode("ascii")


_TICK = _integer(reason="bad_tick", maximum=MAX_TICK)
_USAGE_TICK = _integer(reason="bad_tick", maximum=MAX_TICK - 1)  # its answer is for tick + 1, which must be a tick
_COUNT = _integer()
_FINITE = _number()
_NON_NEGATIVE = _number(minimum=0.0)
_TIMESTAMP = _NON_NEGATIVE  # epoch seconds
_FLAG = _Field(
    _decode_flag,
    fast=lambda value: value if type(value) is bool else _SLOW,
    fast_column=lambda column: column if _all_of(bool, column) else _SLOW,
)
_TEXT = _Field(_decode_text, fast=lambda value: value if type(value) is str and value.isascii() else _SLOW)
_SERVICE = _identifier("bad_service_id")
_BLOB = _Field(_decode_blob, _encode_blob)
_CHANNELS = _Field(_decode_channels, fast=lambda value: None if value is None else _SLOW)


# ---------------------------------------------------------------- the generic record

R = TypeVar("R", bound="_Record")


class _Record:
    """Shared wire behaviour; subclasses are frozen slotted dataclasses declaring ``_TYPE`` and one
    ``_FIELDS`` spec per dataclass field, in the same order."""

    __slots__ = ()
    _SCHEMA: ClassVar[int] = SCHEMA_VERSION
    _TYPE: ClassVar[str]
    _FIELDS: ClassVar[dict[str, _Field]]

    def _check(self) -> None:
        """Invariants across fields (none by default); raises DecodeError."""

    def _payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = {"schema": self._SCHEMA, "type": self._TYPE}
        for name, spec in self._FIELDS.items():
            payload[name] = spec.encode(name, getattr(self, name))
        return payload

    def to_dict(self) -> dict[str, Any]:
        """The JSON object the record travels as (with ``schema`` and ``type``)."""
        return self._payload()

    def to_bytes(self) -> bytes:
        """The orjson value for the topic. A record its own decoder would refuse (NaN, negative usage...)
        raises the same DecodeError here: a worker never emits what another would dead-letter.

        The bytes are those of the decoded payload (``from_dict(payload)._payload()``). When every field holds
        a plain value its decoder would return unchanged (a finite float within its bounds, an int, a known
        choice, a service id seen valid before, a float64 vector...: each field spec's ``fast`` check), that is
        the payload itself, so the decode round trip (most of the encoding time of a worker's outputs) is
        skipped and only the record's cross-field ``_check`` runs; any other value takes the round trip."""
        payload: dict[str, Any] = {"schema": self._SCHEMA, "type": self._TYPE}
        for name, spec in self._FIELDS.items():
            value = spec.fast(getattr(self, name))
            if value is _SLOW:
                return orjson.dumps(type(self).from_dict(self._payload())._payload())
            payload[name] = value
        self._check()
        return orjson.dumps(payload)

    @classmethod
    def encode_many(cls, records: Sequence[Self]) -> list[bytes]:
        """:meth:`to_bytes` of each of ``records`` (the same bytes, or the same DecodeError), with each field's fast
        check run over the whole column at once: a worker encodes a batch's actions and transitions this way."""
        if not records or any(type(record) is not cls for record in records):
            return [record.to_bytes() for record in records]
        columns = []
        for spec, values in zip(cls._FIELDS.values(), zip(*map(attrgetter(*cls._FIELDS), records))):
            column = spec.fast_all(list(values))
            if column is _SLOW:
                return [record.to_bytes() for record in records]
            columns.append(column)
        for record in records:
            record._check()
        keys = ("schema", "type", *cls._FIELDS)
        head = (cls._SCHEMA, cls._TYPE)
        return [orjson.dumps(dict(zip(keys, head + values))) for values in zip(*columns)]

    @classmethod
    def from_dict(cls, obj: Any) -> Self:
        """Validate one parsed JSON object (with its ``schema`` and ``type`` keys) into a record."""
        if type(obj) is not dict and not isinstance(obj, Mapping):
            _fail("not_an_object", "value", "a JSON object", obj)
        for key in ("schema", "type"):
            if key not in obj:
                raise DecodeError("missing_field", f"{key}: required, absent")
        schema = obj["schema"]
        if type(schema) is not int or schema != cls._SCHEMA:
            _fail("unknown_schema_version", "schema", f"version {cls._SCHEMA}", schema)
        if obj["type"] != cls._TYPE:
            _fail("wrong_record_type", "type", repr(cls._TYPE), obj["type"])
        known, required = _wire_keys(cls)
        if not obj.keys() <= known:
            unknown = sorted(map(repr, obj.keys() - known))
            raise DecodeError("unknown_field", f"{cls._TYPE} has no field {', '.join(unknown)}")
        if not required <= obj.keys():
            missing = [name for name in cls._FIELDS if name in required and name not in obj]
            raise DecodeError("missing_field", f"{', '.join(missing)}: required, absent")
        values = {}
        for name, spec in cls._FIELDS.items():
            if name in obj:
                value = obj[name]
                plain = spec.fast(value) if spec.fast_decodes else _SLOW  # the common case, without the full check
                values[name] = spec.decode(name, value) if plain is _SLOW else plain
        record = cls(**values)
        record._check()
        return record


def _wire_keys_of(cls: type[_Record]) -> tuple[frozenset[str], frozenset[str]]:
    """The keys a record may carry (its fields, ``schema`` and ``type``) and the fields without a dataclass
    default (which must be present); checks the specs match the fields."""
    declared = fields(cls)  # type: ignore[arg-type]  # the record classes are dataclasses; _Record is not
    if [field.name for field in declared] != list(cls._FIELDS):
        raise TypeError(f"{cls.__name__}._FIELDS does not list its dataclass fields in order")
    return (
        frozenset(cls._FIELDS) | {"schema", "type"},
        frozenset(field.name for field in declared if field.default is MISSING),
    )


# cast: typeshed's cache takes Hashable arguments, and mypy reads a class's __hash__ as unbound (so the class as
# unhashable); a class hashes by identity
_wire_keys = cast(Callable[[type[_Record]], tuple[frozenset[str], frozenset[str]]], cache(_wire_keys_of))


def encode_all(records: Sequence[_Record]) -> list[bytes]:
    """:meth:`_Record.to_bytes` of each record; column by column (:meth:`_Record.encode_many`) when they are all of
    one type."""
    return type(records[0]).encode_many(records) if records else []


def _decode(raw: bytes | None, cls: type[R]) -> R:
    return _decode_versions(raw, {cls._SCHEMA: cls})


def _check_observation(where: str, usage: float, capacity: float, censored: bool) -> None:
    """The PIC observation rule on one resource: ``y <= a``, and ``y = a`` (within 1%) when censored."""
    if not censored and usage > capacity * (1 + USAGE_ABOVE_CAPACITY_RTOL):
        raise DecodeError(
            "usage_above_capacity", f"{where}usage: {usage!r} exceeds capacity {capacity!r} and censored is false"
        )
    if censored and abs(usage - capacity) > CENSORED_USAGE_RTOL * capacity:
        raise DecodeError(
            "censored_usage_mismatch",
            f"{where}usage: {usage!r} is censored, so it must equal "
            f"capacity {capacity!r} (within {CENSORED_USAGE_RTOL:.0%})",
        )


E = TypeVar("E")


def _per_resource(entry: type[E], specs: dict[str, _Field]) -> _Field:
    """A ``{resource name: {field: value}}`` object of ``entry`` dataclasses, each entry with exactly the
    fields of ``specs`` (checked like a record's); encodes back to plain objects."""
    names = frozenset(specs)

    def decode(name: str, value: Any) -> dict[str, E]:
        if not isinstance(value, Mapping) or not value:
            _fail("wrong_type", name, "a non-empty object of resources", value)
        decoded = {}
        for key, item in value.items():
            key = _RESOURCE_NAME.decode(f"{name} key", key)
            where = f"{name}[{key!r}]"
            if isinstance(item, entry):
                item = {field: getattr(item, field) for field in specs}
            if not isinstance(item, Mapping):
                _fail("wrong_type", where, "an object", item)
            if item.keys() - names:
                unknown = ", ".join(sorted(map(repr, item.keys() - names)))
                raise DecodeError("unknown_field", f"{where} has no field {unknown}")
            if names - item.keys():
                raise DecodeError(
                    "missing_field", f"{where}: {', '.join(sorted(names - item.keys()))} required, absent"
                )
            decoded[key] = entry(
                **{field: spec.decode(f"{where}.{field}", item[field]) for field, spec in specs.items()}
            )
        return decoded

    def encode(_name: str, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value  # decoding refuses it with its reason
        return {
            key: {field: getattr(item, field) for field in specs} if isinstance(item, entry) else item
            for key, item in value.items()
        }

    return _Field(decode, encode)


def _resource_name(name: str, value: Any) -> str:
    text = _decode_text(name, value)
    if (
        not 0 < len(text) <= MAX_RESOURCE_LENGTH
        or not all(c.isascii() and (c.isalnum() or c == "_") for c in text)
        or text != text.lower()
    ):
        _fail("bad_resource_name", name, f"1 to {MAX_RESOURCE_LENGTH} characters of [a-z0-9_]", value)
    return text


_RESOURCE_NAME = _Field(_resource_name)


# ---------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class UsageEvent(_Record):
    """``picrl.usage``: observed usage ``y_t = min(d_t, a_t)`` and ``c_t = 1[d_t > a_t]`` (paper section 2)
    in the service's native unit, with the capacity ``a_t`` in force during ``tick``."""

    service: str
    tick: int
    usage: float
    censored: bool
    capacity: float
    context: dict[str, float] | None = None  # extra channels, e.g. {"duty_cycle": 0.4}
    produced_at: float = 0.0  # producer clock, epoch seconds

    _TYPE: ClassVar[str] = "usage"
    _FIELDS: ClassVar[dict[str, _Field]] = {
        "service": _SERVICE,
        "tick": _USAGE_TICK,
        "usage": _number(0.0, "negative_usage", MAX_QUANTITY),
        "censored": _FLAG,
        "capacity": _number(0.0, maximum=MAX_QUANTITY),
        "context": _CHANNELS,
        "produced_at": _TIMESTAMP,
    }

    def _check(self) -> None:
        _check_observation("", self.usage, self.capacity, self.censored)


@dataclass(frozen=True, slots=True)
class Action(_Record):
    """``picrl.actions``: the capacity decided for ``tick`` (native unit and normalised) and its breakdown:
    prediction ``mu``, ``sigma``, policy outputs ``k``, ``eta``, calibrator ``margin`` and ``bias``.

    ``phase`` is ``"warmup"`` while the worker is still collecting a new service's first window (it then
    holds the capacity in force, raising it after a shortage), ``"control"`` once PIC-RL decides, and
    ``"hold"`` when the tick's usage record was refused for its value (dead-lettered): the capacity in
    force is kept, with the breakdown of the decision that set it.
    ``k_sigma`` is the risk buffer ``k * sigma``; ``escape`` the censoring-streak escape (0 unless the model has
    ``calibrator.escape``); ``clipped`` says whether the order ``mu + k*sigma + margin + bias + escape`` (with
    ``estimator.act_on_repeat``, the default, the critical-fractile quantile of the repeat mixture around it: after a
    seen tick of a service whose demand keeps repeating, the last demand seen, so ``capacity_norm`` can differ from
    that sum inside the range) was cut to the range (``"low"``/``"high"``) or replaced by an operator's override
    (``"override"``).
    ``censor_streak`` counts the consecutive censored ticks up to the decision (0: the last tick was not short).
    ``candidate`` names the buffer rule a portfolio deployed (``picrl_core.rules.portfolio``; None for a method that
    has one rule) and ``weight`` its weight among the candidates (1 for a single rule)."""

    service: str
    tick: int
    capacity: float
    capacity_norm: float
    mu: float
    sigma: float
    k: float
    eta: float
    margin: float
    bias: float
    policy_version: int
    censor_streak: int
    advisory: bool
    decided_at: float
    source_produced_at: float
    phase: str = "control"
    k_sigma: float = 0.0
    clipped: str = "none"
    escape: float = 0.0
    candidate: str | None = None
    weight: float = 1.0

    _TYPE: ClassVar[str] = "action"
    _FIELDS: ClassVar[dict[str, _Field]] = {
        "service": _SERVICE,
        "tick": _TICK,
        "capacity": _NON_NEGATIVE,
        "capacity_norm": _FINITE,
        "mu": _FINITE,
        "sigma": _NON_NEGATIVE,
        "k": _FINITE,
        "eta": _FINITE,
        "margin": _FINITE,
        "bias": _FINITE,
        "policy_version": _COUNT,
        "censor_streak": _COUNT,
        "advisory": _FLAG,
        "decided_at": _TIMESTAMP,
        "source_produced_at": _TIMESTAMP,
        "phase": _choice("warmup", "control", "hold"),
        "k_sigma": _FINITE,
        "clipped": _choice("none", "low", "high", "override"),
        "escape": _NON_NEGATIVE,
        "candidate": _optional(_SERVICE),
        "weight": _NON_NEGATIVE,
    }


@dataclass(frozen=True, slots=True)
class ResourceUsage:
    """One resource's observation on a schema-2 usage record: ``y_r``, the capacity ``a_r`` in force and the
    resource's own monitor flag (it ran at its limit on the load it was given)."""

    usage: float
    capacity: float
    censored: bool


_RESOURCE_USAGE = _per_resource(
    ResourceUsage, {"usage": UsageEvent._FIELDS["usage"], "capacity": UsageEvent._FIELDS["capacity"], "censored": _FLAG}
)


@dataclass(frozen=True, slots=True)
class ResourceUsageEvent(_Record):
    """``picrl.usage``, schema 2: one tick of a service provisioned several resources, each with its own
    observation and flag (``picrl_core.resources``: a hard resource that ran short censors the others'
    observations too; the worker derives those coupled flags, the producer reports what it measured)."""

    service: str
    tick: int
    resources: dict[str, ResourceUsage]
    context: dict[str, float] | None = None
    produced_at: float = 0.0

    _SCHEMA: ClassVar[int] = RESOURCES_SCHEMA_VERSION
    _TYPE: ClassVar[str] = "usage"
    _FIELDS: ClassVar[dict[str, _Field]] = {
        "service": _SERVICE,
        "tick": _USAGE_TICK,
        "resources": _RESOURCE_USAGE,
        "context": _CHANNELS,
        "produced_at": _TIMESTAMP,
    }

    @property
    def censored(self) -> bool:
        """Whether any resource ran at its limit."""
        return any(r.censored for r in self.resources.values())

    def _check(self) -> None:
        for name, r in self.resources.items():
            _check_observation(f"resources[{name!r}].", r.usage, r.capacity, r.censored)


@dataclass(frozen=True, slots=True)
class ResourceDecision:
    """One resource's share of a schema-2 action: its capacity and the breakdown of :class:`Action`."""

    capacity: float
    capacity_norm: float
    mu: float
    sigma: float
    k: float
    eta: float
    margin: float
    bias: float
    censor_streak: int
    k_sigma: float = 0.0
    clipped: str = "none"
    escape: float = 0.0


_DECISION_FIELDS = (
    "capacity",
    "capacity_norm",
    "mu",
    "sigma",
    "k",
    "eta",
    "margin",
    "bias",
    "censor_streak",
    "k_sigma",
    "clipped",
    "escape",
)


@dataclass(frozen=True, slots=True)
class ResourceAction(_Record):
    """``picrl.actions``, schema 2: the capacities decided for ``tick`` of a service provisioned several
    resources, one :class:`ResourceDecision` each, decided together (``phase`` as on :class:`Action`)."""

    service: str
    tick: int
    resources: dict[str, ResourceDecision]
    policy_version: int
    advisory: bool
    decided_at: float
    source_produced_at: float
    phase: str = "control"

    _SCHEMA: ClassVar[int] = RESOURCES_SCHEMA_VERSION
    _TYPE: ClassVar[str] = "action"
    _FIELDS: ClassVar[dict[str, _Field]] = {
        "service": _SERVICE,
        "tick": _TICK,
        "resources": _per_resource(ResourceDecision, {name: Action._FIELDS[name] for name in _DECISION_FIELDS}),
        "policy_version": _COUNT,
        "advisory": _FLAG,
        "decided_at": _TIMESTAMP,
        "source_produced_at": _TIMESTAMP,
        "phase": Action._FIELDS["phase"],
    }

    @property
    def censor_streak(self) -> int:
        """The longest censoring streak among the resources."""
        return max(r.censor_streak for r in self.resources.values())


@dataclass(frozen=True, slots=True)
class TransitionRecord(_Record):
    """``picrl.replay``: one transition for the slow trainer (state features, pre-squash ``(eta, k)``
    sample and its behaviour log-probability, reward, next state, censoring, applied action), with what
    the reward was computed from: the normalised observation ``y``, the prediction ``(mu, sigma)`` the
    action was based on and the censoring streak after this tick (Eq. 9 when censored, Eq. 10 otherwise)."""

    service: str
    tick: int
    features: tuple[float, ...]
    pre: tuple[float, float]
    log_prob: float
    reward: float
    next_features: tuple[float, ...]
    censored: bool
    action: float
    policy_version: int
    observed: float = 0.0
    mu: float = 0.0
    sigma: float = 0.0
    censor_streak: int = 0

    _TYPE: ClassVar[str] = "transition"
    _FIELDS: ClassVar[dict[str, _Field]] = {
        "service": _SERVICE,
        "tick": _TICK,
        "features": _numbers(),
        "pre": _numbers(2),
        "log_prob": _FINITE,
        "reward": _FINITE,
        "next_features": _numbers(),
        "censored": _FLAG,
        "action": _FINITE,
        "policy_version": _COUNT,
        "observed": _FINITE,
        "mu": _FINITE,
        "sigma": _NON_NEGATIVE,
        "censor_streak": _COUNT,
    }

    def _check(self) -> None:
        if len(self.features) != len(self.next_features):
            raise DecodeError(
                "length_mismatch",
                f"next_features: {len(self.next_features)} numbers, features has {len(self.features)}",
            )


@dataclass(frozen=True, slots=True)
class PolicyVersion(_Record):
    """``picrl.policy`` (compacted, key = ``name@version``): policy weights as safetensors bytes plus lineage:
    the parent version, ``KL(new || parent)`` on replayed states, and the off-policy validation scores
    of the new policy and of its parent on the same held-out transitions (higher is better)."""

    name: str
    version: int
    parent: int | None
    kl_to_parent: float
    validation_score: float
    created_at: float
    weights: bytes
    accepted_by_trainer: bool = True
    parent_score: float | None = None  # the parent's validation score on the same held-out transitions
    rollback_of: int | None = None  # set by `picrl policy rollback`: these are that version's weights

    _TYPE: ClassVar[str] = "policy"
    _FIELDS: ClassVar[dict[str, _Field]] = {
        "name": _identifier("bad_policy_name"),
        "version": _COUNT,
        "parent": _optional(_COUNT),
        "kl_to_parent": _NON_NEGATIVE,
        "validation_score": _FINITE,
        "created_at": _TIMESTAMP,
        "weights": _BLOB,
        "accepted_by_trainer": _FLAG,
        "parent_score": _optional(_FINITE),
        "rollback_of": _optional(_COUNT),
    }

    @property
    def key(self) -> bytes:
        """Message key on the policy topic: one per version, so compaction keeps every version
        (the lineage and rollback targets) while dropping re-sent duplicates."""
        return f"{self.name}@{self.version}".encode()

    def _check(self) -> None:
        if self.parent is not None and self.parent >= self.version:
            raise DecodeError("bad_parent", f"parent: {self.parent} is not older than version {self.version}")


@dataclass(frozen=True, slots=True)
class DeadLetter(_Record):
    """``picrl.deadletter``: a message that could not be used, verbatim, with the reason it was refused. A reading
    ``picrl produce prometheus`` refused names its source instead: ``topic`` ``prometheus:<url>``, ``partition`` 0,
    ``offset`` the tick, ``raw`` the readings as JSON."""

    reason: str
    detail: str
    topic: str
    partition: int
    offset: int
    raw: bytes
    failed_at: float

    _TYPE: ClassVar[str] = "deadletter"
    _FIELDS: ClassVar[dict[str, _Field]] = {
        "reason": _TEXT,
        "detail": _TEXT,
        "topic": _TEXT,
        "partition": _COUNT,
        "offset": _COUNT,
        "raw": _BLOB,
        "failed_at": _TIMESTAMP,
    }


def _decode_versions(raw: bytes | None, versions: Mapping[int, type[R]]) -> R:
    """:func:`_decode` into the record class its ``schema`` names (the first class, which refuses it, for any
    other schema)."""
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        _fail("malformed_json", "value", "bytes (a tombstone has no record)", raw)
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise DecodeError("malformed_json", f"value: {exc}") from None
    schema = obj.get("schema") if type(obj) is dict else None
    if type(schema) is int and schema in versions:
        return versions[schema].from_dict(obj)
    if len(versions) > 1 and type(obj) is dict and "schema" in obj and "type" in obj:
        _fail("unknown_schema_version", "schema", "version " + " or ".join(map(str, versions)), schema)
    return next(iter(versions.values())).from_dict(obj)


_USAGE_VERSIONS: dict[int, type[UsageEvent] | type[ResourceUsageEvent]] = {
    SCHEMA_VERSION: UsageEvent,
    RESOURCES_SCHEMA_VERSION: ResourceUsageEvent,
}
_ACTION_VERSIONS: dict[int, type[Action] | type[ResourceAction]] = {
    SCHEMA_VERSION: Action,
    RESOURCES_SCHEMA_VERSION: ResourceAction,
}


def decode_usage(raw: bytes | None) -> UsageEvent | ResourceUsageEvent:
    """A usage record of either schema (one resource, or a ``resources`` map)."""
    return _decode_versions(raw, _USAGE_VERSIONS)


def usage_identity(raw: bytes) -> tuple[str, int] | None:
    """``(service, tick)`` of a message that is a usage record of this schema with a valid service id and
    tick, whatever its other fields hold; None otherwise (the refusal is then about its identity)."""
    try:
        obj = orjson.loads(raw)
    except (orjson.JSONDecodeError, TypeError):
        return None
    if (
        not isinstance(obj, dict)
        or type(obj.get("schema")) is not int
        or obj["schema"] not in (SCHEMA_VERSION, RESOURCES_SCHEMA_VERSION)
        or obj.get("type") != UsageEvent._TYPE
    ):
        return None
    try:
        return _SERVICE.decode("service", obj.get("service")), _USAGE_TICK.decode("tick", obj.get("tick"))
    except DecodeError:
        return None


def decode_action(raw: bytes | None) -> Action | ResourceAction:
    """An action record of either schema (one resource, or a ``resources`` map)."""
    return _decode_versions(raw, _ACTION_VERSIONS)


def decode_transition(raw: bytes | None) -> TransitionRecord:
    return _decode(raw, TransitionRecord)


def decode_policy(raw: bytes | None) -> PolicyVersion:
    return _decode(raw, PolicyVersion)


def decode_dead_letter(raw: bytes | None) -> DeadLetter:
    return _decode(raw, DeadLetter)
