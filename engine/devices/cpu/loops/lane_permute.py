"""One block of lanes permuted from a source block and merged into a destination block under a lane mask, as one
vector permute (vpermps): the blocked layout's lane regroups (layout/loops.py `permute_lanes`) build each
destination block of a channel shuffle or a lane-shifted concat from a few such steps instead of one lane at a time.

`permute_merge(dst, src, idx, mask, first, width)` reads `width` float32 at the integer address src and `width` int32
lane indices at idx, and writes at dst, for each lane j, src[idx[j]] where bit j of mask is set, else dst's old lane
(zero when `first`: the first step of a block writes every lane). `width` is a literal (8 or 16 where it is native):
the vector's width is fixed when the caller compiles.

Where numba's target (`_target_flags`: the features numba compiles for) has the permute for that width natively
(AVX-512F for 16 lanes, AVX2 for 8) it is that one instruction; elsewhere the same meaning is written lane by lane
(extract, insert), so that a kernel holding both widths compiles on every CPU and never emits an instruction the
CPU lacks. `native_width` says which widths are fast here; the kernels pick this path only for those.
"""

from __future__ import annotations

import functools

from llvmlite import ir
from numba import types
from numba.core import codegen, config
from numba.core.errors import TypingError
from numba.extending import intrinsic

# Per width: the x86 feature that has a one-instruction variable permute of that many float32 lanes, and the LLVM
# intrinsic for it (vpermps zmm / ymm).
_NATIVE = {16: ("avx512f", "llvm.x86.avx512.permvar.sf.512"), 8: ("avx2", "llvm.x86.avx2.permps")}


@functools.cache
def _target_flags() -> tuple[str, ...]:
    """The feature string numba compiles for and keys its cache on, as its signed flags: NUMBA_CPU_FEATURES, else
    numba's own reading of the host's (numba.core.codegen: it turns every AVX feature off where NUMBA_ENABLE_AVX is
    0 or the CPU name is one numba does not trust with AVX, as some cloud VMs report)."""
    flags = config.CPU_FEATURES if config.CPU_FEATURES is not None else codegen.get_host_cpu_features()
    return tuple(f for f in flags.split(",") if f[:1] in ("+", "-"))


def native_width(width: int) -> bool:
    """Whether permute_merge of `width` lanes is one instruction on numba's target CPU. 16 lanes also need the
    512-bit registers where the flags name them (LLVM's `evex512`, from LLVM 18 on)."""
    native = _NATIVE.get(width)
    flags = _target_flags()
    enabled = {f[1:] for f in flags if f[0] == "+"}
    if native is None or native[0] not in enabled:
        return False
    return width != 16 or "evex512" in enabled or "evex512" not in {f[1:] for f in flags}


def _permute(builder: ir.IRBuilder, v: ir.Value, idx: ir.Value, width: int) -> ir.Value:
    if native_width(width):
        vec, ivec = v.type, idx.type
        name = _NATIVE[width][1]
        fn = builder.module.globals.get(name) or ir.Function(builder.module, ir.FunctionType(vec, [vec, ivec]), name)
        return builder.call(fn, [v, idx])
    out = ir.Constant(v.type, None)
    for j in range(width):  # lane by lane; idx's lanes are below `width` (the plan builds them so)
        lane = ir.Constant(ir.IntType(32), j)
        out = builder.insert_element(out, builder.extract_element(v, builder.extract_element(idx, lane)), lane)
    return out


@intrinsic
def permute_merge(typingctx, dst, src, idx, mask, first, width):
    """See the module's docstring. dst, src, idx: int64 addresses; mask: int64 (bit j: lane j); first: bool."""
    if not isinstance(width, types.IntegerLiteral) or width.literal_value not in (4, 8, 16):
        raise TypingError("permute_merge's width must be the literal 4, 8 or 16")
    w = width.literal_value

    def codegen(context, builder, signature, args):
        dst_at, src_at, idx_at, bits, is_first = args[:5]
        vec, ivec = ir.VectorType(ir.FloatType(), w), ir.VectorType(ir.IntType(32), w)
        out_ptr = builder.inttoptr(dst_at, vec.as_pointer())
        v = builder.load(builder.inttoptr(src_at, vec.as_pointer()), align=4)
        lanes = builder.load(builder.inttoptr(idx_at, ivec.as_pointer()), align=4)
        keep = builder.select(is_first, ir.Constant(vec, None), builder.load(out_ptr, align=4))
        m = builder.bitcast(builder.trunc(bits, ir.IntType(w)), ir.VectorType(ir.IntType(1), w))
        builder.store(builder.select(m, _permute(builder, v, lanes, w), keep), out_ptr, align=4)
        return context.get_dummy_value()
    return types.void(dst, src, idx, mask, first, width), codegen
