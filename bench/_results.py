"""bench/RESULTS.md upkeep and the machine description every recorded run carries.

Several benches share RESULTS.md, each owning one `## <Section>`; a run is appended at the end of its own
section so the other sections (written by other benches) are never touched.
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "RESULTS.md"
HEADER = "# Benchmark results\n\nEvery figure below comes from one run of the command printed with it.\n"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def blas_description() -> str:
    """numpy's BLAS as threadpoolctl sees it (library, version, threads), or numpy's own config summary."""
    try:
        import numpy  # noqa: F401  (loads the BLAS so threadpoolctl can see it)
        from threadpoolctl import threadpool_info
    except ImportError:
        return "threadpoolctl not installed"
    parts = [f"{i.get('internal_api')} {i.get('version')} ({i.get('num_threads')} threads, {i.get('prefix')})"
             for i in threadpool_info() if i.get("user_api") == "blas"]
    return "; ".join(parts) or "no BLAS found"


def machine() -> str:
    return (f"{cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"numpy BLAS: {blas_description()}")


def source_tree() -> str:
    """The commit measured, and whether engine/ or server/ had uncommitted changes (the checkout is shared)."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "engine", "server"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}" + (f" plus uncommitted changes to {len(dirty.splitlines())} file(s) in engine/ or server/"
                        if dirty else "")


def command_line() -> str:
    """The exact command, with the interpreter and script relative to the repository."""
    exe = Path(sys.executable)
    try:
        exe = exe.relative_to(ROOT)
    except ValueError:
        exe = Path(exe.name)
    script = Path(sys.argv[0]).resolve()
    try:
        script = script.relative_to(ROOT)
    except ValueError:
        pass
    return shlex.join([str(exe), str(script), *sys.argv[1:]])


def append_run(section: str, body: str) -> None:
    """Appends one run (dated, with machine and command) at the end of `## section`, creating it if missing."""
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    run = (f"### Run {stamp}\n\nMachine: {machine()}; load average at the end {load} (the machine is shared)\n\n"
           f"Source: {source_tree()}\n\nCommand: `{command_line()}`\n\n{body.rstrip()}\n")
    append_text(section, run)


def append_text(section: str, block: str) -> None:
    """Appends `block` at the end of `## section` (created at the end of the file if missing)."""
    block = block.rstrip("\n") + "\n"
    text = RESULTS.read_text() if RESULTS.exists() else HEADER
    match = re.compile(rf"^## {re.escape(section)}\s*$", re.M).search(text)
    if match is None:
        text = text.rstrip("\n") + f"\n\n## {section}\n\n{block}"
    else:
        following = re.compile(r"^## ", re.M).search(text, match.end())
        end = following.start() if following else len(text)
        text = text[:end].rstrip("\n") + "\n\n" + block + ("\n" + text[end:] if following else "")
    RESULTS.write_text(text)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)
