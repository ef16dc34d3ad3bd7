"""lower_pnnx: replaces every pnnx operator (`pnnx:nn.Conv2d`, `pnnx:torch.cat`, ...) by the canonical ops of
engine/ops/SPEC.md, through the handler each op family module registers. Dispatch is on the pnnx type only, never
on operator names (pnnx keeps `Tensor.select_21` as the name of a `torch.unbind`).
"""

from __future__ import annotations

from engine.errors import EngineError, UnsupportedOpError
from engine.formats.pnnx.lowering import (  # noqa: F401  (each registers its handlers)
    activations,
    annotated_shapes,
    attention,
    convolution,
    creation,
    cut_join,
    elementwise,
    expression,
    indexing,
    layout,
    linear,
    lists,
    normalization,
    pooling,
    recurrent,
    reduce,
    resize_pad,
    scatter,
    transformer_encoder,
    unfold,
    unread_params,
    volume,
)
from engine.formats.pnnx.lowering.context import PREFIX, Ctx
from engine.formats.pnnx.lowering.registry import HANDLERS
from engine.formats.pnnx.lowering.unread_params import TrackedParams
from engine.ir import Graph

# The pnnx types (without prefix) lower_pnnx handles.
HANDLED_TYPES: frozenset[str] = frozenset(HANDLERS)

# Types refused on purpose, with the reason the error gives (docs/pnnx_export_bugs.md).
REFUSED: dict[str, str] = {
    "aten::zero": "(an in-place zero_(): pnnx writes the zeroed value but drops its write-back into the tensor it "
                  "was a slice of, as in torchvision's Swin-V2 `qkv_bias[n:2 * n].zero_()`, so the file does not "
                  "compute what the model did; zero out of place (torch.cat or a mask) and export again: "
                  "docs/pnnx_export_bugs.md)",
}


def lower_pnnx(graph: Graph) -> Graph:
    """Replaces every `pnnx:*` node by canonical ops; unknown types raise UnsupportedOpError with file:line,
    parameters or operands a handler cannot use ModelFormatError with file:line, and a lowered graph whose shapes or
    dtypes contradict the file's annotations ModelFormatError."""
    notes = annotated_shapes.snapshot(graph)
    removed: set[int] = set()
    pending, graph.nodes = graph.nodes, []  # rebuilt in order as the nodes are lowered (context.py says how)
    for node in pending:
        if id(node) in removed:
            continue
        if not node.op_type.startswith(PREFIX):
            graph.nodes.append(node)
            continue
        params = node.params = TrackedParams(node.params)
        attrs = set(node.attrs)
        ctx = Ctx(graph, node, removed)
        handler = HANDLERS.get(ctx.type)
        if handler is None:
            reason = REFUSED.get(ctx.type)  # refused on purpose: the reason, not the list of what is handled
            raise UnsupportedOpError(f"{ctx.type} {reason}" if reason else ctx.type, node.name, node.where(),
                                     None if reason else sorted(HANDLERS))
        ctx.drop_shared_parameters()
        originals = list(node.inputs)
        try:
            handler(ctx)
        except EngineError:
            raise
        except Exception as e:  # a handler tripping over operands it did not expect: the file is not what it read
            raise ctx.fail(f"cannot be lowered from these operands and params ({type(e).__name__}: {e})") from e
        unread_params.check(ctx, params, attrs)
        unused = ctx.unused_inputs(originals)
        if unused:
            tags = dict(zip(map(id, originals), ctx.arg_names, strict=False))
            names = ", ".join(f"{v.name!r}" + (f" (${tags[id(v)]})" if tags.get(id(v)) else "") for v in unused)
            raise ctx.unsupported(f"operand(s) {names} the lowering does not use")
        if ctx.kept:
            graph.nodes.append(node)
    graph.drop_nodes(removed)
    _drop_unused_scalars(graph)
    graph.validate()
    annotated_shapes.check(graph, notes)
    return graph


def _drop_unused_scalars(graph: Graph) -> None:
    # Input-less expressions (`expr=32`, `expr=None`) feed scalar arguments that lowering folded into params;
    # `None` has no tensor value, so leaving them for shape inference would fail.
    gone = set()
    for node in [n for n in graph.nodes if n.op_type == "Expression" and not n.inputs]:
        if not any(v.consumers or v in graph.outputs for v in node.outputs):
            graph.unlink(node)
            gone.add(id(node))
    graph.drop_nodes(gone)
