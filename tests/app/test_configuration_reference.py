"""docs/reference/configuration.md is generated from the code (picrl.reference) and kept in sync with it."""

from __future__ import annotations

from pathlib import Path

from picrl.reference import COMMAND, read_dataclasses, render
from picrl.settings import SPECS
from picrl_core.config import PicRLConfig

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "configuration.md"


def test_the_committed_reference_is_what_the_code_renders() -> None:
    assert PAGE.read_text() == render(), f"docs/reference/configuration.md is out of date; regenerate it: {COMMAND}"


def test_the_reference_names_every_setting_and_every_model_field() -> None:
    page = render()
    for name in SPECS:
        assert f"| `{name}` | `PICRL_{name.upper()}` |" in page, name
    config = PicRLConfig().to_dict()
    for section, values in config.items():
        for key in values if isinstance(values, dict) else [None]:
            assert f"| `{section if key is None else f'{section}.{key}'}` |" in page, (section, key)


def test_comments_beside_and_above_a_field_are_its_meaning() -> None:
    source = '''
from dataclasses import dataclass, field
from typing import ClassVar

@dataclass
class Inner:
    """Inner things.

    More detail."""

    # the first line of a block
    # and its second
    size: int = 1 << 3  # and a note beside it
    rate: float = 1 / 32  # a | pipe
    kind: ClassVar[str] = "left out"
    bare: str = "x"

@dataclass
class Outer:
    inner: Inner = field(default_factory=Inner)
'''
    classes = read_dataclasses(source)
    size, rate, bare = classes["Inner"].fields
    assert (size.default, size.comment) == ("1 << 3", "the first line of a block and its second; and a note beside it")
    assert (rate.annotation, rate.default, rate.comment) == ("float", "1 / 32", "a | pipe")
    assert bare.comment == ""
    assert classes["Outer"].fields[0].factory == "Inner" and classes["Outer"].fields[0].default is None
    assert classes["Inner"].doc.startswith("Inner things.")
