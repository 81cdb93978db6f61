"""Sub-commands of the ``picrl`` CLI, in the order ``picrl --help`` lists them."""
from picrl.commands import compare, config, evaluate, explain, kafka, policy, produce, topics, train, trainer, up, worker

COMMANDS = [up, train, evaluate, compare, kafka, topics, worker, trainer, produce, policy, explain, config]
