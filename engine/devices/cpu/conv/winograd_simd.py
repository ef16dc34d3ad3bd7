"""Winograd F(4x4, 3x3) and F(2x2, 3x3) transforms of whole tiles as 8-float vector code, for
winograd_blocked.

numba compiles the lane loops of winograd_blocked_loops to mostly scalar code (its input transform held 154
scalar and 35 vector float instructions): it cannot prove the patch buffers, x and v apart, so LLVM does not
vectorise the 8 lanes of a blocked pixel. The two intrinsics here emit one tile's transform directly as LLVM
<8 x float> loads, arithmetic and stores: 36 vectors in, 36 (input side) or 16 (output side) out, each lane an
independent channel. The numba loops around them pick tiles and fall back to a small zero-padded patch where a
tile crosses the border. Pixels of 16 lanes (AVX-512's block) run as two halves; other blocks use the scalar
kernels (F(4x4) only). F(4x4)'s arithmetic is the scalar kernels' (B^T, A^T in their module docstring); F(2x2)
(m = 2: 4x4 patches, 16 products per 2x2 outputs) uses
    B^T = [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]]    A^T = [[1, 1, 1, 0], [0, 1, -1, -1]]
Kernels take the output tile size (4 or 2): tiles of m x m outputs from (m + 2) x (m + 2) patches.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from engine.devices.cpu.conv.winograd_blocked_loops import ACT_CLIP, ACT_LEAKY, ACT_RELU, _item

LANES = 8
_F32 = ir.FloatType()
_VEC = ir.VectorType(_F32, LANES)
_I64 = ir.IntType(64)


class _Vec:
    """Vector arithmetic on one IR builder, with scalars broadcast to all lanes."""

    def __init__(self, builder: ir.IRBuilder):
        self.b = builder

    def const(self, value: float) -> ir.Constant:
        return ir.Constant(_VEC, [float(value)] * LANES)

    def splat(self, scalar) -> ir.Value:
        one = self.b.insert_element(ir.Constant(_VEC, ir.Undefined), scalar, ir.Constant(ir.IntType(32), 0))
        return self.b.shuffle_vector(one, ir.Constant(_VEC, ir.Undefined), ir.Constant(ir.VectorType(
            ir.IntType(32), LANES), [0] * LANES))

    def add(self, a, c):
        return self.b.fadd(a, c)

    def sub(self, a, c):
        return self.b.fsub(a, c)

    def mul(self, a, k: float):
        return self.b.fmul(a, self.const(k))

    def at(self, base, offset) -> ir.Value:
        """Pointer to the vector at float offset `offset` from `base`."""
        return self.b.bitcast(self.b.gep(base, [offset]), _VEC.as_pointer())

    def load(self, base, offset) -> ir.Value:
        return self.b.load(self.at(base, offset), align=4)

    def store(self, value, base, offset) -> None:
        self.b.store(value, self.at(base, offset), align=4)

    def offset(self, start, *terms) -> ir.Value:
        """start + sum(i * stride) for (i, stride) terms, strides IR i64 values."""
        out = start
        for i, stride in terms:
            if i:
                out = self.b.add(out, self.b.mul(ir.Constant(_I64, i), stride))
        return out


def _bt6(v: _Vec, d: list) -> list:
    """F(4x4)'s B^T d for six vectors."""
    d0, d1, d2, d3, d4, d5 = d
    return [v.add(v.sub(v.mul(d0, 4), v.mul(d2, 5)), d4),
            v.sub(v.add(d3, d4), v.mul(v.add(d1, d2), 4)),
            v.add(v.sub(v.mul(v.sub(d1, d2), 4), d3), d4),
            v.add(v.sub(v.mul(v.sub(d3, d1), 2), d2), d4),
            v.add(v.sub(v.mul(v.sub(d1, d3), 2), d2), d4),
            v.add(v.sub(v.mul(d1, 4), v.mul(d3, 5)), d5)]


def _at6(v: _Vec, m: list) -> list:
    """F(4x4)'s A^T m for six vectors."""
    m0, m1, m2, m3, m4, m5 = m
    dif, s34, d34 = v.sub(m1, m2), v.add(m3, m4), v.sub(m3, m4)
    s12 = v.add(m1, m2)
    return [v.add(v.add(m0, s12), s34), v.add(dif, v.mul(d34, 2)), v.add(s12, v.mul(s34, 4)),
            v.add(v.add(dif, v.mul(d34, 8)), m5)]


def _bt4(v: _Vec, d: list) -> list:
    """F(2x2)'s B^T d for four vectors."""
    d0, d1, d2, d3 = d
    return [v.sub(d0, d2), v.add(d1, d2), v.sub(d2, d1), v.sub(d1, d3)]


def _at4(v: _Vec, m: list) -> list:
    """F(2x2)'s A^T m for four vectors."""
    m0, m1, m2, m3 = m
    return [v.add(v.add(m0, m1), m2), v.sub(v.sub(m1, m2), m3)]


def _data(context, builder, arr_type, arr):
    return context.make_array(arr_type)(context, builder, arr).data


def _c_float32(*arrays) -> bool:
    return all(isinstance(a, types.Array) and a.dtype == types.float32 and a.layout == "C" for a in arrays)


def _tile_in_intrinsic(alpha: int, bt):
    """An intrinsic for one tile's input transform with `alpha` x `alpha` patches and `bt` as B^T."""

    @intrinsic
    def tile_in(typingctx, x, x_off, x_row, x_pix, v, v_off, v_step):
        """v[v_off + (alpha a + b) * v_step + lane] = (B^T d B)[a, b], d[i, j] = x[x_off + i x_row + j x_pix + lane]
        (flat float offsets of C-contiguous float32 arrays)."""
        if not _c_float32(x, v):
            return None
        i64 = types.int64
        sig = types.void(x, i64, i64, i64, v, i64, i64)

        def codegen(context, builder, signature, args):
            vec, n = _Vec(builder), range(alpha)
            src, dst = _data(context, builder, x, args[0]), _data(context, builder, v, args[4])
            x_off, x_row, x_pix, v_off, v_step = args[1], args[2], args[3], args[5], args[6]
            d = [[vec.load(src, vec.offset(x_off, (i, x_row), (j, x_pix))) for j in n] for i in n]
            cols = [bt(vec, [d[i][j] for i in n]) for j in n]  # cols[j][a] = (B^T d)[a, j]
            for a in n:
                for b_, value in enumerate(bt(vec, [cols[j][a] for j in n])):
                    vec.store(value, dst, vec.offset(v_off, (alpha * a + b_, v_step)))
            return context.get_dummy_value()

        return sig, codegen

    return tile_in


def _tile_out_intrinsic(alpha: int, at):
    """An intrinsic for one tile's output transform with `alpha` x `alpha` products and `at` as A^T."""
    m_out = alpha - 2

    @intrinsic
    def tile_out(typingctx, m, m_off, m_step, bias, b_off, z, y, y_off, y_row, y_pix, has_z, slope, lo, hi):
        """y[y_off + i y_row + j y_pix + lane] = clamp(leaky(A^T M A + bias (+ z)), lo, hi) over the output tile,
        M[a, b] = m[m_off + (alpha a + b) * m_step + lane]; z is read at y's offsets (pass y when has_z is 0)."""
        if not _c_float32(m, bias, z, y):
            return None
        i64, f32 = types.int64, types.float32
        sig = types.void(m, i64, i64, bias, i64, z, y, i64, i64, i64, i64, f32, f32, f32)

        def codegen(context, builder, signature, args):
            vec, n = _Vec(builder), range(alpha)
            src, bias_p = _data(context, builder, m, args[0]), _data(context, builder, bias, args[3])
            z_p, dst = _data(context, builder, z, args[5]), _data(context, builder, y, args[6])
            m_off, m_step, y_off, y_row, y_pix = args[1], args[2], args[7], args[8], args[9]
            use_z = builder.icmp_signed("!=", args[10], ir.Constant(_I64, 0))
            slope, lo, hi = vec.splat(args[11]), vec.splat(args[12]), vec.splat(args[13])
            bias_v = vec.load(bias_p, args[4])
            mm = [[vec.load(src, vec.offset(m_off, (alpha * a + b_, m_step))) for b_ in n] for a in n]
            cols = [at(vec, [mm[a][j] for a in n]) for j in n]  # cols[j][i] = (A^T M)[i, j]
            for i in range(m_out):
                for j, value in enumerate(at(vec, [cols[jj][i] for jj in n])):
                    where = vec.offset(y_off, (i, y_row), (j, y_pix))
                    value = vec.add(value, bias_v)
                    value = vec.add(value, builder.select(use_z, vec.load(z_p, where), vec.const(0.0)))
                    negative = builder.fcmp_ordered("<", value, vec.const(0.0))
                    value = builder.select(negative, builder.fmul(value, slope), value)
                    value = builder.select(builder.fcmp_ordered("<", value, lo), lo, value)
                    value = builder.select(builder.fcmp_ordered(">", value, hi), hi, value)
                    vec.store(value, dst, where)
            return context.get_dummy_value()

        return sig, codegen

    return tile_out


_tile_in6, _tile_in4 = _tile_in_intrinsic(6, _bt6), _tile_in_intrinsic(4, _bt4)
_tile_out6, _tile_out4 = _tile_out_intrinsic(6, _at6), _tile_out_intrinsic(4, _at4)


@njit(nogil=True, cache=True)
def _epilogue_params(act, lo_clip, hi_clip):
    """(slope below zero, low clamp, high clamp) equivalent to an ACT_* code."""
    if act == ACT_RELU:
        return np.float32(1.0), np.float32(0.0), np.float32(np.inf)
    if act == ACT_CLIP:
        return np.float32(1.0), np.float32(lo_clip), np.float32(hi_clip)
    if act == ACT_LEAKY:
        return np.float32(lo_clip), np.float32(-np.inf), np.float32(np.inf)
    return np.float32(1.0), np.float32(-np.inf), np.float32(np.inf)


@njit(nogil=True, cache=True, inline="always")
def _corner(tile, tiles_h, tiles_w, m):
    """(image, top row, left column) of a tile's m x m output."""
    n, r = tile // (tiles_h * tiles_w), tile % (tiles_h * tiles_w)
    return n, m * (r // tiles_w), m * (r % tiles_w)


@njit(nogil=True, cache=True)
def input_transform(x, v, tile, t0, t1, tiles_h, tiles_w, pt, pl, slices, lo, hi):
    """As winograd_blocked_loops.input_transform, for output tiles of `tile` x `tile` (4 or 2) and blocks that are a
    multiple of 8 lanes: v (alpha^2, tiles, C) with alpha = tile + 2."""
    cbs, h_n, w_n, b = x.shape[1], x.shape[2], x.shape[3], x.shape[4]
    v_step, chans, alpha = v.shape[1] * v.shape[2], v.shape[2], tile + 2
    patch = np.zeros(6 * 6 * LANES, np.float32)
    for item in range(lo, hi):
        cb, first, last = _item(item, slices, t0, t1)
        for t in range(first, last):
            n, y0, x0 = _corner(t, tiles_h, tiles_w, tile)
            y0, x0 = y0 - pt, x0 - pl
            inside = y0 >= 0 and x0 >= 0 and y0 + alpha <= h_n and x0 + alpha <= w_n
            for l0 in range(0, b, LANES):
                v_off = (t - t0) * chans + cb * b + l0
                src, s_off, s_row, s_pix = x, (((n * cbs + cb) * h_n + y0) * w_n + x0) * b + l0, w_n * b, b
                if not inside:  # a zero-padded copy of the patch
                    for i in range(alpha):
                        for j in range(alpha):
                            yy, xx, at = y0 + i, x0 + j, (alpha * i + j) * LANES
                            inb = 0 <= yy < h_n and 0 <= xx < w_n
                            for lane in range(LANES):
                                patch[at + lane] = x[n, cb, yy, xx, l0 + lane] if inb else 0.0
                    s_off, s_row, s_pix = 0, alpha * LANES, LANES
                    if tile == 4:
                        _tile_in6(patch, s_off, s_row, s_pix, v, v_off, v_step)
                    else:
                        _tile_in4(patch, s_off, s_row, s_pix, v, v_off, v_step)
                elif tile == 4:
                    _tile_in6(src, s_off, s_row, s_pix, v, v_off, v_step)
                else:
                    _tile_in4(src, s_off, s_row, s_pix, v, v_off, v_step)


@njit(nogil=True, cache=True)
def output_transform(m, y, z, has_z, bias, act, lo_clip, hi_clip, tile, t0, t1, tiles_h, tiles_w, slices, lo, hi):
    """As winograd_blocked_loops.output_transform, for output tiles of `tile` x `tile` (4 or 2) and blocks
    that are a multiple of 8 lanes."""
    kbs, oh, ow, b = y.shape[1], y.shape[2], y.shape[3], y.shape[4]
    m_step, chans = m.shape[1] * m.shape[2], m.shape[2]
    slope, low, high = _epilogue_params(act, lo_clip, hi_clip)
    part = np.empty(4 * 4 * LANES, np.float32)
    for item in range(lo, hi):
        kb, first, last = _item(item, slices, t0, t1)
        for t in range(first, last):
            n, y0, x0 = _corner(t, tiles_h, tiles_w, tile)
            whole = y0 + tile <= oh and x0 + tile <= ow
            for l0 in range(0, b, LANES):
                m_off, k0 = (t - t0) * chans + kb * b + l0, kb * b + l0
                if whole:
                    y_off = (((n * kbs + kb) * oh + y0) * ow + x0) * b + l0
                    if tile == 4:
                        _tile_out6(m, m_off, m_step, bias, k0, z, y, y_off, ow * b, b, has_z, slope, low, high)
                    else:
                        _tile_out4(m, m_off, m_step, bias, k0, z, y, y_off, ow * b, b, has_z, slope, low, high)
                    continue
                # a tile over the bottom or right edge: transform into `part`, keep the pixels inside
                one, inf = np.float32(1.0), np.float32(np.inf)
                if tile == 4:
                    _tile_out6(m, m_off, m_step, bias, k0, part, part, 0, tile * LANES, LANES, 0, one, -inf, inf)
                else:
                    _tile_out4(m, m_off, m_step, bias, k0, part, part, 0, tile * LANES, LANES, 0, one, -inf, inf)
                for i in range(min(tile, oh - y0)):
                    for j in range(min(tile, ow - x0)):
                        for lane in range(LANES):
                            val = part[(tile * i + j) * LANES + lane]
                            if has_z:
                                val += z[n, kb, y0 + i, x0 + j, l0 + lane]
                            if val < 0:
                                val *= slope
                            y[n, kb, y0 + i, x0 + j, l0 + lane] = min(max(val, low), high)
