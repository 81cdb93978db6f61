"""The docs' headline figures, rendered from the committed result files (``docs/results/*/results.json``).

A page holds each rendered block between ``<!-- figures:NAME -->`` and ``<!-- /figures:NAME -->``; :func:`fill`
replaces what lies between with :data:`BLOCKS` ``[NAME]``'s rendering, and leaves the rest of the page as it is.
``python -m picrl.reference`` writes every generated page (:func:`picrl.reference.pages`), and
``tests/app/test_generated_docs.py`` fails while a committed page differs from its rendering.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Callable
from functools import cache
from pathlib import Path

from picrl.comparison.tables import Summary, markdown_table2, markdown_table3
from picrl_core.methods import REGISTRY

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
PAGES = (ROOT / "README.md", ROOT / "docs" / "results.md", ROOT / "docs" / "performance.md")
# the runs the docs' tables come from, in the order "How these tables were made" lists them
RUNS = (
    ".",
    "default",
    "pods",
    "dlrm-product",
    "deployable",
    "pods-2r",
    "load-2r",
    "pods-2r-oom",
    "quick-product",
    "quick-paper",
)
GENAI = ("genai-mem", "genai-ctx")
# the README's results table: its label of each method and the run each column reads
README_ROWS = (
    ("PIC-RL (default)", "pic-rl"),
    ("PIC-RL with a CQL Phase 2", "cql"),
    ("one-sided conformal on the LSTM", "conformal"),
    ("censored SGD newsvendor on the LSTM's `mu`", "sgd-residual"),
    ("PIC-RL fed the demand (no censoring; the limit)", "pic-rl-fi"),
    ("persistence + the best buffer in hindsight (reads the test split; not a bound)", "oracle"),
)
README_COLUMNS = (
    ("GenAI-Mem", ".", "genai-mem"),
    ("GenAI-Ctx", ".", "genai-ctx"),
    ("pod fleet (91 pods, per pod)", "pods", "pods"),
)
# the methods whose change between the protocols the quick runs show
PROTOCOL_ROWS = ("pic-rl", "cql", "conformal", "sgd-residual", "thompson", "kaplan-meier", "vpa", "recent-max")


@cache
def run(folder: str) -> dict:
    """``docs/results/<folder>/results.json``."""
    loaded: dict = json.loads((RESULTS / folder / "results.json").read_text())
    return loaded


def summaries(folder: str) -> dict[tuple[str, str], Summary]:
    """The run's per-(method, dataset) summaries, as ``picrl compare`` computed them."""
    return {
        (s["method"], s["dataset"]): Summary(s["method"], s["dataset"], s["mean"], s["std"], s["seeds"], s["failed"])
        for s in run(folder)["summary"]
    }


def _regret(summary: Summary) -> str:
    deterministic = summary.std["regret"] == 0.0 or REGISTRY[summary.method].group == "hindsight"
    return f"{summary.mean['regret']:.2f}" + ("" if deterministic else f" ± {summary.std['regret']:.2f}")


def readme_results() -> str:
    """The README's table: test-split regret of the headline methods on GenAI and the pod fleet, the lowest
    censored method of each column in bold."""
    lines = ["| method | " + " | ".join(label for label, _, _ in README_COLUMNS) + " |", "|---|---|---|---|"]
    cells = {
        (m, label): summaries(folder)[(m, dataset)] for _, m in README_ROWS for label, folder, dataset in README_COLUMNS
    }
    censored = [
        m for _, m in README_ROWS if REGISTRY[m].censoring and REGISTRY[m].group not in ("reference", "hindsight")
    ]
    lowest = {
        label: min(round(cells[(m, label)].mean["regret"], 2) for m in censored) for label, _, _ in README_COLUMNS
    }
    for name, method in README_ROWS:
        row = []
        for label, _, _ in README_COLUMNS:
            text, summary = _regret(cells[(method, label)]), cells[(method, label)]
            bold = method in censored and round(summary.mean["regret"], 2) == lowest[label]
            row.append(f"**{text}**" if bold else text)
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def table2_genai() -> str:
    """docs/results.md's Table 2: every method of the full run on GenAI-Mem and GenAI-Ctx."""
    return markdown_table2(summaries("."), list(run(".")["methods"]), GENAI).rstrip("\n")


def table3_genai() -> str:
    """docs/results.md's Table 3: the default and its ablations on GenAI."""
    return markdown_table3(summaries("."), list(run(".")["methods"]), GENAI).rstrip("\n")


def _command(folder: str) -> str:
    """The run's recorded command as it runs now: its ``--out`` the folder it is committed in, and its protocol
    named (a run recorded before the product protocol became the default ran the paper's without naming it)."""
    record = run(folder)
    out = "docs/results" if folder == "." else f"docs/results/{folder}"
    command = re.sub(r"--out \S+", f"--out {out}", record["command"])
    named = f" --protocol {record['protocol']} --out "
    return command if "--protocol" in command else command.replace(" --out ", named)


def _cells(record: dict) -> str:
    """The run's cell count, and how many it computed when it read others from the cache."""
    cells = record["cells"]
    computed = sum(not c["cached"] for c in cells)
    return f"{len(cells)}" + ("" if computed == len(cells) else f" ({computed} computed)")


def runs_table() -> str:
    """Every committed run: its protocol, budget, cells (and how many it computed rather than read from the cache),
    wall time and command, as its results.json records."""
    lines = ["| run | protocol | budget | cells | wall time | command |", "|---|---|---|---|---|---|"]
    for folder in RUNS:
        record = run(folder)
        name = "results" if folder == "." else folder
        link = f"[`{name}`](results/{'' if folder == '.' else folder + '/'}results.json)"
        lines.append(
            f"| {link} | {record['protocol']} | {record['budget']['name']}, {record['seeds']} seed(s) | "
            f"{_cells(record)} | {record['wall_seconds']:,.0f} s, {record['jobs']} job(s) | "
            f"`{_command(folder)}` |"
        )
    return "\n".join(lines)


def cell_means(folder: str, metric: str) -> dict[tuple[str, str], float]:
    """The mean over seeds of one metric of the run's cells (those that report it), per (method, dataset)."""
    values: dict[tuple[str, str], list[float]] = {}
    for cell in run(folder)["cells"]:
        if cell["metrics"] is not None and metric in cell["metrics"]:
            values.setdefault((cell["method"], cell["dataset"]), []).append(cell["metrics"][metric])
    return {key: sum(v) / len(v) for key, v in values.items()}


def _native(value: float) -> str:
    return f"{value:.3g}" if abs(value) >= 1e5 else f"{value:,.1f}"


def protocol_change() -> str:
    """The headline methods' test regret under the paper's protocol and the product's, from the two quick runs
    (one seed, the first 300 test ticks), in units of the training range, with the product's native regret; then
    what each run recommends."""
    paper, product = summaries("quick-paper"), summaries("quick-product")
    native = cell_means("quick-product", "regret_native")
    datasets = list(run("quick-product")["datasets"])
    header = "| method | " + " | ".join(f"{d}: paper / product (native)" for d in datasets) + " |"
    lines = [header, "|---|" + "---|" * len(datasets)]
    for method in PROTOCOL_ROWS:
        row = []
        for dataset in datasets:
            old, new = paper[(method, dataset)].mean, product[(method, dataset)].mean
            row.append(f"{old['regret']:.2f} / {new['regret']:.2f} ({_native(native[(method, dataset)])})")
        lines.append(f"| {REGISTRY[method].label} | " + " | ".join(row) + " |")
    lines.append(
        "| *recommended (validation regret under the run's protocol)* | "
        + " | ".join(f"{_recommended('quick-paper', d)} / {_recommended('quick-product', d)}" for d in datasets)
        + " |"
    )
    return "\n".join(lines)


def _recommended(folder: str, dataset: str) -> str:
    rec = run(folder)["recommendation"][dataset]
    return "none" if rec is None else REGISTRY[rec["method"]].label


def compare_cells() -> str:
    """How many cells the full comparison has under each protocol (performance.md)."""
    record = run(".")
    methods, datasets, seeds = len(record["methods"]), len(record["datasets"]), record["seeds"]
    product = sum(REGISTRY[m].group != "hindsight" for m in record["methods"])
    text = (
        f"`picrl compare --datasets all --seeds 5 --methods all` is {product * datasets * seeds:,} cells under the "
        f"product protocol ({product} methods x {datasets} datasets x {seeds} seeds; the hindsight references do not "
        f"run under it) and {len(record['cells']):,} under `--protocol paper` ({methods} methods). The committed "
        f"paper run, [`docs/results/results.json`](results/results.json), took {record['wall_seconds']:,.0f} s of wall "
        f"time on {record['jobs']} jobs beside other work ([results](results.md#how-these-tables-were-made))."
    )
    return textwrap.fill(text, width=116, break_on_hyphens=False, break_long_words=False)


BLOCKS: dict[str, Callable[[], str]] = {
    "readme-results": readme_results,
    "table2-genai": table2_genai,
    "table3-genai": table3_genai,
    "runs": runs_table,
    "protocol-change": protocol_change,
    "compare-cells": compare_cells,
}
_BLOCK = re.compile(r"(<!-- figures:([\w-]+) -->\n)(.*?\n)?(<!-- /figures:\2 -->)", re.S)


def fill(text: str) -> str:
    """``text`` with every marked block rendered anew (an unknown name is an error)."""

    def rendered(match: re.Match[str]) -> str:
        name = match[2]
        if name not in BLOCKS:
            raise KeyError(f"unknown figures block {name!r}; known: {', '.join(BLOCKS)}")
        return match[1] + BLOCKS[name]() + "\n" + match[4]

    return _BLOCK.sub(rendered, text)


def pages() -> dict[Path, str]:
    """README.md, docs/results.md and docs/performance.md with their blocks rendered."""
    return {path: fill(path.read_text()) for path in PAGES}
