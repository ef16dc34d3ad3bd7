"""CPU kernels of the NHWC int8 ops (ops.py): the convolution on oneDNN (conv.py), the rest numba loops
(loops.py) over channels-last rows, and TnnQRelu's max(x, 0) in place of its allocating reference."""

from __future__ import annotations

import weakref

import numpy as np

from engine.devices.cpu import threads as T
from engine.devices.cpu.fused_calls import Native, team_record
from engine.devices.cpu.int8 import conv, loops
from engine.devices.cpu.int8.ops import OPS
from engine.devices.cpu.kernel import Backends, CpuKernel
from engine.devices.cpu.threads import get_threads, native_regions, parallel_for, region_job, run_native
from engine.errors import KernelError
from engine.ir import Node
from engine.ops.quant import F32, pool_geometry, refuse_nan
from engine.ops.registry import TensorInfo

# A quantization splits as a native region (no thread entering Python, the team already spinning: a few
# microseconds) from this many floats, ~0.25 ns each on one thread; from Python only past threads.MIN_WORK.
# UltraFace's 3x240x320 input (230K floats, under MIN_WORK): 65 us on one thread, 37 on two (2-vCPU Xeon).
NATIVE_QUANTIZE_ELEMENTS = 1 << 15
# A joined dequantize (its rows' loop, an exp a value ~8 of these units) splits as a native region from this much
# work: UltraFace's class scores at batch 1 (4420 pairs, 80K) 22 us on one thread.
NATIVE_JOIN_WORK = 1 << 15
_SPECS: weakref.WeakKeyDictionary[Node, conv.QConvSpec] = weakref.WeakKeyDictionary()


def _spec(backends: Backends, node: Node) -> conv.QConvSpec:
    """One spec per node: the workspace sizer and the builder share its weights and factors."""
    spec = _SPECS.get(node)
    if spec is None:
        spec = _SPECS[node] = conv.QConvSpec(node, backends.onednn)
    return spec


def build_conv(backends: Backends, node: Node, ins: list[TensorInfo]):
    return conv.build(_spec(backends, node), ins)


def conv_workspace(backends: Backends, node: Node, ins: list[TensorInfo]) -> int:
    return conv.workspace(_spec(backends, node), ins)


def _channels(node: Node, key: str, c: int) -> np.ndarray:
    s = np.asarray(node.attrs[key], F32).reshape(-1)
    return np.ascontiguousarray(np.broadcast_to(s if s.size == c else s[:1], (c,)))


def _contiguous(node: Node, out: np.ndarray) -> np.ndarray:
    """`out`, which the kernel reshapes: a non-contiguous one would have it write into a copy."""
    if not out.flags.c_contiguous:
        raise KernelError(f"{node.where()}: {node.op_type} needs a contiguous output")
    return out


def _pixels(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1, a.shape[-1])


def build_quantize(backends: Backends, node: Node, ins: list[TensorInfo]):
    scale = _channels(node, "scale", ins[0].shape[1])
    loop = loops.quantize3 if scale.size == 3 and np.all(scale != 0) else loops.quantize
    zero = int(node.params.get("zero_point", 0))  # the output is uint8 where it is not 0 (ops.py)
    if zero not in (0, 128):
        raise KernelError(f"{node.where()}: Int8QuantizeNhwc writes zero point 0 or 128, not {zero}")
    flip = np.int8(-128 if zero else 0)  # q ^ -128 has the bytes of q + 128 as uint8

    loops.quantize_team()  # compiled (or loaded) with the kernel, not on its first split

    def job_for(x: np.ndarray, rows: np.ndarray, nan: np.ndarray) -> np.ndarray:
        """loops.quantize_team's job over these arrays (see QN_*)."""
        job = region_job(loops.QN_LEN)
        job[loops.QN_N:loops.QN_X] = x.shape
        job[loops.QN_X], job[loops.QN_SCALE], job[loops.QN_OUT] = x.ctypes.data, scale.ctypes.data, rows.ctypes.data
        job[loops.QN_FLIP], job[loops.QN_NAN], job[loops.QN_THREE] = flip, nan.ctypes.data, loop is loops.quantize3
        return job

    def spreads(x: np.ndarray, items: int) -> bool:
        """Whether the split is one native region on OpenMP's team (else parallel_for's chunks)."""
        return x.size >= NATIVE_QUANTIZE_ELEMENTS and items > 1 and get_threads() > 1 and native_regions()

    def run(inputs, outputs, workspace):
        x, out = inputs[0], _contiguous(node, outputs[0])
        if x.dtype != F32:
            raise KernelError(f"{node.where()}: Int8QuantizeNhwc reads float32, got {x.dtype}")
        rows = out.reshape(out.shape[0], out.shape[1], -1).view(np.int8)  # (N, H, W * C), a view
        items = x.shape[0] * x.shape[2]
        nan = np.zeros(items, np.bool_)  # per run: instances may share this kernel across threads
        x = np.ascontiguousarray(x)
        if not (spreads(x, items) and run_native(loops.quantize_team().address, job_for(x, rows, nan))):
            parallel_for(loop, items, x.size, x, scale, flip, rows, nan)
        if nan.any():
            refuse_nan(node, x)  # the exact check and its error

    def native_rebound(inputs, outputs, workspace, reads: tuple[int, ...] = (),
                       writes: tuple[int, ...] = ()) -> Native | None:
        """The quantization as a record of native programs (the split `run` makes, over quantize_team): where its
        input is the caller's array (`reads` = (0,)), its address is rebound before each replay; the NaN flags
        (this recording's own, every item rewritten each run) are checked after the program. Its int8 output is
        never a graph's (`writes` is ())."""
        x, out = inputs[0], outputs[0]
        if writes or type(x) is not np.ndarray or x.dtype != F32 or not (x.flags.c_contiguous
                                                                         and out.flags.c_contiguous):
            return None
        rows = out.reshape(out.shape[0], out.shape[1], -1).view(np.int8)
        items = x.shape[0] * x.shape[2]
        nan = np.zeros(items, np.bool_)
        job, fn = job_for(x, rows, nan), loops.quantize_team().address
        record = T.region_record(fn, job.ctypes.data) if spreads(x, items) else team_record(fn, job, items, x.size)
        if record is None:
            return None

        def check() -> None:
            # a search of the flags' bytes (numpy's bools are 0 or 1), not nan.any(): the reduction's machinery cost
            # ~17 us a run after a model's kernels had left the caches cold (UltraFace int8, batch 1)
            if b"\x01" in nan.tobytes():
                refuse_nan(node, inputs[0])  # the array this run attached
        rebinds = [(0, job, loops.QN_X)] if reads else []
        return Native([record], [], [job, rows, nan, scale], rebinds, [check])

    run.native_rebound = native_rebound  # type: ignore[attr-defined]
    run.native = native_rebound  # type: ignore[attr-defined]
    return run


def build_dequantize(backends: Backends, node: Node, ins: list[TensorInfo]):
    scale = _channels(node, "scale", ins[0].shape[3])

    def run(inputs, outputs, workspace):
        x = inputs[0]
        parallel_for(loops.dequantize, x.shape[0] * x.shape[1], x.size, x, scale, outputs[0])
    return run


def build_dequantize_mean(backends: Backends, node: Node, ins: list[TensorInfo]):
    """Int8DequantizeMeanNhwc: loops.dequantize_mean over the images, as a native region where they split and
    OpenMP's threads spin (one on this thread otherwise), recorded into native programs."""
    scale = _channels(node, "scale", ins[0].shape[3])
    loops.dequantize_mean(np.zeros((1, 1, 1), np.int8), np.ones(1, F32), np.zeros((1, 1), F32), 0, 1)
    loops.dequantize_mean_team()

    def job_for(x: np.ndarray, out: np.ndarray) -> np.ndarray:
        n, h, w, c = x.shape
        job = region_job(loops.DM_LEN)
        job[loops.DM_N:loops.DM_X] = n, h * w, c
        job[loops.DM_X], job[loops.DM_SCALE], job[loops.DM_OUT] = x.ctypes.data, scale.ctypes.data, out.ctypes.data
        return job

    def run(inputs, outputs, workspace):
        x, out = np.ascontiguousarray(inputs[0]), _contiguous(node, outputs[0])
        n, h, w, c = x.shape
        if h * w == 0 or n == 0:  # empty maps: the reference's NaN means
            np.copyto(out, OPS["Int8DequantizeMeanNhwc"].reference(node, [x])[0])
            return
        if T.chunks_for(n, x.size) > 1 and native_regions():
            if run_native(loops.dequantize_mean_team().address, job_for(x, out)):
                return
        parallel_for(loops.dequantize_mean, n, x.size, x.reshape(n, h * w, c), scale, out.reshape(n, c))

    def native(inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        if not (x.flags.c_contiguous and out.flags.c_contiguous) or x.shape[0] == 0 or x.shape[1] * x.shape[2] == 0:
            return None
        job = job_for(x, out)
        record = team_record(loops.dequantize_mean_team().address, job, x.shape[0], x.size)
        return None if record is None else Native([record], [], [job, scale])

    run.native = native  # type: ignore[attr-defined]
    return run


def build_dequantize_to_nhwc(backends: Backends, node: Node, ins: list[TensorInfo]):
    scale = _channels(node, "scale", ins[0].shape[3])

    def run(inputs, outputs, workspace):
        x, out = inputs[0], _contiguous(node, outputs[0])
        x = _pixels(x)
        parallel_for(loops.dequantize_pixels, x.shape[0], x.size, x, scale, _pixels(out))
    return run


def build_dequantize_concat(backends: Backends, node: Node, ins: list[TensorInfo]):
    """Each head dequantized straight into its place in the joined output (no per-head value, no concat copy),
    then the softmax over the last axis where the node has it, on the joined value while it is in cache. Where
    OpenMP's runtime is loaded, rows of the output at a time (loops.dequantize_concat_team: a thread's rows need
    no other's values), on this thread or as a native region, recorded into native programs; the Python path
    calls the same function, so a replay gives its bits."""
    patterns = [_pattern(_per_head(s, i.shape[3])) for s, i in zip(node.attrs["scales"], ins, strict=True)]
    softmax = bool(node.params.get("softmax"))
    k = int(node.params["trailing"][-1])
    if T.regions_callable():
        loops.dequantize_concat_team()  # compiled (or loaded) with the kernel
    last = T.LastJob()  # the last run's job: its inputs and output are arena views, run after run

    def split(out: np.ndarray) -> tuple[int, int]:
        """(rows, work) of the output: rows of K values; a value's multiply, and an exp's ~8 more."""
        return out.size // k, out.size * (9 if softmax else 1)

    def joinable(inputs, out) -> bool:
        """Whether the rows' loop takes these arrays: dense, of the dtypes and sizes the job says."""
        n = out.shape[0] if out.ndim else 0
        return (n > 0 and out.dtype == F32 and out.flags.c_contiguous and k > 0 and (out.size // n) % k == 0
                and all(x.dtype == np.int8 and x.flags.c_contiguous and x.shape[0] == n for x in inputs)
                and sum(x.size for x in inputs) == out.size)

    def job_for(inputs, out) -> np.ndarray:
        n = out.shape[0]
        job = region_job(loops.DC_LEN + len(inputs) * loops.DC_HEAD)
        job[loops.DC_N:loops.DC_OUT] = n, out.size // n, k, softmax, len(inputs)
        job[loops.DC_OUT] = out.ctypes.data
        at = 0
        for h, (x, pattern) in enumerate(zip(inputs, patterns, strict=True)):
            f, base = x.size // n, loops.DC_LEN + h * loops.DC_HEAD
            job[base:base + loops.DC_HEAD] = x.ctypes.data, f, at, pattern.ctypes.data, pattern.size
            at += f
        return job

    def regioned(rows: int, work: int) -> bool:
        return rows > 1 and work >= NATIVE_JOIN_WORK and get_threads() > 1 and native_regions()

    def run(inputs, outputs, workspace):
        out = _contiguous(node, outputs[0])
        rows, work = split(out)
        spread = regioned(rows, work)
        if T.regions_callable() and joinable(inputs, out) and (spread or T.chunks_for(rows, work) <= 1):
            job = last.get(inputs, out, lambda: job_for(inputs, out))
            if not (spread and run_native(loops.dequantize_concat_team().address, job)):
                T.run_alone(loops.dequantize_concat_team().address, job)  # one chunk, or the team busy
            return
        n = out.shape[0]  # over Python callbacks where regions do not run (no records then), or without OpenMP
        flat, at = out.reshape(n, -1), 0
        for x, pattern in zip(inputs, patterns, strict=True):
            size = x.size // n
            parallel_for(loops.dequantize_into, n, x.size, x.reshape(n, size), pattern, flat, at)
            at += size
        if softmax:
            r = out.reshape(-1, k)
            parallel_for(loops.softmax_rows, r.shape[0], 8 * r.size, r)

    def native_rebound(inputs, outputs, workspace, reads: tuple[int, ...] = (),
                       writes: tuple[int, ...] = ()) -> Native | None:
        """The rows' loop as a record of native programs (the split `run` makes); where the output is a fresh
        array each run (`writes` = (0,): the graph's output, runtime/bind.py), its address is rebound before
        each replay. Its int8 inputs are never the caller's (`reads` is ())."""
        out = outputs[0]
        if reads or not (T.regions_callable() and joinable(inputs, out)):
            return None
        job, fn = job_for(inputs, out), loops.dequantize_concat_team().address
        rows, work = split(out)
        record = T.region_record(fn, job.ctypes.data) if regioned(rows, work) else team_record(fn, job, rows, work)
        out_rebinds = [(0, job, loops.DC_OUT)] if writes else []
        return None if record is None else Native([record], [], [job], out_rebinds=out_rebinds)

    run.native = native_rebound  # type: ignore[attr-defined]
    run.native_rebound = native_rebound  # type: ignore[attr-defined]
    run.writes_fresh = lambda out: True  # type: ignore[attr-defined]  # a detector's outputs (runtime/bind.py)
    return run


def _per_head(s, c: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(s, F32).reshape(-1), (c,))


def _pattern(scale: np.ndarray, values: int = 256) -> np.ndarray:
    """The channels' scales repeated over as many whole pixels as make about `values` values."""
    return np.ascontiguousarray(np.tile(scale, max(1, values // scale.size)))


def build_add(backends: Backends, node: Node, ins: list[TensorInfo]):
    c = ins[0].shape[3]
    sa, sb, so = (_channels(node, k, c) for k in ("scale_a", "scale_b", "scale_out"))
    floor = np.int8(0 if node.params.get("relu") else -128)

    def run(inputs, outputs, workspace):
        a, b = (_pixels(x) for x in inputs)
        parallel_for(loops.add, a.shape[0], a.size, a, b, sa, sb, so, floor, _pixels(outputs[0]))

    def native(inputs, outputs, workspace):
        arrays = (*inputs, outputs[0])
        if not all(x.dtype == np.int8 and x.flags.c_contiguous for x in arrays):  # so _pixels gives views
            return None
        a, b, out = (_pixels(x) for x in arrays)
        if not (a.shape == b.shape == out.shape and all(s.dtype == F32 and s.shape == (a.shape[1],)
                                                        for s in (sa, sb, so))):
            return None
        job = region_job(loops.ADD_LEN)
        job[loops.ADD_P], job[loops.ADD_C] = a.shape
        job[loops.ADD_A:loops.ADD_FLOOR] = [v.ctypes.data for v in (a, b, sa, sb, so)]
        job[loops.ADD_FLOOR], job[loops.ADD_OUT] = floor, out.ctypes.data
        record = team_record(loops.add_team().address, job, a.shape[0], a.size)
        return None if record is None else Native([record], [], [job, sa, sb, so])

    run.native = native  # type: ignore[attr-defined]
    return run


def build_pool(backends: Backends, node: Node, ins: list[TensorInfo]):
    is_max = node.params.get("mode", "max") == "max"

    def run(inputs, outputs, workspace):
        x, out = inputs[0], outputs[0]
        n, h, w, c = x.shape
        _, (kh, kw), (sh, sw), (ph, pw) = pool_geometry(node, (n, c, h, w))
        parallel_for(loops.pool, n * out.shape[1], out.size * kh * kw, x, out, kh, kw, sh, sw, ph, pw, is_max)
    return run


def build_concat(backends: Backends, node: Node, ins: list[TensorInfo]):
    factors = [F32.type(s) for s in node.attrs["scales"]] if "scales" in node.attrs else None
    s_out = F32.type(node.attrs["scale_out"].reshape(-1)[0]) if factors else F32.type(1)

    def run(inputs, outputs, workspace):
        out = _pixels(outputs[0])
        at = 0
        for i, a in enumerate(inputs):
            a = _pixels(a)
            f = factors[i] if factors else F32.type(1)
            parallel_for(loops.concat_part, a.shape[0], a.size, a, f, s_out, factors is not None, at, out)
            at += a.shape[1]
    return run


def _transpose(to_nhwc: bool):
    def build(backends: Backends, node: Node, ins: list[TensorInfo]):
        def run(inputs, outputs, workspace):
            x = inputs[0]
            np.copyto(outputs[0], x.transpose(0, 2, 3, 1) if to_nhwc else x.transpose(0, 3, 1, 2))
        return run
    return build


def build_relu(backends: Backends, node: Node, ins: list[TensorInfo]):
    def run(inputs, outputs, workspace):
        np.maximum(inputs[0], np.int8(0), out=outputs[0])
    return run


KERNELS = {
    "Int8ConvNhwc": CpuKernel(build_conv, conv_workspace),
    "Int8QuantizeNhwc": CpuKernel(build_quantize),
    "Int8DequantizeNhwc": CpuKernel(build_dequantize),
    "Int8DequantizeToNhwc": CpuKernel(build_dequantize_to_nhwc),
    "Int8DequantizeMeanNhwc": CpuKernel(build_dequantize_mean),
    "Int8DequantizeConcatNhwc": CpuKernel(build_dequantize_concat),
    "Int8AddNhwc": CpuKernel(build_add),
    "Int8PoolNhwc": CpuKernel(build_pool),
    "Int8ConcatNhwc": CpuKernel(build_concat),
    "Int8ToNhwc": CpuKernel(_transpose(True)),
    "Int8ToNchw": CpuKernel(_transpose(False)),
    "TnnQRelu": CpuKernel(build_relu),
}
