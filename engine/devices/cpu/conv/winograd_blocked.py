"""Winograd F(4x4, 3x3) and F(2x2, 3x3) for ConvBlocked: dense 3x3 stride-1 convolutions with both sides blocked.

Per chunk of output tiles: the input transform (winograd_simd's vector code, or the scalar numba kernels of
winograd_blocked_loops for blocks that are not a multiple of 8 lanes) writes v (36, tiles, C), one
oneDNN matmul with a batch of 36 multiplies it by the transformed filters U (36, C, K) into m (36, tiles, K),
and the output transform writes act(A^T m A + bias + z) into the blocked output. 36 * C * K multiply-adds per
16 outputs instead of 144 * C * K: 4x fewer than the direct kernel, for transforms that cost memory traffic.

When it pays (`worth_it`; bench/winograd_layers.py, a 2-core AVX2 machine, against oneDNN's jit direct kernel,
ms): ResNet-18's 64ch@56 b1 1.28 -> 0.91, 128ch@28 b1 1.35 -> 0.70, 512ch@7 b8 12.9 -> 6.6, SqueezeNet's
32->128@27 b8 2.39 -> 1.58. It does not with few tiles (512ch@7 b1, 4 tiles: U's 36 * C * K floats are read for
almost no work, 1.66 -> 2.50), very narrow inputs (16->64@55 b8: 1.02x, the output transform dominates), or
little work per call (c * o * tiles under SMALL_WORK, or under MIN_WORK with few tiles a thread: `worth_it`;
the transforms' and the matmul's fixed costs are not repaid there); those stay on the direct kernel, except wide ones on
small maps, which F(2x2) takes (`choose`). F(2x2) is the same pipeline with 4x4 patches, 2x2 outputs and 16
products (m = 2 below; alpha = m + 2 is the patch side). Chunks hold at most CHUNK_BYTES of v so v and m stay
in cache; the workspace holds v | m | scratchpad.

Non-finite inputs: a NaN or an infinity in a tile's input patch makes that tile's outputs NaN (and its neighbours'
whose patches overlap it), where the direct conv gives NaN or an infinity only in the windows that hold it; inputs
near float32's range (1e36 and more) may overflow in the transforms to NaN. Non-finite either way, never a wrong
finite number (tests/engine/devices/cpu/conv/test_winograd_nchw.py).

The vector transforms run the same three steps as ONE parallel region per conv instead (REGION,
winograd_blocked_region.py): each thread takes whole items (its tiles, or its output channels where tiles are
few) from input transform to output, its GEMMs on a one-thread matmul primitive, with no hand-over between our
pool and OpenMP's team inside the conv (ResNet-18 at batch 1, one thread: 64ch@56 0.89 -> 0.71 ms, the others
within 3%; two threads, 64ch@56 0.87 -> 0.53, 128ch@28 0.67 -> 0.50), as a native function on OpenMP's team where
our splits run natively (recordable into native programs: `records`). The chunked steps above remain for the
scalar kernels.
"""

from __future__ import annotations

import math

import numpy as np

from engine.devices.cpu.conv import winograd_blocked_loops as K
from engine.devices.cpu.conv import winograd_blocked_region as R
from engine.devices.cpu.conv import winograd_simd as S
from engine.devices.cpu.epilogue import apply_activation
from engine.devices.cpu.fused_calls import Native
from engine.devices.cpu.onednn import binding as L
from engine.devices.cpu.onednn import objects as D
from engine.devices.cpu.threads import get_threads, parallel_for
from engine.ops.conv_geometry import ConvGeom

CHUNK_BYTES = 4 << 20
VECTOR_TRANSFORMS = True  # winograd_simd where the block allows; False keeps the scalar kernels (tests both)
MIN_TILES, MIN_CHANNELS, MIN_WORK = 16, 32, 1 << 19
# Below MIN_WORK, down to SMALL_WORK, F(4x4) still pays when every thread gets SPLIT_TILES tiles or more (the
# one-region kernel; layer A/B on an AVX2 EPYC, 2 vCPUs, jit:avx2 direct -> F(4x4), 1 / 2 threads: MobileViT's
# 96->48 @32 0.64 / 0.56, 48->48 @32 0.69 / 0.77, 40->40 @28 0.64 / 0.88, 64->64 @24 0.70 / 0.92, 96->96 @20 0.53 /
# 0.70, SqueezeNet's 32->128 @27 0.86 / 0.92; 16 tiles on two threads lose or tie: 64->64 @16 1.47, 128->64 @16
# 1.00, 48->192 @13 1.05, at one thread 0.71-0.79; 32->32 @32, 65K, 1.05 / 1.09).
SMALL_WORK, SPLIT_TILES = 72 << 10, 12
SMALL_MIN_CHANNELS = 256  # F(2x2) for maps too small for F(4x4)'s tiles (see choose)
REGION = True  # the vector path as one parallel region (winograd_blocked_region); False: chunks of three stages
WIDE_BLOCK, WIDE_MIN_MACS, WIDE_MIN_TILES = 16, 1 << 26, 16  # AVX-512 blocks; from what work, and how many tiles
# a thread, Winograd pays there (pays_on_wide_vectors)
_G = {4: np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
                   [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]]),
      2: np.array([[1, 0, 0], [1 / 2, 1 / 2, 1 / 2], [1 / 2, -1 / 2, 1 / 2], [0, 0, 1]])}
_INLINE_ACTS = {None: K.ACT_NONE, "relu": K.ACT_RELU, "relu6": K.ACT_CLIP, "clip": K.ACT_CLIP,
                "leaky_relu": K.ACT_LEAKY}


def tiles(geo: ConvGeom, m: int = 4) -> tuple[int, int]:
    """Rows and columns of m x m output tiles."""
    return -(-geo.oh // m), -(-geo.ow // m)


def eligible(geo: ConvGeom, block: int, src_blocked: bool, dst_blocked: bool) -> bool:
    """A dense 3x3 stride-1 undilated conv, blocked on both sides, whose channels fill whole blocks (NNSERVE_WINOGRAD,
    CpuOptions.winograd, decides whether eligible convs may run Winograd at all)."""
    return (src_blocked and dst_blocked and (geo.kh, geo.kw) == (3, 3) and geo.stride == (1, 1)
            and geo.dilation == (1, 1) and geo.groups == 1 and geo.c % block == 0 and geo.o % block == 0)


def worth_it(geo: ConvGeom, threads: int | None) -> bool:
    """Whether F(4x4) repays its transforms here: MIN_TILES tiles, MIN_CHANNELS each side, MIN_WORK (c * o * tiles);
    on `threads` threads (8-lane blocks: None for the wide ones, where only MIN_WORK was measured) also from
    SMALL_WORK with SPLIT_TILES tiles a thread."""
    th, tw = tiles(geo)
    n_tiles = geo.n * th * tw
    if n_tiles < MIN_TILES or min(geo.c, geo.o) < MIN_CHANNELS:
        return False
    work = geo.c * geo.o * n_tiles
    if work >= MIN_WORK:
        return True
    return threads is not None and work >= SMALL_WORK and n_tiles >= SPLIT_TILES * max(1, threads)


def pays_on_wide_vectors(geo: ConvGeom, threads: int) -> bool:
    """Whether F(4x4) beats the AVX-512 direct kernel: from WIDE_MIN_MACS direct multiply-adds and WIDE_MIN_TILES
    tiles per thread. With few tiles a thread (ResNet-18's 256ch@14 at batch 1 on 2 threads: 8 each) the GEMMs
    are thin and reading U (36 * C * K floats, 4x the direct filters) bounds them; the direct kernel is as fast
    or faster there. On a 2-core AVX-512 machine (bench/winograd_layers.py, ms, direct against F(4x4) on 2
    threads as one region, winograd_blocked_region): ResNet-18 b1 64ch@56 0.77 -> 0.53, 128ch@28 0.76 -> 0.50,
    256ch@14 0.73 -> 0.73, 512ch@7 (4 tiles) 1.03 -> 1.45; at one thread 1.39 -> 0.69, 1.35 -> 0.64,
    1.33 -> 0.96."""
    th, tw = tiles(geo)
    macs = geo.n * geo.oh * geo.ow * geo.c * geo.o * 9
    return macs >= WIDE_MIN_MACS and geo.n * th * tw >= WIDE_MIN_TILES * max(1, threads)


def choose(geo: ConvGeom, block: int, threads: int = 1) -> int | None:
    """The output tile size (4 or 2) a conv runs Winograd with at this shape on `threads` threads, None for the
    direct kernel.

    F(2x2) (16 products per 4 outputs, 2.25x fewer than direct; U 16 * C * K floats) takes wide layers whose
    maps are too small for F(4x4)'s tiles: ResNet-18's 512ch@7 at batch 1, 4 F(4x4) tiles or 16 F(2x2) ones,
    1.64 -> 1.55 ms (bench/winograd_layers.py; reading U, 16.8 MB, bounds it). It needs the vector transforms
    (there are no scalar F(2x2) kernels).

    16-lane blocks mean oneDNN's AVX-512 direct kernel, twice the AVX2 one's multiply-adds per cycle, against
    transforms whose vectors stay 8 lanes wide (winograd_simd): there Winograd pays only on convs big for their
    threads (`pays_on_wide_vectors`) and F(2x2) never."""
    if block >= WIDE_BLOCK:
        return 4 if worth_it(geo, None) and pays_on_wide_vectors(geo, threads) else None
    if worth_it(geo, threads):
        return 4
    th, tw = tiles(geo, 2)
    small_ok = VECTOR_TRANSFORMS and block % S.LANES == 0
    if small_ok and geo.n * th * tw >= MIN_TILES and min(geo.c, geo.o) >= SMALL_MIN_CHANNELS:
        return 2
    return None


def transform_weights(w: np.ndarray, m: int = 4) -> np.ndarray:
    """(K, C, 3, 3) filters -> U (alpha^2, C, K) float32 with alpha = m + 2, U[alpha a + b, c, k] = (G g G^T)[a, b]
    of filter (k, c)."""
    g = _G[m]
    u = np.einsum("ai,kcij,bj->abck", g, w.astype(np.float64), g)
    return np.ascontiguousarray(u.reshape(len(g) ** 2, w.shape[1], w.shape[0]), np.float32)


def chunk_tiles(geo: ConvGeom, m: int = 4) -> int:
    th, tw = tiles(geo, m)
    return int(min(geo.n * th * tw, max(32, CHUNK_BYTES // ((m + 2) ** 2 * 4 * max(geo.c, geo.o)))))


class _Epilogue:
    def __init__(self, act: str | None, params: dict | None, bias: np.ndarray | None, channels: int):
        p = params or {}
        self.act, self.params = act, params
        self.code = _INLINE_ACTS.get(act, K.ACT_NONE)
        self.late = act not in _INLINE_ACTS  # applied to the whole output after the transform
        if act == "relu6":
            self.lo, self.hi = 0.0, 6.0
        elif act == "clip":
            self.lo = -np.inf if p.get("min") is None else float(p["min"])
            self.hi = np.inf if p.get("max") is None else float(p["max"])
        else:
            self.lo, self.hi = (0.01 if p.get("alpha") is None else float(p["alpha"])), 0.0
        self.bias = np.zeros(channels, np.float32) if bias is None else np.ascontiguousarray(bias, np.float32)


class WinogradConv:
    """The filters, the epilogue and one matmul primitive per chunk size, for output tiles of m x m. The
    transformed filters are made by `prepare` (the kernel's build), not by `workspace_bytes`, so sizing the
    workspace transforms nothing."""

    def __init__(self, w: np.ndarray, bias: np.ndarray | None, act: str | None, act_params: dict | None,
                 m: int = 4, *, block: int):
        self.w, self.m, self.products = w, m, (m + 2) ** 2
        self.c, self.o = int(w.shape[1]), int(w.shape[0])
        self.epi = _Epilogue(act, act_params, bias, self.o)
        self.region = R.Region(self.c, self.o, m, block, lambda: transform_weights(w, m))
        self._gemms: dict[int, tuple] = {}  # chunk tiles -> (step, its weights descriptor, scratchpad bytes)
        self._weights: list[tuple[D.MemoryDesc, np.ndarray]] = []  # U in each layout a primitive asked for
        self._weights_of: dict[int, np.ndarray] = {}  # chunk tiles -> U in its primitive's layout
        self._slots: dict[tuple[int, int], tuple] = {}  # (chunk, tiles) -> (workspace address, v, m, pointers)

    def _gemm(self, t: int) -> tuple:
        if t not in self._gemms:
            p = self.products
            src, dst = D.MemoryDesc.plain((p, t, self.c)), D.MemoryDesc.plain((p, t, self.o))
            w_any, attr = D.MemoryDesc.any((p, self.c, self.o)), D.Attr()
            pd = D.PrimitiveDesc.create("dnnl_matmul_primitive_desc_create", D.engine(), src.h, w_any.h, None,
                                        dst.h, attr.h)
            wts, pad = pd.md(L.QUERY_WEIGHTS_MD), pd.md(L.QUERY_SCRATCHPAD_MD)
            step = D.Step(D.Primitive(pd), {L.ARG_SRC: src, L.ARG_WEIGHTS: wts, L.ARG_DST: dst, L.ARG_SCRATCHPAD: pad})
            self._gemms[t] = (step, wts, D.aligned(pad.nbytes))
        return self._gemms[t]

    def _weights_in(self, md: D.MemoryDesc) -> np.ndarray:
        for have, buf in self._weights:
            if have == md:
                return buf
        u = transform_weights(self.w, self.m)
        buf = D.reorder_into(u, D.MemoryDesc.plain(u.shape), md)
        self._weights.append((md, buf))
        return buf

    def _chunk_sizes(self, geo: ConvGeom) -> list[int]:
        th, tw = tiles(geo, self.m)
        t = chunk_tiles(geo, self.m)
        rest = geo.n * th * tw % t
        return [t, rest] if rest else [t]

    def prepare(self, geo: ConvGeom) -> None:
        """The matmuls and transformed filters of this shape's one-region items (or chunks, without REGION), so
        its first run builds nothing."""
        if REGION:
            th, tw = tiles(geo, self.m)
            self.region.prepare(geo.n * th * tw, get_threads())
            return
        for t in self._chunk_sizes(geo):
            self._ready_weights(t)

    def _ready_weights(self, t: int) -> np.ndarray:
        wts = self._weights_of.get(t)
        if wts is None:
            wts = self._weights_of[t] = self._weights_in(self._gemm(t)[1])
        return wts

    def _buffer_bytes(self, tiles_: int) -> tuple[int, int]:
        """Bytes of v and of m for a chunk of `tiles_` tiles."""
        return D.aligned(self.products * tiles_ * self.c * 4), D.aligned(self.products * tiles_ * self.o * 4)

    def workspace_bytes(self, geo: ConvGeom) -> int:
        """v and m for one chunk, and the larger scratchpad of the chunk's and the last (shorter) chunk's matmul; or
        the one-region slots' v and m on the engine's threads, whichever is larger."""
        pad = max(self._gemm(size)[2] for size in self._chunk_sizes(geo))
        th, tw = tiles(geo, self.m)
        region = self.region.workspace_bytes(geo.n * th * tw, get_threads()) if REGION else 0
        return max(sum(self._buffer_bytes(chunk_tiles(geo, self.m))) + pad, region)

    def run(self, geo: ConvGeom, x: np.ndarray, z: np.ndarray | None, out: np.ndarray, buf: np.ndarray) -> None:
        """out = act(conv(x) + bias + z); `buf` is ALIGN-aligned uint8 scratch of workspace_bytes(geo)."""
        b, zz = x.shape[4], out if z is None else z
        vector = _vector_ok(b, x, out, zz)
        if not vector and self.m != 4:  # F(2x2) has vector kernels only: run them on contiguous copies
            assert VECTOR_TRANSFORMS and b % S.LANES == 0, "choose() takes F(2x2) only with the vector transforms"
            target = np.empty_like(out)
            self.run(geo, np.ascontiguousarray(x), None if z is None else np.ascontiguousarray(z), target, buf)
            out[...] = target
            return
        if not (vector and REGION and self.region.run(geo, tiles(geo, self.m), x, z, out, buf, get_threads(),
                                                      self.epi)):
            self._run_chunks(geo, x, z, out, buf, vector)
        if self.epi.late:
            apply_activation(self.epi.act, self.epi.params, out)

    def records(self, geo: ConvGeom, x: np.ndarray, z: np.ndarray | None, out: np.ndarray,
                buf: np.ndarray) -> Native | None:
        """`run` on these arrays as native_program records: the one-region path only (its vector transforms, the
        activation inline); None where `run` would take another path."""
        zz = out if z is None else z
        if not (REGION and _vector_ok(x.shape[4], x, out, zz)) or self.epi.late:
            return None
        return self.region.records(geo, tiles(geo, self.m), x, z, out, buf, get_threads(), self.epi)

    def _slot(self, buf: np.ndarray, chunk: int, t: int, wts: np.ndarray) -> tuple:
        """v and m of a chunk of `t` tiles in `buf` (laid out for chunks of `chunk`) and the matmul's pointers,
        made once per workspace: the views and pointer lookups cost ~40 us a call, a small conv's whole budget."""
        key, address = (chunk, t), D.address(buf)
        slot = self._slots.get(key)
        if slot is None or slot[0] != address:
            v_bytes, m_bytes = self._buffer_bytes(chunk)
            v, m = _view(buf, 0, (self.products, t, self.c)), _view(buf, v_bytes, (self.products, t, self.o))
            pointers = {L.ARG_SRC: D.address(v), L.ARG_WEIGHTS: D.address(wts), L.ARG_DST: D.address(m),
                        L.ARG_SCRATCHPAD: address + v_bytes + m_bytes}
            slot = self._slots[key] = (address, v, m, pointers)
        return slot[1:]

    def _run_chunks(self, geo: ConvGeom, x: np.ndarray, z: np.ndarray | None, out: np.ndarray, buf: np.ndarray,
                    vector: bool) -> None:
        th, tw = tiles(geo, self.m)
        total, chunk = geo.n * th * tw, chunk_tiles(geo, self.m)
        b, epi = x.shape[4], self.epi
        slices = max(1, 2 * get_threads())
        zz = out if z is None else z
        for t0 in range(0, total, chunk):
            t1 = min(total, t0 + chunk)
            step, wts = self._gemm(t1 - t0)[0], self._ready_weights(t1 - t0)
            v, m, pointers = self._slot(buf, chunk, t1 - t0, wts)
            geometry = (th, tw, geo.pads[0], geo.pads[1], slices)
            if vector:
                parallel_for(S.input_transform, (self.c // b) * slices, 1 << 30, x, v, self.m, t0, t1, *geometry)
            else:
                parallel_for(K.input_transform, (self.c // b) * slices, 1 << 30, x, v, t0, t1, *geometry)
            step.run(pointers)
            D.wait()
            epilogue = (m, out, zz, z is not None, epi.bias, epi.code, epi.lo, epi.hi)
            if vector:
                parallel_for(S.output_transform, (self.o // b) * slices, 1 << 30, *epilogue, self.m, t0, t1, th, tw,
                             slices)
            else:
                parallel_for(K.output_transform, (self.o // b) * slices, 1 << 30, *epilogue, t0, t1, th, tw, slices)


def _vector_ok(block: int, *arrays: np.ndarray) -> bool:
    """The vector transforms take whole 8-lane groups of C-contiguous arrays (they address by flat offset)."""
    return VECTOR_TRANSFORMS and block % S.LANES == 0 and all(a.flags.c_contiguous for a in arrays)


def _view(buf: np.ndarray, offset: int, shape: tuple[int, ...]) -> np.ndarray:
    """float32 `shape` over buf[offset:]."""
    return buf[offset:offset + 4 * math.prod(shape)].view(np.float32).reshape(shape)
