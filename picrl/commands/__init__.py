"""Sub-commands of the ``picrl`` CLI, in the order ``picrl --help`` lists them."""
from picrl.commands import evaluate, kafka, train

COMMANDS = [train, evaluate, kafka]
