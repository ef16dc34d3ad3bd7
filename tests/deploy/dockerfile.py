"""A small Dockerfile reader for the deploy tests: instructions, stages, ARG/ENV expansion, .dockerignore."""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

_VAR = re.compile(r"\$\{(\w+)\}|\$(\w+)")


@dataclass
class Instruction:
    cmd: str  # upper case: FROM, RUN, COPY, ...
    value: str  # the rest, continuation lines joined

    def exec_form(self) -> list[str] | None:
        """The JSON-array form (ENTRYPOINT ["a", "b"]), or None for shell form."""
        text = self.value.strip()
        if text.startswith("["):
            return json.loads(text)
        return None


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def all(self, cmd: str) -> list[Instruction]:
        return [i for i in self.instructions if i.cmd == cmd]


def instructions(text: str) -> list[Instruction]:
    """Instructions in order; comments dropped, backslash continuations joined (heredocs are not used)."""
    out: list[Instruction] = []
    pending = ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if pending and line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        cmd, _, value = full.partition(" ")
        out.append(Instruction(cmd.upper(), value.strip()))
    return out


def expand(text: str, values: dict[str, str]) -> str:
    return _VAR.sub(lambda m: values.get(m.group(1) or m.group(2), m.group(0)), text)


def _pairs(value: str) -> dict[str, str]:
    """`ENV A=1 B="x y"` / `ARG A=1` -> {A: 1, B: x y}; a bare `ARG A` has no default."""
    out = {}
    for token in shlex.split(value):
        key, sep, val = token.partition("=")
        if sep:
            out[key] = val
    return out


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: list[Stage]

    @classmethod
    def parse(cls, path: Path) -> Dockerfile:
        global_args: dict[str, str] = {}
        stages: list[Stage] = []
        for ins in instructions(path.read_text()):
            if ins.cmd == "FROM":
                words = ins.value.split()
                stages.append(Stage(base=words[0], name=words[2] if len(words) > 2 else None))
            elif not stages:
                assert ins.cmd == "ARG", f"only ARG may precede the first FROM, found {ins.cmd}"
                global_args.update(_pairs(ins.value))
            else:
                stages[-1].instructions.append(ins)
                if ins.cmd == "ENV":
                    stages[-1].env.update(_pairs(ins.value))
        return cls(global_args, stages)

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    def chain(self, stage: Stage, build_args: dict[str, str] | None = None) -> list[Stage]:
        """The stage and every stage it is built FROM (nearest first), with build args applied to FROM lines."""
        args = {**self.global_args, **(build_args or {})}
        out = [stage]
        base = expand(stage.base, args)
        names = {s.name: s for s in self.stages if s.name}
        while base in names:
            out.append(names[base])
            base = expand(names[base].base, args)
        return out

    def image(self, stage: Stage, build_args: dict[str, str] | None = None) -> str:
        """The external image a stage ends up on."""
        args = {**self.global_args, **(build_args or {})}
        return expand(self.chain(stage, build_args)[-1].base, args)

    def env(self, stage: Stage, build_args: dict[str, str] | None = None) -> dict[str, str]:
        merged: dict[str, str] = {}
        for s in reversed(self.chain(stage, build_args)):
            merged.update(s.env)
        return merged


def dockerignore_allows(patterns: list[str], path: str) -> bool:
    """Whether .dockerignore lets `path` (or something under it) into the build context; last match wins."""
    allowed = True
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw[1:] if negate else raw
        pattern = pattern.strip("/")
        if pattern.startswith("**/"):
            hit = any(fnmatch.fnmatch(p.rsplit("/", 1)[-1], pattern[3:]) for p in prefixes)
        else:
            hit = any(fnmatch.fnmatch(p, pattern) for p in prefixes)
        if hit:
            allowed = negate
    return allowed


def dockerignore_patterns(path: Path) -> list[str]:
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
