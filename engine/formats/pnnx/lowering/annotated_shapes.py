"""The shapes and dtypes pnnx writes beside the operands (`#3=(1,16,32,32)f32`) are torch's own, recorded while
tracing. After lowering, shape inference at the file's input shapes must agree with them: a lowering that read an
operand in the wrong role (a shared weight taken as an op's indices), an operand of an unexpected rank or dtype,
or an op that computes something torch did not, shows up as a shape or dtype the file contradicts, and the model
is refused at load instead of answering wrongly.

With static input shapes inference runs strictly, so an op that refuses its inputs stops the load there. With
dynamic ones (`?` dims), or where a size depends on the data (x[mask]: the file holds the traced count), it runs at
two probe sizes (engine.passes.infer_shapes) and only the dims static in both the file and the inference are
compared; the instance checks again, strictly, at its max shapes.
"""

from __future__ import annotations

import re

import numpy as np

from engine.errors import ModelFormatError
from engine.ir import Graph, Value
from engine.ops.registry import OPS, TensorInfo
from engine.passes.infer_shapes import infer_infos, infer_shapes

Note = tuple[tuple[int, ...], np.dtype]

# The engine computes float16 and bfloat16 models in float32 (their weights are read as float32), so a value the
# file annotates as one of them is inferred as float32.
WIDENED = {np.dtype(np.float16): np.dtype(np.float32)}


def snapshot(graph: Graph) -> dict[Value, Note]:
    """The annotated shape and dtype of every operand an operator produces (before lowering rewrites it)."""
    return {v: (tuple(v.shape), np.dtype(v.dtype)) for n in graph.nodes for v in n.outputs
            if v.shape is not None and v.dtype is not None}


def check(graph: Graph, notes: dict[Value, Note]) -> None:
    """Raises ModelFormatError at the first operand whose inferred shape or dtype the file's annotation
    contradicts. Graph inputs without a shape or dtype leave nothing to infer from."""
    if not notes or any(v.shape is None or v.dtype is None for v in graph.inputs):
        return
    inferred = _infer(graph)
    for v, note in notes.items():
        got = inferred.get(v)
        if got is not None and not _agrees(note, got):
            raise _contradiction(graph, v, note, got)


def _infer(graph: Graph) -> dict[Value, Note]:
    if all(d >= 0 for v in graph.inputs for d in v.shape):
        inputs = {v: TensorInfo(tuple(v.shape), np.dtype(v.dtype)) for v in graph.inputs}
        infos = infer_infos(graph, inputs, strict=True)
        if not any(n.op_type in OPS and OPS[n.op_type].extent_dims for n in graph.nodes):
            return {v: (tuple(i.shape), np.dtype(i.dtype)) for v, i in infos.items()}
        # a size that depends on the data (x[mask]) is the traced count in the file and the bound here: the
        # probes of infer_shapes make the dims that follow it -1, so they are not compared
    infer_shapes(graph)  # what it cannot infer keeps the file's annotation, so it is not compared
    return {v: (tuple(v.shape), np.dtype(v.dtype)) for n in graph.nodes for v in n.outputs
            if v.shape is not None and v.dtype is not None}


def _agrees(note: Note, got: Note) -> bool:
    (shape, dtype), (gshape, gdtype) = note, got
    if len(shape) != len(gshape) or any(a >= 0 and b >= 0 and a != b for a, b in zip(shape, gshape, strict=True)):
        return False
    return gdtype == WIDENED.get(dtype, dtype)


def _contradiction(graph: Graph, v: Value, note: Note, got: Note) -> ModelFormatError:
    node = v.producer
    where = node.source if node is not None else ""
    m = re.search(r":(\d+)$", where)
    what = f"{node.op_type} node {node.name!r}" if node is not None else "a value"
    return ModelFormatError(graph.path or where, f"operand {v.name!r} ({what}): the file says {_fmt(note)}, as "
                            f"torch computed it, the lowered graph computes {_fmt(got)}; refusing the model "
                            "rather than answering wrongly", line=int(m.group(1)) if m else None)


def _fmt(note: Note) -> str:
    shape, dtype = note
    return "(" + ",".join("?" if d < 0 else str(d) for d in shape) + ")" + str(dtype)
