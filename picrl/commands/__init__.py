"""Sub-commands of the ``picrl`` CLI, in the order ``picrl --help`` lists them."""
from picrl.commands import kafka

COMMANDS = [kafka]
