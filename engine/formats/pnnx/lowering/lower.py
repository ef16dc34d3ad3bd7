"""lower_pnnx: replaces every pnnx operator (`pnnx:nn.Conv2d`, `pnnx:torch.cat`, ...) by the canonical ops of
engine/ops/SPEC.md, through the handler each op family module registers. Dispatch is on the pnnx type only, never
on operator names (pnnx keeps `Tensor.select_21` as the name of a `torch.unbind`).
"""

from __future__ import annotations

from engine.errors import EngineError, UnsupportedOpError
from engine.formats.pnnx.lowering import (  # noqa: F401  (each registers its handlers)
    activations,
    attention,
    convolution,
    cut_join,
    elementwise,
    expression,
    indexing,
    layout,
    linear,
    normalization,
    pooling,
    reduce,
    resize_pad,
    transformer_encoder,
)
from engine.formats.pnnx.lowering.context import PREFIX, Ctx
from engine.formats.pnnx.lowering.registry import HANDLERS
from engine.ir import Graph

# The pnnx types (without prefix) lower_pnnx handles.
HANDLED_TYPES: frozenset[str] = frozenset(HANDLERS)


def lower_pnnx(graph: Graph) -> Graph:
    """Replaces every `pnnx:*` node by canonical ops; unknown types raise UnsupportedOpError with file:line,
    parameters a handler cannot use ModelFormatError with file:line."""
    for node in list(graph.nodes):
        if not node.op_type.startswith(PREFIX):
            continue
        ctx = Ctx(graph, node)
        handler = HANDLERS.get(ctx.type)
        if handler is None:
            raise UnsupportedOpError(ctx.type, node.name, node.where(), sorted(HANDLERS))
        try:
            handler(ctx)
        except EngineError:
            raise
        except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError, OverflowError) as e:
            # parameters that parse but make no sense for the op (a size of 'N', an axis out of range)
            raise ctx.fail(f"inconsistent parameters or weights: {type(e).__name__}: {e}") from None
    _drop_unused_scalars(graph)
    graph.validate()
    return graph


def _drop_unused_scalars(graph: Graph) -> None:
    # Input-less expressions (`expr=32`, `expr=None`) feed scalar arguments that lowering folded into params;
    # `None` has no tensor value, so leaving them for shape inference would fail.
    for node in [n for n in graph.nodes if n.op_type == "Expression" and not n.inputs]:
        if not any(v.consumers or v in graph.outputs for v in node.outputs):
            graph.remove_node(node)
