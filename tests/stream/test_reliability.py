"""Reliability against the real broker: crashes, rebalances, broker restarts, bad input, trainer outages and
policy guardrails. Workers and trainers run the CLI's main in processes of their own (tests/support/processes.py);
every loop is bounded."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, RecordsToDelete
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import PolicyViolationError

from picrl.datasets import Trace
from picrl.kafka import LocalKafka
from picrl.kafka.local_broker import pid_alive
from picrl.workloads import copies_of
from picrl_core.artifact import ModelArtifact, policy_to_bytes
from picrl_core.policy import PolicyNetwork
from producers.closed_loop import ClosedLoopEnvironment, ClosedLoopRecord, NoActionError, TickSummary
from producers.workload import Workload
from stream.decisions import DecisionEngine, Incoming
from stream.records import PolicyVersion, UsageEvent, decode_action, decode_dead_letter
from stream.topics import TopicNames, committed_offsets, end_offsets, ensure_topics, read_partition, topic_specs
from tests.stream.conftest import WINDOW
from tests.support.chaos import audit
from tests.support.kafka import committed_everything, consume, produce, unique, usage_json, wait_until
from tests.support.processes import (
    forked_workers,
    picrl_process,
    short_trainer_args,
    spawn,
    stop,
    tail,
    worker_args,
    worker_pid,
)
from tests.support.web import free_port, http_get, metric

PARTITIONS = 2


def _worker_args(
    model: Path, bootstrap: str, prefix: str, *extra: str, partitions: int = PARTITIONS, log_level: str = "warning"
) -> list[str]:
    return worker_args(model, bootstrap, prefix, *extra, partitions=partitions, log_level=log_level)


def _topics(bootstrap: str, name: str, partitions: int = PARTITIONS) -> str:
    prefix = unique(name)
    asyncio.run(ensure_topics(bootstrap, topic_specs(prefix, partitions)))
    return prefix


def _play(bootstrap: str, prefix: str, workload: Workload, on_tick=None, timeout: float = 180.0) -> ClosedLoopRecord:
    env = ClosedLoopEnvironment(bootstrap, TopicNames(prefix), workload, action_timeout=timeout, on_tick=on_tick)
    return asyncio.run(env.run())


def _assert_exactly_once_and_equal(
    record: ClosedLoopRecord, bootstrap: str, prefix: str, artifact: ModelArtifact
) -> int:
    result = audit(record, bootstrap, prefix, artifact, WINDOW)
    assert not result.missing, f"missing actions: {result.missing[:5]}"
    assert not result.repeated, f"repeated actions: {result.repeated[:5]}"
    assert not result.mismatches, (
        f"{result.mismatches} decisions differ from the uninterrupted reference, first (row, tick, decided, "
        f"reference): {result.diverged[:8]}"
    )
    return result.checked


@pytest.fixture()
def workload(native_trace: Trace) -> Workload:
    return copies_of(native_trace, 3, WINDOW + 40, start=900, seed=11)


def _open_loop_usage(workload: Workload, capacity: float, ticks: range) -> list[Incoming]:
    """The usage events of ``ticks`` under a fixed capacity (shortages where demand exceeds it), tick by tick."""
    n = len(workload.services)
    return [
        Incoming(
            UsageEvent(
                s, t, float(min(workload.demand[t, j], capacity)), bool(workload.demand[t, j] > capacity), capacity
            ),
            0,
            t * n + j,
        )
        for t in ticks
        for j, s in enumerate(workload.services)
    ]


def test_a_worker_taking_over_a_backlog_decides_every_event_once(
    kafka_bootstrap: str, tiny_model_dir: Path, tiny_artifact: ModelArtifact, native_trace: Trace, tmp_path: Path
) -> None:
    """Worker A decides a first stretch and stops; events pile up; worker B (same app id) restores the table
    from the changelog and takes the backlog. Two Faust defects broke this before the worker worked around
    them (6 of 7 runs failed): records fetched while B seeked to the committed offsets were dropped
    (faust-streaming issue #596: decisions lost, or a partition that never committed again), and A's last
    changelog writes missed the transaction that committed their offsets (B's decisions drifted)."""
    partitions, services, first, ticks, capacity = 8, 200, WINDOW + 16, WINDOW + 32, 50.0
    prefix = _topics(kafka_bootstrap, "takeover", partitions)
    topics = TopicNames(prefix)
    workload = copies_of(native_trace, services, ticks, start=900, seed=17)
    events = _open_loop_usage(workload, capacity, range(ticks))
    messages = [
        (e.event.service.encode(), usage_json(e.event.service, e.event.tick, e.event.usage, capacity, e.event.censored))
        for e in events
    ]
    args = _worker_args(tiny_model_dir, kafka_bootstrap, prefix, partitions=partitions)
    group = f"{prefix}-worker"
    produce(kafka_bootstrap, topics.usage, messages[: first * services])
    with picrl_process(args, tmp_path / "a.log") as worker:
        committed_everything(kafka_bootstrap, group, topics.usage, partitions, worker, tmp_path / "a.log")
    produce(kafka_bootstrap, topics.usage, messages[first * services :])
    started = time.monotonic()
    with picrl_process(args, tmp_path / "b.log") as worker:
        committed_everything(kafka_bootstrap, group, topics.usage, partitions, worker, tmp_path / "b.log")
    took = time.monotonic() - started

    engine, rows = DecisionEngine(tiny_artifact), dict.fromkeys(workload.services)
    expected: dict[tuple[str, int], float] = {}
    for t in range(ticks):
        outcome = engine.process(events[t * services : (t + 1) * services], rows)
        rows.update(outcome.rows)
        expected.update({(a.service, a.tick): a.capacity for a in outcome.actions})
    stream = [
        decode_action(m.value)
        for m in asyncio.run(consume(kafka_bootstrap, topics.actions, len(expected) + 50, timeout=30))
    ]
    counts = collections.Counter((a.service, a.tick) for a in stream)
    missing = sorted(set(expected) - set(counts))
    assert not missing, f"{len(missing)} decisions lost, e.g. {missing[:5]}"
    assert max(counts.values()) == 1, f"repeated: {[k for k, n in counts.items() if n > 1][:5]}"
    differ = sorted(
        (a.service, a.tick, expected[a.service, a.tick], a.capacity)
        for a in stream
        if a.capacity != expected[a.service, a.tick]
    )
    assert not differ, (
        f"{len(differ)} decisions differ from an uninterrupted run, e.g. (service, tick, expected, got) {differ[:5]}"
    )
    print(
        f"\ntake-over of a {len(messages) - first * services}-event backlog on {partitions} partitions: "
        f"{took:.1f} s to commit it all; {len(stream)} actions checked, 0 lost, 0 repeated"
    )


def test_a_closed_loop_that_gave_up_resumes_where_the_actions_topic_shows_it_stopped(
    kafka_bootstrap: str, tiny_model_dir: Path, tiny_artifact: ModelArtifact, workload: Workload, tmp_path: Path
) -> None:
    """The only worker stops at tick 20, the loop gives up waiting for tick 21 and says where it stopped; once a
    worker is back, a resumed run (start_tick=None) rebuilds the ticks already played from the actions topic
    and finishes: every (service, tick) decided once, equal to the uninterrupted reference."""
    prefix = _topics(kafka_bootstrap, "resume")
    port = free_port()
    args = _worker_args(tiny_model_dir, kafka_bootstrap, prefix, "--web-port", str(port))
    with picrl_process(args, tmp_path / "a.log") as worker:
        # in its group before the loop starts: the 8 s the loop waits for an action is less than a loaded host's
        # start of a worker (torch and Faust imported, the group joined)
        assert asyncio.run(
            wait_until(lambda: http_get(port, "/healthz/")[1]["partitions"], timeout=120, interval=0.5)
        ), f"the worker did not get its partitions:\n{tail(tmp_path / 'a.log')}"

        def stop_worker(summary: TickSummary) -> None:
            if summary.tick == WINDOW + 12:
                stop(worker)

        env = ClosedLoopEnvironment(
            kafka_bootstrap, TopicNames(prefix), workload, action_timeout=8, on_tick=stop_worker
        )
        with pytest.raises(NoActionError) as gave_up:
            asyncio.run(env.run())
    assert gave_up.value.tick in (WINDOW + 13, WINDOW + 14), gave_up.value
    with picrl_process(_worker_args(tiny_model_dir, kafka_bootstrap, prefix), tmp_path / "b.log"):
        resumed = ClosedLoopEnvironment(
            kafka_bootstrap, TopicNames(prefix), workload, action_timeout=120, start_tick=None
        )
        record = asyncio.run(resumed.run())
    _assert_exactly_once_and_equal(record, kafka_bootstrap, prefix, tiny_artifact)
    assert record.duplicate_actions == 0


async def _truncate(bootstrap: str, topic: str, partition: int, before: int, wait: float = 30.0) -> None:
    """Delete the records of a compacted topic's partition before ``before`` (Kafka deletes records of
    topics with the delete policy only: the policy is switched for the deletion, then back).

    AlterConfigs answers once the controller has the new policy; the partition's leader applies it a moment
    later, and refuses the deletion until then (``PolicyViolationError``, seen once under a loaded host). So the
    deletion waits for the leader: asked again until it is accepted, within ``wait`` seconds."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await _set_cleanup_policy(admin, topic, "delete", wait)
        deadline = time.monotonic() + wait
        while True:
            try:
                await admin.delete_records({TopicPartition(topic, partition): RecordsToDelete(before)})
                break
            except PolicyViolationError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)
        await _set_cleanup_policy(admin, topic, "compact", wait)
    finally:
        await admin.close()


async def _set_cleanup_policy(admin: AIOKafkaAdminClient, topic: str, policy: str, wait: float) -> None:
    """Set ``topic``'s ``cleanup.policy`` and wait until the broker describes it so."""
    resource = ConfigResource(ConfigResourceType.TOPIC, topic)
    await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, {"cleanup.policy": policy})])
    deadline = time.monotonic() + wait
    while True:
        (response,) = await admin.describe_configs([resource])
        configs = {entry[0]: entry[1] for described in response.resources for entry in described[4]}
        if configs.get("cleanup.policy") == policy:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{topic}'s cleanup.policy is still {configs.get('cleanup.policy')}, not {policy}")
        await asyncio.sleep(0.1)


def test_a_worker_that_cannot_restore_a_partitions_rows_holds_it_until_they_are_back(
    kafka_bootstrap: str, tiny_model_dir: Path, native_trace: Trace, tmp_path: Path
) -> None:
    """Worker A decides a first stretch and stops; the changelog of partition 0 is then emptied (as retention
    or an operator could; Faust's recovery also skipped whole partitions before stream/transport.py, issue
    #158), so worker B restores no row for partition 0's services. B must hold partition 0 (say so in its log
    and in picrl_partition_state_missing, decide and commit nothing there) and go on with partition 1. Once
    the rows are written back to the changelog, B must find them (it reads a held partition's rows again every
    watch round) and decide partition 0's usage from where the group left it, without a rebalance."""
    partitions, services, first, ticks = 2, 8, WINDOW + 4, WINDOW + 8
    prefix = _topics(kafka_bootstrap, "unrestored", partitions)
    topics, group = TopicNames(prefix), f"{prefix}-worker"
    workload = copies_of(native_trace, services, ticks, start=900, seed=3)
    events = _open_loop_usage(workload, 50.0, range(ticks))
    messages = [
        (e.event.service.encode(), usage_json(e.event.service, e.event.tick, e.event.usage, 50.0, e.event.censored))
        for e in events
    ]
    args = _worker_args(tiny_model_dir, kafka_bootstrap, prefix, partitions=partitions)
    produce(kafka_bootstrap, topics.usage, messages[: first * services])
    with picrl_process(args, tmp_path / "a.log") as worker:
        committed_everything(kafka_bootstrap, group, topics.usage, partitions, worker, tmp_path / "a.log")
    changelog = f"{group}-service-state-changelog"
    rows = asyncio.run(read_partition(kafka_bootstrap, changelog, 0))[0]
    asyncio.run(_truncate(kafka_bootstrap, changelog, 0, asyncio.run(end_offsets(kafka_bootstrap, changelog, 2))[0]))
    produce(kafka_bootstrap, topics.usage, messages[first * services :])
    usage_end = asyncio.run(end_offsets(kafka_bootstrap, topics.usage, partitions))
    port = free_port()
    with picrl_process(args + ["--web-port", str(port), "--stall-timeout", "4"], tmp_path / "b.log") as worker:

        def missing() -> float | None:
            return metric(str(http_get(port, "/metrics")[1]), "picrl_partition_state_missing", partition="0")

        def committed() -> dict[int, int]:
            return asyncio.run(_committed(kafka_bootstrap, group, topics.usage))

        def wait_for(condition: Callable[[], bool]) -> None:
            deadline = time.monotonic() + 90
            while not condition():
                assert time.monotonic() < deadline and worker.poll() is None, tail(tmp_path / "b.log")
                time.sleep(1.0)

        wait_for(lambda: missing() == 1 and committed().get(1) == usage_end[1])
        time.sleep(3)  # B has everything it needs for partition 0 too: it must still decide nothing there
        held = committed()
        late = {
            m.partition
            for m in asyncio.run(consume(kafka_bootstrap, topics.actions, services * ticks, timeout=10))
            if decode_action(m.value).tick > first
        }
        asyncio.run(_write(kafka_bootstrap, changelog, 0, rows))  # an operator restores the changelog
        wait_for(lambda: missing() == 0 and committed().get(0) == usage_end[0])
        assert worker.poll() is None, tail(tmp_path / "b.log")
    assert held[0] < usage_end[0], "partition 0 was committed past its restore failure"
    assert late == {1}, f"actions after the restore failure on partitions {late}: only partition 1 may have them"
    log = (tmp_path / "b.log").read_text()
    assert "the state of usage partition 0 was not restored" in log and "reach the group's committed offsets now" in log
    actions = [
        decode_action(m.value)
        for m in asyncio.run(consume(kafka_bootstrap, topics.actions, services * ticks, timeout=10))
    ]
    counts = collections.Counter((a.service, a.tick) for a in actions if a.tick > first)
    assert sorted(counts.values()) == [1] * services * (ticks - first), "every later tick answered once"


async def _write(bootstrap: str, topic: str, partition: int, rows: dict[bytes, bytes | None]) -> None:
    """Write ``rows`` (key: value) to one partition of ``topic``."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        await asyncio.gather(
            *[await producer.send(topic, value, key=key, partition=partition) for key, value in rows.items()]
        )
    finally:
        await producer.stop()


async def _committed(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return await committed_offsets(admin, group, topic)
    finally:
        await admin.close()


def test_the_worker_rides_out_a_broker_restart_and_its_killed_process_is_forked_again(
    local_kafka: LocalKafka | None,
    tiny_model_dir: Path,
    tiny_artifact: ModelArtifact,
    workload: Workload,
    tmp_path: Path,
) -> None:
    """One worker (``--respawn on``) in closed loop: the only broker is stopped and started again 3 s later, and
    the worker reconnects by itself; later its worker process is SIGKILLed (as the OOM killer would) and the command
    forks a new one, which rejoins as the same static member. Every (service, tick) gets one action equal to the
    uninterrupted reference. A SIGKILL of the command takes its worker process with it."""
    if local_kafka is None:
        pytest.fail("this test restarts a broker it owns: it needs the provisioned one (unset KAFKA_BOOTSTRAP_SERVERS)")
    broker = LocalKafka(home=tmp_path / "kafka", cache=local_kafka.cache, log=lambda _: None)
    bootstrap = broker.start().bootstrap
    log = tmp_path / "worker.log"
    try:
        prefix = _topics(bootstrap, "restart")
        seconds: dict[str, float] = {}

        def on_tick(summary: TickSummary) -> None:
            if summary.tick == WINDOW + 10:
                started = time.monotonic()
                broker.stop()
                time.sleep(3.0)
                broker.start()
                seconds["broker down"] = time.monotonic() - started
            elif summary.tick == WINDOW + 26:
                os.kill(forked_workers(log)[0], signal.SIGKILL)
                seconds["killed at"] = time.monotonic()
            elif "killed at" in seconds and "worker back" not in seconds:
                seconds["worker back"] = time.monotonic() - seconds["killed at"]

        args = _worker_args(tiny_model_dir, bootstrap, prefix, "--respawn", "on", log_level="info")
        with picrl_process(args, log) as command:
            try:
                record = _play(bootstrap, prefix, workload, on_tick, timeout=240)
            except Exception as exc:
                raise AssertionError(f"{exc}\n{tail(log)}") from exc
            assert command.poll() is None, tail(log)
            forked = forked_workers(log)
            command.kill()
            command.wait()
            assert asyncio.run(wait_until(lambda: not pid_alive(forked[-1]), timeout=10))
        print(
            f"\nbroker down and back in {seconds['broker down']:.1f} s; worker process SIGKILLed, the next tick's "
            f"actions {seconds['worker back']:.1f} s later; run completed"
        )
        assert len(forked) == 2 and "killed by SIGKILL: forking a new one" in log.read_text(), tail(log)
        _assert_exactly_once_and_equal(record, bootstrap, prefix, tiny_artifact)
    finally:
        broker.stop()


def test_a_fault_meant_for_the_worker_process_waits_for_the_command_to_fork_it(
    kafka_bootstrap: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The command builds its worker before it forks, and forks again after a SIGKILL of its child: the chaos
    harness's worker process (``worker_pid``) is always that child, asked for at once after the start or the kill,
    never the command (a soak round's first-tick fault once killed the command instead)."""
    prefix = _topics(kafka_bootstrap, "forked")
    log = tmp_path / "worker.log"
    with picrl_process(_worker_args(tiny_model_dir, kafka_bootstrap, prefix, log_level="info"), log) as command:
        first = worker_pid(command)
        assert first != command.pid and _parent(first) == command.pid, tail(log)
        os.kill(first, signal.SIGKILL)
        assert asyncio.run(wait_until(lambda: not pid_alive(first), timeout=10))
        second = worker_pid(command)
        assert second not in (first, command.pid) and _parent(second) == command.pid, tail(log)
        assert command.poll() is None, tail(log)
    assert forked_workers(log)[:2] == [first, second], tail(log)


def _parent(pid: int) -> int:
    """The parent of process ``pid`` (``/proc/PID/stat``'s fourth field)."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def test_bad_input_goes_to_the_dead_letter_topic_with_a_reason_and_the_worker_keeps_going(
    kafka_bootstrap: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    prefix = _topics(kafka_bootstrap, "badinput")
    topics = TopicNames(prefix)
    port = free_port()
    args = _worker_args(
        tiny_model_dir, kafka_bootstrap, prefix, "--web-port", str(port), "--max-services", "2", "--max-tick-gap", "100"
    )
    good = [(b"svc", usage_json("svc", t, 5.0, 10.0)) for t in range(3)]
    bad = {
        "malformed_json": b'{"schema": 1, "type": "usage", ',
        "wrong_type": usage_json("svc", 3, "5.0", 10.0),  # type: ignore[arg-type]
        "unknown_schema_version": usage_json("svc", 3, 5.0, 10.0, schema=3),
        "negative_usage": usage_json("svc", 3, -1.0, 10.0),
        "usage_above_capacity": usage_json("svc", 3, 12.0, 10.0),
        "tick_out_of_range": usage_json("svc", 5_000, 5.0, 10.0),
        "duplicate_tick": usage_json("svc", 1, 5.0, 10.0),
        "service_limit": usage_json("third", 0, 1.0, 10.0),
    }
    nan_and_inf = [
        b'{"schema": 1, "type": "usage", "service": "svc", "tick": 3, "usage": NaN, "censored": false, '
        b'"capacity": 10.0}',
        usage_json("svc", 3, 1e400, 10.0).replace(b"inf", b"1e400"),
    ]
    with picrl_process(args, tmp_path / "worker.log") as worker:
        produce(
            kafka_bootstrap,
            topics.usage,
            good
            + [(b"other", usage_json("other", 0, 1.0, 10.0))]
            + [(b"svc", v) for v in bad.values()]
            + [(b"svc", v) for v in nan_and_inf]
            + [(b"svc", usage_json("svc", 4, 6.0, 10.0))],
        )
        letters = [
            decode_dead_letter(m.value)
            for m in asyncio.run(consume(kafka_bootstrap, topics.deadletter, len(bad) + 2, timeout=90))
        ]
        actions = [decode_action(m.value) for m in asyncio.run(consume(kafka_bootstrap, topics.actions, 6, timeout=30))]
        status, text = http_get(port, "/metrics/")
        assert worker.poll() is None, tail(tmp_path / "worker.log")
    reasons = collections.Counter(letter.reason for letter in letters)
    assert reasons == collections.Counter({**{reason: 1 for reason in bad}, "malformed_json": 3}), reasons
    assert all(letter.topic == topics.usage and letter.raw for letter in letters)
    assert {(a.service, a.tick) for a in actions} == {
        ("svc", 1),
        ("svc", 2),
        ("svc", 3),
        ("other", 1),
        ("svc", 4),
        ("svc", 5),
    }
    assert [a.phase for a in actions if a.tick == 4] == ["hold"]  # tick 3 refused for its values: held, missed
    assert status == 200 and isinstance(text, str)
    for reason, count in reasons.items():
        assert metric(text, "picrl_dead_letters_total", reason=reason) == count, reason
    assert metric(text, "picrl_events_total") == len(good) + 1 + len(bad) + len(nan_and_inf) + 1
    logged = [json.loads(line) for line in (tmp_path / "worker.log").read_text().splitlines() if line.startswith("{")]
    duplicate = [entry for entry in logged if entry.get("reason") == "duplicate_tick"]
    assert duplicate and duplicate[0]["service"] == "svc" and duplicate[0]["tick"] == 1 and "error" not in duplicate[0]


def _policy_record(config_policy: PolicyNetwork, version: int, parent: int | None, **changes: object) -> PolicyVersion:
    record = PolicyVersion(
        "default", version, parent, 0.01, 0.5, time.time(), policy_to_bytes(config_policy), parent_score=0.5
    )
    return dataclasses.replace(record, **changes)


def test_policy_guardrails_refuse_bad_versions_and_rollback_is_followed(
    kafka_bootstrap: str, tiny_model_dir: Path, tiny_artifact: ModelArtifact, tmp_path: Path
) -> None:
    from picrl.cli import main

    prefix = _topics(kafka_bootstrap, "guard")
    topics = TopicNames(prefix)
    port = free_port()
    good = tiny_artifact.policy
    nan_policy = PolicyNetwork(tiny_artifact.config.policy)
    with torch.no_grad():
        nan_policy.log_std.fill_(float("nan"))
    wider = PolicyNetwork(
        dataclasses.replace(tiny_artifact.config.policy, hidden=tiny_artifact.config.policy.hidden + 3)
    )
    versions = [
        _policy_record(good, 0, None),
        _policy_record(nan_policy, 1, 0),  # non-finite weights
        _policy_record(wider, 2, 0),  # wrong shape
        _policy_record(good, 3, 0, kl_to_parent=5.0),  # KL above the bound
        _policy_record(good, 4, 0, validation_score=0.1, parent_score=0.9),  # worse than its parent
        _policy_record(good, 5, 0),  # fine
    ]
    produce(kafka_bootstrap, topics.policy, [(v.key, v.to_bytes()) for v in versions])
    with picrl_process(
        _worker_args(tiny_model_dir, kafka_bootstrap, prefix, "--web-port", str(port)), tmp_path / "worker.log"
    ) as worker:
        assert asyncio.run(wait_until(lambda: http_get(port, "/healthz/")[1].get("policy_version") == 5, timeout=90)), (
            tail(tmp_path / "worker.log")
        )
        _, text = http_get(port, "/metrics/")
        assert metric(text, "picrl_policy_refusals_total", reason="unreadable_weights") == 2
        assert metric(text, "picrl_policy_refusals_total", reason="kl_above_bound") == 1
        assert metric(text, "picrl_policy_refusals_total", reason="score_below_parent") == 1
        assert metric(text, "picrl_policy_version") == 5
        assert main(["policy", "rollback", "--to", "0", "--bootstrap", kafka_bootstrap, "--prefix", prefix]) == 0
        assert asyncio.run(wait_until(lambda: http_get(port, "/healthz/")[1].get("policy_version") == 6, timeout=60))
        assert worker.poll() is None
    log = (tmp_path / "worker.log").read_text()
    assert "version 3 refused (kl_above_bound)" in log and "Traceback" not in log


def test_trainer_versions_reach_the_actions_and_workers_keep_the_last_while_the_trainer_is_down(
    kafka_bootstrap: str, tiny_model_dir: Path, native_trace: Trace, tmp_path: Path
) -> None:
    """A worker and a trainer in closed loop: the trainer's versions (each the child of the one before) reach the
    actions, whose version stamps never go back; its Prometheus endpoint counts them while it runs. The trainer is
    stopped: the worker keeps acting with the last version it accepted. Restarted, the trainer resumes the replay
    from its committed offsets and its next versions reach the actions again."""
    prefix = _topics(kafka_bootstrap, "outage")
    workload = copies_of(native_trace, 4, WINDOW + 70, start=850, seed=13)
    metrics_port = free_port()
    trainer_args = short_trainer_args(
        tiny_model_dir, kafka_bootstrap, prefix, "--metrics-port", str(metrics_port), partitions=PARTITIONS
    )
    log = tmp_path / "trainer.log"
    trainers = [spawn(trainer_args, log)]
    down, back = WINDOW + 25, WINDOW + 45
    seen: dict[str, int] = {}
    scraped: list[str] = []

    def hold_until(logged: Callable[[str], bool]) -> None:
        """Hold the loop's clock (at most 90 s) until the trainers' log says ``logged``: a loaded host may take
        half a minute to start a trainer, longer than any fixed pause between ticks."""
        deadline = time.monotonic() + 90
        while not logged(log.read_text()) and time.monotonic() < deadline:
            time.sleep(0.2)

    def on_tick(summary: TickSummary) -> None:
        if summary.tick == WINDOW:  # the first transitions come now: the trainer reads the replay from here on
            hold_until(lambda text: "resuming replay at" in text)
        if summary.tick == down:
            # a version out before the stop (the workers keep it), its replay offsets committed (resumed from)
            hold_until(lambda text: "published policy" in text)
            scraped.append(str(http_get(metrics_port, "/metrics")[1]))  # the running trainer's endpoint
            stop(trainers[0])  # SIGTERM: the trainer stops between updates
            seen["version_at_stop"] = summary.policy_version
        elif summary.tick == back:
            trainers.append(spawn(trainer_args, log))
            hold_until(lambda text: text.count("resuming replay at") >= 2)  # until the trainer is back
            seen["published_at_restart"] = log.read_text().count("published policy")
        published = log.read_text().count("published policy")
        if (WINDOW <= summary.tick < down and published == 0) or published == seen.get("published_at_restart", -1):
            time.sleep(0.6)  # a tick's transitions reach the trainer on their own: one candidate each

    # guardrails wide open: this test is about propagation (the guardrails have their own test)
    worker_args = _worker_args(tiny_model_dir, kafka_bootstrap, prefix, "--max-kl", "1e9", "--score-margin", "1e9")
    with picrl_process(worker_args, tmp_path / "worker.log"):
        try:
            record = _play(kafka_bootstrap, prefix, workload, on_tick)
        finally:
            for trainer in trainers:
                stop(trainer)
    text = log.read_text()
    assert len(trainers) == 2 and "resuming replay at committed offsets" in text
    resumed = text.split("resuming replay at committed offsets")[-1].split("}")[0]
    assert "None" not in resumed and any(int(o.split(":")[1]) > 0 for o in resumed.strip(" {").split(",")), (
        f"the restarted trainer did not resume from committed offsets: {resumed}"
    )
    versions = record.policy_version[WINDOW:]
    assert (np.diff(versions, axis=0) >= 0).all(), "a worker went back to an older version"
    first = int(np.argmax(record.policy_version.max(axis=1) >= 1))  # stamped on every action once it arrived
    assert first > 0 and (record.policy_version[first + 2 :] >= 1).all()
    # while the trainer was down the workers kept acting, with the last version they had accepted
    gap = record.policy_version[down + 3 : back + 1]
    assert (gap >= 0).all() and (gap == gap[0, 0]).all() and gap[0, 0] >= 1
    published = asyncio.run(_versions(kafka_bootstrap, prefix))
    assert [p.version for p in published] == list(range(len(published))) and len(published) - 1 > gap[0, 0]
    assert (published[0].version, published[0].parent) == (0, None) and "version 1 (parent 0)" in text
    for p in published[1:]:
        assert p.parent == p.version - 1 and p.kl_to_parent >= 0, (p.version, p.parent, p.kl_to_parent)
        assert np.isfinite(p.validation_score) and p.parent_score is not None
    assert record.policy_version[-1].min() > gap[0, 0], "versions published after the restart reached the actions"
    gauge = {line.split()[0]: float(line.split()[1]) for line in scraped[0].splitlines() if line and line[0] != "#"}
    assert gauge["picrl_trainer_versions_total"] >= 1 and gauge["picrl_trainer_transitions_total"] > 0
    assert gauge["picrl_trainer_policy_version"] == gauge["picrl_trainer_versions_total"]


async def _versions(bootstrap: str, prefix: str) -> list[PolicyVersion]:
    from stream.policy_follower import read_policy_versions

    return await read_policy_versions(bootstrap, TopicNames(prefix).policy, "default")
