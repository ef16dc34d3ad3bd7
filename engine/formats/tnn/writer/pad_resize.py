"""Writer rules for Pad -> PadV2 and Resize -> Upsample."""

from __future__ import annotations

from engine.formats.tnn.writer.core import Writer, io_names
from engine.formats.tnn.writer.registry import writes
from engine.ir import Node

PAD_CODES = {"constant": 0, "reflect": 1, "edge": 2}


@writes("Pad")
def pad(w: Writer, node: Node) -> None:
    mode = node.params.get("mode", "constant")
    if mode not in PAD_CODES:
        w.unsupported(f"with mode {mode!r}")
    pads = [int(p) for p in node.params["pads"]]
    x, y = io_names(w, node)
    w.layer("PadV2", [x], [y], [len(pads) // 2, *pads, PAD_CODES[mode], float(node.params.get("value", 0.0))])


@writes("Resize")
def resize(w: Writer, node: Node) -> None:
    mode = {"nearest": 1, "bilinear": 2, "linear": 2}.get(node.params.get("mode", "nearest"))
    if mode is None:
        w.unsupported(f"with mode {node.params.get('mode')!r}")
    oh, ow = w.shape(node.outputs[0])[2:]
    x, y = io_names(w, node)
    w.layer("Upsample", [x], [y], [mode, 0.0, 0.0, int(bool(node.params.get("align_corners"))), oh, ow])
