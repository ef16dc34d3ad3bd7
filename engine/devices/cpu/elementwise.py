"""CPU kernels of the elementwise ops (engine/ops/elementwise.py): numpy ufuncs writing straight into the output
view; a mixed-dtype operand is cast inside the ufunc's buffered loop (`signature=`), so no operand-sized temporary
is made. Float Add/Sub/Mul/Div whose second operand broadcasts along a middle axis run a numba row loop; Erf a
numba loop.
"""

from __future__ import annotations

import numpy as np

from engine.devices.cpu import native_program as N
from engine.devices.cpu.fused_calls import Native, team_record
from engine.devices.cpu.kernel import Backends, CpuKernel, empty, numba_ok, reference_fallback, remember
from engine.devices.cpu.loops import rows as PL
from engine.devices.cpu.loops.pointwise import erf_loop
from engine.devices.cpu.threads import parallel_for, region_job, regions_callable
from engine.ir import Node
from engine.ops.elementwise import BINARY, UNARY, binary_dtypes, shift_params, unary_dtype, unary_reference
from engine.ops.registry import TensorInfo
from engine.ops.rules import float_of

# float binaries with a row-broadcast numba kernel (see row_plan)
_ROW_OPS = {"Add": PL.ADD, "Sub": PL.SUB, "Mul": PL.MUL, "Div": PL.DIV}


def row_plan(big: tuple[int, ...], small: tuple[int, ...]) -> tuple[int, int, int] | None:
    """(rows, s_rows, width R) when `small` broadcasts against `big` as (rows, Q*R) (op) (s_rows, R) with
    s row p % s_rows: after leading broadcast dims, a run of kept dims, a run (Q >= 4) of broadcast ones, then
    optionally kept ones. (N,C,H,W) * (N,C,1,1) is (N*C, H*W) by (N*C, 1); the blocked (N,Cb,H,W,16) *
    (N,Cb,1,1,16) is (N*Cb, H*W*16) by (N*Cb, 16); (N,C,H,W) + (C,1,1) is (N*C, H*W) by (C, 1)."""
    small = (1,) * (len(big) - len(small)) + tuple(small)
    if len(small) != len(big):
        return None
    runs: list[list] = []  # [kind, product] with kind "k" (kept) or "b" (broadcast); size-1 dims join anything
    for d, s in zip(big, small, strict=True):
        if d == 1:
            continue
        kind = "k" if s == d else "b" if s == 1 else None
        if kind is None:
            return None
        if runs and runs[-1][0] == kind:
            runs[-1][1] *= d
        else:
            runs.append([kind, d])
    kinds = "".join(k for k, _ in runs)
    lead = runs[0][1] if kinds.startswith("b") else 1
    core = kinds[1:] if kinds.startswith("b") else kinds
    if core not in ("kb", "kbk"):
        return None
    i = len(kinds) - len(core)
    p_a, q = runs[i][1], runs[i + 1][1]
    r = runs[i + 2][1] if core == "kbk" else 1
    return (lead * p_a, p_a, r) if q >= 4 else None


def _binary_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    ufunc, ct, ot = binary_dtypes(node, ins)
    sig = (ct, ct, ot)
    row_op = _ROW_OPS.get(node.op_type) if ct == ot and ct in (np.float32, np.float64) else None
    plans: dict[tuple, tuple | None] = {}
    if row_op is not None:  # compile (or load from numba's cache) now, not on the first request
        PL.rows_binary(empty(2, ct), np.zeros((1, 1), ct), empty(2, ct), row_op, False, 0, 0)

    def plan(a, b, out):
        key = (a.shape, b.shape, a.dtype, b.dtype)
        if key not in plans:
            made = None
            if a.dtype == b.dtype == ct:
                swap = a.shape != out.shape
                big, small = (b, a) if swap else (a, b)
                if big.shape == out.shape:
                    rows = row_plan(out.shape, small.shape)
                    made = None if rows is None else (swap, *rows)
            return remember(plans, key, made)
        return plans[key]

    def run(inputs, outputs, workspace):
        a, b = inputs
        out = outputs[0]
        p = plan(a, b, out) if row_op is not None else None
        if p is not None:
            swap, rows, s_rows, width = p
            big, small = (b, a) if swap else (a, b)
            # memory-bound: split only past ~8 MB (EfficientNet's SE products ran slower on 2 threads at b1 and b8)
            parallel_for(PL.rows_binary, rows, out.size // 8, np.ascontiguousarray(big).reshape(rows, -1),
                         np.ascontiguousarray(small).reshape(s_rows, width), out.reshape(rows, -1), row_op, swap)
            return
        with np.errstate(all="ignore"):
            ufunc(a, b, out=out, signature=sig, casting="unsafe")

    def native(inputs, outputs, workspace):
        """float32 Add/Sub/Mul/Div as a native_program record (loops/rows.binary_team): `run`'s broadcast rows, or
        the same-shape op numpy computes in `run` (one IEEE operation a value: the same bits); None otherwise."""
        a, b = inputs
        out = outputs[0]
        if row_op is None or not all(x.dtype == np.float32 and x.flags.c_contiguous for x in (a, b, out)):
            return None
        job = region_job(PL.BIN_LEN)
        job[PL.BIN_OP] = row_op
        if a.shape == b.shape == out.shape and out.size:
            job[PL.BIN_ROWS:PL.BIN_A] = 0, 0, 1, out.size, 1, out.size
            job[PL.BIN_A:PL.BIN_LEN] = a.ctypes.data, b.ctypes.data, out.ctypes.data
            items = out.size
        else:
            p = plan(a, b, out)
            if p is None or not out.size:
                return None
            swap, rows, s_rows, width = p
            big, small = (b, a) if swap else (a, b)
            job[PL.BIN_ROWS:PL.BIN_A] = 1, swap, rows, out.size // rows, s_rows, width
            job[PL.BIN_A:PL.BIN_LEN] = big.ctypes.data, small.ctypes.data, out.ctypes.data
            items = rows
        fn = PL.binary_team().address
        record = team_record(fn, job, items, out.size // 8)
        if record is None and job[PL.BIN_ROWS] == 0:  # numpy's same-shape op in `run` is one thread's, whatever
            record = (N.OP_CALL, fn, job.ctypes.data)  # the size: so is the loop on this thread
        return None if record is None else Native([record], [], [job])

    if row_op is not None and ct == np.float32 and regions_callable():
        PL.binary_team()  # compiled (or loaded) with the kernel
        run.native = native  # type: ignore[attr-defined]
    return run


def _where_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    def run(inputs, outputs, workspace):
        cond, a, b = inputs
        out = outputs[0]
        np.copyto(out, b, casting="unsafe")
        np.copyto(out, a, casting="unsafe", where=cond.astype(bool, copy=False))
    return run


def _erf_into(x, out):
    erf_loop(np.ascontiguousarray(x).reshape(-1), out.reshape(-1))
    return out


def _unary_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    fn, kind = UNARY[node.op_type]
    dt = np.dtype(ins[0].dtype)
    if node.op_type == "Erf":
        if not numba_ok(dt):
            return reference_fallback(node, unary_reference)
        erf_loop(empty(1, dt), empty(1, float_of(dt)))
        fn = _erf_into
    if kind == "round" and dt.kind in "iub":
        return lambda inputs, outputs, ws: np.copyto(outputs[0], inputs[0])
    if kind == "float" and dt != unary_dtype(node, dt):
        def run_cast(inputs, outputs, workspace):
            out = outputs[0]
            np.copyto(out, inputs[0], casting="unsafe")
            with np.errstate(all="ignore"):
                fn(out, out=out)
        return run_cast

    def run(inputs, outputs, workspace):
        with np.errstate(all="ignore"):
            fn(inputs[0], out=outputs[0])
    return run


def _bit_shift_kernel(backends: Backends, node: Node, ins: list[TensorInfo]):
    direction, bits = shift_params(node)
    shift = np.left_shift if direction == "left" else np.right_shift

    def run(inputs, outputs, workspace):
        shift(inputs[0].view(np.uint32), np.uint32(bits), out=outputs[0].view(np.uint32))
    return run


KERNELS = {
    "BitShift": CpuKernel(_bit_shift_kernel),
    **{name: CpuKernel(_binary_kernel) for name in BINARY},
    "Where": CpuKernel(_where_kernel),
    **{name: CpuKernel(_unary_kernel) for name in UNARY},
}
