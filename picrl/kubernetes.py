"""An example scheduler's translation of picrl actions into ``kubectl patch`` commands (printed, never run).

A service id is ``<namespace>/<pod>/<container>`` (or ``<pod>/<container>`` in a default namespace), as the PromQL
``label_join(..., "service", "/", "namespace", "pod", "container")`` of docs/guide/prometheus.md names it. Two ways
to apply a capacity:

* ``resize``: an in-place resize of the running pod (Kubernetes 1.33+, the ``resize`` subresource): the container's
  limit is set to the decided capacity;
* ``vpa``: the recommendation of a VerticalPodAutoscaler named after the pod's workload (``--vpa NAME``), written to
  its status as a recommender would: the VPA updater then applies it in its own way (evicting, or in place).
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass

from stream.records import Action, ResourceAction


@dataclass(frozen=True)
class Target:
    """Where a service runs."""

    namespace: str
    pod: str
    container: str


def target_of(service: str, namespace: str = "default") -> Target:
    """The pod and container a service id names; ``ValueError`` unless it is ``[namespace/]pod/container``."""
    parts = service.split("/")
    if len(parts) == 3 and all(parts):
        return Target(*parts)
    if len(parts) == 2 and all(parts):
        return Target(namespace, *parts)
    raise ValueError(f"service {service!r} is not <namespace>/<pod>/<container> or <pod>/<container>")


def quantity(resource: str, value: float) -> str:
    """A Kubernetes quantity of ``resource``, rounded up: whole bytes for memory, millicores for cpu."""
    if resource == "cpu":
        return f"{math.ceil(value * 1000)}m"
    return str(math.ceil(value))


def capacities(action: Action | ResourceAction, names: dict[str, str]) -> dict[str, float]:
    """The action's capacities by Kubernetes resource: ``names`` maps picrl's resource names (``""`` for the single
    resource of a schema-1 action) to Kubernetes ones (memory, cpu, ...)."""
    if isinstance(action, Action):
        return {names[""]: action.capacity}
    return {names[r]: decision.capacity for r, decision in action.resources.items() if r in names}


def patch_command(
    action: Action | ResourceAction, names: dict[str, str], method: str, namespace: str = "default"
) -> str:
    """The ``kubectl patch`` command that applies ``action`` (``method``: resize or vpa)."""
    target = target_of(action.service, namespace)
    limits = {resource: quantity(resource, value) for resource, value in capacities(action, names).items()}
    if method == "resize":
        patch = {"spec": {"containers": [{"name": target.container, "resources": {"limits": limits}}]}}
        what = ["pod", target.pod]
    elif method == "vpa":
        recommendation = {"containerName": target.container, "target": limits}
        patch = {"status": {"recommendation": {"containerRecommendations": [recommendation]}}}
        what = ["verticalpodautoscaler", target.pod]
    else:
        raise ValueError(f"method must be resize or vpa; got {method!r}")
    words = ["kubectl", "patch", *what, "-n", target.namespace]
    words += ["--subresource", "resize" if method == "resize" else "status", "--type", "merge"]
    words += ["-p", json.dumps(patch, separators=(",", ":"))]
    return shlex.join(words)


class Scheduler:
    """Keeps the newest tick applied per service and answers, for each action, the command to run (None: an older
    tick, or the capacity already in force). Advisory actions (recommend mode) come back as comments."""

    def __init__(self, names: dict[str, str], method: str, namespace: str = "default") -> None:
        self.names, self.method, self.namespace = names, method, namespace
        self._applied: dict[str, tuple[int, dict[str, float]]] = {}

    def command(self, action: Action | ResourceAction) -> str | None:
        previous = self._applied.get(action.service)
        if previous is not None and action.tick <= previous[0]:
            return None
        wanted = capacities(action, self.names)
        self._applied[action.service] = (action.tick, wanted)
        if previous is not None and wanted == previous[1]:
            return None
        command = patch_command(action, self.names, self.method, self.namespace)
        return f"# advisory (recommend mode): {command}" if action.advisory else command
