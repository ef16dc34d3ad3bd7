"""docs/OPERATORS.md is what tools/make_operators_doc.py writes from the lowering registries now (so it cannot go
stale), and every name of the vocabularies in docs/vocabulary/ has a status row there."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT / "tools"))
make_operators_doc = importlib.import_module("make_operators_doc")

STATUSES = (make_operators_doc.SUPPORTED, make_operators_doc.READER, make_operators_doc.NOT_HANDLED)


@pytest.fixture(scope="module")
def rendered() -> str:
    return make_operators_doc.render()


def test_committed_doc_is_what_the_tool_writes(rendered: str) -> None:
    committed = (REPO_ROOT / "docs" / "OPERATORS.md").read_text()
    assert committed == rendered, "docs/OPERATORS.md is stale: run .venv/bin/python tools/make_operators_doc.py"


@pytest.mark.parametrize("file", ["pnnx_ops.txt", "tnn_layers.txt"])
def test_every_vocabulary_name_has_a_status_row(rendered: str, file: str) -> None:
    voc = make_operators_doc.read_vocabulary(make_operators_doc.VOCABULARY / file)
    names = [e.name for e in voc.entries]
    assert len(names) > 100 and len(set(names)) == len(names), f"{file}: {len(names)} names, duplicates?"
    assert all(e.group in voc.groups for e in voc.entries), f"{file}: an entry outside a declared group"
    statuses = "|".join(map(re.escape, STATUSES))
    for name in names:
        shown = name.removeprefix(make_operators_doc.EXPR_PREFIX)
        row = re.compile(rf"^\| `{re.escape(shown)}` \|(?:[^|\n]*\|)*? ({statuses}) \|", re.M)
        assert row.search(rendered), f"{file}: no status row for {name!r} in docs/OPERATORS.md"
