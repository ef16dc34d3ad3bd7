"""write_tnn: writes a canonical (lowered) graph as a TNN model, `<prefix>.tnnproto` + `<prefix>.tnnmodel`, one
registered rule per node.

    write_tnn(engine.load("m.pnnx.param").graph, "out/m", version=2, fp16=False)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.errors import UnsupportedOpError
from engine.formats.tnn.writer import (  # noqa: F401  (each registers its rules)
    activations,
    binary,
    conv_pool,
    layout,
    linear,
    normalization,
    pad_resize,
    reduce,
    tensor,
)
from engine.formats.tnn.writer.core import Writer
from engine.formats.tnn.writer.int8 import link_int8_names
from engine.formats.tnn.writer.registry import RULES
from engine.ir import Graph


def write_tnn(graph: Graph, prefix: str | Path, version: int = 2, fp16: bool = False,
              input_shapes: dict[str, tuple[int, ...]] | None = None) -> tuple[Path, Path]:
    """Writes `<prefix>.tnnproto` and `<prefix>.tnnmodel`; returns both paths.

    `input_shapes` fixes inputs with dynamic dims (TNN records one shape per input)."""
    w = Writer(graph, version, fp16, input_shapes)
    link_int8_names(w)
    for node in graph.nodes:
        w.node = node
        rule = RULES.get(node.op_type)
        if rule is None:
            w.unsupported()
        rule(w, node)
    w.node = None
    for blob, scale in w.blob_scales.items():
        w.resources.append(("BlobScale", f"{blob}_scale_data_",
                            [w.raw(scale, False), w.raw(np.zeros(scale.size, np.int32), False)]))
    for v in graph.outputs:
        if v.is_const or v in graph.inputs:
            raise UnsupportedOpError("graph output that is an input or a constant in a TNN file", v.name)
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    proto, model = Path(f"{prefix}.tnnproto"), Path(f"{prefix}.tnnmodel")
    proto.write_text(w.proto_text())
    model.write_bytes(w.model_bytes())
    return proto, model
