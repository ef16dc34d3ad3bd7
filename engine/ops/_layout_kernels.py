"""Kernels for ToBlocked / ToPlain and the oneDNN side of the blocked layout: the block size oneDNN's convolutions
prefer on this CPU, and memory descriptors in the blocked tag.

The numpy kernels copy whole blocks with one strided copy and the last partial block apart; with oneDNN a
reorder primitive does the same (several times faster on big maps, and it writes the padding lanes' zeros).
"""

from __future__ import annotations

import ctypes
import functools
import logging

import numpy as np

from engine.ops.registry import Kernel

try:  # the ctypes binding over libdnnl (absent builds keep the numpy kernels)
    from engine.ops import _onednn as D
    from engine.ops import _onednn_lib as L
except ImportError:  # pragma: no cover - depends on the checkout
    D = L = None

log = logging.getLogger("engine.layout")
PROBE_CHANNELS = 64
CANDIDATE_BLOCKS = (16, 8, 4)


def onednn_available() -> bool:
    return D is not None and D.available()


def tag(block: int) -> str:
    """oneDNN's string tag of NCHW with channels blocked by `block` (nChw16c is "aBcd16b")."""
    return f"aBcd{block}b"


def blocked_md(shape, block: int):
    """A float32 memory descriptor of logical NCHW `shape` in the nChw{block}c layout."""
    h = ctypes.c_void_p()
    L.call("dnnl_memory_desc_create_with_string_tag", ctypes.byref(h), len(shape), L.dims(shape), L.F32,
           tag(block).encode())
    return D.MemoryDesc(h)


@functools.lru_cache(maxsize=1)
def native_block() -> int:
    """The channel block oneDNN's f32 convolutions work in here; 0 when there is none (or no oneDNN).

    First the layout a 64-channel 3x3 conv picks for `format_tag_any` src, compared with each candidate tag
    (robust across versions); when that is not a channel-blocked layout (oneDNN 3.x picks NHWC for its brgemm
    kernels), the largest block a probe conv accepts with an optimized (not reference or gemm) implementation.
    """
    if not onednn_available():
        return 0
    shape = (1, PROBE_CHANNELS, 8, 8)
    any_md = D.MemoryDesc.any(shape)
    chosen = _probe(any_md).md(L.QUERY_SRC_MD)
    for block in CANDIDATE_BLOCKS:
        if blocked_md(shape, block) == chosen:
            return block
    for block in CANDIDATE_BLOCKS:
        md = blocked_md(shape, block)
        impl = _probe(md).impl
        if not impl.startswith(("ref", "gemm")):
            log.debug("oneDNN: blocked layout %s with %s", tag(block), impl)
            return block
    return 0


def _probe(io):
    """A 64 -> 64 channel 3x3 conv primitive descriptor with src and dst descriptor `io`."""
    w = D.MemoryDesc.any((PROBE_CHANNELS, PROBE_CHANNELS, 3, 3))
    return D.PrimitiveDesc.create(
        "dnnl_convolution_forward_primitive_desc_create", D.engine(), L.FORWARD_INFERENCE, L.CONVOLUTION_DIRECT,
        io.h, w.h, None, io.h, L.dims((1, 1)), L.dims((0, 0)), L.dims((1, 1)), L.dims((1, 1)), None)


# -- kernels ------------------------------------------------------------------------------------------
def build(to_blocked: bool, block: int, dtype: np.dtype) -> Kernel:
    if dtype == np.float32 and onednn_available():
        return _onednn_kernel(to_blocked, block)
    return _numpy_kernel(to_blocked, block)


def _numpy_kernel(to_blocked: bool, block: int) -> Kernel:
    def run(inputs, outputs, workspace):
        (blocked_into if to_blocked else plain_into)(inputs[0], outputs[0], block)
    return run


def blocked_into(x: np.ndarray, out: np.ndarray, block: int) -> None:
    n, c, h, w = x.shape
    full, rem = divmod(c, block)
    if full:
        np.copyto(out[:, :full], x[:, :full * block].reshape(n, full, block, h, w).transpose(0, 1, 3, 4, 2))
    if rem:
        np.copyto(out[:, full, :, :, :rem], x[:, full * block:].transpose(0, 2, 3, 1))
        out[:, full, :, :, rem:] = 0


def plain_into(x: np.ndarray, out: np.ndarray, block: int) -> None:
    n, c, h, w = out.shape
    full, rem = divmod(c, block)
    if full:
        np.copyto(out[:, :full * block].reshape(n, full, block, h, w), x[:, :full].transpose(0, 1, 4, 2, 3))
    if rem:
        np.copyto(out[:, full * block:], x[:, full, :, :, :rem].transpose(0, 3, 1, 2))


def _onednn_kernel(to_blocked: bool, block: int) -> Kernel:
    steps: dict[tuple, object] = {}

    def step_for(plain_shape: tuple) -> object:
        step = steps.get(plain_shape)
        if step is None:
            plain, blocked = D.MemoryDesc.plain(plain_shape), blocked_md(plain_shape, block)
            step = steps[plain_shape] = (D.reorder_step(plain, blocked) if to_blocked
                                         else D.reorder_step(blocked, plain))
        return step

    def run(inputs, outputs, workspace):
        x, out = np.ascontiguousarray(inputs[0]), outputs[0]
        D.sync_threads()
        step_for(x.shape if to_blocked else out.shape).run({L.ARG_SRC: D.address(x), L.ARG_DST: D.address(out)})
        D.wait()
    return run
