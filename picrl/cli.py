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


def innermost_parser(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser of the deepest sub-command named in ``argv`` (``parser`` itself when none is)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = next((word for word in argv if word in action.choices), None)
            if chosen is not None:
                return innermost_parser(action.choices[chosen], argv[list(argv).index(chosen) + 1 :])
    return parser


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The parsed arguments; an unknown option is reported with the usage of the sub-command it was given to
    (argparse's sub-parsers leave unknown options to the top-level parser, which would print its own usage)."""
    chosen = chosen_command(argv)
    parser = build_parser([] if chosen is None else [chosen])
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        innermost_parser(parser, argv).error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
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
