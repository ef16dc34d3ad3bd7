"""Writes docs/OPERATORS.md from the lowering registries themselves and the vocabularies in docs/vocabulary/ (what
pnnx can emit, what TNN can load; tools/extract_vocabularies.py). Runs with the project's .venv, no torch:

    .venv/bin/python tools/make_operators_doc.py           # writes docs/OPERATORS.md
    .venv/bin/python tools/make_operators_doc.py --check   # exits 1 when docs/OPERATORS.md is not what it writes

For every vocabulary name: whether a lowering handler takes it, which canonical ops, params and refusals the
handler's source shows (tools/_handler_facts.py), and which tests and fixtures mention it (tools/_test_mentions.py).
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from _handler_facts import Facts, handler_doc, handler_facts
from _test_mentions import Mentions, scan

import engine.formats.pnnx.lowering.lower  # noqa: F401  (registers the pnnx handlers)
import engine.formats.tnn.lowering.lower  # noqa: F401  (registers the TNN handlers)
from engine.formats.pnnx import reader as pnnx_reader
from engine.formats.pnnx.lowering.expression import BINARY as EXPR_BINARY
from engine.formats.pnnx.lowering.expression import UNARY as EXPR_UNARY
from engine.formats.pnnx.lowering.registry import HANDLERS as PNNX_HANDLERS
from engine.formats.tnn.lowering.registry import HANDLERS as TNN_HANDLERS
from engine.formats.tnn.lowering.registry import QUANTIZED as TNN_QUANTIZED
from engine.ops.expression import FUNCTIONS as EXPR_FUNCTIONS
from engine.ops.registry import all_ops

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "OPERATORS.md"
PNNX_BUGS = REPO / "docs" / "pnnx_export_bugs.md"  # hand-written: included as it is
VOCABULARY = REPO / "docs" / "vocabulary"
EXPR_PREFIX = "pnnx.Expression:"
LIST_CAP = 4  # names shown in a table cell before "(+N)"

# The refusals issue 18 reports, with where they were met.
ISSUE_18 = {
    "aten::addcmul": "ConvNeXt-V2's GRN",
    "torch.addmm": "GPT-2's Conv1D",
    "Tensor.reshape_as": "LeViT",
    "Tensor.slice_copy": "an in-place strided slice assignment in a detection head",
    "nn.RMSNorm": "T5",
}


@dataclass(frozen=True)
class Registries:
    pnnx: dict[str, Callable]  # pnnx type -> lowering handler
    pnnx_reader: frozenset[str]  # names the pnnx reader consumes itself (inputs, outputs, constants)
    tnn: dict[str, Callable]  # TNN layer type -> handler, float layers
    tnn_quantized: dict[str, Callable]  # TNN Quantized* layer type -> handler
    ops: dict[str, str]  # canonical op type -> its family module
    expression_functions: frozenset[str]  # the functions the Expression op evaluates
    expression_ops: dict[str, str]  # expression function -> canonical op, when lowered as float element-wise


def registries() -> Registries:
    """Everything the document is generated from: the one place that knows where the registries live."""
    reader_names = {n.value for n in ast.walk(ast.parse(inspect.getsource(pnnx_reader)))
                    if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    ops = {op_type: _family(opdef) for op_type, opdef in all_ops().items()}
    return Registries(dict(PNNX_HANDLERS), frozenset(reader_names), dict(TNN_HANDLERS), dict(TNN_QUANTIZED), ops,
                      frozenset(EXPR_FUNCTIONS), {**EXPR_BINARY, **EXPR_UNARY})


def _family(opdef) -> str:
    """The family module an op's functions come from (not a shared private helper module)."""
    modules = [f.__module__ for f in (opdef.infer, opdef.reference) if f is not None]
    return next((m for m in modules if not m.rsplit(".", 1)[-1].startswith("_")), modules[0])


# -- vocabularies ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    name: str
    group: str
    fields: tuple[str, ...]  # the rest of the line: pnnx source files; TNN LayerType and registries


@dataclass
class Vocabulary:
    notes: list[str]  # the file's header comment
    groups: dict[str, str]  # group key -> note, in file order
    entries: list[Entry]


def read_vocabulary(path: Path) -> Vocabulary:
    voc, group = Vocabulary([], {}, []), ""
    for raw in path.read_text().splitlines():
        line = re.sub(r"\s+#.*$", "", raw).strip()
        if raw.startswith("## "):
            group, _, note = raw[3:].partition(": ")
            voc.groups[group] = note
        elif raw.startswith("#"):
            voc.notes.append(raw.lstrip("# "))
        elif line:
            name, *rest = line.split()
            voc.entries.append(Entry(name, group, tuple(rest)))
    return voc


# -- status ------------------------------------------------------------------------------------------------------

SUPPORTED, READER, NOT_HANDLED = "supported", "read by the reader", "not handled"


@dataclass
class Row:
    name: str
    status: str
    handler: Callable | None = None
    facts: Facts | None = None
    tests: list[str] = field(default_factory=list)
    fixtures: list[str] = field(default_factory=list)
    canonical: str = ""  # expression functions: the canonical op a float element-wise use lowers to
    label: str = ""  # the handler's name in this document (label_handlers)


def pnnx_row(name: str, reg: Registries, mentions: Mentions) -> Row:
    if name.startswith(EXPR_PREFIX):
        fn = name[len(EXPR_PREFIX):]
        status = SUPPORTED if fn in reg.expression_functions else NOT_HANDLED
        return Row(name, status, None, None, *mentions.expression(fn), canonical=reg.expression_ops.get(fn, ""))
    tests, fixtures = mentions.pnnx(name)
    handler = reg.pnnx.get(name)
    if handler is not None:
        return Row(name, SUPPORTED, handler, handler_facts(handler, name, reg.ops, reg.pnnx), tests, fixtures)
    return Row(name, READER if name in reg.pnnx_reader else NOT_HANDLED, None, None, tests, fixtures)


def tnn_row(name: str, reg: Registries, mentions: Mentions) -> Row:
    tests, fixtures = mentions.tnn(name)
    table = reg.tnn_quantized if name in reg.tnn_quantized else reg.tnn
    handler = table.get(name)
    if handler is None:
        return Row(name, NOT_HANDLED, None, None, tests, fixtures)
    return Row(name, SUPPORTED, handler, handler_facts(handler, name, reg.ops, table), tests, fixtures)


# -- rendering ---------------------------------------------------------------------------------------------------


def _capped(items: list[str], cap: int = LIST_CAP) -> str:
    return ", ".join(items[:cap]) + (f" (+{len(items) - cap})" if len(items) > cap else "")


def _code(items: list[str], cap: int = LIST_CAP) -> str:
    return _capped([f"`{i}`" for i in items], cap)


def handler_label(handler: Callable) -> str:
    """`pnnx/activations.softmax`; a handler made by a factory is named for the factory: `tnn/unary._unary()`."""
    fmt = handler.__module__.split(".")[2]
    qual = handler.__qualname__
    qual = qual.split(".<locals>.")[0] + "()" if ".<locals>." in qual else qual.replace("<lambda>", "lambda")
    return f"{fmt}/{handler.__module__.rsplit('.', 1)[-1]}.{qual}"


def _anchor(text: str) -> str:
    """GitHub's heading anchor."""
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def label_handlers(rows: list[Row]) -> None:
    """One label per handler code: the closures a factory made (`_unary("Relu")`, `_unary("Abs")`) share one, a
    module-level lambda is named for the first type it lowers."""
    labels: dict[object, str] = {}
    for r in rows:
        if r.handler is not None:
            code = r.handler.__code__
            if code not in labels:
                label = handler_label(r.handler)
                labels[code] = f"{label} ({r.name})" if label.endswith(".lambda") else label
            r.label = labels[code]


def _coverage(row: Row) -> str:
    tests = [Path(t).stem for t in row.tests]
    fixtures = [Path(f).parent.as_posix().removeprefix("fixtures/") for f in row.fixtures]
    parts = [_capped(tests)] if tests else []
    if fixtures:
        parts.append("fixtures " + _capped(sorted(set(fixtures))))
    return "; ".join(parts) or "none"


def _lowering(row: Row) -> str:
    f = row.facts
    if f is None and row.name.startswith(EXPR_PREFIX) and row.status == SUPPORTED:
        return f"`{row.canonical}` (float element-wise), else `Expression`" if row.canonical else "`Expression`"
    if f is None:
        return ""
    ops = _code(f.ops, 8) if f.ops else ""
    if f.bypass:
        ops = "removed (the input flows through; `Identity` for a graph output)" + (f", {ops}" if ops else "")
    return ops + (" and an op name the source computes" if f.unresolved else "")


def _op_table(rows: list[Row], extra: Callable[[Row], list[str]] | None = None,
              extra_heads: tuple[str, ...] = ()) -> list[str]:
    heads = ("name", *extra_heads, "status", "handler", "canonical ops", "tests")
    out = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for r in rows:
        handler = f"[{r.label}](#{_anchor(r.label)})" if r.label else ""
        cells = [f"`{r.name}`", *(extra(r) if extra else []), r.status, handler, _lowering(r), _coverage(r)]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return out


def _counts(rows: list[Row]) -> tuple[int, int]:
    return len(rows), sum(r.status != NOT_HANDLED for r in rows)


def _summary(pnnx: list[Row], tnn: dict[str, Row], tnn_voc: Vocabulary) -> list[str]:
    ops = [r for r in pnnx if not r.name.startswith(EXPR_PREFIX)]
    funcs = [r for r in pnnx if r.name.startswith(EXPR_PREFIX)]
    tags = {e.name: set(e.fields[1:]) for e in tnn_voc.entries}
    quantized = {e.name for e in tnn_voc.entries if e.group == "quantized"}
    lines = ["| vocabulary | names | supported | not handled |", "|---|---|---|---|"]
    for label, rows in (
        ("pnnx operators (`pnnx_ops.txt`, without Expression functions)", ops),
        ("pnnx.Expression functions", funcs),
        ("TNN layer type strings, all (`tnn_layers.txt`)", list(tnn.values())),
        ("TNN x86 registry: type strings with an x86 acc", [r for n, r in tnn.items() if "x86" in tags[n]]),
        ("TNN x86 device: an x86 acc or TNN's CPU fallback", [r for n, r in tnn.items() if tags[n] & {"x86", "cpu"}]),
        ("TNN ARM registry", [r for n, r in tnn.items() if "arm" in tags[n]]),
        ("TNN quantized type strings", [r for n, r in tnn.items() if n in quantized]),
        ("TNN layer types onnx2tnn writes (`onnx2tnn` in `tnn_layers.txt`)",
         [r for n, r in tnn.items() if "onnx2tnn" in tags[n]]),
    ):
        total, supported = _counts(rows)
        lines.append(f"| {label} | {total} | {supported} | {total - supported} |")
    return lines


def _issue_18(by_name: dict[str, Row]) -> list[str]:
    lines = ["| op | met in | status |", "|---|---|---|"]
    for name, where in ISSUE_18.items():
        row = by_name.get(name)
        lines.append(f"| `{name}` | {where} | {row.status if row else 'not in the vocabulary'} |")
    return lines


def _onnx2tnn_refused(tnn: dict[str, Row], voc: Vocabulary) -> list[str]:
    """The converter's types without a handler: a model using one is refused at load (UnsupportedOpError naming the
    layer type, the layer and the .tnnproto line; tests/engine/formats/tnn/test_tnn_lowering.py loads each)."""
    names = [e.name for e in voc.entries if "onnx2tnn" in e.fields[1:] and tnn[e.name].status == NOT_HANDLED]
    no_tnn = [n for n in names if not set(next(e for e in voc.entries if e.name == n).fields[1:]) - {"onnx2tnn"}]
    return [f"Refused at load with an error naming the layer type, the layer and the .tnnproto line ({len(names)}): "
            + ", ".join(f"`{n}`" for n in sorted(names, key=str.lower)) + ".",
            "", "Of these, TNN itself has no layer for " + (", ".join(f"`{n}`" for n in no_tnn) or "none")
            + " (its converter writes them, its runtime cannot load them)."]


def _unsupported_by_group(rows: list[Row], voc: Vocabulary, label: Callable[[str], str]) -> list[str]:
    group_of = {e.name: e.group for e in voc.entries}
    missing: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        if r.status == NOT_HANDLED:
            missing[group_of[r.name]].append(r.name)
    return [f"- {label(g)} ({len(missing[g])}): " + ", ".join(f"`{n}`" for n in missing[g])
            for g in voc.groups if missing[g]]


def _handlers_section(rows: list[Row]) -> list[str]:
    by_label: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        if r.label:
            by_label[r.label].append(r)
    out = []
    for label, lrows in sorted(by_label.items()):
        out += ["", f"#### {label}", "", *_handler_facts_lines(lrows[0].handler, lrows)]
    return out


def _handler_facts_lines(handler: Callable, rows: list[Row]) -> list[str]:
    path = Path(inspect.getsourcefile(handler)).relative_to(REPO).as_posix()
    facts = [r.facts for r in rows if r.facts is not None]
    paragraphs = [f"Source: [{path}](../{path}). Handles: " + ", ".join(f"`{r.name}`" for r in rows) + "."]
    doc = handler_doc(handler)
    if doc:
        paragraphs.append(f"{doc}.")
    ops = list(dict.fromkeys(o for f in facts for o in f.ops))
    if ops:
        paragraphs.append("Emits: " + ", ".join(f"`{o}`" for o in ops) + ".")
    reads = list(dict.fromkeys(p for f in facts for p in f.reads))
    if reads:
        paragraphs.append("Reads (params, attributes, resources): " + ", ".join(f"`{p}`" for p in reads) + ".")
    positions = sorted({p for f in facts for p in f.positions})
    computed = any(f.computed_positions for f in facts)
    if positions or computed:
        listed = _ranges(positions) + (" and positions it computes" if computed else "")
        paragraphs.append(f"Reads positional params {listed.removeprefix(' and ')}.")
    for kind, key in (("Refuses (UnsupportedOpError)", "refusals"),
                      ("Calls the model malformed (ModelFormatError)", "malformed")):
        items = list(dict.fromkeys(i for f in facts for i in getattr(f, key)))
        if items:
            paragraphs.append(f"{kind}:\n\n" + "\n".join(_when(h, w) + (m or "(no message)") for h, w, m in items))
    return "\n\n".join(paragraphs).splitlines()


def _when(helper: str, condition: str) -> str:
    where = f"in `{helper}`, " if helper else ""
    return f"- {where}always: " if condition == "always" else f"- {where}when `{condition}`: "


def _ranges(numbers: list[int]) -> str:
    """0, 1, 2, 3, 7 -> "0-3, 7"."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)


def _canonical_section(reg: Registries, pnnx: list[Row], tnn: list[Row]) -> list[str]:
    users: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for fmt, rows in (("pnnx", pnnx), ("tnn", tnn)):
        for r in rows:
            for op in (r.facts.ops if r.facts else []) + ([r.canonical] if r.canonical else []):
                users[op][fmt].append(r.name)
    lines = ["| op | family module | lowered from pnnx | lowered from TNN |", "|---|---|---|---|"]
    for op in sorted(reg.ops):
        lines.append(f"| `{op}` | `{reg.ops[op]}` | {_code(users[op]['pnnx'])} | {_code(users[op]['tnn'])} |")
    return lines


HEADER = """# Operators

Generated by `tools/make_operators_doc.py` from the lowering registries
(`engine/formats/pnnx/lowering/registry.py`, `engine/formats/tnn/lowering/registry.py`), the canonical op
registry (`engine.ops`) and the vocabularies in `docs/vocabulary/` (what pnnx can emit and what TNN can load, read
from their sources by `tools/extract_vocabularies.py`). Do not edit by hand:
`.venv/bin/python tools/make_operators_doc.py` rewrites it, and `tests/tools/test_operators_doc.py` fails when it
is stale.

How to read it:
- *status*: `supported` (a lowering handler takes the type), `read by the reader` (the pnnx reader turns it into
  graph inputs, outputs or constants), `not handled` (loading a model with it raises UnsupportedOpError).
- *canonical ops*, params read and refusals are read from each handler's source with `ast`
  (`tools/_handler_facts.py`): literals, closures, tables indexed by the op type, branches on the op type. The
  ops of a handler are the ones its branches can emit for that type, not all at once. A param a handler does not
  read is ignored, not refused.
- *tests*: the test files that hold a model line of that type, or quote a dotted name; *fixtures*: committed
  models under `tests/fixtures/` whose file holds such a line (`tools/_test_mentions.py`; a text search, no
  more). The fixture models run against PyTorch in `tests/engine/test_pnnx_models.py` and against TNN's own
  outputs in `tests/engine/test_tnn_models.py`.
"""


def render(reg: Registries | None = None, tests_root: Path = REPO / "tests") -> str:
    reg = reg or registries()
    mentions = scan(tests_root)
    pnnx_voc, tnn_voc = read_vocabulary(VOCABULARY / "pnnx_ops.txt"), read_vocabulary(VOCABULARY / "tnn_layers.txt")
    pnnx = [pnnx_row(e.name, reg, mentions) for e in pnnx_voc.entries]
    tnn = {e.name: tnn_row(e.name, reg, mentions) for e in tnn_voc.entries}
    by_name = {r.name: r for r in pnnx}
    label_handlers(pnnx + list(tnn.values()))
    out = [HEADER, "## Summary", "", *_summary(pnnx, tnn, tnn_voc), "",
           "### The refusals issue 18 reports", "", *_issue_18(by_name), "",
           "### pnnx operators not handled, by group", "",
           *_unsupported_by_group(pnnx, pnnx_voc, lambda g: f"{g}: {pnnx_voc.groups[g]}"), "",
           "### TNN layer types not handled, by group", "",
           *_unsupported_by_group(list(tnn.values()), tnn_voc, lambda g: f"{g}: {tnn_voc.groups[g]}"), "",
           "### TNN layer types onnx2tnn writes that the engine refuses", "",
           *_onnx2tnn_refused(tnn, tnn_voc), "",
           "### Where pnnx exports wrongly", "", f"From `{PNNX_BUGS.relative_to(REPO)}`:", "",
           PNNX_BUGS.read_text().rstrip(), ""]
    out += ["## pnnx operators", "", *(f"> {n}" for n in pnnx_voc.notes), ""]
    for group, note in pnnx_voc.groups.items():
        rows = [r for r, e in zip(pnnx, pnnx_voc.entries, strict=True) if e.group == group]
        out += [f"### {group}: {note}", ""]
        if group == "expr":
            out += _expr_table(rows)
        else:
            out += _op_table(rows)
        out.append("")
    out += ["## TNN layers", "", *(f"> {n}" for n in tnn_voc.notes), ""]
    for group, note in tnn_voc.groups.items():
        entries = [e for e in tnn_voc.entries if e.group == group]
        out += [f"### {group}: {note}", "",
                *_op_table([tnn[e.name] for e in entries], lambda r, t=tnn_voc: _tnn_cells(t, r.name),
                           ("LayerType", "TNN registries")), ""]
    out += _extra_section(reg, pnnx_voc, tnn_voc)
    out += ["## Lowering handlers", "", "What each handler's source shows, for the types it handles.",
            *_handlers_section(pnnx + list(tnn.values())), ""]
    out += ["## Canonical ops", "", "The ops of `engine.ops`' registry, with the family module their functions "
            "come from and the vocabulary names lowered to them.", "",
            *_canonical_section(reg, pnnx, list(tnn.values())), ""]
    return "\n".join(out)


def _expr_table(rows: list[Row]) -> list[str]:
    out = ["| function | status | canonical op | tests |", "|---|---|---|---|"]
    for r in rows:
        out.append(f"| `{r.name[len(EXPR_PREFIX):]}` | {r.status} | {_lowering(r)} | {_coverage(r)} |")
    return out


def _tnn_cells(voc: Vocabulary, name: str) -> list[str]:
    entry = next(e for e in voc.entries if e.name == name)
    return [f"`{entry.fields[0]}`", " ".join(entry.fields[1:])]


def _extra_section(reg: Registries, pnnx_voc: Vocabulary, tnn_voc: Vocabulary) -> list[str]:
    pnnx_names, tnn_names = {e.name for e in pnnx_voc.entries}, {e.name for e in tnn_voc.entries}
    pnnx_extra = sorted(set(reg.pnnx) - pnnx_names, key=str.lower)
    tnn_extra = sorted((set(reg.tnn) | set(reg.tnn_quantized)) - tnn_names, key=str.lower)
    return ["## Handled, not in the vocabularies", "",
            "Types a handler takes that the vocabularies do not list (names older pnnx versions wrote, torch "
            "aliases, ONNX-style names):", "",
            "- pnnx: " + (", ".join(f"`{n}`" for n in pnnx_extra) or "none"),
            "- TNN: " + (", ".join(f"`{n}`" for n in tnn_extra) or "none"), ""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/OPERATORS.md is stale")
    args = ap.parse_args()
    text = render()
    if args.check:
        stale = not DOC.exists() or DOC.read_text() != text
        print(f"{DOC.relative_to(REPO)} is {'stale' if stale else 'up to date'}")
        return int(stale)
    DOC.write_text(text)
    print(f"wrote {DOC.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
