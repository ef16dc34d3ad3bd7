"""Writer rules for Gather (a constant table or constant indices stored in the resource) and Cast."""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.constants import DTYPE_CODES
from engine.formats.tnn.writer.core import Writer, io_names
from engine.formats.tnn.writer.registry import writes
from engine.ir import Node


@writes("Gather")
def gather(w: Writer, node: Node) -> None:
    data, idx = node.inputs
    axis = int(node.params.get("axis", 0)) % len(w.shape(data))
    res: list = [("int", int(data.is_const))]
    if data.is_const:
        if w.version == 1 and np.asarray(data.const).ndim != 1:
            w.unsupported("with a constant table of rank > 1 in a v1 file")
        res.append(w.raw(data.const))
    res.append(("int", int(idx.is_const)))
    if idx.is_const:
        if w.version == 1 and np.asarray(idx.const).ndim != 1:
            w.unsupported("with constant indices of rank != 1 in a v1 file")
        res.append(w.raw(np.asarray(idx.const).astype(np.int32), False))
    ins = [w.name(v) for v in node.inputs if not v.is_const]
    w.layer("Gather", ins, [w.name(node.outputs[0])], [axis, int(data.is_const), int(idx.is_const)], res)


@writes("Cast")
def cast(w: Writer, node: Node) -> None:
    code = DTYPE_CODES.get(np.dtype(node.params["to"]))
    if code is None:
        w.unsupported(f"to {node.params['to']}")
    x, y = io_names(w, node)
    w.layer("Cast", [x], [y], [code])
