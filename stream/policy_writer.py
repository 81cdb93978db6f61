"""One writer at a time on a policy's versions, so that no two versions share a number.

The trainer and ``picrl policy rollback`` publish through :func:`publish_next`. Both use one Kafka
transactional id per policy (:func:`writer_id`). Starting a transactional producer fences every
other producer with that id and aborts its open transaction, so from the start of
:func:`publish_next` to its commit the caller is the policy's only writer: it reads the policy topic
to its end (``read_committed``), numbers its record one above the newest version, and commits. A
writer fenced in between gets :class:`aiokafka.errors.ProducerFenced` and none of its records
becomes visible; it reads the topic again before its next try. A commit that fails otherwise (a broker
fencing a writer mid-commit can answer with an unknown server error) is judged by the topic: the record is
there, or the writer tries again as if fenced.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, ProducerFenced, UnknownError

from stream.policy_follower import read_policy_versions
from stream.records import PolicyVersion

log = logging.getLogger("picrl.policy")

MAX_POLICY_BYTES = 8 << 20  # policy messages carry weights


def writer_id(topic: str, name: str) -> str:
    """The transactional id every writer of policy ``name`` on ``topic`` uses."""
    return f"{topic}.writer.{name}"


def next_version(versions: list[PolicyVersion]) -> int:
    """The number the next version of a policy gets: one above the newest (0 for the first)."""
    return max((v.version for v in versions), default=-1) + 1


async def publish_next(
    bootstrap: str,
    topic: str,
    name: str,
    build: Callable[[list[PolicyVersion]], PolicyVersion | None],
    attempts: int = 5,
) -> PolicyVersion | None:
    """As the only writer of policy ``name``: read its versions, publish ``build(versions)`` (numbered
    :func:`next_version`) unless it is None, and return what was published (None: nothing).

    When another writer starts before the commit, nothing is published and this starts over (``build``
    then sees that writer's version), up to ``attempts`` times in all; then ProducerFenced. ``build``'s
    errors propagate."""
    _quiet_fenced_futures(asyncio.get_running_loop())
    _quiet_unknown_commit_errors()
    for attempt in range(1, attempts):
        try:
            return await _publish_once(bootstrap, topic, name, build)
        except ProducerFenced:
            log.warning("another writer of policy %s started meanwhile; reading its versions again", name)
            await asyncio.sleep(random.uniform(0.1, 0.5) * attempt)  # let the other writer finish
    return await _publish_once(bootstrap, topic, name, build)


def _quiet_fenced_futures(loop: asyncio.AbstractEventLoop) -> None:
    """A fenced aiokafka producer leaves futures failed with ProducerFenced that nobody awaits, which
    asyncio reports with a traceback each when they are collected; the fence is an expected, already
    logged event, so those reports are dropped (everything else goes to the loop's handler as before)."""
    previous = loop.get_exception_handler()
    if getattr(previous, "drops_fenced_futures", False):
        return

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if isinstance(context.get("exception"), ProducerFenced):
            return
        if previous is None:
            loop.default_exception_handler(context)
        else:
            previous(loop, context)

    handler.drops_fenced_futures = True  # type: ignore[attr-defined]  # a mark on the function, read above
    loop.set_exception_handler(handler)


class _UnknownCommitErrors(logging.Filter):
    """Drops aiokafka's two lines (one with a traceback) for a commit answered with UNKNOWN_SERVER_ERROR: for a
    policy writer that is a fence in the middle of its commit, which :func:`_publish_once` judges by the topic and
    logs itself."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        unknown_commit = str(record.msg).startswith("Could not end transaction") and record.args == (UnknownError,)
        return not (isinstance(error, UnknownError) or unknown_commit)


def _quiet_unknown_commit_errors() -> None:
    sender = logging.getLogger("aiokafka.producer.sender")
    if not any(isinstance(f, _UnknownCommitErrors) for f in sender.filters):
        sender.addFilter(_UnknownCommitErrors())


async def _publish_once(
    bootstrap: str, topic: str, name: str, build: Callable[[list[PolicyVersion]], PolicyVersion | None]
) -> PolicyVersion | None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        transactional_id=writer_id(topic, name),
        max_request_size=MAX_POLICY_BYTES,
    )
    await producer.start()  # fences the other writers from here on
    try:
        versions = await read_policy_versions(bootstrap, topic, name)
        record = build(versions)
        if record is None:
            return None
        if record.name != name or record.version != next_version(versions):
            raise ValueError(
                f"policy {record.name} version {record.version} is not the next version of {name} "
                f"({next_version(versions)})"
            )
        payload = record.to_bytes()
        try:
            async with producer.transaction():
                await producer.send_and_wait(topic, payload, key=record.key)
        except ProducerFenced:
            raise
        except KafkaError as error:
            # A broker can answer the commit (EndTxn) with UNKNOWN_SERVER_ERROR when another writer fences this one
            # in the middle of it. The topic says what happened: the record is there (committed) or it is not.
            if not await _committed(bootstrap, topic, record, payload):
                failed = f"the commit of policy {name} version {record.version} failed: {error!r}"
                raise ProducerFenced(failed) from error
            log.warning(
                "the commit of policy %s version %s reported %r, and the version is there", name, record.version, error
            )
        return record
    finally:
        await producer.stop()


async def _committed(bootstrap: str, topic: str, record: PolicyVersion, payload: bytes) -> bool:
    """Whether ``record`` (its number and its bytes, ``payload``) is among the committed versions of its policy."""
    return any(
        v.version == record.version and v.to_bytes() == payload
        for v in await read_policy_versions(bootstrap, topic, record.name)
    )
