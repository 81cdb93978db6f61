"""The example scheduler's dry run: the kubectl patch commands it prints for picrl's actions."""

from __future__ import annotations

import shlex

import pytest

from picrl.kubernetes import Scheduler, patch_command, quantity, target_of
from stream.records import Action, ResourceAction, ResourceDecision


def _action(service: str, tick: int, capacity: float, advisory: bool = False) -> Action:
    return Action(service, tick, capacity, 0.5, 0, 0, 0, 0, 0, 0, 0, 0, advisory, 0, 0)


def test_an_in_place_resize_sets_the_containers_limit_rounded_up() -> None:
    command = patch_command(_action("shop/cart-7d9f/app", 12, 536870911.2), {"": "memory"}, "resize")
    assert command == (
        "kubectl patch pod cart-7d9f -n shop --subresource resize --type merge "
        """-p '{"spec":{"containers":[{"name":"app","resources":{"limits":{"memory":"536870912"}}}]}}'"""
    )


def test_a_vpa_recommendation_names_the_workload_and_cpu_in_millicores() -> None:
    command = patch_command(_action("search/app", 3, 0.2501), {"": "cpu"}, "vpa", namespace="prod")
    assert shlex.split(command) == [
        "kubectl",
        "patch",
        "verticalpodautoscaler",
        "search",
        "-n",
        "prod",
        "--subresource",
        "status",
        "--type",
        "merge",
        "-p",
        '{"status":{"recommendation":{"containerRecommendations":[{"containerName":"app","target":{"cpu":"251m"}}]}}}',
    ]


def test_the_scheduler_prints_each_change_once_and_advisory_ones_as_comments() -> None:
    scheduler = Scheduler({"": "memory"}, "resize")
    printed = [
        scheduler.command(a)
        for a in [
            _action("ns/p/c", 1, 100.0),
            _action("ns/p/c", 2, 100.0),  # the capacity in force: nothing to do
            _action("ns/p/c", 1, 50.0),  # an older tick (a redelivery)
            _action("ns/p/c", 3, 120.0),
            _action("ns/q/c", 3, 80.0, advisory=True),
        ]
    ]
    assert [p is not None for p in printed] == [True, False, False, True, True]
    assert '"memory":"120"' in printed[3] and printed[4].startswith("# advisory (recommend mode): kubectl patch pod q")


def test_several_resources_map_to_kubernetes_resources_and_bad_ids_are_refused() -> None:
    decision = ResourceDecision(4e9, 0.5, 0, 0, 0, 0, 0, 0, 0)
    action = ResourceAction("ns/p/c", 4, {"gpu_mem": decision, "gpu_compute": decision}, 0, False, 0, 0)
    assert '"limits":{"memory":"4000000000"}' in patch_command(action, {"gpu_mem": "memory"}, "resize")
    assert quantity("memory", 1.0001) == "2"
    with pytest.raises(ValueError, match="namespace"):
        target_of("just-a-name")
