"""The slow policy trainer (Algorithm 1, lines 31-35, as its own process).

It consumes ``<prefix>.replay`` as a consumer group, keeps a bounded replay buffer, and every
``update_every`` transitions runs one KL-regularised slow update (``picrl_core.online``). The new
acting policy is scored off-policy on held-out transitions (every ``holdout_every``-th one never
trains) next to its parent, the version last published, and published on the compacted ``<prefix>.policy`` topic
as the next version with its parent, KL to the parent on the held-out states and both scores, only when it differs
from the parent (KL at least ``min_kl``) and scores better; otherwise it is skipped (counted, logged at info) and
the learner goes on from it, so small updates can add up to a version. Offsets are committed after each candidate,
published or skipped, so a restarted trainer resumes after the last transitions it trained on. A skipped candidate's
transitions are committed too: the learner has consumed them (it goes on from that candidate), and its state beyond
the published version (weights, value network, buffers) lives in memory only, so a restart loses it whether they are
replayed or not; replaying from the last publish instead would grow without bound while a converged policy keeps
being skipped (consumer lag that never falls, and a restart that retrains on everything since).

On start it continues from the newest version of its policy on the topic; on an empty topic it
first publishes the model artifact's policy as version 0. It publishes as the policy's only writer
(``stream.policy_writer``): when another writer published since its last version (``picrl policy
rollback``), it drops the update it was about to publish and continues from that version, so a
rollback holds and the versions after it descend from the rolled-back weights.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from aiokafka import AIOKafkaConsumer

from picrl_core.artifact import ArtifactError, ModelArtifact, policy_from_bytes, policy_to_bytes
from picrl_core.controller import Transition
from picrl_core.online import ReplayBuffer, SlowPolicyLearner, off_policy_score
from picrl_core.policy import N_FEATURES, PolicyNetwork, gaussian_kl
from stream.metrics import TrainerMetrics
from stream.policy_writer import next_version, publish_next
from stream.records import DecodeError, PolicyVersion, TransitionRecord, decode_transition
from stream.topics import TopicNames
from stream.trainer_replay import TrainerSettings, is_held_out

log = logging.getLogger("picrl.trainer")


@dataclass(frozen=True)
class Published:
    """One version the trainer published."""

    version: int
    parent: int | None
    kl_to_parent: float
    validation_score: float
    parent_score: float | None
    transitions_seen: int


def policy_kl(policy: PolicyNetwork, parent: PolicyNetwork, features: torch.Tensor) -> float:
    """``KL(policy || parent)`` of the two Gaussian policies, mean over the states ``features``."""
    with torch.no_grad():
        return max(float(gaussian_kl(*policy(features), *parent(features)).mean()), 0.0)  # identical: -1e-8 is 0


def _as_transition(records: list[TransitionRecord]) -> Transition:
    return Transition(
        features=np.array([r.features for r in records], np.float32),
        pre=np.array([r.pre for r in records], np.float32),
        log_prob=np.array([r.log_prob for r in records], np.float32),
        reward=np.array([r.reward for r in records], np.float64),
        next_features=np.array([r.next_features for r in records], np.float32),
        censored=np.array([r.censored for r in records], bool),
        action=np.array([r.action for r in records], np.float64),
    )


@dataclass
class _Lineage:
    """The version the trainer goes on from, its learner, and the parent the next candidate is scored against
    (a copy of the weights last published or adopted)."""

    version: int
    learner: SlowPolicyLearner
    parent: PolicyNetwork


@dataclass(frozen=True)
class _Candidate:
    """A slow update's acting policy, scored: KL to the parent and off-policy scores on the held-out
    transitions, the transitions the learner has seen, and when its update started (``time.monotonic``)."""

    kl: float
    score: float
    parent_score: float
    transitions_seen: int
    started: float


class PolicyTrainer:
    """Replay consumer, slow learner and policy publisher."""

    def __init__(
        self,
        artifact: ModelArtifact,
        settings: TrainerSettings,
        on_publish: Callable[[Published], None] | None = None,
        on_resume: Callable[[dict[int, int | None]], None] | None = None,
    ) -> None:
        self.artifact = artifact
        self.settings = settings
        self.topics = TopicNames(settings.prefix)
        self.on_publish = on_publish
        self.on_resume = on_resume
        self.resumed_from: dict[int, int | None] | None = None  # committed replay offset per partition at start
        config = artifact.config
        self.update_every = settings.update_every or config.online.n_update
        self.buffer = ReplayBuffer(config.online.buffer_size, N_FEATURES)
        self.holdout = ReplayBuffer(settings.holdout_size, N_FEATURES)
        self.published: list[Published] = []
        self.refused = 0
        self.skipped = 0  # candidates not published: too close to their parent, or no better on held-out data
        self.metrics = TrainerMetrics()
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> list[Published]:
        """Train and publish until stopped or ``max_updates`` versions are out, in stages: read the replay topic
        (:meth:`_fetch`), keep the transitions (:meth:`_keep`), and every ``update_every`` training transitions
        train a candidate (:meth:`_candidate`) and publish or skip it (:meth:`_publish_or_skip`)."""
        consumer = AIOKafkaConsumer(
            self.topics.replay,
            bootstrap_servers=self.settings.bootstrap,
            group_id=self.settings.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        )
        try:
            version, policy = await self._latest()
            parent = copy.deepcopy(policy)
            lineage = _Lineage(
                version, SlowPolicyLearner(policy, self.artifact.networks()[2], self.artifact.config), parent
            )
            await consumer.start()
            since_update = 0
            while not self._stop.is_set():
                since_update += self._keep(await self._fetch(consumer))
                if since_update < self.update_every or len(self.holdout) == 0:
                    continue
                since_update = 0
                if await self._publish_or_skip(self._candidate(lineage), lineage, consumer) and self._enough():
                    break
        finally:
            await consumer.stop()
        return self.published

    async def _fetch(self, consumer: AIOKafkaConsumer) -> list[TransitionRecord]:
        """The next transitions on the replay topic (up to 2,000, waiting up to 0.5 s); on the first assignment
        the committed offsets it resumes from are noted (:attr:`resumed_from`, ``on_resume``)."""
        batches = await consumer.getmany(timeout_ms=500, max_records=2_000)
        if self.resumed_from is None and consumer.assignment():
            self.resumed_from = {tp.partition: await consumer.committed(tp) for tp in sorted(consumer.assignment())}
            if self.on_resume is not None:
                self.on_resume(self.resumed_from)
        records = [record for messages in batches.values() for record in self._decode(messages)]
        self.metrics.transitions.inc(len(records))
        return records

    def _keep(self, records: list[TransitionRecord]) -> int:
        """Add ``records`` to the replay buffer, the held-out ones (every ``holdout_every``-th) to the
        validation buffer; returns how many went to training."""
        held = [is_held_out(r, self.settings.holdout_every) for r in records]
        train = [r for r, h in zip(records, held) if not h]
        validation = [r for r, h in zip(records, held) if h]
        if train:
            self.buffer.add(_as_transition(train))
        if validation:
            self.holdout.add(_as_transition(validation))
        return len(train)

    def _candidate(self, lineage: _Lineage) -> _Candidate:
        """One slow update of the learner on the replay buffer, scored next to the parent on the held-out
        transitions (its KL to the parent and both off-policy scores)."""
        started = time.monotonic()
        stats = lineage.learner.update(self.buffer)
        held_out = self.holdout.contents()
        acting = lineage.learner.acting
        kl = policy_kl(acting, lineage.parent, held_out["features"])
        score, parent_score = off_policy_score(acting, held_out), off_policy_score(lineage.parent, held_out)
        return _Candidate(kl, score, parent_score, stats.transitions_seen, started)

    async def _publish_or_skip(self, candidate: _Candidate, lineage: _Lineage, consumer: AIOKafkaConsumer) -> bool:
        """Publish ``candidate`` as the next version when it differs from its parent (KL at least ``min_kl``) and
        scores better, else skip it; the replay offsets are committed either way. Returns whether it was
        published (not when another writer published since the lineage's version: the lineage continues from
        theirs)."""
        settings = self.settings
        if candidate.kl < settings.min_kl or candidate.score <= candidate.parent_score:
            await consumer.commit()
            self.skipped += 1
            self.metrics.skipped.inc()
            log.info(
                "skipped a candidate for policy %s after version %d (%d skipped): KL %.2g to it (publish "
                "from %.2g), held-out score %.6g against its %.6g",
                settings.policy_name,
                lineage.version,
                self.skipped,
                candidate.kl,
                settings.min_kl,
                candidate.score,
                candidate.parent_score,
            )
            return False
        record = PolicyVersion(
            settings.policy_name,
            lineage.version + 1,
            lineage.version,
            candidate.kl,
            candidate.score,
            time.time(),
            policy_to_bytes(lineage.learner.acting),
            parent_score=candidate.parent_score,
        )
        newest = await self._publish(record)
        await consumer.commit()
        if newest is not record:
            lineage.version, lineage.learner = self._continue_from(newest, lineage.learner)
            lineage.parent = copy.deepcopy(lineage.learner.acting)
            return False
        lineage.version += 1
        lineage.parent = copy.deepcopy(lineage.learner.acting)
        self._record(record, candidate.transitions_seen)
        self.metrics.update_seconds.observe(time.monotonic() - candidate.started)
        return True

    def _enough(self) -> bool:
        """Whether ``max_updates`` versions are out."""
        return self.settings.max_updates is not None and len(self.published) >= self.settings.max_updates

    async def _publish(self, record: PolicyVersion) -> PolicyVersion:
        """Publish ``record`` if its parent is still the newest version; else (another writer, a rollback,
        published since) publish nothing and return that writer's newest version."""
        theirs: list[PolicyVersion] = []

        def build(versions: list[PolicyVersion]) -> PolicyVersion | None:
            theirs[:] = [max(versions, key=lambda v: v.version)] if versions else []
            return record if next_version(versions) == record.version else None

        published = await publish_next(self.settings.bootstrap, self.topics.policy, self.settings.policy_name, build)
        if published is None and not theirs:
            raise ValueError(
                f"{self.topics.policy} holds no version of policy {self.settings.policy_name} any more "
                "(was the topic deleted?); restart the trainer to publish the model's policy again"
            )
        return published or theirs[0]

    def _continue_from(self, newest: PolicyVersion, learner: SlowPolicyLearner) -> tuple[int, SlowPolicyLearner]:
        """The version and learner to go on with after another writer published ``newest``: its weights
        (the value network is kept), or the current weights numbered above it when they are unreadable."""
        name = self.settings.policy_name
        try:
            policy = policy_from_bytes(newest.weights, self.artifact.config)
        except ArtifactError as exc:
            log.warning(
                "policy %s version %d, published by another writer, is unreadable (%s); the next version "
                "continues from this trainer's weights",
                name,
                newest.version,
                exc,
            )
            return newest.version, learner
        origin = (
            f"a rollback to version {newest.rollback_of}"
            if newest.rollback_of is not None
            else f"parent {newest.parent}"
        )
        log.info(
            "policy %s version %d was published by another writer (%s): continuing from it, this update is dropped",
            name,
            newest.version,
            origin,
            extra={"version": newest.version},
        )
        return newest.version, SlowPolicyLearner(policy, learner.value, self.artifact.config)

    def _decode(self, messages: list) -> list[TransitionRecord]:
        records = []
        for message in messages:
            try:
                records.append(decode_transition(message.value))
            except DecodeError as exc:
                self.refused += 1
                self.metrics.refused.inc()
                log.warning(
                    "replay message %s[%d]@%d refused: %s", message.topic, message.partition, message.offset, exc
                )
        return records

    def _record(self, record: PolicyVersion, seen: int) -> None:
        published = Published(
            record.version, record.parent, record.kl_to_parent, record.validation_score, record.parent_score, seen
        )
        self.published.append(published)
        self.metrics.versions.inc()
        self.metrics.policy_version.set(record.version)
        self.metrics.kl.set(record.kl_to_parent)
        self.metrics.score.set(record.validation_score)
        log.info("published policy %s version %d", record.name, record.version)
        if self.on_publish is not None:
            self.on_publish(published)

    async def _latest(self) -> tuple[int, PolicyNetwork]:
        """The newest readable version of our policy on the topic; publishes the artifact's policy as the
        next version (0 on an empty topic) if there is none."""
        name = self.settings.policy_name
        found: list[tuple[int, PolicyNetwork]] = []

        def build(versions: list[PolicyVersion]) -> PolicyVersion | None:
            for record in sorted(versions, key=lambda v: v.version, reverse=True):
                try:
                    found[:] = [(record.version, policy_from_bytes(record.weights, self.artifact.config))]
                    return None
                except ArtifactError as exc:
                    log.warning("skipping unreadable policy %s version %d: %s", name, record.version, exc)
            return PolicyVersion(
                name, next_version(versions), None, 0.0, 0.0, time.time(), policy_to_bytes(self.artifact.networks()[1])
            )

        root = await publish_next(self.settings.bootstrap, self.topics.policy, name, build)
        if root is not None:
            return root.version, copy.deepcopy(self.artifact.networks()[1])
        log.info("continuing from policy %s version %d", name, found[0][0])
        return found[0]
