"""The generated docs (``python -m picrl.reference``): docs/reference/configuration.md from the code, and the
headline figures of the README, docs/results.md and docs/performance.md from the committed result files."""

from __future__ import annotations

import re

import pytest

from picrl import doc_figures
from picrl.reference import COMMAND, ROOT, pages, read_dataclasses, render
from picrl.settings import SPECS
from picrl_core.config import PicRLConfig
from picrl_core.methods import REGISTRY


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
    # every "N cells" the pages state is a committed run's count or the full / quick comparison's under a protocol
    methods = len(full["methods"])
    product = sum(REGISTRY[m].group != "hindsight" for m in full["methods"])
    known = {len(doc_figures.run(f)["cells"]) for f in doc_figures.RUNS}
    known |= {product * 15, methods * 15, product * 3, methods * 3}
    for path in doc_figures.PAGES:
        stated = {int(n.replace(",", "")) for n in re.findall(r"([\d,]+) cells", path.read_text())}
        assert stated <= known, (path, stated - known)
    computed = sum(not c["cached"] for c in full["cells"])
    assert f"| {len(full['cells'])} ({computed} computed) |" in doc_figures.runs_table()


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


def test_the_protocol_change_the_docs_state_is_the_quick_runs() -> None:
    """docs/results.md's reading of the two quick runs quotes their numbers."""
    page = (ROOT / "docs" / "results.md").read_text()
    paper, product = (doc_figures.summaries(f"quick-{p}") for p in ("paper", "product"))
    for dataset in ("genai-mem", "genai-ctx"):  # inside the training range: one loop under both protocols
        for method in doc_figures.PROTOCOL_ROWS:
            old, new = paper[(method, dataset)].mean["regret"], product[(method, dataset)].mean["regret"]
            assert new == pytest.approx(old, rel=1e-12), (method, dataset)
    recommended = doc_figures.run("quick-product")["recommendation"]["dlrm"]
    assert (recommended["method"], recommended["runner_up"]) == ("pic-rl", "cql")
    assert f"at {product[('pic-rl', 'dlrm')].mean['regret']:.2f} (PIC-RL)" in page
    assert f"PIC-RL ({recommended['regret']:.2f}, CQL {recommended['runner_up_regret']:.2f})" in page
