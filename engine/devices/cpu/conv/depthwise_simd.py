"""Depthwise convolution on blocked values (nChw{B}c, B = 8 or 16) as B-float vector code, for depthwise.py.

One channel block of one image is a plane of pixels, each B lanes of independent channels, so a depthwise conv
is the same 2-D filter on every lane: out[oy, ox] = sum_ij w[i, j] * x[oy sy - pt + i dy, ox sx - pl + j dx].
numba compiles lane loops to scalar code (winograd_simd.py's docstring says why), so the intrinsic below emits
a run of T output pixels directly as LLVM <B x float> code: T accumulators kept in registers through a loop over
the kernel rows [i0, i1) (rows outside the input are skipped, which is the zero padding), the KW taps of a row
unrolled (each tap's weight vector loaded once for the T pixels), then bias, the residual z and the activation
(leaky slope below zero, then a clamp: relu, relu6, clip and leaky_relu are all that form) and one store per
pixel. Pixels whose taps cross the left or right edge take the one-pixel variant with its tap range [j0, j1) a
loop too. Offsets are flat float offsets of C-contiguous float32 arrays.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from engine.devices.cpu.conv.winograd_simd import _c_float32, _data

_F32 = ir.FloatType()
_I64 = ir.IntType(64)
# Output pixels per run of the unrolled kernel: T accumulators of B lanes, a weight and a loaded input in
# registers (16 zmm of AVX-512's 32 at B = 16; 10 ymm of AVX2's 16 at B = 8).
RUN = 8
HALF = 4  # the shorter runs: edges, and rows narrower than RUN
KERNEL_SIZES = (3, 5, 7)  # the kernel widths the unrolled runs exist for
BLOCKS = (8, 16)


def _loop(builder: ir.IRBuilder, start, stop, carried: list, body) -> list:
    """for i in [start, stop): carried = body(i, carried); the carried values after the loop."""
    pre = builder.block
    head, loop, done = (builder.append_basic_block(name) for name in ("head", "loop", "done"))
    builder.branch(head)
    builder.position_at_end(head)
    i = builder.phi(_I64)
    i.add_incoming(start, pre)
    phis = [builder.phi(v.type) for v in carried]
    for phi, v in zip(phis, carried, strict=True):
        phi.add_incoming(v, pre)
    builder.cbranch(builder.icmp_signed("<", i, stop), loop, done)
    builder.position_at_end(loop)
    new = body(i, phis)
    end = builder.block
    i.add_incoming(builder.add(i, ir.Constant(_I64, 1)), end)
    for phi, v in zip(phis, new, strict=True):
        phi.add_incoming(v, end)
    builder.branch(head)
    builder.position_at_end(done)
    return phis


# flags of the epilogue
HAS_Z, GELU = 1, 2
# erf(x) = x P(x^2) / Q(x^2) on x clamped to [-4, 4] (erf is +-1 in float32 beyond): the rational approximation
# of Eigen's and XLA's float erf, within 5e-7 of math.erf
_ERF_P = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
          -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02)
_ERF_Q = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
          -1.42647390514189e-02)


def _gelu(builder: ir.IRBuilder, fma, vec_t: ir.VectorType, v):
    """0.5 v (1 + erf(v / sqrt(2))) on a vector (GELU, erf form)."""
    def const(c: float):
        return ir.Constant(vec_t, [float(np.float32(c))] * vec_t.count)

    def poly(coefs, x2):
        acc = const(coefs[0])
        for c in coefs[1:]:
            acc = builder.call(fma, [acc, x2, const(c)])
        return acc

    x = builder.fmul(v, const(0.7071067811865476))
    x = builder.select(builder.fcmp_ordered(">", x, const(4.0)), const(4.0), x)
    x = builder.select(builder.fcmp_ordered("<", x, const(-4.0)), const(-4.0), x)
    x2 = builder.fmul(x, x)
    erf = builder.fdiv(builder.fmul(x, poly(_ERF_P, x2)), poly(_ERF_Q, x2))
    return builder.fmul(builder.fmul(v, const(0.5)), builder.fadd(erf, const(1.0)))


def _pixels_intrinsic(lanes: int, taps: int, run: int, stride: int):
    """An intrinsic for `run` output pixels of `lanes` lanes, `taps` unrolled taps per kernel row, the pixel step
    `stride` pixels, the first `count` pixels stored. Constant steps make every load of a row one displacement
    from one pointer, and the loads that two (pixel, tap) pairs share at stride 1 one load (runtime steps left
    LLVM T * KW addresses, spilled)."""
    vec_t = ir.VectorType(_F32, lanes)

    @intrinsic
    def pixels(typingctx, x, x_off, x_row, i0, i1, w, w_off, w_row, bias, b_off, z, y, y_off, count, flags, slope,
               lo, hi):
        """y[y_off + t lanes + l] = clamp(leaky(gelu?(sum_{i in [i0, i1), j < taps} x[x_off + i x_row + (t stride +
        j) lanes + l] * w[w_off + i w_row + j lanes + l] + bias[b_off + l] (+ z at y's offset))), lo, hi) for t <
        count (<= run); flags: HAS_Z, GELU."""
        if not _c_float32(x, w, bias, z, y):
            return None
        i64, f32 = types.int64, types.float32
        sig = types.void(x, i64, i64, i64, i64, w, i64, i64, bias, i64, z, y, i64, i64, i64, f32, f32, f32)

        def codegen(context, builder, signature, args):
            src, wts = _data(context, builder, x, args[0]), _data(context, builder, w, args[5])
            bias_p, z_p = _data(context, builder, bias, args[8]), _data(context, builder, z, args[10])
            dst = _data(context, builder, y, args[11])
            x_off, x_row, i0, i1 = args[1:5]
            w_off, w_row, b_off, y_off, count = args[6], args[7], args[9], args[12], args[13]
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec_t, [vec_t] * 3),
                                                 f"llvm.fma.v{lanes}f32")
            zero = ir.Constant(vec_t, [0.0] * lanes)

            def const(v):
                return ir.Constant(_I64, v)

            def at(base, offset):
                return builder.bitcast(builder.gep(base, [offset]), vec_t.as_pointer())

            def load(base, offset):
                return builder.load(at(base, offset), align=4)

            def splat(scalar):
                one = builder.insert_element(ir.Constant(vec_t, ir.Undefined), scalar, ir.Constant(ir.IntType(32), 0))
                return builder.shuffle_vector(one, ir.Constant(vec_t, ir.Undefined),
                                              ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes))

            def row_taps(x_at, w_at, accs):
                loaded = {}  # x at float offset from x_at -> its vector, loaded once
                for j in range(taps):
                    wv = load(wts, builder.add(w_at, const(j * lanes)))
                    for t in range(run):
                        k = (t * stride + j) * lanes
                        if k not in loaded:
                            loaded[k] = load(src, builder.add(x_at, const(k)))
                        accs[t] = builder.call(fma, [loaded[k], wv, accs[t]])
                return accs

            def row(i, accs):
                x_at = builder.add(x_off, builder.mul(i, x_row))
                w_at = builder.add(w_off, builder.mul(i, w_row))
                return row_taps(x_at, w_at, list(accs))

            accs = _loop(builder, i0, i1, [zero] * run, row)
            bias_v = load(bias_p, b_off)
            use_z = builder.icmp_signed("!=", builder.and_(args[14], const(HAS_Z)), const(0))
            use_gelu = builder.icmp_signed("!=", builder.and_(args[14], const(GELU)), const(0))
            slope, low, high = splat(args[15]), splat(args[16]), splat(args[17])

            def either(flag, then_value, value):
                """then_value(value) where flag holds, else value (a branch: the untaken side costs nothing)."""
                with builder.if_else(flag) as (then, otherwise):
                    with then:
                        changed = then_value(value)
                        then_block = builder.block
                    with otherwise:
                        else_block = builder.block
                merged = builder.phi(vec_t)
                merged.add_incoming(changed, then_block)
                merged.add_incoming(value, else_block)
                return merged

            for t, acc in enumerate(accs):
                where = builder.add(y_off, const(t * lanes))
                with builder.if_then(builder.icmp_signed("<", const(t), count), likely=True):
                    value = builder.fadd(acc, bias_v)
                    value = either(use_z, lambda v, at_=where: builder.fadd(v, load(z_p, at_)), value)
                    value = either(use_gelu, lambda v: _gelu(builder, fma, vec_t, v), value)
                    value = builder.select(builder.fcmp_ordered("<", value, zero), builder.fmul(value, slope), value)
                    value = builder.select(builder.fcmp_ordered("<", value, low), low, value)
                    value = builder.select(builder.fcmp_ordered(">", value, high), high, value)
                    builder.store(value, at(dst, where), align=4)
            return context.get_dummy_value()

        return sig, codegen

    return pixels


@intrinsic
def _copy(typingctx, dst, d_off, src, s_off, n):
    """dst[d_off:d_off + n] = src[s_off:s_off + n], or zeros when s_off < 0; n a multiple of 8 (numba's loop here
    compiled to scalar moves: the strips cost a third of a 5x5 conv)."""
    if not _c_float32(dst, src):
        return None
    i64 = types.int64

    def codegen(context, builder, signature, args):
        vec_t = ir.VectorType(_F32, 8)
        d_p, s_p = _data(context, builder, dst, args[0]), _data(context, builder, src, args[2])
        d_off, s_off, n = args[1], args[3], args[4]
        zeros = builder.icmp_signed("<", s_off, ir.Constant(_I64, 0))

        def step(k, _):
            off = builder.mul(k, ir.Constant(_I64, 8))
            at_s = builder.gep(s_p, [builder.add(builder.select(zeros, ir.Constant(_I64, 0), s_off), off)])
            with builder.if_else(zeros) as (then, otherwise):
                with then:
                    then_block = builder.block
                with otherwise:
                    loaded = builder.load(builder.bitcast(at_s, vec_t.as_pointer()), align=4)
                    else_block = builder.block
            value = builder.phi(vec_t)
            value.add_incoming(ir.Constant(vec_t, [0.0] * 8), then_block)
            value.add_incoming(loaded, else_block)
            at_d = builder.gep(d_p, [builder.add(d_off, off)])
            builder.store(value, builder.bitcast(at_d, vec_t.as_pointer()), align=4)
            return []

        _loop(builder, ir.Constant(_I64, 0), builder.sdiv(n, ir.Constant(_I64, 8)), [], step)
        return context.get_dummy_value()

    return types.void(dst, i64, src, i64, i64), codegen


_R = {(b, k, s, r): _pixels_intrinsic(b, k, r, s) for b in BLOCKS for k in KERNEL_SIZES for s in (1, 2)
      for r in (RUN, HALF)}
_f16_3_1, _f16_5_1, _f16_7_1, _f16_3_2, _f16_5_2, _f16_7_2 = (_R[16, k, s, RUN] for s in (1, 2) for k in KERNEL_SIZES)
_f8_3_1, _f8_5_1, _f8_7_1, _f8_3_2, _f8_5_2, _f8_7_2 = (_R[8, k, s, RUN] for s in (1, 2) for k in KERNEL_SIZES)
_h16_3_1, _h16_5_1, _h16_7_1, _h16_3_2, _h16_5_2, _h16_7_2 = (_R[16, k, s, HALF] for s in (1, 2) for k in KERNEL_SIZES)
_h8_3_1, _h8_5_1, _h8_7_1, _h8_3_2, _h8_5_2, _h8_7_2 = (_R[8, k, s, HALF] for s in (1, 2) for k in KERNEL_SIZES)


@njit(nogil=True, cache=True, inline="always")
def _full(b, kw, sx, args):
    """The RUN-pixel kernel for this block, kernel width and stride."""
    if b == 16:
        if sx == 1:
            if kw == 3:
                _f16_3_1(*args)
            elif kw == 5:
                _f16_5_1(*args)
            else:
                _f16_7_1(*args)
        elif kw == 3:
            _f16_3_2(*args)
        elif kw == 5:
            _f16_5_2(*args)
        else:
            _f16_7_2(*args)
    elif sx == 1:
        if kw == 3:
            _f8_3_1(*args)
        elif kw == 5:
            _f8_5_1(*args)
        else:
            _f8_7_1(*args)
    elif kw == 3:
        _f8_3_2(*args)
    elif kw == 5:
        _f8_5_2(*args)
    else:
        _f8_7_2(*args)


@njit(nogil=True, cache=True, inline="always")
def _half(b, kw, sx, args):
    """The HALF-pixel kernel for this block, kernel width and stride."""
    if b == 16:
        if sx == 1:
            if kw == 3:
                _h16_3_1(*args)
            elif kw == 5:
                _h16_5_1(*args)
            else:
                _h16_7_1(*args)
        elif kw == 3:
            _h16_3_2(*args)
        elif kw == 5:
            _h16_5_2(*args)
        else:
            _h16_7_2(*args)
    elif sx == 1:
        if kw == 3:
            _h8_3_1(*args)
        elif kw == 5:
            _h8_5_1(*args)
        else:
            _h8_7_1(*args)
    elif kw == 3:
        _h8_3_2(*args)
    elif kw == 5:
        _h8_5_2(*args)
    else:
        _h8_7_2(*args)


@njit(nogil=True, cache=True, inline="always")
def _ceil_div(a, b):
    return -((-a) // b)


@njit(nogil=True, cache=True, inline="always")
def _strip(xf, x_at, w_n, b, c0, width, strip, s_at):
    """strip[s_at:] = input columns [c0, c0 + width) of the row at xf[x_at:], zero outside [0, w_n)."""
    lo_c = min(max(c0, 0), c0 + width)
    hi_c = max(min(c0 + width, w_n), lo_c)
    _copy(strip, s_at, xf, -1, (lo_c - c0) * b)
    _copy(strip, s_at + (lo_c - c0) * b, xf, x_at + lo_c * b, (hi_c - lo_c) * b)
    _copy(strip, s_at + (hi_c - c0) * b, xf, -1, (c0 + width - hi_c) * b)


@njit(nogil=True, cache=True)
def depthwise(x, w, bias, z, flags, y, kh, kw, sy, sx, pt, pl, slope, lo, hi, bands, first, last):
    """y = act(depthwise conv of x + bias (+ z)) (flags: HAS_Z, GELU) over work items [first, last), each (image,
    channel block, band of output rows); undilated, kw one of KERNEL_SIZES, stride 1 or 2 across. x (N, Cb, H, W,
    B), y and z (N, Cb, OH, OW, B), w (Cb, kh, kw, B), bias (Cb * B); B is 8 or 16.

    Runs of RUN (then HALF) pixels whose taps lie inside the row read x. The others (the left edge, and from
    `right` on the right edge with the last short run) run as HALF-pixel runs on strips: copies of the input
    columns they cover, the padding as zeros, made once per band of rows. Kernel rows outside the input are
    skipped (the runs' row range), so there is no vertical padding to copy."""
    cbs, h_n, w_n, b = x.shape[1], x.shape[2], x.shape[3], x.shape[4]
    oh, ow = y.shape[2], y.shape[3]
    xf, yf, zf = x.reshape(-1), y.reshape(-1), z.reshape(-1)
    per_band = _ceil_div(oh, bands)
    # output columns whose taps all lie inside the input: [ox0, ox1); runs of RUN from ox0 to `mid`, then of HALF
    # to `right`, then the right edge
    ox0 = min(ow, _ceil_div(pl, sx))
    ox1 = max(ox0, min(ow, (w_n - kw + pl) // sx + 1))
    mid = ox0 + (ox1 - ox0) // RUN * RUN
    right = mid + (ox1 - mid) // HALF * HALF
    left_w = (_ceil_div(ox0, HALF) * HALF - 1) * sx + kw
    right_w = (_ceil_div(ow - right, HALF) * HALF - 1) * sx + kw
    rows_max = min(h_n, (per_band - 1) * sy + kh)
    left = np.empty(rows_max * left_w * b, np.float32)
    rightside = np.empty(rows_max * right_w * b, np.float32)
    x_row, w_row = w_n * b, kw * b
    for item in range(first, last):
        image, band = item // bands, item % bands
        n, cb = image // cbs, image % cbs
        w_off, b_off = cb * kh * kw * b, cb * b
        x_plane, y_plane = (n * cbs + cb) * h_n * w_n * b, (n * cbs + cb) * oh * ow * b
        oy_a, oy_b = band * per_band, min(oh, (band + 1) * per_band)
        if oy_a >= oy_b:
            continue
        r0, r1 = max(0, oy_a * sy - pt), min(h_n, (oy_b - 1) * sy - pt + kh)  # the input rows of the band
        for r in range(r0, r1):
            if ox0 > 0:
                _strip(xf, x_plane + r * x_row, w_n, b, -pl, left_w, left, (r - r0) * left_w * b)
            if right < ow:
                _strip(xf, x_plane + r * x_row, w_n, b, right * sx - pl, right_w, rightside, (r - r0) * right_w * b)
        for oy in range(oy_a, oy_b):
            iy = oy * sy - pt
            i0, i1 = max(0, -iy), min(kh, h_n - iy)
            x_at, y_at = x_plane + iy * x_row, y_plane + oy * ow * b
            for ox in range(0, ox0, HALF):
                _half(b, kw, sx, (left, (iy - r0) * left_w * b + ox * sx * b, left_w * b, i0, i1, w, w_off, w_row,
                                  bias, b_off, zf, yf, y_at + ox * b, min(HALF, ox0 - ox), flags, slope, lo, hi))
            for ox in range(ox0, mid, RUN):
                _full(b, kw, sx, (xf, x_at + (ox * sx - pl) * b, x_row, i0, i1, w, w_off, w_row, bias, b_off, zf, yf,
                                  y_at + ox * b, RUN, flags, slope, lo, hi))
            for ox in range(mid, right, HALF):
                _half(b, kw, sx, (xf, x_at + (ox * sx - pl) * b, x_row, i0, i1, w, w_off, w_row, bias, b_off, zf, yf,
                                  y_at + ox * b, HALF, flags, slope, lo, hi))
            for ox in range(right, ow, HALF):
                _half(b, kw, sx, (rightside, (iy - r0) * right_w * b + (ox - right) * sx * b, right_w * b, i0, i1, w,
                                  w_off, w_row, bias, b_off, zf, yf, y_at + ox * b, min(HALF, ow - ox), flags, slope,
                                  lo, hi))


def pack_weights(w: np.ndarray, block: int) -> np.ndarray:
    """(C, 1, KH, KW) depthwise filters -> (ceil(C / block), KH, KW, block) float32, padding lanes zero."""
    c, kh, kw = w.shape[0], w.shape[2], w.shape[3]
    cbs = -(-c // block)
    out = np.zeros((cbs * block, kh, kw), np.float32)
    out[:c] = w[:, 0]
    return np.ascontiguousarray(out.reshape(cbs, block, kh, kw).transpose(0, 2, 3, 1))
