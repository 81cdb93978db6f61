"""Sub-commands of the ``picrl`` CLI, in the order ``picrl --help`` lists them.

A command's module (``picrl/commands/<name>.py``) is imported only when that command is parsed: some
load torch or Faust (seconds), and ``picrl --help`` or ``picrl kafka status`` should not wait for them.
``SUMMARIES`` holds the one-line help ``picrl --help`` shows for the commands it does not import; a
test keeps each equal to the help its module registers.
"""

from __future__ import annotations

import importlib
from types import ModuleType

SUMMARIES: dict[str, str] = {
    "up": "run everything: local broker, topics, a worker, the trainer and a closed loop on a bundled trace",
    "train": "train the predictor (phase 1) and pretrain the policy (phase 2) on a trace",
    "evaluate": "run PIC-RL online on a trace's test split and report MAE, regret and shortages",
    "compare": "reproduce Tables 2 and 3: PIC-RL vs baselines and ablations under the same PIC loop",
    "kafka": "run a local Apache Kafka cluster (KRaft; one node, or --brokers N) for picrl",
    "topics": "create picrl's Kafka topics (usage, actions, replay, policy, deadletter)",
    "worker": "run a stream worker: usage events in, provisioning actions and replay transitions out",
    "trainer": "run the policy trainer: consume replay, publish KL-regularised policy versions",
    "produce": "produce usage telemetry from a trace (open-loop replay or closed loop) or from Prometheus",
    "policy": "list the published policy versions, or roll the workers back to one",
    "schedule": "print the kubectl patch commands that would apply the actions to Kubernetes pods (dry run)",
    "explain": "show a service's state and last decisions from a running worker",
    "config": "show the effective settings of workers and trainers, with the source of each",
}


def load(name: str) -> ModuleType:
    """The module of command ``name``; it exposes ``register(subparsers)``."""
    return importlib.import_module(f"picrl.commands.{name}")
