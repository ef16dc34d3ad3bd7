"""The direct CPU paths of Conv and ConvTranspose (float32 NCHW, no oneDNN): 1x1 as plain GEMM, depthwise and
grouped convs of few channels per group as direct numba loops, 3x3 stride-1 as Winograd F(2x2, 3x3), everything
else as tiled im2col + BLAS GEMM; bias, residual and activation fused into one epilogue pass.

A kernel is built once at the instance's max input shape (weights are packed then) and reads the actual
shapes from the arrays on every call, so any smaller input runs in the same output view and workspace.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np

from engine.devices.base import Kernel
from engine.devices.cpu import threads as T
from engine.devices.cpu.blas import Blas
from engine.devices.cpu.conv import loops as K
from engine.devices.cpu.conv import winograd as W
from engine.devices.cpu.epilogue import activation_records, apply_activation
from engine.devices.cpu.fused_calls import Native, team_record
from engine.devices.cpu.kernel import packed, remember
from engine.devices.cpu.loops import fused_epilogue as E
from engine.devices.cpu.onednn import objects as D
from engine.devices.cpu.threads import native_regions, parallel_for, region_job, run_native
from engine.errors import KernelError
from engine.ir import Node
from engine.ops.conv_geometry import ConvGeom, conv_geom, tconv_geom, weight_of
from engine.ops.registry import TensorInfo

# im2col scratch per conv before it tiles over output rows; the perf work may tune it.
WORKSPACE_BUDGET = 2 << 20
# Winograd pays off once the GEMMs are big enough to dominate its transforms.
WINOGRAD = True
WINOGRAD_MIN_CHANNELS = 16
WINOGRAD_MIN_TILES = 32  # below this many 2x2 tiles (7x7 maps at batch 1) im2col is as fast; the least per block
WINOGRAD_BLOCK_TILES = 256  # tiles per block to aim for: GEMMs large enough, scratch still in L2/L3
# A stem: a dense conv whose every output reads at most this many inputs (channels x taps), into many channels
# (an audio encoder's 1-channel conv1d, a grayscale image's first conv). Its im2col matrix is small and its
# output large, so the bias rides in the GEMM as a row of ones (no epilogue pass over the output) and it runs
# here rather than on oneDNN, whose jit kernel writes nCw16c and reorders the output to NCW (conv1d 10x1 s5
# 1->512 @16000 as a one-layer graph: 0.75 vs 1.81 ms CPU, interleaved in one process).
STEM_MAX_TAPS = 16
STEM_MIN_CHANNELS = 64
# Up to this many input channels per group a grouped conv runs loops.grouped (flat axpys per output channel) rather
# than im2col + a GEMM of a few rows per group.
GROUPED_MAX_CHANNELS = 8
# The direct paths taken with oneDNN on where oneDNN has only its gemm-based kernel for a conv (im2col per group:
# depthwise ones of dilation 6 and more, groups of fewer channels than a block, on AVX2): conv/kernels.py for NCHW
# sides, conv/blocked.py (through NCHW copies) for blocked ones. One layer, 2 threads, wall ms: 3x3 dw d12 256 @65
# 8.0-8.5 -> 2.0 (ORT 0.9); 3x3 g32 32->64 @56 1.6 -> 0.33, g32 128 @28 1.2 -> 0.39 (ORT 0.31, 0.38).
OVER_ONEDNN_GEMM = ("depthwise", "grouped")
_F32 = np.dtype(np.float32)
_DUMMY4 = np.zeros((1, 1, 1, 1), np.float32)
_DUMMY2 = np.zeros((1, 1), np.float32)


def kind(geo: ConvGeom) -> str:
    """The direct path a conv of this geometry takes: "gemm", "depthwise", "grouped", "winograd" or "im2col"."""
    if geo.kh == geo.kw == 1 and geo.stride == (1, 1) and not any(geo.pads):
        return "gemm"
    if geo.groups == geo.c == geo.o and geo.pad_mode == "zeros":
        return "depthwise"
    if geo.groups > 1 and geo.c // geo.groups <= GROUPED_MAX_CHANNELS and geo.pad_mode == "zeros":
        return "grouped"
    if (WINOGRAD and geo.kh == geo.kw == 3 and geo.stride == geo.dilation == (1, 1) and geo.groups == 1
            and geo.pad_mode == "zeros" and min(geo.c, geo.o) >= WINOGRAD_MIN_CHANNELS
            and geo.n * _tiles(geo)[1] >= WINOGRAD_MIN_TILES):  # a batch's tiles share each block
        return "winograd"
    return "im2col"


def is_stem(geo: ConvGeom) -> bool:
    """Whether an im2col conv is a stem (see STEM_MAX_TAPS)."""
    return geo.groups == 1 and geo.c * geo.kh * geo.kw <= STEM_MAX_TAPS and geo.o >= STEM_MIN_CHANNELS


def _tiles(geo: ConvGeom) -> tuple[int, int]:
    """(tiles across, tile count) of the 2x2 Winograd output tiles."""
    tw = (geo.ow + 1) // 2
    return tw, ((geo.oh + 1) // 2) * tw


def _tile_block(geo: ConvGeom, cap_elems: int) -> int:
    """Tiles per transform block: whole rows of tiles (of one or more images), about WINOGRAD_BLOCK_TILES as
    the budget allows, at least WINOGRAD_MIN_TILES (or one row)."""
    tw, n_tiles = _tiles(geo)
    per_row = 16 * (geo.c + geo.o) * tw
    fit = min(cap_elems // per_row, -(-WINOGRAD_BLOCK_TILES // tw))
    rows = max(-(-WINOGRAD_MIN_TILES // tw), fit, 1)
    return min(geo.n * n_tiles, rows * tw)


def _winograd_budget() -> int:
    """Winograd's block scratch in float32 elements: larger than im2col's so 512-channel layers still get
    128-tile GEMMs (the 16 GEMMs of a 32-tile block ran at ~30 GFLOP/s, 128 tiles at ~65)."""
    return 4 * WORKSPACE_BUDGET // _F32.itemsize


def _tile_rows(k_rows: int, width: int, height: int, cap_elems: int) -> int:
    return max(1, min(height, cap_elems // max(1, k_rows * width)))


def conv_workspace(node: Node, ins: list[TensorInfo]) -> int:
    geo = conv_geom(node, ins[0].shape)
    path = kind(geo)
    if path == "winograd":
        return 16 * (geo.c + geo.o) * _tile_block(geo, _winograd_budget()) * _F32.itemsize
    if path != "im2col":
        return 0
    k_rows = geo.c // geo.groups * geo.kh * geo.kw + is_stem(geo)
    rows = _tile_rows(k_rows, geo.ow, geo.oh, WORKSPACE_BUDGET // _F32.itemsize)
    return k_rows * rows * geo.ow * _F32.itemsize


def tconv_workspace(node: Node, ins: list[TensorInfo]) -> int:
    geo = tconv_geom(node, ins[0].shape)
    m_rows = geo.o // geo.groups * geo.kh * geo.kw
    rows = _tile_rows(m_rows, geo.w, geo.h, WORKSPACE_BUDGET // _F32.itemsize)
    return m_rows * rows * geo.w * _F32.itemsize


def _scratch(workspace: np.ndarray | None, node: Node) -> np.ndarray:
    """The shared workspace as a flat float32 array."""
    if workspace is None:
        raise KernelError(f"{node.where()}: {node.op_type} kernel needs a workspace and got none")
    buf = workspace.reshape(-1)
    if buf.dtype != _F32:
        buf = buf.view(np.uint8)
        buf = buf[: buf.size // 4 * 4].view(np.float32)
    return buf


def _cols(buf: np.ndarray, node: Node, k_rows: int, width: int, height: int) -> tuple[int, np.ndarray]:
    """Rows per tile and the buffer to carve (k_rows, rows*width) tiles from."""
    cap = min(buf.size, max(WORKSPACE_BUDGET // 4, k_rows * width))
    rows = _tile_rows(k_rows, width, height, cap)
    if k_rows * rows * width > buf.size:
        raise KernelError(f"{node.where()}: {node.op_type} needs {k_rows * width * 4} bytes of workspace, "
                          f"the instance has {buf.size * 4} (input larger than the instance's max shape?)")
    return rows, buf


class _Epilogue:
    """bias + residual + activation for one image's (O, L) output, fused in numba where the activation allows."""

    def __init__(self, node: Node, o: int, folded: bool = False):
        """`folded`: the GEMM already added the bias (a stem's row of ones), so the pass adds none."""
        bias = node.attrs.get("bias")
        self.bias = np.zeros(o, np.float32) if bias is None or folded else packed(np.ravel(bias))
        self.needed = bias is not None and not folded or node.params.get("activation") is not None
        self.name, self.params = node.params.get("activation"), node.params.get("activation_params")
        code = E.act_code(self.name, self.params)
        self.late = code is None  # run through apply_activation after the fused pass
        c, p0, p1, p2 = code or (E.ACT_NONE, 0.0, 0.0, 0.0)
        self.code, self.p = c, (np.float32(p0), np.float32(p1), np.float32(p2))

    def __call__(self, y2: np.ndarray, z2: np.ndarray | None) -> None:
        has_z = z2 is not None
        if not (self.needed or has_z):
            return
        parallel_for(E.epilogue, y2.shape[0], y2.size, y2, self.bias, z2 if has_z else _DUMMY2, has_z, self.code,
                     *self.p)
        if self.late:
            apply_activation(self.name, self.params, y2)


def _geom_cache(fn: Callable[[Node, Sequence[int]], ConvGeom], node: Node) -> Callable[[tuple], ConvGeom]:
    cache: dict[tuple, ConvGeom] = {}

    def get(shape: tuple) -> ConvGeom:
        geo = cache.get(shape)
        if geo is None:
            geo = remember(cache, shape, fn(node, shape))
        return geo
    return get


def build_conv(blas: Blas, node: Node, ins: list[TensorInfo]) -> Kernel:
    geo_max = conv_geom(node, ins[0].shape)
    path = kind(geo_max)
    matmul = blas.matmul
    geom = _geom_cache(conv_geom, node)
    stem = path == "im2col" and is_stem(geo_max)
    epi = _Epilogue(node, geo_max.o, folded=stem)
    w = np.asarray(weight_of(node), np.float32)
    if stem:
        # One GEMM call on one thread: a GEMM of so few rows is bound by writing its output, and split in column
        # blocks it cost 1.8x the CPU (conv1d 10x1 s5 1->512 @16000: 1.31 vs 0.73 ms CPU, loaded machine).
        run = _im2col_run(functools.partial(matmul, split=False), node, geom, packed(_with_bias(node, w)[None]),
                          epi, ones=True)
    elif path == "depthwise":
        run = _loop_run(geom, packed(w.reshape(geo_max.c, geo_max.kh, geo_max.kw)), epi, _depthwise_loop)
    elif path == "grouped":
        run = _loop_run(geom, packed(w), epi, _grouped_loop)
    else:
        wg = packed(w.reshape(geo_max.groups, geo_max.o // geo_max.groups, -1))
        if path == "gemm":
            run = _gemm_run(matmul, geom, wg, epi)
        elif path == "winograd":
            run = _winograd_run(matmul, node, geom, W.transform_weights(w), epi)
        else:
            run = _im2col_run(matmul, node, geom, wg, epi)
    run.impl = f"direct:{'stem' if stem else path}"  # type: ignore[attr-defined]
    return run


def _finish_image(epi: _Epilogue, out: np.ndarray, z: np.ndarray | None, n: int, geo: ConvGeom) -> None:
    hw = geo.oh * geo.ow
    epi(out[n].reshape(geo.o, hw), None if z is None else z[n].reshape(geo.o, hw))


def _gemm_run(matmul, geom, wg: np.ndarray, epi: _Epilogue) -> Kernel:
    def run(inputs, outputs, workspace):
        x, out = np.ascontiguousarray(inputs[0]), outputs[0]
        z = np.ascontiguousarray(inputs[1]) if len(inputs) > 1 else None
        geo = geom(x.shape)
        g, cg, og, hw = geo.groups, geo.c // geo.groups, geo.o // geo.groups, geo.h * geo.w
        if g == 1:
            matmul(wg[0], x.reshape(geo.n, geo.c, hw), out=out.reshape(geo.n, geo.o, hw))
        for n in range(geo.n):
            for gi in range(g if g > 1 else 0):
                matmul(wg[gi], x[n, gi * cg:(gi + 1) * cg].reshape(cg, hw),
                          out=out[n, gi * og:(gi + 1) * og].reshape(og, hw))
            _finish_image(epi, out, z, n, geo)
    return run


def _with_bias(node: Node, w: np.ndarray) -> np.ndarray:
    """(O, C*kh*kw + 1): the weights with the bias as a last column (zeros without one)."""
    o = w.shape[0]
    bias = node.attrs.get("bias")
    b = np.zeros(o, np.float32) if bias is None else np.ravel(bias).astype(np.float32)
    return np.concatenate([w.reshape(o, -1), b[:, None]], axis=1)


def _im2col_run(matmul, node: Node, geom, wg: np.ndarray, epi: _Epilogue, ones: bool = False) -> Kernel:
    """`ones`: the weights carry the bias as a last column (`_with_bias`), so cols get a last row of ones."""
    def run(inputs, outputs, workspace):
        x, out = np.ascontiguousarray(inputs[0]), outputs[0]
        z = np.ascontiguousarray(inputs[1]) if len(inputs) > 1 else None
        geo = geom(x.shape)
        g, cg, og = geo.groups, geo.c // geo.groups, geo.o // geo.groups
        k_rows = cg * geo.kh * geo.kw + ones
        rows, buf = _cols(_scratch(workspace, node), node, k_rows, geo.ow, geo.oh)
        (sh, sw), (dh, dw), (pt, pl) = geo.stride, geo.dilation, geo.pads[:2]
        mode = K.PAD_MODES[geo.pad_mode]
        for n in range(geo.n):
            for gi in range(g):
                xg, yg = x[n, gi * cg:(gi + 1) * cg], out[n, gi * og:(gi + 1) * og]
                for oh0 in range(0, geo.oh, rows):
                    r = min(rows, geo.oh - oh0)
                    cols = buf[: k_rows * r * geo.ow].reshape(k_rows, r * geo.ow)
                    parallel_for(K.im2col, cg, cols.size, xg, cols, oh0, r, geo.ow, geo.kh, geo.kw, sh, sw, dh, dw,
                                 pt, pl, mode)
                    if ones:
                        cols[-1] = 1.0
                    matmul(wg[gi], cols, out=yg[:, oh0:oh0 + r].reshape(og, r * geo.ow))
            _finish_image(epi, out, z, n, geo)
    return run


def _winograd_run(matmul, node: Node, geom, u: np.ndarray, epi: _Epilogue) -> Kernel:
    def run(inputs, outputs, workspace):
        x, out = np.ascontiguousarray(inputs[0]), outputs[0]
        z = np.ascontiguousarray(inputs[1]) if len(inputs) > 1 else None
        geo = geom(x.shape)  # any size works: only the kernel shape, stride and groups chose Winograd
        buf = _scratch(workspace, node)
        c, o = geo.c, geo.o
        tw, n_tiles = _tiles(geo)
        block = _tile_block(geo, min(buf.size, max(_winograd_budget(), 16 * (c + o) * tw)))
        if 16 * (c + o) * block > buf.size:
            raise KernelError(f"{node.where()}: Conv needs {16 * (c + o) * block * 4} bytes of workspace, the "
                              f"instance has {buf.size * 4} (input larger than the instance's max shape?)")
        th, rows = n_tiles // tw, block // tw
        done = 0  # images whose every tile row is through the output transform
        for g0 in range(0, geo.n * th, rows):  # global tile rows: image n holds [n*th, (n+1)*th)
            g1 = min(geo.n * th, g0 + rows)
            b = (g1 - g0) * tw
            v = buf[:16 * c * b].reshape(16, c, b)
            m = buf[16 * c * b:16 * (c + o) * b].reshape(16, o, b)
            segments = _segments(g0, g1, th, tw)
            for n, ty0, ty1, col0 in segments:
                parallel_for(W.input_transform, c, 16 * c * (ty1 - ty0) * tw, x[n], v, ty0, ty1, tw,
                             geo.pads[0], geo.pads[1], col0)
            matmul(u, v, m)
            for n, ty0, ty1, col0 in segments:
                parallel_for(W.output_transform, o, 16 * o * (ty1 - ty0) * tw, m, out[n], ty0, ty1, tw, col0)
            while done < geo.n and (done + 1) * th <= g1:
                _finish_image(epi, out, z, done, geo)
                done += 1
    return run


def _segments(g0: int, g1: int, th: int, tw: int) -> list[tuple[int, int, int, int]]:
    """(image, first tile row, end tile row, first column in the block) for global tile rows [g0, g1)."""
    segs = []
    for n in range(g0 // th, (g1 - 1) // th + 1):
        ty0, ty1 = max(g0 - n * th, 0), min(g1 - n * th, th)
        segs.append((n, ty0, ty1, (n * th + ty0 - g0) * tw))
    return segs


# A depthwise tap is a vectorised multiply-add over a strip in L1 (loops.depthwise): the loop splits over the
# threads at this many times threads.MIN_WORK taps. In-process A/B, 2 vCPUs, AVX-512 EPYC, ms one / two threads:
# 3x3 20 @56 (0.56M taps) 0.089 / 0.147, 40 @28 0.056 / 0.107, 100 @28 0.112 / 0.152; 72 @56 (2.0M) 0.191 / 0.167,
# 20 @112 0.175 / 0.154, 8 @320 0.42 / 0.31.
DEPTHWISE_TAPS_PER_WORK = 4


# A depthwise or grouped loop splits as a native region (no thread entering Python, the team already spinning: a
# few microseconds) from this many taps where OpenMP's threads spin through a request (threads.native_regions),
# from DEPTHWISE_TAPS_PER_WORK times threads.MIN_WORK otherwise. One-layer graphs, 2 vCPUs, Intel Xeon (AVX-512),
# ms before / with the region (ORT): 3x3 dw 20 @56 (0.56M taps) 0.078 / 0.069 (0.032), 3x3 d12 dw 256 @65 0.76 / 0.49
# (0.54), 3x3 g32 32->64 @56 0.177 / 0.089 (0.155), the same between blocked layers 0.374 / 0.196 (0.156).
NATIVE_DIRECT_TAPS = 1 << 16


def _depthwise_loop(geo: ConvGeom) -> tuple:
    """(loop, items, leading geometry arguments, work divisor, which loop for K.direct_team) of a depthwise conv:
    loops.depthwise, any stride."""
    return K.depthwise, geo.n * geo.c, (*geo.stride, *geo.dilation), DEPTHWISE_TAPS_PER_WORK, K.DIRECT_DEPTHWISE


def _grouped_loop(geo: ConvGeom) -> tuple:
    return K.grouped, geo.n * geo.groups, (*geo.stride, *geo.dilation), 1, K.DIRECT_GROUPED


def _loop_run(geom, w: np.ndarray, epi: _Epilogue, loop: Callable[[ConvGeom], tuple]) -> Kernel:
    """A direct numba conv loop (the bias, residual and cheap activations fused), split over its items: as one
    native region (K.direct_team) where the team spins, and recorded into native programs."""
    code = E.ACT_NONE if epi.late else epi.code
    K.direct_team()  # compiled (or loaded) with the kernel, not on its first split

    def job_for(geo: ConvGeom, x: np.ndarray, z: np.ndarray | None, out: np.ndarray) -> np.ndarray:
        job = region_job(K.DT_LEN)
        _, items, lead, _, which = loop(geo)
        job[K.DT_LOOP], job[K.DT_ITEMS] = which, items
        job[K.DT_N:K.DT_W0] = x.shape + out.shape[1:]
        job[K.DT_W0:K.DT_X] = w.shape if w.ndim == 4 else (w.shape[0], 1, *w.shape[1:])
        job[K.DT_X:K.DT_HAS_Z] = [D.address(a) for a in (x, w, epi.bias, _DUMMY4 if z is None else z, out)]
        job[K.DT_HAS_Z], job[K.DT_SH:K.DT_PT], job[K.DT_PT:K.DT_ACT] = z is not None, lead, geo.pads[:2]
        job[K.DT_ACT] = code
        job[K.DT_P0:K.DT_LEN] = [np.float32(v).view(np.int32) for v in epi.p]
        return job

    def taps(geo: ConvGeom, out: np.ndarray) -> int:
        return out.size * geo.kh * geo.kw * (geo.c // geo.groups)

    def split_work(geo: ConvGeom, out: np.ndarray, per_work: int) -> int:
        """The work parallel_for (and team_record) split by: where regions run natively, past NATIVE_DIRECT_TAPS
        (on the team) or not at all; else DEPTHWISE_TAPS_PER_WORK's rule (over Python callbacks)."""
        if native_regions():
            return T.MIN_WORK if taps(geo, out) >= NATIVE_DIRECT_TAPS else 0
        return taps(geo, out) // per_work

    def run(inputs, outputs, workspace):
        x, out = np.ascontiguousarray(inputs[0]), outputs[0]
        z = np.ascontiguousarray(inputs[1]) if len(inputs) > 1 else None
        geo = geom(x.shape)
        fn, items, lead, per_work, _ = loop(geo)
        work = split_work(geo, out, per_work)
        native = T.chunks_for(items, work) > 1 and native_regions() and out.flags.c_contiguous
        if not (native and run_native(K.direct_team().address, job_for(geo, x, z, out))):
            parallel_for(fn, items, work, x, w, epi.bias, _DUMMY4 if z is None else z, z is not None, out, *lead,
                         *geo.pads[:2], code, *epi.p)
        if epi.late:
            apply_activation(epi.name, epi.params, out)

    def native(inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        z = inputs[1] if len(inputs) > 1 else None
        if not (x.flags.c_contiguous and out.flags.c_contiguous and (z is None or z.flags.c_contiguous)):
            return None
        geo = geom(x.shape)
        _, items, _, per_work, _ = loop(geo)
        job = job_for(geo, x, z, out)
        record = team_record(K.direct_team().address, job, items, split_work(geo, out, per_work))
        act = activation_records(epi.name, epi.params, out) if epi.late else ([], [])
        if record is None or act is None:
            return None
        return Native([record] + act[0], [], [job, w, epi.bias, *act[1]])

    run.native = native  # type: ignore[attr-defined]
    return run


def build_tconv(blas: Blas, node: Node, ins: list[TensorInfo]) -> Kernel:
    matmul = blas.matmul
    geo_max = tconv_geom(node, ins[0].shape)
    geom = _geom_cache(tconv_geom, node)
    epi = _Epilogue(node, geo_max.o)
    g, ig = geo_max.groups, geo_max.c // geo_max.groups
    w = np.asarray(weight_of(node), np.float32)
    # Per group (Og*kh*kw, Ig): one GEMM turns an input tile into every output patch it scatters.
    wt = packed(np.stack([w[gi * ig:(gi + 1) * ig].reshape(ig, -1).T for gi in range(g)]))

    def run(inputs, outputs, workspace):
        x, out = np.ascontiguousarray(inputs[0]), outputs[0]
        geo = geom(x.shape)
        og = geo.o // g
        m_rows = og * geo.kh * geo.kw
        rows, buf = _cols(_scratch(workspace, node), node, m_rows, geo.w, geo.h)
        (sh, sw), (dh, dw), (pt, pl) = geo.stride, geo.dilation, geo.pads[:2]
        out.fill(0)
        for n in range(geo.n):
            for gi in range(g):
                xg, yg = x[n, gi * ig:(gi + 1) * ig], out[n, gi * og:(gi + 1) * og]
                for h0 in range(0, geo.h, rows):
                    r = min(rows, geo.h - h0)
                    cols = buf[: m_rows * r * geo.w].reshape(m_rows, r * geo.w)
                    matmul(wt[gi], xg[:, h0:h0 + r].reshape(ig, r * geo.w), out=cols)
                    parallel_for(K.col2im_add, og, cols.size, cols, yg, h0, r, geo.w, geo.kh, geo.kw, sh, sw, dh, dw,
                                 pt, pl)
            _finish_image(epi, out, None, n, geo)
    run.impl = "direct:gemm+col2im"  # type: ignore[attr-defined]
    return run
