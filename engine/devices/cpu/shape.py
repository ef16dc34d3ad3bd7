"""CPU kernels of the copying layout ops (engine/ops/shape.py): Transpose, Expand, Tile, Cast and Identity copy
into the output view; Meshgrid broadcasts each input into its output; Shape writes the dims. The alias ops
(Reshape and co.) need none: the runtime makes the view.

A float32 Transpose large enough to split runs as oneDNN's reorder from the input's permuted strides to the plain
output (`TeamTranspose`): its threads split the copy natively, where numpy's copy runs on the calling thread alone,
reading what the other thread's half of the previous op just wrote through the other core's cache. EfficientFormerV2-S0
at batch 1, two threads (AVX-512 EPYC, 2 vCPUs), its 16 transposes of 25-400 KB in the model: 0.49 -> 0.28 ms a run
(numpy's copies there took 2-4x their time on warm data; at one thread about the same). Past TEAM_MAX_BYTES
a copy that keeps the last axis (numpy copies whole rows, see _transpose) is bound by memory rather than by where
its input sits, and numpy's was as fast or faster (Whisper-tiny's 2.3 MB head splits: 0.42-0.56 ms numpy,
0.42-0.65 oneDNN); one that moves the last axis reads one element per step, where oneDNN's blocked copy is the
faster at any size (MobileViT-XXS's 2 MB patch unfolds at batch 8: 1.54 -> 0.36 ms; its whole run 0.945x).

In a native program (fused_calls.py) every float32 Transpose oneDNN can take is its reorder, the small ones on one
thread too (`TeamTranspose.recorded`; row copies past TEAM_MAX_BYTES stay numpy's): there no Python runs around
it, which is what made numpy's copy the cheaper call for them, and a transpose between two convolutions no longer
splits their program in two.
"""

from __future__ import annotations

import numpy as np

from engine.devices.cpu.fused_calls import step_native
from engine.devices.cpu.kernel import Backends, CpuKernel, ShapeCache, remember
from engine.devices.cpu.onednn import binding as L
from engine.devices.cpu.onednn import objects as D
from engine.devices.cpu.threads import threads_for, work_of
from engine.errors import KernelError
from engine.ir import Node
from engine.ops.registry import TensorInfo
from engine.ops.shape import float_to_int_cast, meshgrid_views, shape_slice, tile_reps, transpose_perm

TEAM_MAX_BYTES = 1 << 20  # the largest input TeamTranspose copies when the last axis stays last (see above)
MAX_DIMS = 12  # oneDNN's DNNL_MAX_NDIMS


def _copy_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    op = node.op_type
    perm = transpose_perm(node, len(ins[0].shape)) if op == "Transpose" else None  # the rank is fixed for an instance
    float_to_int = op == "Cast" and float_to_int_cast(ins[0].dtype, node)
    team = TeamTranspose(perm) if op == "Transpose" and backends.onednn and ins[0].dtype == np.float32 else None

    def run(inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        if team is not None and team.run(x, out):
            return
        if op == "Transpose":
            _transpose(x, perm, out)
        elif op == "Tile":
            reps = tile_reps(node, x.ndim)
            xs = (1,) * (len(reps) - x.ndim) + x.shape
            # out viewed as (r0, d0, r1, d1, ...) receives x broadcast over the repeat axes: no temporary
            np.copyto(out.reshape([v for r, d in zip(reps, xs, strict=True) for v in (r, d)]),
                      x.reshape([v for d in xs for v in (1, d)]))
        elif float_to_int:
            with np.errstate(invalid="ignore"):  # see float_to_int_cast
                np.copyto(out, x, casting="unsafe")
        else:  # Expand broadcasts x into out; Cast and Identity convert or copy
            np.copyto(out, x, casting="unsafe")

    def native(inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        step = team.recorded(x, out)
        return None if step is None else step_native(step, {L.ARG_SRC: D.address(x), L.ARG_DST: D.address(out)}, step)

    if team is not None:
        run.native = native  # type: ignore[attr-defined]
    return run


def _transpose(x: np.ndarray, perm: tuple[int, ...], out: np.ndarray) -> None:
    """out = x.transpose(perm). When the last axis stays last and holds two elements or more (MobileViT's 2x2
    patches: two floats; the blocked layout's 8 or 16 lanes), both sides are viewed as one element of that many
    bytes per row: numpy's copy costs per innermost run. One thread, AVX2 EPYC, numpy 2, (4, 64, n, k) -> (4, n,
    64, k) float32, rows as whole elements against as floats: k = 2 and 4 0.07x, k = 3, 5-7 0.37-0.53x, 8-128
    0.42-0.66x; EfficientFormerV2's blocked (8, 16, 7, 7, 8) -> (8, 7, 7, 16, 8) 63 -> 16-31 us."""
    if (x.ndim >= 2 and x.shape[-1] >= 2 and perm[-1] == x.ndim - 1 and x.size and not x.dtype.hasobject
            and x.strides[-1] == x.itemsize and out.flags.c_contiguous):
        width = x.shape[-1] * x.itemsize
        whole = np.dtype(f"V{width}")
        x, out = x.view(whole), out.view(whole)
    np.copyto(out, x.transpose(perm))


class TeamTranspose:
    """out = x.transpose(perm) for float32 as a oneDNN reorder (see the module doc), one per input shape and strides;
    `run` returns False, copying nothing, where numpy's copy is the better one or the only one: work too small to
    split (threads.threads_for) or rows larger than TEAM_MAX_BYTES in all, fewer than 2 or more than MAX_DIMS axes, a
    zero-size or broadcast (stride 0) side, strides oneDNN cannot take (negative, not whole elements, overlapping),
    another dtype, or an output that is not C-contiguous."""

    def __init__(self, perm: tuple[int, ...]):
        self.perm = perm
        self.steps: ShapeCache = ShapeCache()
        self.any_size: ShapeCache = ShapeCache()  # `recorded`'s steps, whatever the size

    def recorded(self, x: np.ndarray, out: np.ndarray) -> D.Step | None:
        """The reorder a native program runs for x -> out: `run`'s where it has one, else one made for any size (on
        as many threads as its size is worth, one for the small ones); None where oneDNN cannot take it or numpy's
        row copy is the faster (rows kept, past TEAM_MAX_BYTES)."""
        if x.dtype != np.float32 or not out.flags.c_contiguous:
            return None
        key = (x.shape, x.strides)
        step = self.steps.get(key, None)
        if step is not None:
            return step
        step = self.any_size.get(key, False)
        if step is False:
            step = remember(self.any_size, key, self._step(x, any_size=True))
        return step

    def run(self, x: np.ndarray, out: np.ndarray) -> bool:
        if x.dtype != np.float32 or not out.flags.c_contiguous:
            return False
        key = (x.shape, x.strides)
        step = self.steps.get(key, False)
        if step is False:
            step = remember(self.steps, key, self._step(x))
        if step is None:
            return False
        D.sync_threads()
        step.run({L.ARG_SRC: D.address(x), L.ARG_DST: D.address(out)})
        D.wait()
        return True

    def _step(self, x: np.ndarray, any_size: bool = False) -> D.Step | None:
        if not 2 <= x.ndim <= MAX_DIMS or x.size == 0:
            return None
        rows = self.perm[-1] == x.ndim - 1 and x.shape[-1] > 1
        if (not any_size and threads_for(work_of(0, 2 * x.nbytes)) <= 1) or (rows and x.nbytes > TEAM_MAX_BYTES):
            return None
        shape = tuple(x.shape[p] for p in self.perm)
        strides = []
        for p in self.perm:
            st, n = x.strides[p], x.shape[p]
            if n > 1 and (st <= 0 or st % x.itemsize):
                return None
            strides.append(st // x.itemsize if n > 1 else 1)  # a single index: any stride reads the same element
        try:
            return D.reorder_step(D.MemoryDesc.strided(shape, strides), D.MemoryDesc.plain(shape))
        except KernelError:  # strides oneDNN refuses (views whose elements overlap): numpy's copy
            return None


def _shape_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    def run(inputs, outputs, workspace):
        outputs[0][...] = shape_slice(node, inputs[0].shape)
    return run


def _meshgrid_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    def run(inputs, outputs, workspace):
        _, views = meshgrid_views(node, [x.shape for x in inputs])  # the run's sizes, within the instance's max
        for x, view, out in zip(inputs, views, outputs, strict=True):
            np.copyto(out, x.reshape(view))
    return run


KERNELS = {**{op: CpuKernel(_copy_kernel) for op in ("Transpose", "Expand", "Tile", "Cast", "Identity")},
           "Shape": CpuKernel(_shape_kernel), "Meshgrid": CpuKernel(_meshgrid_kernel)}
