"""The ``picrl`` command line: one sub-command per thing a user does.

Each sub-command lives in ``picrl/commands/<name>.py`` and exposes ``register(subparsers)``, which
adds its parser and sets ``handler`` (a function of the parsed arguments returning an exit code).
Only the module of the command being run is imported (see ``picrl.commands``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection, Sequence

from picrl.commands import SUMMARIES, load
from picrl.errors import UserError


def build_parser(commands: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The parser with the full options of ``commands`` (default: all of them); the other commands are
    listed with their one-line help only, without importing their modules."""
    parser = argparse.ArgumentParser(
        prog="picrl",
        description="PIC-RL capacity provisioning under prediction-induced censoring: "
        "offline training and evaluation, and a Kafka stream processor.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, summary in SUMMARIES.items():
        if commands is None or name in commands:
            load(name).register(sub)
        else:
            sub.add_parser(name, help=summary)
    return parser


def chosen_command(argv: Sequence[str]) -> str | None:
    """The command named on the line: the first word that is not an option (the top level has only -h)."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = chosen_command(argv)
    args = build_parser([] if chosen is None else [chosen]).parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except UserError as exc:
        print(f"picrl {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"picrl {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
