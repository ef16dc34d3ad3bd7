"""Which tests mention an op, for tools/make_operators_doc.py. Kept simple, and honest about being a text search:

- a test file (outside tests/fixtures and tests/tools) mentions an op when it holds a model line of that type
  (`type name n_in n_out ...`, the way .pnnx.param and .tnnproto lines are written, Python strings included) or,
  for dotted names (`nn.Conv2d`, `aten::addcmul`), the name in quotes; TNN's bare layer names (`Add`) count in
  quotes only in test files whose path says tnn;
- a fixture mentions an op when its model file (.pnnx.param, .tnnproto) holds a line of that type;
- a pnnx.Expression function is mentioned where it is called in an `expr=` value, in a line of a test holding an
  operand (`@0`), or in an expression golden (a `<case>/expr` string in an .npz under tests/) that a test names.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

LAYER_LINE = re.compile(r"""(?:^|["'])[ \t]*([A-Za-z_][\w.:]*)[ \t]+[^\s"']+[ \t]+\d+[ \t]+\d+(?=[ \t"',]|$)""",
                        re.M)
QUOTED = re.compile(r"""["']([A-Za-z_][\w.:]*)["']""")
CALL = re.compile(r"([A-Za-z_][\w.]*)\(")
OPERAND = re.compile(r"@\d")
EXPR_PARAM = re.compile(r"\bexpr=(\S+)")
MODEL_SUFFIXES = (".param", ".tnnproto")


@dataclass
class Mentions:
    lines: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # type -> test files
    quoted: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # name -> test files
    calls: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # expr function -> test files
    fixture_lines: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # type -> fixtures
    fixture_calls: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))  # function -> fixtures

    def pnnx(self, name: str) -> tuple[list[str], list[str]]:
        tests = self.lines.get(name, set()) | self.quoted.get(name, set())
        return sorted(tests), sorted(f for f in self.fixture_lines.get(name, set()) if not f.endswith(".tnnproto"))

    def tnn(self, name: str) -> tuple[list[str], list[str]]:
        quoted = {t for t in self.quoted.get(name, set()) if "tnn" in t}
        tests = self.lines.get(name, set()) | quoted
        return sorted(tests), sorted(f for f in self.fixture_lines.get(name, set()) if f.endswith(".tnnproto"))

    def expression(self, function: str) -> tuple[list[str], list[str]]:
        return sorted(self.calls.get(function, set())), sorted(self.fixture_calls.get(function, set()))


def _functions(expr: str) -> set[str]:
    return set(CALL.findall(expr))


def scan(tests_root: Path) -> Mentions:
    """Reads every test file and fixture model under `tests_root` once."""
    m = Mentions()
    skipped = (tests_root / "fixtures", tests_root / "tools")  # fixture generators; the tests of this tool
    texts = {}
    for path in sorted(tests_root.rglob("*.py")):
        if any(d in path.parents for d in skipped):
            continue
        rel, text = path.relative_to(tests_root).as_posix(), path.read_text(errors="replace")
        texts[rel] = text
        for t in LAYER_LINE.findall(text):
            m.lines[t].add(rel)
        for q in QUOTED.findall(text):
            if "." in q or "::" in q or "tnn" in rel:
                m.quoted[q].add(rel)
        for line in text.splitlines():
            if OPERAND.search(line):
                for fn in _functions(line):
                    m.calls[fn].add(rel)
    for path in sorted(p for p in tests_root.rglob("*") if p.name.endswith(MODEL_SUFFIXES)):
        rel, text = path.relative_to(tests_root).as_posix(), path.read_text(errors="replace")
        for t in LAYER_LINE.findall(text):
            m.fixture_lines[t].add(rel)
        for expr in EXPR_PARAM.findall(text):
            for fn in _functions(expr):
                m.fixture_calls[fn].add(rel)
    for path in sorted(tests_root.rglob("*.npz")):
        readers = [rel for rel, text in texts.items() if path.name in text]
        with np.load(path) as data:
            exprs = [str(data[k]) for k in data.files if k.endswith("/expr")]
        for fn in set().union(*map(_functions, exprs)) if exprs else ():
            for rel in readers:
                m.calls[fn].add(rel)
    return m
