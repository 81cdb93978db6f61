"""The records a batch answers with: actions (a PIC-RL decision, a warm-up tick's or a held tick's capacity) and
the replay transitions the slow trainer learns from, built from the services' rows and controller states."""

from __future__ import annotations

import numpy as np

from picrl_core.controller import Transition
from picrl_core.controller_state import ControllerState
from picrl_core.deployable import RuleState
from stream.batch import Incoming
from stream.records import Action, TransitionRecord, UsageEvent


def warmup_action(
    event: UsageEvent, capacity: float, clipped: str, policy_version: int, advisory: bool, now: float
) -> Action:
    """The capacity to keep for the tick after a warm-up tick (no decision yet: its breakdown is zeros)."""
    return Action(
        event.service,
        event.tick + 1,
        capacity,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        0.0,
        policy_version,
        0,
        advisory,
        now,
        event.produced_at,
        phase="warmup",
        clipped=clipped,
    )


def hold_action(
    row: np.void, service: str, tick: int, produced_at: float, advisory: bool, use_k_sigma: bool, now: float
) -> Action:
    """The capacity in force (``row``'s) kept for ``tick + 1``, with the breakdown of the decision that set it."""
    core = row["core"]
    k, sigma = float(core["k"]), float(core["sigma"])
    return Action(
        service,
        tick + 1,
        float(row["capacity"]),
        float(core["action"]),
        float(core["mu"]),
        sigma,
        k,
        float(core["eta"]),
        float(core["margin"]),
        float(core["bias"]),
        int(row["policy_version"]),
        int(core["censor_streak"]),
        advisory,
        now,
        produced_at,
        phase="hold",
        k_sigma=k * sigma if use_k_sigma else 0.0,
        escape=float(core["escape"]),
    )


def control_actions(
    items: list[Incoming],
    state: RuleState,
    capacity: np.ndarray,
    clipped: np.ndarray,
    policy_version: int,
    advisory: bool,
    use_k_sigma: bool,
    now: float,
    choice: tuple[list[str], np.ndarray] | None = None,
) -> list[Action]:
    """The decisions in ``state`` (for its ``tick``) as actions: the native ``capacity`` and its breakdown (any
    deployed rule's: zeros where it has none), with the candidate each one is and its weight where the rule chooses
    among several (``choice``)."""
    names, weights = ([None] * len(items), [1.0] * len(items)) if choice is None else (choice[0], choice[1].tolist())
    k_sigma = state.k * state.sigma if use_k_sigma else np.zeros_like(state.k)
    columns = zip(
        state.tick.tolist(),
        capacity.tolist(),
        state.action.tolist(),
        state.mu.tolist(),
        state.sigma.tolist(),
        state.k.tolist(),
        state.eta.tolist(),
        state.margin.tolist(),
        state.bias.tolist(),
        state.censor_streak.tolist(),
        k_sigma.tolist(),
        clipped.tolist(),
        state.escape.tolist(),
        names,
        weights,
    )
    return [
        Action(
            item.event.service,
            tick,
            cap,
            norm,
            mu,
            sigma,
            k,
            eta,
            margin,
            bias,
            policy_version,
            streak,
            advisory,
            now,
            item.event.produced_at,
            k_sigma=ks,
            clipped=clip,
            escape=esc,
            candidate=name,
            weight=weight,
        )
        for item, (tick, cap, norm, mu, sigma, k, eta, margin, bias, streak, ks, clip, esc, name, weight) in zip(
            items, columns
        )
    ]


def replay_transitions(
    items: list[Incoming],
    before: ControllerState,
    after: ControllerState,
    transition: Transition,
    y: np.ndarray,
    versions: np.ndarray,
) -> list[TransitionRecord]:
    """One step's transitions (``before`` -> ``after``, observing ``y``), stamped with the behaviour policy's
    ``versions``, with what the reward was computed from (Eq. 9 when censored, Eq. 10 otherwise)."""
    columns = zip(
        before.tick.tolist(),
        transition.features.tolist(),
        transition.pre.tolist(),  # Python values,
        transition.log_prob.tolist(),
        transition.reward.tolist(),  # converted column by column
        transition.next_features.tolist(),
        transition.censored.tolist(),
        transition.action.tolist(),
        versions.tolist(),
        y.tolist(),
        before.mu.tolist(),
        before.sigma.tolist(),
        after.censor_streak.tolist(),
    )
    return [
        TransitionRecord(
            item.event.service,
            tick,
            features,
            pre,
            log_prob,
            reward,
            next_features,
            censored,
            action,
            version,
            observed=observed,
            mu=mu,
            sigma=sigma,
            censor_streak=streak,
        )
        for item, (
            tick,
            features,
            pre,
            log_prob,
            reward,
            next_features,
            censored,
            action,
            version,
            observed,
            mu,
            sigma,
            streak,
        ) in zip(items, columns)
    ]
