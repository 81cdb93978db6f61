"""``picrl config show``: the effective settings and where each value came from."""

from __future__ import annotations

import argparse
from pathlib import Path

from picrl.settings import SPECS, load_settings


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "config",
        help="show the effective settings of workers and trainers, with the source of each",
        description="Resolve every setting from its default, the settings file (--settings or $PICRL_SETTINGS) "
        "and PICRL_<NAME> environment variables, and print the value, its source and its meaning. "
        "An invalid setting is an error naming it.",
    )
    parser.add_argument("action", choices=("show",))
    parser.add_argument("--settings", type=Path, metavar="FILE", help="JSON settings file (default $PICRL_SETTINGS)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    settings = load_settings(args.settings)
    width = max(map(len, SPECS))
    for name, spec in SPECS.items():
        value = settings[name]
        shown = "none" if value is None else str(value)
        print(f"{name:<{width}}  {shown:<14} {settings.sources[name]:<28} {spec.help}")
    for service, override in sorted(settings.services.items()):
        print(f"services.{service}: {override}")
    return 0
