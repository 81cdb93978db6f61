"""The ``picrl`` command line: one sub-command per thing a user does.

Each sub-command lives in ``picrl/commands/<name>.py`` and exposes ``register(subparsers)``, which
adds its parser and sets ``handler`` (a function of the parsed arguments returning an exit code).
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from picrl.commands import COMMANDS
from picrl.errors import UserError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="picrl",
        description="PIC-RL capacity provisioning under prediction-induced censoring: "
                    "offline training and evaluation, and a Kafka stream processor.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
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
