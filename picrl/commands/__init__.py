"""Sub-commands of the ``picrl`` CLI, in the order ``picrl --help`` lists them."""
from picrl.commands import evaluate, kafka, topics, train

COMMANDS = [train, evaluate, kafka, topics]
