"""oneDNN's side of the blocked activation layout: memory descriptors in the nChw{B}c tag, and the block size
oneDNN's float32 convolutions prefer on this CPU."""

from __future__ import annotations

import ctypes
import functools
import logging

from engine.devices.cpu.onednn import binding as L
from engine.devices.cpu.onednn import objects as D

log = logging.getLogger("engine.layout")
PROBE_CHANNELS = 64
CANDIDATE_BLOCKS = (16, 8, 4)


def tag(block: int) -> str:
    """oneDNN's string tag of NCHW with channels blocked by `block` (nChw16c is "aBcd16b")."""
    return f"aBcd{block}b"


def blocked_md(shape, block: int) -> D.MemoryDesc:
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
    if not D.available():
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
