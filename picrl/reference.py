"""The generated docs: the configuration reference, ``docs/reference/configuration.md``, rendered from the code
that defines it, and the headline figures of the README, docs/results.md and docs/performance.md, rendered from the
committed result files (:mod:`picrl.doc_figures`).

It reads the worker and trainer settings (:data:`picrl.settings.SPECS`), the per-service overrides
(``stream.engine_settings.ServiceOverride``) and the model's hyper-parameters (the dataclasses under
``picrl_core.config.PicRLConfig``): each field's name, type, default and the comment written beside or above it.
The dataclasses are read from their source with :mod:`ast` and :mod:`tokenize`, without importing the stream's
modules (they load torch and Faust). Regenerate every generated page with::

    python -m picrl.reference

``tests/app/test_generated_docs.py`` fails while a committed page differs from :func:`pages`.
"""

from __future__ import annotations

import ast
import importlib.util
import io
import json
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from picrl.settings import SPECS

COMMAND = "python -m picrl.reference"
ROOT = Path(__file__).resolve().parents[1]
PAPER_PRESET = ROOT / "configs" / "paper.json"
CONFIGURATION = ROOT / "docs" / "reference" / "configuration.md"


@dataclass(frozen=True)
class Field:
    """One dataclass field as written in its source."""

    name: str
    annotation: str
    default: str | None  # the default's source text; None for a required field
    factory: str | None  # the name given to ``field(default_factory=...)``
    comment: str


@dataclass(frozen=True)
class DataclassSource:
    """A dataclass read from its module's source: its docstring and its fields, in order."""

    name: str
    doc: str
    fields: tuple[Field, ...]


def module_source(module: str) -> str:
    """The source text of ``module``, found without importing it (its package's ``__init__`` is imported)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise LookupError(f"module {module} not found")
    return Path(spec.origin).read_text()


def _comments(source: str) -> tuple[dict[int, str], set[int]]:
    """Each line's comment text (without ``#``), and the lines that hold nothing but a comment."""
    lines = source.splitlines()
    text: dict[int, str] = {}
    alone: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            text[row] = token.string.lstrip("#").strip()
            if not lines[row - 1][:col].strip():
                alone.add(row)
    return text, alone


def _field_comment(node: ast.AnnAssign, text: dict[int, str], alone: set[int]) -> str:
    """The block of comment lines right above the field, then the comment beside its last line."""
    block: list[str] = []
    row = node.lineno - 1
    while row in alone:
        block.insert(0, text[row])
        row -= 1
    end = node.end_lineno or node.lineno
    beside = text[end] if end in text and end not in alone else ""
    return "; ".join(part for part in (" ".join(block), beside) if part)


def _factory(value: ast.expr | None) -> str | None:
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "field":
        for keyword in value.keywords:
            if keyword.arg == "default_factory":
                return ast.unparse(keyword.value)
    return None


def read_dataclasses(source: str) -> dict[str, DataclassSource]:
    """Every top-level class of ``source`` with its annotated fields (``ClassVar`` ones left out)."""
    text, alone = _comments(source)
    classes = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ClassDef):
            continue
        found = []
        for item in node.body:
            if not (isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)):
                continue
            annotation = ast.get_source_segment(source, item.annotation) or ast.unparse(item.annotation)
            if annotation.startswith(("ClassVar", "typing.ClassVar")):
                continue
            factory = _factory(item.value)
            default = None if item.value is None or factory else ast.get_source_segment(source, item.value)
            found.append(Field(item.target.id, annotation, default, factory, _field_comment(item, text, alone)))
        classes[node.name] = DataclassSource(node.name, ast.get_docstring(node) or "", tuple(found))
    return classes


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _code(text: str) -> str:
    return f"`{_cell(text)}`" if text else ""


def _first_paragraph(doc: str) -> str:
    return re.sub(r":\w+:`", "`", " ".join(doc.split("\n\n")[0].split()))  # Sphinx roles read as code


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, tuple):
        return ",".join(map(str, value)) or "(empty)"
    return str(value)


def _settings_section() -> list[str]:
    out = [
        "## Worker and trainer settings",
        "",
        "Workers, trainers and the Kafka commands (`topics`, `produce`, `policy`) read one typed settings object "
        "(`picrl/settings.py`). Each value comes from, later ones winning:",
        "",
        "1. the default below;",
        "2. a JSON settings file: `--settings FILE` or `$PICRL_SETTINGS`;",
        "3. the environment variable `PICRL_<NAME>`;",
        "4. the command-line flag `--name-with-dashes`.",
        "",
        "`picrl config show [--settings FILE]` prints every effective value with its source. An invalid value stops "
        "the command at start with a message naming the setting and where it came from; an unknown key in the file "
        "is an error too.",
        "",
        "| setting | environment | default | meaning |",
        "|---|---|---|---|",
    ]
    for name, spec in SPECS.items():
        out.append(f"| `{name}` | `PICRL_{name.upper()}` | `{_shown(spec.default)}` | {_cell(spec.help)} |")
    return out


def _overrides_section(override: DataclassSource) -> list[str]:
    out = [
        "## Per-service overrides (settings file only)",
        "",
        f'{_first_paragraph(override.doc)} Keyed by service id under `"services"` in the settings file '
        "(`stream.engine_settings.ServiceOverride`); a worker deciding several resources keys each resource's row as "
        '`"<service>/<resource>"`. Values are in the service\'s native unit.',
        "",
        "```json",
        '{"bootstrap": "kafka-1:9092", "partitions": 16, "mode": "recommend",',
        ' "services": {"web-frontend": {"min_capacity": 4, "max_capacity": 64}, "nightly-batch": {"freeze": 8},',
        '              "gpu-pool": {"low": 0, "high": 512}, "pod-17/gpu_mem": {"max_capacity": 40e9}}}',
        "```",
        "",
        "| key | type | default | meaning |",
        "|---|---|---|---|",
    ]
    for f in override.fields:
        out.append(f"| `{f.name}` | {_code(f.annotation)} | {_code(f.default or '')} | {_cell(f.comment)} |")
    out += [
        "",
        "The capacity an override imposes is the capacity in force: the calibrator and the replay transitions see "
        "what ran. `low` / `high` carry the service's controller state over to that range from its next event, and "
        "such a range never grows; settings are read at start, so restart the workers one at a time.",
    ]
    return out


def _model_row(key: str, f: Field, preset: Any) -> str:
    shown = "" if preset is None else _code(json.dumps(preset))
    return f"| `{key}` | {_code(f.annotation)} | {_code(f.default or '')} | {shown} | {_cell(f.comment)} |"


def _model_section(classes: dict[str, DataclassSource], paper: dict[str, Any]) -> list[str]:
    header = ["| key | type | default | paper preset | meaning |", "|---|---|---|---|---|"]
    out = [
        "## Model hyper-parameters",
        "",
        "The algorithm's hyper-parameters belong to the model (`picrl_core/config.py`): "
        "`picrl train|evaluate|compare|up --config FILE` takes a JSON object that overrides any of the fields below "
        'by section, for example `{"cost": {"c_under": 9, "c_over": 1}, "predictor": {"kind": "windowed"}}` '
        "(unknown keys are refused), and the model folder records the config it was trained with. "
        "`--config configs/paper.json` is the paper's Phase 3 as printed; the column *paper preset* gives the values "
        "that file sets (blank: the default).",
        "",
        *header,
    ]
    sections = []
    for f in classes["PicRLConfig"].fields:
        if f.factory in classes:
            sections.append((f.name, classes[f.factory]))
        else:
            out.append(_model_row(f.name, f, paper.get(f.name)))
    for section, cls in sections:
        out += ["", f"### `{section}`", "", _first_paragraph(cls.doc), "", *header]
        out += [_model_row(f"{section}.{f.name}", f, paper.get(section, {}).get(f.name)) for f in cls.fields]
    return out


def render(paper_preset: Path = PAPER_PRESET) -> str:
    """The whole page, as ``docs/reference/configuration.md`` holds it."""
    config = read_dataclasses(module_source("picrl_core.config"))
    override = read_dataclasses(module_source("stream.engine_settings"))["ServiceOverride"]
    paper = json.loads(paper_preset.read_text())
    lines = [
        "# Configuration reference",
        "",
        f"<!-- Generated from the code by `{COMMAND}`; do not edit by hand. -->",
        "",
        "Two kinds of configuration: the settings of the processes you run (workers, the trainer, the Kafka "
        "commands), and the hyper-parameters of a model, fixed when it is trained. What the algorithm does with the "
        "second kind is in [the algorithm guide](../guide/algorithm.md).",
        "",
        *_settings_section(),
        "",
        *_overrides_section(override),
        "",
        *_model_section(config, paper),
    ]
    return "\n".join(lines) + "\n"


def pages() -> dict[Path, str]:
    """Every generated page as it should be committed: the configuration reference whole, and the pages whose
    figure blocks are rendered from the result files."""
    from picrl import doc_figures  # here: it loads the comparison's tables (torch)

    return {CONFIGURATION: render(), **doc_figures.pages()}


if __name__ == "__main__":
    for path, text in pages().items():
        path.write_text(text)
        print(f"wrote {path.relative_to(ROOT)}")
