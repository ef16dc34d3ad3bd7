"""merge_transposes: Transpose -> reshape -> Transpose on static shapes becomes one Transpose between two reshapes
(views), where the reshape only splits and joins whole groups of axes: one copy of the tensor instead of two.

MobileViT's unfold and fold (`reshape(B*C*nh, ph, nw, pw).transpose(1, 2).reshape(B, C, N, P).transpose(1, 3)`
and back) are such chains. Both reshapes are refined to their finest common factors; the first Transpose's input
seen at those factors, the two permutations compose into one. A reshape whose axis boundaries do not line up
(6x4 -> 4x6) cannot be written so: the chain is left alone, as it is when a shape is not static, when an
intermediate has another reader or is a graph output, or when the middle op is not a pure reshape (Reshape,
Flatten, Squeeze, Unsqueeze). The data moved is the same element for element: numerics are untouched.
"""

from __future__ import annotations

from engine.ir import Graph, Node
from engine.ops.shape import transpose_perm
from engine.passes.graph_edit import is_static, single_consumer

RESHAPES = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}


def merge_transposes(graph: Graph) -> Graph:
    for node in list(graph.nodes):  # the rewrite changes nodes in place, never the list: no membership test
        if node.op_type == "Transpose":
            _merge(graph, node)
    return graph


def _merge(graph: Graph, first: Node) -> None:
    mid = single_consumer(graph, first.outputs[0])
    if mid is None or mid.op_type not in RESHAPES or mid.inputs[0] is not first.outputs[0]:
        return
    second = single_consumer(graph, mid.outputs[0])
    if second is None or second.op_type != "Transpose" or len(second.inputs) != 1 or len(first.inputs) != 1:
        return
    x, y1, y2, y3 = first.inputs[0], first.outputs[0], mid.outputs[0], second.outputs[0]
    if not all(is_static(v.shape) for v in (x, y1, y2, y3)) or len(mid.outputs) != 1:
        return
    plan = compose(tuple(x.shape), transpose_perm(first, len(x.shape)), tuple(y2.shape),
                   transpose_perm(second, len(y2.shape)))
    if plan is None:
        return
    rewrite_chain(first, mid, second, *plan)


def rewrite_chain(first: Node, mid: Node, second: Node, factors: tuple[int, ...], perm: list[int]) -> None:
    """first -> mid -> second (first and mid single-output, each read only by the next) becomes
    Reshape(to factors) -> Transpose(perm) -> Reshape(to second's output shape), in place: the two Reshapes are
    views, the Transpose the one copy (a Reshape too when perm is the identity)."""
    y1, y2, y3 = first.outputs[0], mid.outputs[0], second.outputs[0]
    for node in (first, mid, second):
        for v in node.inputs[1:]:
            while node in v.consumers:
                v.consumers.remove(node)
        node.inputs = node.inputs[:1]
    first.op_type, first.params = "Reshape", {"shape": list(factors)}
    y1.shape = tuple(factors)
    if perm == list(range(len(perm))):  # the permutations cancel out: the chain only reshapes
        mid.op_type, mid.params = "Reshape", {"shape": list(factors)}
    else:
        mid.op_type, mid.params = "Transpose", {"perm": list(perm)}
    y2.shape = tuple(factors[p] for p in perm)
    second.op_type, second.params = "Reshape", {"shape": list(y3.shape)}


def compose(x_shape: tuple[int, ...], p1: list[int], mid_shape: tuple[int, ...],
            p2: list[int]) -> tuple[tuple[int, ...], list[int]] | None:
    """(factors, perm) with transpose(reshape(transpose(x, p1), mid_shape), p2) equal to
    transpose(reshape(x, factors), perm) reshaped; None when the reshape does not split and join whole axes."""
    y1_shape = tuple(x_shape[p] for p in p1)
    refined = _refine(y1_shape, mid_shape)
    if refined is None:
        return None
    g1, g2, sizes = refined  # factor ids (in y1's element order) of each axis of y1 and of mid_shape
    x_groups: list[list[int]] = [[] for _ in x_shape]
    for axis, p in enumerate(p1):
        x_groups[p] = g1[axis]
    order = [f for grp in x_groups for f in grp]  # the factor ids in x's element order
    wanted = [f for axis in p2 for f in g2[axis]]  # ... and in the output's
    where = {f: i for i, f in enumerate(order)}
    return tuple(sizes[f] for f in order), [where[f] for f in wanted]


def _refine(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[list[list[int]], list[list[int]], list[int]] | None:
    """The finest common factors of two shapes with the same element count: the factor ids (0, 1, ...) each axis
    of `a` and of `b` is made of (size-1 axes get none) and the factors' sizes. None when an axis boundary of one
    falls inside an axis of the other at a point that does not divide it (6x4 -> 4x6)."""
    if _product(a) != _product(b) or _product(a) <= 1:
        return None
    bounds = sorted(set(_cumulative(a)) | set(_cumulative(b)))  # where a factor ends, in elements
    sizes = []
    for lo, hi in zip([1, *bounds], bounds, strict=False):
        if hi % lo:
            return None
        sizes.append(hi // lo)
    index = {v: i for i, v in enumerate(bounds)}

    def groups(shape: tuple[int, ...]) -> list[list[int]]:
        out, start, acc = [], 0, 1
        for d in shape:
            acc *= d
            end = index[acc] + 1 if d != 1 else start
            out.append(list(range(start, end)))
            start = end
        return out
    return groups(a), groups(b), sizes


def _cumulative(shape: tuple[int, ...]) -> list[int]:
    out, acc = [], 1
    for d in shape:
        acc *= d
        if d != 1:
            out.append(acc)
    return out


def _product(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
