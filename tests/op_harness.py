"""Running one op outside a graph: build a node, infer, run the reference or the CPU kernel as the runtime would.

Used by the op and kernel tests and handy when debugging a single node. Ops are looked up on the CPU device (the
shared registry plus its blocked-layout ops); kernels are built by a CPU device with default options unless a
test passes its own. Kernels get outputs that are C-contiguous views at the front of buffers sized for the
kernel's max shapes (like arena views), pre-filled with garbage so an element the kernel forgets to write shows up.
"""

from __future__ import annotations

import json
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.devices.cpu import CpuDevice, CpuOptions
from engine.devices.cpu import native_program as N
from engine.devices.cpu import threads as T
from engine.devices.cpu.device import PRIVATE_OPS
from engine.ir import Node, Value
from engine.ops.registry import OPS, OpDef, TensorInfo

_DEVICE: list[CpuDevice] = []


def cpu_device(**options) -> CpuDevice:
    """A CPU device with these CpuOptions (the default one is made once)."""
    if options:
        return CpuDevice(CpuOptions(**options))
    if not _DEVICE:
        _DEVICE.append(CpuDevice(CpuOptions()))
    return _DEVICE[0]


def get_op(op_type: str) -> OpDef:
    """The op as the CPU device sees it (its private blocked-layout ops included)."""
    return PRIVATE_OPS[op_type] if op_type in PRIVATE_OPS else OPS[op_type]


def make_node(op: str, n_in: int, n_out: int = 1, params: dict | None = None, attrs: dict | None = None) -> Node:
    return Node(op, f"{op.lower()}_0", [Value(f"in{i}") for i in range(n_in)],
                [Value(f"out{i}") for i in range(n_out)], dict(params or {}), dict(attrs or {}), source="test:1")


# Inputs that are host int lists (a target shape or size): the runtime always knows their values.
HOST_INPUTS = {"Reshape": 1, "Expand": 1, "Resize": 1, "Full": 0, "Range": 0}


def infos_of(arrays: list[np.ndarray], values: bool = False, node: Node | None = None) -> list[TensorInfo]:
    """TensorInfos of `arrays`; with `values`, every value is known, else only host inputs' values."""
    host = HOST_INPUTS.get(node.op_type, len(arrays)) if node is not None else len(arrays)
    return [TensorInfo(tuple(np.shape(a)), np.asarray(a).dtype, np.asarray(a) if values or i >= host else None)
            for i, a in enumerate(arrays)]


def infer(node: Node, arrays: list[np.ndarray], values: bool = False) -> list[TensorInfo]:
    return get_op(node.op_type).infer(node, infos_of(arrays, values, node))


def reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    return get_op(node.op_type).reference(node, [np.asarray(a) for a in arrays])


def _garbage_view(shape: tuple[int, ...], dtype: np.dtype, capacity: int) -> np.ndarray:
    n = int(np.prod(shape, dtype=np.int64))
    buf = np.empty(max(capacity, n), dtype)
    buf[...] = 77 if dtype.kind in "iub" else np.nan
    return buf[:n].reshape(shape)


def build_kernel(node: Node, ins: list[TensorInfo], device: CpuDevice | None = None):
    """(kernel, workspace) as the runtime builds them for `node` at input infos `ins`; the op must have a kernel."""
    device = device or cpu_device()
    op = get_op(node.op_type)
    assert node.op_type in device.kernels, f"{node.op_type} has no CPU kernel"
    return device.build_kernel(node, op, ins), np.zeros(device.workspace_bytes(node, op, ins), np.uint8)


def kernel_workspace(node: Node, ins: list[TensorInfo], device: CpuDevice | None = None) -> int:
    """Workspace bytes the CPU kernel of `node` asks for at input infos `ins`."""
    device = device or cpu_device()
    return device.workspace_bytes(node, get_op(node.op_type), ins)


def run_kernel(node: Node, arrays: list[np.ndarray], max_arrays: list[np.ndarray] | None = None,
               inplace: bool = False, device: CpuDevice | None = None) -> list[np.ndarray]:
    """Builds the kernel at `max_arrays`' shapes (default: `arrays`), runs it on `arrays`, returns the outputs.

    With `inplace`, output 0 is input 0's buffer when their shapes and dtypes match (as the runtime does)."""
    op = get_op(node.op_type)
    kins = infos_of(max_arrays if max_arrays is not None else arrays, node=node)
    fn, ws = build_kernel(node, kins, device)
    max_outs = op.infer(node, kins)
    outs_info = op.infer(node, infos_of(arrays, node=node))
    inputs = [np.array(a, copy=True, order="C") for a in arrays]
    outs = [_garbage_view(o.shape, np.dtype(o.dtype), int(np.prod(m.shape, dtype=np.int64)))
            for o, m in zip(outs_info, max_outs, strict=True)]
    if inplace and (outs[0].shape, outs[0].dtype) == (inputs[0].shape, inputs[0].dtype):
        outs[0] = inputs[0]
    fn(inputs, outs, ws)
    return outs


def force_native_regions(monkeypatch, request, threads_n: int, *modules) -> list[bool]:
    """Our kernels' splits as native regions over `threads_n` threads (MIN_WORK 0, native_regions on in threads
    and in each of `modules`, where their kernels ask it), even where the suite's team sleeps; each module's
    run_native counted: returns the list of whether each region ran. Skips where our kernels do not run on OpenMP's
    team (no oneDNN, or the `short` wait policy)."""
    import pytest

    cpu_device()
    if T.pool_kind(T.get_policy(), T._openmp is not None) != "openmp":
        pytest.skip("our kernels do not run on OpenMP's team here (no oneDNN, or the `short` wait policy)")
    before = T.get_threads()
    request.addfinalizer(lambda: T.set_threads(before))
    T.set_threads(threads_n)
    monkeypatch.setattr(T, "MIN_WORK", 0)
    monkeypatch.setattr(T, "native_regions", lambda: True)
    ran: list[bool] = []
    for module in modules:
        monkeypatch.setattr(module, "native_regions", lambda: True)
        real = module.run_native
        monkeypatch.setattr(module, "run_native", lambda fn, job, real=real: ran.append(real(fn, job)) or ran[-1])
    return ran


def replay(native) -> tuple[int, int] | None:
    """Runs a kernel's records (`kernel.native(...)`) as one native program, holding OpenMP's region pool while they
    run as fused_calls.Segment does where they hold a region; Program.run's answer (None, or the failed record's
    index and status)."""
    pool = T.region_pool() if N.OP_REGION in {r[0] for r in native.records} else None
    if pool is not None:
        assert pool.busy.acquire(blocking=False), "OpenMP's region pool is busy"
    try:
        return N.Program(native.records, native.keep).run()
    finally:
        if pool is not None:
            pool.busy.release()


def replay_recorded(rec) -> tuple[int, int] | None:
    """A fused_calls recording's program run as Segment runs it (holding OpenMP's region pool where it has regions);
    Program.run's answer."""
    pool = T.region_pool() if rec.regions else None
    if pool is not None:
        assert pool.busy.acquire(blocking=False), "OpenMP's region pool is busy"
    try:
        return rec.program.run()
    finally:
        if pool is not None:
            pool.busy.release()


@dataclass
class Case:
    name: str
    op: str
    params: dict
    inputs: list[np.ndarray]
    attrs: dict[str, np.ndarray]
    outputs: list[np.ndarray]

    def node(self) -> Node:
        return make_node(self.op, len(self.inputs), len(self.outputs), self.params, self.attrs)


def load_cases(path: Path, ops: set[str] | None = None) -> list[Case]:
    """The golden cases in `path` (written by tools/make_op_goldens_*.py), optionally only for `ops`."""
    with np.load(path, allow_pickle=False) as z:
        data = {k: z[k] for k in z.files}
    cases = []
    for key in sorted(k for k in data if k.endswith("/op")):
        name = key[:-3]
        op = str(data[key])
        if ops is not None and op not in ops:
            continue
        attrs = {k[len(name) + 6:]: v for k, v in data.items() if k.startswith(f"{name}/attr_")}
        cases.append(Case(name, op, json.loads(str(data[f"{name}/params"])), _seq(data, name, "in"), attrs,
                          _seq(data, name, "out")))
    return cases


def _seq(data: dict[str, np.ndarray], name: str, prefix: str) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    while f"{name}/{prefix}{len(out)}" in data:
        out.append(data[f"{name}/{prefix}{len(out)}"])
    return out


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float = 1e-5, atol: float = 1e-5, what: str = "") -> None:
    """Same shape and dtype, values within rtol plus atol scaled by the expected output's magnitude."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    if want.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    finite = want[np.isfinite(want)]
    scale = max(1.0, float(np.abs(finite).max())) if finite.size else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol * scale, err_msg=what)


def check_golden(case: Case, rtol: float = 1e-5, atol: float = 1e-5) -> None:
    """The reference matches the saved PyTorch outputs and infer predicts their shapes and dtypes."""
    node = case.node()
    got = reference(node, case.inputs)
    infos = infer(node, case.inputs)
    assert len(got) == len(infos) == len(case.outputs), case.name
    for i, (g, info, want) in enumerate(zip(got, infos, case.outputs, strict=True)):
        assert_close(g, want, rtol, atol, f"{case.name} out{i}")
        assert (tuple(info.shape), np.dtype(info.dtype)) == (want.shape, want.dtype), f"{case.name}: infer {info}"


def check_kernel(node: Node, arrays: list[np.ndarray], max_arrays: list[np.ndarray] | None = None, rtol: float = 1e-5,
                 atol: float = 1e-6, inplace: bool = False, device: CpuDevice | None = None) -> None:
    """The kernel (built at `max_arrays`) matches the reference on `arrays`."""
    want = reference(node, arrays)
    got = run_kernel(node, arrays, max_arrays, inplace, device)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_close(g, w, rtol, atol, f"{node.op_type} out{i}")


def kernel_peak_bytes(node: Node, arrays: list[np.ndarray], device: CpuDevice | None = None) -> int:
    """Peak bytes the kernel allocates during one call (numpy reports its buffers to tracemalloc).

    The kernel is built and warmed up first, so one-off costs (numba compilation) are not counted."""
    op = get_op(node.op_type)
    ins = infos_of(arrays, node=node)
    fn, ws = build_kernel(node, ins, device)
    outs = [np.empty(o.shape, o.dtype) for o in op.infer(node, ins)]
    fn(arrays, outs, ws)
    tracemalloc.start()
    try:
        fn(arrays, outs, ws)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
