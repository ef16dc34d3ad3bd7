"""What a CPU kernel is: an entry of the kernel table (`CpuKernel`: how to build it, how much workspace it needs),
what the builders may use (`Backends`), and the helpers builders share.

A builder runs once per instance at the max input shapes: build(backends, node, ins) -> fn(inputs, outputs,
workspace), with `ins` the input infos (for prepacking weights and picking an algorithm). `fn` writes into
`outputs` (preallocated, C-contiguous arena views of the actual shapes) and never allocates activations.
`workspace(backends, node, ins)` is the scratch bytes it needs at those shapes; one workspace serves a whole
instance. An op without an entry runs its numpy reference (`reference_kernel`), which allocates.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from engine.devices.base import Kernel
from engine.devices.cpu import blas, threads
from engine.devices.cpu.onednn import binding
from engine.devices.cpu.options import CpuOptions
from engine.errors import EngineError, KernelError
from engine.ir import Node
from engine.ops.registry import OpDef, TensorInfo


@dataclass(frozen=True)
class Backends:
    """What the CPU kernels may build on, decided once per device from its options."""
    onednn: bool  # libdnnl is loaded and NNSERVE_ONEDNN is not 0
    winograd: bool  # NNSERVE_WINOGRAD: Winograd for blocked 3x3 convolutions where it pays
    blas: blas.Blas  # NNSERVE_BLAS: MKL's sgemm or numpy's matmul

    @classmethod
    def from_options(cls, options: CpuOptions) -> Backends:
        # never loaded when switched off; once loaded, the `run` wait policy runs our kernels on its OpenMP team
        policy = options.wait_policy
        onednn = options.onednn and binding.load(policy.openmp_spin_us, policy.intel_blocktime_us,
                                                 options.openmp) is not None
        if options.onednn_required and not onednn:
            raise EngineError("NNSERVE_ONEDNN=1 asks for oneDNN, which was not found (libdnnl): install the "
                              "onednn-cpu-gomp wheel nnserve depends on, or unset NNSERVE_ONEDNN")
        if onednn:
            threads.use_openmp(binding.OMP, binding.INTEL, binding.INTEL_BLOCKTIME_MS, policy,
                               move_apart=not options.openmp_bound)
        return cls(onednn, options.winograd, blas.for_choice(options.blas))


Builder = Callable[[Backends, Node, list[TensorInfo]], Kernel]
Sizer = Callable[[Backends, Node, list[TensorInfo]], int]


@dataclass(frozen=True)
class CpuKernel:
    build: Builder
    workspace: Sizer | None = None


def reference_kernel(node: Node, op: OpDef) -> Kernel:
    """Runs the numpy reference and copies its results into the preallocated outputs (allocates; a fallback)."""
    reference = op.reference

    def run_reference(inputs, outputs, workspace) -> None:
        results = reference(node, list(inputs))
        for out, res in zip(outputs, results, strict=True):
            if np.shape(res) != out.shape:
                raise KernelError(f"{node.where()}: {node.op_type} node {node.name!r} produced shape "
                                  f"{np.shape(res)} where {out.shape} was inferred")
            np.copyto(out, res, casting="unsafe")

    run_reference.is_fallback = True  # type: ignore[attr-defined]
    return run_reference


def reference_fallback(node: Node, reference: Callable[[Node, list[np.ndarray]], list[np.ndarray]]) -> Kernel:
    """A kernel that runs `reference` and copies into the outputs, for rare dtypes of an op with a kernel."""
    def run(inputs, outputs, workspace):
        for out, res in zip(outputs, reference(node, list(inputs)), strict=True):
            np.copyto(out, res, casting="unsafe")
    run.is_fallback = True  # the runtime lists nodes that allocate through the reference
    return run


def numba_ok(dt: np.dtype) -> bool:
    """Whether the numba loops take this dtype (numba has no float16 arithmetic on the CPU)."""
    dt = np.dtype(dt)
    return dt.kind in "iub" or dt in (np.float32, np.float64)


def empty(ndim: int, dtype) -> np.ndarray:
    """A zero-size C-contiguous array: calling a numba loop on these at kernel build compiles it then, so the
    first request does not pay for the JIT."""
    return np.zeros((0,) * ndim, dtype)


def packed(a, dtype=np.float32) -> np.ndarray:
    """`a` as an aligned C-contiguous array of `dtype`, copied only when it is not one already.

    Weights read straight out of a model file can sit at any byte offset; numpy then copies an unaligned
    operand on every matmul call, and numba compiles a second, slower variant for it.
    """
    arr = np.asarray(a)
    if arr.dtype != dtype or not arr.flags.c_contiguous or not arr.flags.aligned or arr.ctypes.data % 16:
        arr = np.array(arr, dtype=dtype, order="C", copy=True)
    return arr


# Per-shape values a kernel keeps (its geometry, taps, oneDNN primitives): a server sees a few input shapes, but
# traffic of ever new ones (each within the max shape: sequence lengths, image sizes) must not grow a cache without
# bound (a oneDNN matmul primitive holds ~55 KB; 72 GEMMs of BERT at 4096 lengths each would hold 16 GB). Past this
# many, the oldest entry goes: first in, first out for the cheap values; the least recently used for oneDNN's
# primitives (ShapeCache), which cost ~0.5 ms to make again.
SHAPES_KEPT = 64


class ShapeCache(dict):
    """A dict whose `get` moves a hit to the end, so that `remember` drops the least recently used entry: traffic
    cycling through a working set of up to SHAPES_KEPT shapes (sequence lengths) never re-creates a primitive."""

    def get(self, key, default=None):
        value = super().pop(key, _MISSING)
        if value is _MISSING:
            return default
        self[key] = value
        return value


_MISSING = object()


def remember(cache: dict, key, value, keep: int = SHAPES_KEPT):
    """cache[key] = value, the oldest entry dropped first while the cache holds `keep`; returns value."""
    while len(cache) >= keep:
        del cache[next(iter(cache))]
    cache[key] = value
    return value
