"""TNN layers that move, cut or join data without computing -> Reshape, Flatten, Transpose (Permute),
ChannelShuffle, PixelShuffle, Reorg (PixelShuffle / PixelUnshuffle), Squeeze, Unsqueeze, Concat, Split (SplitV;
Caffe's Split copies), Slice (StridedSlice, StridedSliceV2)."""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.lowering.context import Ctx
from engine.formats.tnn.lowering.registry import Handler, handles, register

INT_MAX = 2**31 - 1


@handles("Reshape")
def lower_reshape(c: Ctx) -> None:
    axis, num_axes = c.i(0, 0), c.i(1, -1)
    shape, after = c.counted(2)
    if len(c.inputs) > 1:
        known = c.value_of(c.inputs[1])
        if known is None:
            return c.out("Reshape", [c.inputs[0], c.inputs[1]])
        shape = [int(s) for s in np.asarray(known).reshape(-1)]
    elif axis != 0 or num_axes not in (-1, len(shape)):
        c.unsupported(f"of axes {axis}..{axis + num_axes}")
    if c.i(after, 0) == 1:
        return _reshape_nhwc(c, shape)
    c.out("Reshape", [c.inputs[0]], {"shape": shape})


def _reshape_nhwc(c: Ctx, shape: list[int]) -> None:
    """reshape_type 1: TNN reshapes in NHWC order, i.e. between an NCHW->NHWC and an NHWC->NCHW permute."""
    src = c.shape(c.inputs[0])
    if src is None or len(src) != 4:
        c.unsupported("with reshape_type 1 on a non 4-D input")
    dims = [src[k] if d == 0 else d for k, d in enumerate(shape)]
    if -1 in dims:
        dims[dims.index(-1)] = int(np.prod(src)) // max(-int(np.prod(dims)), 1)
    nhwc = c.tmp("Transpose", [c.inputs[0]], {"perm": [0, 2, 3, 1]})
    if len(dims) != 4:
        return c.out("Reshape", [nhwc], {"shape": dims})
    y = c.tmp("Reshape", [nhwc], {"shape": [dims[0], dims[2], dims[3], dims[1]]})
    c.out("Transpose", [y], {"perm": [0, 3, 1, 2]})


@handles("Flatten")
def lower_flatten(c: Ctx) -> None:
    axis = c.i(0, 1)
    x = c.inputs[0]
    if axis <= 0:  # TNN flattens to 2-D: prod(dims[:axis]) x prod(dims[axis:])
        return c.out("Reshape", [x], {"shape": [1, -1]})
    if axis > 1:
        x = c.tmp("Flatten", [x], {"start_dim": 0, "end_dim": axis - 1})
    c.out("Flatten", [x], {"start_dim": 1, "end_dim": -1})


@handles("Permute")
def lower_permute(c: Ctx) -> None:
    order, _ = c.counted(0)
    shape = c.shape(c.inputs[0])
    rank = len(shape) if shape is not None else len(order)
    perm = tnn_permutation(order, rank)
    if sorted(perm) != list(range(rank)):
        c.fail(f"orders {order} are not a permutation of {rank} axes")
    c.out("Transpose", [c.inputs[0]], {"perm": perm})


def tnn_permutation(order: list[int], rank: int) -> list[int]:
    """TNN's Permute orders as PermuteLayer::InferOutputShape completes them: the axes the orders leave out are
    appended in ascending order ([2, 0] on 4-D is [2, 0, 1, 3]); what is then not a permutation TNN refuses."""
    return list(order) + [i for i in range(rank) if i not in order]


@handles("Concat")
def lower_concat(c: Ctx) -> None:
    c.out("Concat", list(c.inputs), {"axis": c.i(0, 1)})


@handles("SplitV")
def lower_splitv(c: Ctx) -> None:
    axis = c.i(0, 1)
    sizes, _ = c.counted(1)
    params = {"axis": axis, "sizes": sizes or None}
    if sizes and len(sizes) != len(c.outputs):
        c.fail(f"{len(sizes)} slice sizes for {len(c.outputs)} outputs")
    c.emit("Split", [c.inputs[0]], params, outputs=list(c.outputs))


@handles("Split")
def lower_split(c: Ctx) -> None:
    for v in c.outputs:  # Caffe's Split copies its input to every output
        c.emit("Identity", [c.inputs[0]], outputs=[v])


@handles("StridedSlice")
def lower_strided_slice(c: Ctx) -> None:
    begins, k = c.counted(0)
    ends, k = c.counted(k)
    strides, _ = c.counted(k)
    if not len(begins) == len(ends) == len(strides):
        c.fail("begins, ends and strides differ in length")
    ends = [INT_MAX if e == 0 else e for e in ends]  # an end of 0 means "to the end"
    c.out("Slice", [c.inputs[0]], {"starts": begins, "ends": ends, "axes": list(range(len(begins))),
                                   "steps": strides})


@handles("StridedSliceV2")
def lower_strided_slice_v2(c: Ctx) -> None:
    begins, k = c.counted(0)
    ends, k = c.counted(k)
    axes, k = c.counted(k)
    strides, _ = c.counted(k)
    if len(c.inputs) > 1:
        c.unsupported("with slice bounds from inputs")
    c.out("Slice", [c.inputs[0]], {"starts": begins, "ends": ends, "axes": axes,
                                   "steps": strides or [1] * len(axes)})


def _axes_op(op: str) -> Handler:
    return lambda c: c.out(op, [c.inputs[0]], {"axes": c.counted(0)[0] or None})


@handles("Reorg")
def lower_reorg(c: Ctx) -> None:
    """Params stride, forward, run_with_output_dims (unused by TNN), mode (0 DCR, 1 CRD), as NaiveReorg reads them:
    forward is DepthToSpace, else SpaceToDepth. CRD is PixelShuffle / PixelUnshuffle's channel order; DCR's is that
    order with the channels regrouped, a ChannelShuffle before the shuffle (by r*r groups) or after the unshuffle
    (by the input's channel count)."""
    stride, forward, mode = c.i(0), c.i(1), c.i(3, 0)
    if stride <= 0 or mode not in (0, 1):
        c.fail(f"stride={stride}, mode={mode} (takes a positive stride, mode 0 (DCR) or 1 (CRD))")
    x = c.inputs[0]
    if forward:
        if mode == 0:
            x = c.tmp("ChannelShuffle", [x], {"groups": stride * stride})
        return c.out("PixelShuffle", [x], {"upscale": stride})
    if mode == 1:
        return c.out("PixelUnshuffle", [x], {"downscale": stride})
    shape = c.shape(x)
    if shape is None or len(shape) != 4:
        c.fail(f"SpaceToDepth (DCR) of an input of shape {shape}; takes NCHW with a known channel count")
    c.out("ChannelShuffle", [c.tmp("PixelUnshuffle", [x], {"downscale": stride})], {"groups": shape[1]})


register({
    "ShuffleChannel": lambda c: c.out("ChannelShuffle", [c.inputs[0]], {"groups": c.i(0, 1)}),
    "PixelShuffle": lambda c: c.out("PixelShuffle", [c.inputs[0]], {"upscale": c.i(0)}),
    "Squeeze": _axes_op("Squeeze"), "Unsqueeze": _axes_op("Unsqueeze"),
})
