"""The streaming service end to end on the real broker: the worker in a process of its own running the CLI's main,
the closed-loop environment in process (the trainer's versions reaching the actions:
tests/stream/test_reliability.py)."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from picrl.datasets import Trace
from picrl.workloads import copies_of
from picrl_core.artifact import ModelArtifact, save_artifact
from picrl_core.deployable import DEPLOYABLE
from picrl_core.reward import step_reward
from producers.closed_loop import ClosedLoopEnvironment, ClosedLoopRecord
from stream.records import decode_transition
from stream.topics import TopicNames, ensure_topics, topic_specs
from tests.stream.conftest import PIC_RL_FAMILY, WINDOW
from tests.support.kafka import committed_everything, consume, unique
from tests.support.processes import picrl_process, tail, worker_args
from tests.support.reference import reference_run, rule_reference_run, tripled
from tests.support.web import free_port

PARTITIONS = 2


def _play(bootstrap: str, prefix: str, workload, timeout: float = 120.0, on_tick=None) -> ClosedLoopRecord:
    env = ClosedLoopEnvironment(bootstrap, TopicNames(prefix), workload, action_timeout=timeout, on_tick=on_tick)
    return asyncio.run(env.run())


def _worker_args(model: Path, bootstrap: str, prefix: str, guarantee: str = "exactly_once") -> list[str]:
    return worker_args(model, bootstrap, prefix, "--guarantee", guarantee, partitions=PARTITIONS)


@pytest.fixture(scope="module", params=["exactly_once", "at_least_once"])
def fixed_policy_run(
    request: pytest.FixtureRequest,
    kafka_bootstrap: str,
    tiny_model_dir: Path,
    native_trace: Trace,
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[ClosedLoopRecord, list]:
    """A worker without trainer (the artifact's policy throughout) driven by the closed loop, and the replay
    transitions it wrote, under either processing guarantee (``at_least_once`` acknowledges a batch's events
    once its records are delivered, while later batches go on). They are read while the worker runs: the
    last tick's transitions ride in a transaction the loop does not wait for, and a worker stopped before
    committing it aborts it (exactly once: a restart would decide those events again)."""
    prefix = unique("e2e")
    asyncio.run(ensure_topics(kafka_bootstrap, topic_specs(prefix, PARTITIONS)))
    log = tmp_path_factory.mktemp("logs") / "worker.log"
    workload = copies_of(native_trace, 3, WINDOW + 30, start=900, seed=7)
    expected = len(workload.services) * (workload.ticks - WINDOW)
    with picrl_process(_worker_args(tiny_model_dir, kafka_bootstrap, prefix, request.param), log) as worker:
        try:
            record = _play(kafka_bootstrap, prefix, workload)
        except Exception as exc:
            raise AssertionError(f"closed loop failed: {exc}\nworker log:\n{tail(log)}") from exc
        replay = asyncio.run(consume(kafka_bootstrap, TopicNames(prefix).replay, expected, timeout=30))
        # every event acknowledged (at_least_once: once its batch was delivered) and its offset committed
        committed_everything(
            kafka_bootstrap, f"{prefix}-worker", TopicNames(prefix).usage, PARTITIONS, worker, log, stall_after=30
        )
    return record, replay


def test_stream_actions_equal_the_embedded_runner_tick_for_tick(
    fixed_policy_run: tuple[ClosedLoopRecord, list], tiny_artifact: ModelArtifact
) -> None:
    record, _ = fixed_policy_run
    workload = record.workload
    reference = reference_run(tiny_artifact, workload.demand, workload.services, headroom=0.5).trajectory
    assert record.control[WINDOW:].all() and not record.control[:WINDOW].any()
    assert np.array_equal(record.breakdown["capacity_norm"][WINDOW:], reference.action)
    assert np.array_equal(record.censored[WINDOW:], reference.censored)
    assert record.duplicate_actions == 0
    assert (record.policy_version[1:] == 0).all()


def test_replay_transitions_carry_the_paper_rewards(
    fixed_policy_run: tuple[ClosedLoopRecord, list], tiny_artifact: ModelArtifact
) -> None:
    record, messages = fixed_policy_run
    workload = record.workload
    expected = len(workload.services) * (workload.ticks - WINDOW)
    transitions = {(t.service, t.tick): t for t in (decode_transition(m.value) for m in messages)}
    assert len(transitions) == expected == len(messages)
    reference = reference_run(tiny_artifact, workload.demand, workload.services, headroom=0.5).trajectory
    cfg = tiny_artifact.config
    kinds = set()
    for j, service in enumerate(workload.services):
        for t in range(WINDOW, workload.ticks):
            tr = transitions[service, t]
            assert tr.censored == record.censored[t, j]
            assert tr.reward == reference.reward[t - WINDOW, j]
            if tr.censored:  # Eq. 9: inverse-Mills surrogate with pessimism; y = a
                assert tr.observed == tr.action and tr.censor_streak >= 1
                assert tr.reward == step_reward(
                    tr.action, tr.observed, True, tr.mu, tr.sigma, tr.censor_streak, cfg.cost, cfg.reward
                )
            else:  # Eq. 10: the true asymmetric cost of the revealed demand
                gap = tr.action - tr.observed
                assert tr.reward == pytest.approx(-(cfg.cost.c_over * gap if gap > 0 else -cfg.cost.c_under * gap))
            kinds.add(tr.censored)
    assert kinds == {True, False}, "the run should contain censored and uncensored steps"


def test_a_worker_grows_the_range_of_a_service_that_outgrew_it(
    kafka_bootstrap: str, tiny_model_dir: Path, native_trace: Trace, tiny_artifact: ModelArtifact, tmp_path: Path
) -> None:
    prefix = unique("e2e-grow")
    asyncio.run(ensure_topics(kafka_bootstrap, topic_specs(prefix, PARTITIONS)))
    workload = tripled(copies_of(native_trace, 2, WINDOW + 60, start=900, seed=3), WINDOW)
    port = free_port()
    with picrl_process(
        [*_worker_args(tiny_model_dir, kafka_bootstrap, prefix), "--web-port", str(port)], tmp_path / "worker.log"
    ) as worker:
        record = _play(kafka_bootstrap, prefix, workload)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            scraped = response.read().decode()
        assert worker.poll() is None, tail(tmp_path / "worker.log")
    reference = reference_run(tiny_artifact, workload.demand, workload.services, headroom=0.5)
    assert np.array_equal(record.breakdown["capacity_norm"][WINDOW:], reference.trajectory.action)  # bit for bit
    assert (record.capacity[WINDOW:] > reference.high[0] * (1 + 1e-9)).any(axis=0).all()  # above the first range
    grown = [
        json.loads(line)
        for line in (tmp_path / "worker.log").read_text().splitlines()
        if line.startswith("{") and "range of" in line
    ]
    assert grown and all(entry["reason"] == "outgrown" and entry["service"] in workload.services for entry in grown)
    assert f'picrl_range_changes_total{{reason="outgrown"}} {float(len(grown))}' in scraped


@pytest.mark.parametrize("method", ["tft", "informer", "autoformer"])
def test_a_worker_deploys_a_predictor_variant_as_the_simulator_runs_it(
    method: str,
    kafka_bootstrap: str,
    variant_artifact: Callable[[str], ModelArtifact],
    native_trace: Trace,
    tmp_path: Path,
) -> None:
    """``picrl worker --method tft`` (Informer, Autoformer) over the broker, its model loaded from its folder: the
    actions equal the simulator's controller on the same networks bit for bit."""
    prefix = unique(f"e2e-{method}")
    asyncio.run(ensure_topics(kafka_bootstrap, topic_specs(prefix, PARTITIONS)))
    artifact = variant_artifact(method)
    model = save_artifact(artifact, tmp_path / "model")
    workload = copies_of(native_trace, 2, WINDOW + 30, start=900, seed=7)
    log = tmp_path / "worker.log"
    with picrl_process([*_worker_args(model, kafka_bootstrap, prefix), "--method", method], log):
        try:
            record = _play(kafka_bootstrap, prefix, workload)
        except Exception as exc:
            raise AssertionError(f"closed loop failed: {exc}\nworker log:\n{tail(log)}") from exc
    reference = reference_run(artifact, workload.demand, workload.services, headroom=0.5).trajectory
    assert np.array_equal(record.breakdown["capacity_norm"][WINDOW:], reference.action)  # bit for bit
    assert np.array_equal(record.censored[WINDOW:], reference.censored)


@pytest.mark.parametrize("method", [name for name in DEPLOYABLE if name not in PIC_RL_FAMILY])
def test_a_worker_deploys_another_method_as_the_comparison_simulates_it(
    method: str,
    kafka_bootstrap: str,
    rule_artifacts: dict[str, ModelArtifact],
    native_trace: Trace,
    tmp_path: Path,
) -> None:
    """``picrl worker --method NAME`` over the broker: its actions equal the comparison's provisioner of the same
    rule in the growth protocol's loop, bit for bit (the ranges grow on the way)."""
    prefix = unique(f"e2e-{method}")
    asyncio.run(ensure_topics(kafka_bootstrap, topic_specs(prefix, PARTITIONS)))
    model = save_artifact(rule_artifacts[method], tmp_path / "model")
    workload = tripled(copies_of(native_trace, 2, WINDOW + 40, start=900, seed=3), WINDOW)
    log = tmp_path / "worker.log"
    with picrl_process([*_worker_args(model, kafka_bootstrap, prefix), "--method", method], log):
        try:
            record = _play(kafka_bootstrap, prefix, workload)
        except Exception as exc:
            raise AssertionError(f"closed loop failed: {exc}\nworker log:\n{tail(log)}") from exc
    reference = rule_reference_run(rule_artifacts[method], workload.demand, workload.services, headroom=0.5)
    assert record.control[WINDOW:].all() and not record.control[:WINDOW].any()
    assert np.array_equal(record.breakdown["capacity_norm"][WINDOW:], reference.actions)  # bit for bit
    assert np.array_equal(record.censored[WINDOW:], reference.censored)
    assert (reference.high[-1] > reference.high[0]).all()  # the ranges grew
