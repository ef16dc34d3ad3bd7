"""The runnable steps of a Markdown guide, and how to run one.

Every fenced block a reader is meant to type is preceded by a marker naming who runs it:

    <!-- step: walk -->                      run by tests/e2e/test_walk.py (nnserve installed, on a fresh clone)
    <!-- step: server -->                    started there as the server the next steps talk to
    <!-- step: dev; file export.py -->       run by a tools/ script with the dev extra (torch, pnnx); `file` writes
                                             the block to that file instead of running it
    <!-- step: walk; prints TEXT -->         ... and its output must contain TEXT
    <!-- step: none; why REASON -->          not run, for the reason given

`sh` blocks run with bash -e, `python` blocks with the given interpreter. Blocks without a marker
must be `text` (layouts, config excerpts): `unmarked_blocks` finds the others, so a new command cannot go untested.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

WHO = ("walk", "server", "dev", "none")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)
MARKER = re.compile(r"<!-- step: (.*?) -->")


class StepError(AssertionError):
    """A step that failed, with where it is written and what it printed."""


@dataclass(frozen=True)
class Step:
    source: str  # the guide's path, for messages
    line: int  # the line of the opening fence
    who: str
    lang: str  # sh, python
    code: str
    file: str | None = None
    prints: str | None = None
    why: str | None = None

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"


def steps(text: str, source: str) -> list[Step]:
    """The marked blocks of `text`, in order."""
    out = []
    for fence in FENCE.finditer(text):
        above = text[text.rfind("\n", 0, max(fence.start() - 1, 0)) + 1:fence.start()].strip()
        marker = MARKER.fullmatch(above)
        if marker is None:
            continue
        who, *parts = marker.group(1).split(";")
        options = dict(_option(part) for part in parts)
        if who.strip() not in WHO or set(options) - {"file", "prints", "why"}:
            raise ValueError(f"{source}: bad step marker {above!r}")
        line = text.count("\n", 0, fence.start()) + 1
        out.append(Step(source, line, who.strip(), fence.group(1), fence.group(2), **options))
    return out


def _option(part: str) -> tuple[str, str]:
    key, _, value = part.strip().partition(" ")
    return key, value.strip()


def unmarked_blocks(text: str) -> list[tuple[int, str]]:
    """(line, language) of each fenced block that is neither marked nor `text`."""
    marked = {s.line for s in steps(text, "")}
    return [(text.count("\n", 0, f.start()) + 1, f.group(1)) for f in FENCE.finditer(text)
            if f.group(1) != "text" and text.count("\n", 0, f.start()) + 1 not in marked]


def run(step: Step, cwd: Path, env: dict[str, str], python: str, timeout: float = 600) -> str:
    """Runs one step in `cwd` and returns its output; raises StepError naming the step when it fails."""
    if step.file:
        (cwd / step.file).write_text(step.code)
        return ""
    if step.lang == "python":
        argv = [python, "-c", step.code]
    elif step.lang == "sh":
        argv = ["bash", "-e", "-c", step.code]  # no pipefail: `... | head` is how users read long output
    else:
        raise StepError(f"{step.where}: a step must be sh or python, not {step.lang!r}")
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise StepError(f"{step.where}: the step exited {proc.returncode}:\n{step.code}\n--- output:\n{output[-4000:]}")
    if step.prints and step.prints not in proc.stdout:
        raise StepError(f"{step.where}: the step should print {step.prints!r}:\n{step.code}\n--- output:\n"
                        f"{output[-4000:]}")
    return proc.stdout
