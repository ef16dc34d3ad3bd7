"""The TNN writer's rule table: canonical op type -> rule writing TNN layers for one node. Rule modules register
with @writes, or a table of made rules with register()."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from engine.formats.tnn.writer.core import Writer
from engine.ir import Node

Rule = Callable[[Writer, Node], None]
RULES: dict[str, Rule] = {}


def register(table: Mapping[str, Rule]) -> None:
    for op_type, rule in table.items():
        if op_type in RULES:
            raise ValueError(f"op {op_type!r} has two TNN writer rules")
        RULES[op_type] = rule


def writes(*op_types: str) -> Callable[[Rule], Rule]:
    def deco(fn: Rule) -> Rule:
        register(dict.fromkeys(op_types, fn))
        return fn
    return deco
