"""Layout-only ops. Reshape/Flatten/Squeeze/Unsqueeze are aliases (the runtime makes the view, no kernel);
Transpose/Expand/Tile/Cast/Identity copy into the output, and Meshgrid broadcasts each of its 1-D inputs into
one grid. Every op here propagates known values, so shape arithmetic (Shape -> Gather -> Concat -> Reshape) is
done at infer time and never scheduled."""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import nullcontext

import numpy as np

from engine.errors import ShapeError
from engine.ir import Node
from engine.ir.dtypes import to_dtype
from engine.ops.registry import OpDef, TensorInfo, register
from engine.ops.rules import INT64, elements, ints, norm_axes, norm_axis, with_value


def _target(node: Node, ins: list[TensorInfo], arrays: list[np.ndarray] | None = None) -> list[int]:
    """The target shape of Reshape/Expand: input 1's value when present, else the `shape` param."""
    if arrays is not None and len(arrays) > 1:
        return ints(node, "shape", arrays[1])
    if len(ins) > 1:
        if ins[1].value is None:
            raise ShapeError(f"{node.where()}: {node.op_type} target shape input is not known before running")
        return ints(node, "shape", ins[1].value)
    if node.params.get("shape") is None:
        raise ShapeError(f"{node.where()}: {node.op_type} has neither a shape input nor a shape param")
    return ints(node, "shape", node.params["shape"])


def reshape_shape(node: Node, shape: tuple[int, ...], target: list[int]) -> tuple[int, ...]:
    """ONNX/TNN reshape: 0 copies the input dim at that index, one -1 takes what is left."""
    out = [shape[i] if d == 0 and i < len(shape) else d for i, d in enumerate(target)]
    if out.count(-1) > 1 or any(d < -1 for d in out):
        raise ShapeError(f"{node.where()}: Reshape target {target} is invalid")
    if -1 in out:
        known = elements([d for d in out if d != -1])
        if known == 0 or elements(shape) % known:
            raise ShapeError(f"{node.where()}: cannot reshape {shape} to {target}")
        out[out.index(-1)] = elements(shape) // known
    if elements(out) != elements(shape):
        raise ShapeError(f"{node.where()}: cannot reshape {shape} ({elements(shape)} elements) to {target}")
    return tuple(out)


def _flatten_shape(node: Node, shape: tuple[int, ...]) -> tuple[int, ...]:
    if not shape:
        return (1,)
    s = norm_axis(node, int(node.params.get("start_dim", 1)), len(shape))
    e = norm_axis(node, int(node.params.get("end_dim", -1)), len(shape))
    if e < s:
        raise ShapeError(f"{node.where()}: Flatten start_dim {s} is after end_dim {e}")
    return shape[:s] + (elements(shape[s:e + 1]),) + shape[e + 1:]


def _squeeze_shape(node: Node, shape: tuple[int, ...]) -> tuple[int, ...]:
    axes = node.params.get("axes")
    drop = {i for i, d in enumerate(shape) if d == 1} if axes is None else set(norm_axes(node, axes, len(shape)))
    return tuple(d for i, d in enumerate(shape) if not (i in drop and d == 1))  # torch keeps non-1 dims


def _unsqueeze_shape(node: Node, shape: tuple[int, ...]) -> tuple[int, ...]:
    axes = node.params.get("axes")
    axes = [axes] if isinstance(axes, int) else list(axes or [])
    rank = len(shape) + len(axes)
    pos = {norm_axis(node, int(a), rank) for a in axes}
    if len(pos) != len(axes):
        raise ShapeError(f"{node.where()}: Unsqueeze axes {axes} repeat a position")
    dims = iter(shape)
    return tuple(1 if i in pos else next(dims) for i in range(rank))


def transpose_perm(node: Node, rank: int) -> list[int]:
    perm = node.params.get("perm")
    if perm is None:
        return list(range(rank))[::-1]
    p = [norm_axis(node, int(a), rank) for a in perm]
    if sorted(p) != list(range(rank)):
        raise ShapeError(f"{node.where()}: Transpose perm {list(perm)} is not a permutation of rank {rank}")
    return p


def expand_shape(node: Node, shape: tuple[int, ...], target: list[int]) -> tuple[int, ...]:
    """torch `expand` (-1 keeps a dim) combined with ONNX Expand's two-way broadcasting; with `torch` set, torch's
    one-way rule alone (the target has at least the input's rank and only size-1 dims grow)."""
    if node.params.get("torch") and (len(target) < len(shape) or any(
            t not in (-1, x) and x != 1 for x, t in zip(reversed(shape), reversed(target), strict=False))):
        raise ShapeError(f"{node.where()}: cannot expand {shape} to {target} (torch's expand grows size-1 dims "
                         "only)")
    rank = max(len(shape), len(target))
    xs = (1,) * (rank - len(shape)) + tuple(shape)
    ts = [1] * (rank - len(target)) + list(target)
    out = []
    for i, (x, t) in enumerate(zip(xs, ts, strict=True)):
        if t == -1 and i >= rank - len(shape):
            out.append(x)
        elif x == t or x == 1 and t >= 0:
            out.append(t)
        elif t == 1:
            out.append(x)
        else:
            raise ShapeError(f"{node.where()}: cannot expand {shape} to {target}")
    return tuple(out)


def tile_reps(node: Node, rank: int) -> list[int]:
    reps = ints(node, "repeats", node.params.get("repeats"))
    if any(r < 0 for r in reps):
        raise ShapeError(f"{node.where()}: Tile repeats {reps} must be >= 0")
    return [1] * (rank - len(reps)) + reps


def _tile_shape(node: Node, shape: tuple[int, ...]) -> tuple[int, ...]:
    reps = tile_reps(node, len(shape))
    xs = (1,) * (len(reps) - len(shape)) + tuple(shape)
    return tuple(r * d for r, d in zip(reps, xs, strict=True))


def shape_slice(node: Node, shape: tuple[int, ...]) -> tuple[int, ...]:
    start, end = node.params.get("start", 0), node.params.get("end")
    return tuple(shape[start:end])


# op -> (output shape from (node, input infos), output dtype from input dtype)
_SHAPES: dict[str, Callable[[Node, list[TensorInfo]], tuple[int, ...]]] = {
    "Reshape": lambda n, ins: reshape_shape(n, ins[0].shape, _target(n, ins)),
    "Flatten": lambda n, ins: _flatten_shape(n, ins[0].shape),
    "Squeeze": lambda n, ins: _squeeze_shape(n, ins[0].shape),
    "Unsqueeze": lambda n, ins: _unsqueeze_shape(n, ins[0].shape),
    "Transpose": lambda n, ins: tuple(ins[0].shape[p] for p in transpose_perm(n, len(ins[0].shape))),
    "Expand": lambda n, ins: expand_shape(n, ins[0].shape, _target(n, ins)),
    "Tile": lambda n, ins: _tile_shape(n, ins[0].shape),
    "Cast": lambda n, ins: ins[0].shape,
    "Identity": lambda n, ins: ins[0].shape,
}


def _dtype(node: Node, dt: np.dtype) -> np.dtype:
    return to_dtype(node.params["to"]) if node.op_type == "Cast" else np.dtype(dt)


def _infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if not ins or len(ins) > (2 if node.op_type in ("Reshape", "Expand") else 1):
        raise ShapeError(f"{node.where()}: {node.op_type} got {len(ins)} inputs")
    out = TensorInfo(_SHAPES[node.op_type](node, ins), _dtype(node, ins[0].dtype))
    return with_value(node, ins, [out], _reference)


def float_to_int_cast(x_dtype: np.dtype, node: Node) -> bool:
    """A float-to-integer Cast: NaN, infinities and out-of-range values become what the CPU's conversion gives
    (INT64_MIN on x86), as in torch, without numpy's warning. Exports rely on it: T5's relative-position buckets
    take log(0) = -inf to int64 and then mask those entries out with a where."""
    return np.dtype(x_dtype).kind == "f" and _dtype(node, x_dtype).kind in "iu"


def _reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x, op = np.asarray(arrays[0]), node.op_type
    infos = [TensorInfo(tuple(a.shape), a.dtype, np.asarray(a)) for a in arrays]
    if op == "Transpose":
        y = np.transpose(x, transpose_perm(node, x.ndim))
    elif op == "Expand":
        y = np.broadcast_to(x, expand_shape(node, x.shape, _target(node, infos, arrays)))
    elif op == "Tile":
        y = np.tile(x, tile_reps(node, x.ndim))
    elif op == "Cast":
        with np.errstate(invalid="ignore") if float_to_int_cast(x.dtype, node) else nullcontext():
            y = x.astype(_dtype(node, x.dtype))
    else:
        y = x.reshape(_SHAPES[op](node, infos))
    return [np.array(y, copy=True)]


# -- Shape ----------------------------------------------------------------------------------------------------
def _shape_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len(ins) != 1:
        raise ShapeError(f"{node.where()}: Shape takes 1 input, got {len(ins)}")
    dims = np.array(shape_slice(node, ins[0].shape), dtype=INT64)
    return [TensorInfo((len(dims),), INT64, dims)]


def _shape_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    return [np.array(shape_slice(node, np.shape(arrays[0])), dtype=np.int64)]


def _arity(op: str) -> tuple[int, int]:
    return (1, 2) if op in ("Reshape", "Expand") else (1, 1)


# Shape rules that take a run-time extent (registry.OpDef.follows_extent): a Reshape that infers a -1 from it, a
# Flatten, a Squeeze of other dims; extents.py refuses one whose fixed target shape only the bound fits. An Expand
# or Tile to a shape fixed at load could not follow.
FOLLOWS_EXTENT = {"Unsqueeze", "Transpose", "Cast", "Identity", "Reshape", "Flatten", "Squeeze"}
register(*[OpDef(op, _infer, _reference, alias=True, arity=_arity(op), follows_extent=op in FOLLOWS_EXTENT)
           for op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze")])
register(*[OpDef(op, _infer, _reference, arity=_arity(op), follows_extent=op in FOLLOWS_EXTENT)
           for op in ("Transpose", "Expand", "Tile", "Cast", "Identity")])
register(OpDef("Shape", _shape_infer, _shape_reference, arity=(1, 1)))


# -- Meshgrid ---------------------------------------------------------------------------------------------------
MESHGRID_INDEXING = ("ij", "xy")


def meshgrid_views(node: Node, shapes: list[tuple[int, ...]]) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """torch.meshgrid: (the grid shape, the shape each input is viewed as to broadcast into it). Input i (0-d or
    1-D, n_i elements) varies along dim i of an (n_0, ..., n_k) grid; `xy` swaps the first two dims (cartesian
    indexing), so input 0 varies along dim 1 and input 1 along dim 0."""
    indexing = node.params.get("indexing", "ij")
    if indexing not in MESHGRID_INDEXING:
        raise ShapeError(f"{node.where()}: Meshgrid indexing {indexing!r} (takes 'ij' or 'xy')")
    if any(len(s) > 1 for s in shapes):
        raise ShapeError(f"{node.where()}: Meshgrid takes 0-d or 1-D inputs, got shapes {shapes}")
    sizes = [math.prod(s) for s in shapes]
    dims = list(range(len(sizes)))
    if indexing == "xy" and len(sizes) > 1:
        dims[0], dims[1] = 1, 0
    grid = [0] * len(sizes)
    for i, d in enumerate(dims):
        grid[d] = sizes[i]
    views = [tuple(n if j == d else 1 for j in range(len(sizes))) for n, d in zip(sizes, dims, strict=True)]
    return tuple(grid), views


def _meshgrid_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if len({np.dtype(i.dtype) for i in ins}) != 1:
        raise ShapeError(f"{node.where()}: Meshgrid inputs differ in dtype: {[str(i.dtype) for i in ins]}")
    if len(node.outputs) != len(ins):
        raise ShapeError(f"{node.where()}: Meshgrid has {len(ins)} inputs but {len(node.outputs)} outputs")
    grid, _ = meshgrid_views(node, [i.shape for i in ins])
    return with_value(node, ins, [TensorInfo(grid, ins[0].dtype) for _ in ins], _meshgrid_reference)


def _meshgrid_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    xs = [np.asarray(a) for a in arrays]
    grid, views = meshgrid_views(node, [x.shape for x in xs])
    return [np.array(np.broadcast_to(x.reshape(v), grid), copy=True) for x, v in zip(xs, views, strict=True)]


register(OpDef("Meshgrid", _meshgrid_infer, _meshgrid_reference, arity=(1, 64)))
