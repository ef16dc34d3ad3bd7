"""Rules of the server's layout that a reader relies on, read from the sources: the server core (everything outside
server/protocol/) imports no protocol adapter except where the app wiring starts them, and only the CLI reads the
environment (into ServerSettings)."""

from __future__ import annotations

import ast
from pathlib import Path

SERVER = Path(__file__).resolve().parents[2] / "server"
WIRING = {"app.py"}  # starts the REST and gRPC adapters
SETTINGS_READER = {"cli.py"}


def core_modules() -> dict[str, ast.Module]:
    return {p.relative_to(SERVER).as_posix(): ast.parse(p.read_text()) for p in sorted(SERVER.rglob("*.py"))
            if "protocol" not in p.relative_to(SERVER).parts and not p.name.endswith("_pb2.py")}


def imported(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return names


def test_the_core_imports_no_protocol_adapter():
    for path, tree in core_modules().items():
        adapters = {n for n in imported(tree) if n.startswith("server.protocol")}
        assert not adapters or path in WIRING, f"server/{path} imports {sorted(adapters)}"


def test_only_the_cli_reads_the_environment():
    for path in sorted(SERVER.rglob("*.py")):
        rel = path.relative_to(SERVER).as_posix()
        if rel in SETTINGS_READER or path.name.endswith("_pb2.py"):
            continue
        tree = ast.parse(path.read_text())
        reads = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in ("environ", "getenv")]
        assert not reads, f"server/{rel} reads the environment at line(s) {reads}: read it in server/cli.py"
