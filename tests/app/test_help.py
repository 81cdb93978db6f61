"""Every command and sub-command answers ``--help``, and the commands that need neither torch nor Faust
start without importing them (``picrl --help`` and ``picrl kafka status`` in a fraction of a second)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator

import pytest

from picrl.cli import build_parser, main
from picrl.commands import SUMMARIES


def _command_paths(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """``path`` and the word sequences of every sub-command below it, depth first."""
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _command_paths(child, (*path, name))


PATHS = list(_command_paths(build_parser()))


def test_the_tree_holds_every_command_and_the_produce_kinds() -> None:
    assert {path[0] for path in PATHS if path} == set(SUMMARIES)
    assert ("produce", "replay") in PATHS and ("produce", "closed-loop") in PATHS


@pytest.mark.parametrize("path", PATHS, ids=lambda path: " ".join(path) or "picrl")
def test_help_answers(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*path, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: " + " ".join(("picrl", *path))), out[:200]


def test_the_top_level_summaries_are_the_commands_own() -> None:
    subparsers = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert {choice.dest: choice.help for choice in subparsers._choices_actions} == SUMMARIES


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["kafka", "status", "--help"],
        ["topics", "--help"],
        ["explain", "--help"],
        ["config", "show"],
        ["policy", "--help"],
        ["produce", "replay", "--help"],
        ["up", "--help"],
    ],
)
def test_light_commands_do_not_import_torch_or_faust(argv: list[str]) -> None:
    probe = (
        "import sys\nfrom picrl.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
        "print('loaded:', *sorted({'torch', 'faust'} & set(sys.modules)), file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=120)
    assert done.stderr.strip().splitlines()[-1] == "loaded:", done.stderr[-2000:]
