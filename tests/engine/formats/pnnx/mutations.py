"""Mistyped versions of an op_corpus Sample: one operand of another dtype or rank, an extra operand, a missing one,
two operands in each other's role. Each keeps the rest of the line, its output annotations included, so the
model still claims what torch computed for the original."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
from op_corpus import Line, Sample

from engine.formats.pnnx.param_values import parse_annotation

OTHER_DTYPE = {"f32": "i64", "f16": "i64", "f64": "i64", "i64": "f32", "i32": "f32", "i8": "f32", "u8": "f32",
               "bool": "f32"}
NUMPY = {"f32": np.float32, "i64": np.int64, "bool": np.bool_}


def _note(shape: tuple[int, ...], code: str) -> str:
    return "(" + ",".join(map(str, shape)) + ")" + code


def _renote(line: Line, operand: str, note: str) -> Line:
    items = [f"#{operand}={note}" if i.startswith(f"#{operand}=") else i for i in line.items]
    if line.type == "pnnx.Attribute" and operand in line.outs:
        items = [f"@data={note}" if i.startswith("@data=") else i for i in items]
    return replace(line, items=items)


def with_note(sample: Sample, operand: str, shape: tuple[int, ...], code: str) -> Sample:
    """The sample with `operand` annotated (and, for a graph input or a weight, made) of this shape and dtype."""
    note = _note(shape, code)
    out = replace(sample, op=_renote(sample.op, operand, note), inputs=dict(sample.inputs),
                  feeders=[_renote(f, operand, note) for f in sample.feeders], weights=dict(sample.weights))
    if operand in out.inputs:
        out.inputs[operand] = note
    for f in out.feeders:
        if f.type == "pnnx.Attribute" and operand in f.outs:
            rng = np.random.default_rng(0)
            out.weights[f"{f.name}.data"] = (rng.standard_normal(shape) * 3).astype(NUMPY[code])
    return out


def _typed_operands(sample: Sample) -> dict[str, tuple[tuple[int, ...], str]]:
    """Operands whose shape and dtype the model sets: graph inputs and weights (pnnx.Attribute)."""
    out = {op: parse_annotation(note) for op, note in sample.inputs.items() if op in sample.op.ins}
    for f in sample.feeders:
        if f.type == "pnnx.Attribute" and f.outs[0] in sample.op.ins:
            spec = next(i for i in f.items if i.startswith("@data="))
            out[f.outs[0]] = parse_annotation(spec.split("=", 1)[1])
    return out


@dataclass(frozen=True)
class Mutation:
    kind: str  # dtype, rank+, rank-, extra, missing, swap
    roles: tuple[str, ...]  # the operands' roles: `$` tags, else `@<position>`
    text: str


def role(line: Line, operand: str) -> str:
    return line.tag(operand) or f"@{line.ins.index(operand)}"


def mutations(sample: Sample) -> Iterator[tuple[Mutation, Sample]]:
    op = sample.op
    for operand, (shape, code) in _typed_operands(sample).items():
        r = (role(op, operand),)
        if code in OTHER_DTYPE:
            yield Mutation("dtype", r, f"{operand} as {OTHER_DTYPE[code]}"), with_note(sample, operand, shape,
                                                                                     OTHER_DTYPE[code])
            if code != "bool":
                yield Mutation("dtype", r, f"{operand} as bool"), with_note(sample, operand, shape, "bool")
        yield Mutation("rank+", r, f"{operand} with a leading dim"), with_note(sample, operand, (2, *shape), code)
        if shape:
            yield Mutation("rank-", r, f"{operand} without its first dim"), with_note(sample, operand, shape[1:],
                                                                                    code)
    first = next(iter(sample.inputs.values()), "(2,3)f32")
    extra = replace(sample, op=replace(op, ins=[*op.ins, "extra_operand"],
                                       items=[*op.items, f"#extra_operand={first}"]),
                    inputs={**sample.inputs, "extra_operand": first})
    yield Mutation("extra", (), "an extra operand"), extra
    for i, operand in enumerate(op.ins):
        ins = op.ins[:i] + op.ins[i + 1:]
        items = [it for it in op.items if not (it.startswith("$") and it.endswith(f"={operand}"))]
        yield (Mutation("missing", (role(op, operand),), f"without operand {i} ({operand})"),
               replace(sample, op=replace(op, ins=ins, items=items)))
    notes = {o: op.note(o) for o in op.ins}
    for i in range(len(op.ins)):
        for j in range(i + 1, len(op.ins)):
            a, b = op.ins[i], op.ins[j]
            if a == b or notes[a] == notes[b]:
                continue  # indistinguishable: the file would describe a valid model
            ins = list(op.ins)
            ins[i], ins[j] = b, a
            items = [_swap_tag(it, a, b) for it in op.items]
            yield (Mutation("swap", (role(op, a), role(op, b)), f"operands {a} and {b} swapped"),
                   replace(sample, op=replace(op, ins=ins, items=items)))


def _swap_tag(item: str, a: str, b: str) -> str:
    if not item.startswith("$"):
        return item
    name, _, operand = item.partition("=")
    return f"{name}={b}" if operand == a else f"{name}={a}" if operand == b else item
