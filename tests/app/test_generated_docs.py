"""The generated docs (``python -m picrl.reference``): docs/reference/configuration.md from the code, and the
headline figures of the README, docs/results.md and docs/performance.md from the committed result files."""

from __future__ import annotations

import re

import pytest

from picrl import doc_figures
from picrl.reference import COMMAND, ROOT, pages, read_dataclasses, render
from picrl.settings import SPECS
from picrl_core.config import PicRLConfig


def test_every_committed_generated_page_is_what_its_sources_render() -> None:
    for path, text in pages().items():
        assert path.read_text() == text, f"{path.relative_to(ROOT)} is out of date; regenerate it: {COMMAND}"


def test_every_figures_block_is_on_a_page_and_a_block_is_replaced_whole() -> None:
    committed = "".join(path.read_text() for path in doc_figures.PAGES)
    assert set(re.findall(r"<!-- figures:([\w-]+) -->", committed)) == set(doc_figures.BLOCKS)
    text = "before\n<!-- figures:compare-cells -->\nstale 1 2 3\n<!-- /figures:compare-cells -->\nafter"
    filled = doc_figures.fill(text)
    assert "stale" not in filled and filled.startswith("before\n") and filled.endswith("\nafter")
    assert doc_figures.compare_cells() in filled
    with pytest.raises(KeyError, match="unknown figures block 'nope'"):
        doc_figures.fill("<!-- figures:nope -->\nx\n<!-- /figures:nope -->")


def test_the_docs_figures_agree_with_the_result_files() -> None:
    """The README's table reads the committed runs; the full run's cell count is one number on every page."""
    full, pods = doc_figures.run("."), doc_figures.run("pods")
    mean = {(s["method"], s["dataset"]): s["mean"]["regret"] for s in full["summary"] + pods["summary"]}
    table = doc_figures.readme_results()
    assert f"| PIC-RL (default) | {mean[('pic-rl', 'genai-mem')]:.2f} ± " in table
    assert f"**{mean[('conformal', 'genai-mem')]:.2f} ± " in table  # the lowest censored method on GenAI-Mem
    assert f"| {mean[('oracle', 'pods')]:.2f} |" in table  # a hindsight reference has no spread
    cells = len(full["cells"])
    for path in (ROOT / "docs" / "results.md", ROOT / "docs" / "performance.md"):
        counts = {int(n.replace(",", "")) for n in re.findall(r"([\d,]+) cells", path.read_text())}
        assert cells in counts, path


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
