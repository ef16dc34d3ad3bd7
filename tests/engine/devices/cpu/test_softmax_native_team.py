"""Float32 softmax rows split as one native OpenMP region (devices/cpu/softmax.py, loops/attention.softmax_team),
and the same region as a native program's record: bit for bit the cfunc's numbers on one thread (the code a
program's call runs), special rows at the shares' edges, in place and into another buffer; the dispatched loops
(the Python split's, where regions do not run) within float32 rounding of them."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from op_harness import build_kernel, cpu_device, force_native_regions, infos_of, make_node, reference, replay

from engine.devices.cpu import native_program as N
from engine.devices.cpu import softmax as S
from engine.devices.cpu import threads as T
from engine.devices.cpu.loops import attention as LA

NODE = make_node("Softmax", 1, params={"axis": -1})


@pytest.fixture
def regions(monkeypatch, request):
    """Every softmax split (MIN_WORK 0) on the native region over 2 threads (a test may set another count), even
    where the suite's team sleeps; records whether each region ran."""
    return force_native_regions(monkeypatch, request, 2, S)


def _rows(rows: int, n: int) -> np.ndarray:
    """Rows with every special kind at the start, the middle and the end (where two or three shares meet)."""
    x = (np.random.default_rng(rows * 1000 + n).standard_normal((rows, n)) * 6).astype(np.float32)
    for r in (0, rows // 3, rows // 2 - 1, rows // 2, 2 * rows // 3, rows - 1):
        x[r, r % n] = (np.nan, np.inf, -np.inf)[r % 3]
    x[min(rows // 2 + 1, rows - 1)] = -np.inf  # every entry -inf: a NaN row
    return x


def _loop(x: np.ndarray) -> np.ndarray:
    """The row loop over every row on this thread, as a native program's call runs it: softmax_team's cfunc
    alone (threads.run_alone), whose machine code may round its vectorised sums differently from the dispatcher's."""
    want = np.empty_like(x)
    T.run_alone(LA.softmax_team().address, S._job(x, want))
    return want


def _dispatched(x: np.ndarray) -> np.ndarray:
    """The row loop called through its numba dispatcher (the Python split's code)."""
    want = np.empty_like(x)
    (LA.short_rows_softmax if x.shape[1] <= S.SHORT_ROW else LA.long_rows_softmax)(x, want, 0, x.shape[0])
    return want


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the reference's inf - inf
@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("rows,n", [(7, 2), (40, 64), (40, 65), (31, 197), (3, 1000)])
def test_region_matches_the_row_loops_in_place_and_not(rows, n, threads, regions):
    T.set_threads(threads)
    x = _rows(rows, n)
    want = _loop(x)
    kernel, ws = build_kernel(NODE, infos_of([x]))
    out = np.full_like(x, 7.0)
    kernel([x], [out], ws)
    y = x.copy()
    kernel([y], [y], ws)
    assert regions == [True, True]
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(y, want)
    np.testing.assert_allclose(out, _dispatched(x), rtol=1e-6, atol=1e-12)
    ref = reference(NODE, [x])[0]
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    ok = ~np.isnan(ref)
    np.testing.assert_allclose(out[ok], ref[ok], rtol=2e-6, atol=1e-7)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_a_busy_team_runs_the_cfunc_alone_and_no_regions_the_python_split(regions, monkeypatch):
    """A busy team (run_native answers False): the cfunc on this thread, the same bits; where regions do not run
    natively, the rows split over Python callbacks (no records are made in that regime)."""
    T.set_threads(2)
    monkeypatch.setattr(S, "run_native", lambda fn, data: regions.append(False) or False)
    x = _rows(50, 197)
    kernel, ws = build_kernel(NODE, infos_of([x]))
    out = np.empty_like(x)
    kernel([x], [out], ws)
    assert regions == [False]
    np.testing.assert_array_equal(out, _loop(x))
    monkeypatch.setattr(S, "native_regions", lambda: False)
    calls = []
    monkeypatch.setattr(S, "parallel_for", lambda fn, *a: calls.append(fn) or fn(*a[2:], 0, a[0]))
    kernel([x], [out], ws)
    assert calls == [LA.long_rows_softmax] and regions == [False]
    np.testing.assert_array_equal(out, _dispatched(x))


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("n", [4, 197])
def test_records_replay_the_row_loops(n, regions):
    """The kernel's record: a region where the rows split over the team, a call on this thread where they do not
    (MIN_WORK back), each the row loops' numbers; none for an output of another shape."""
    T.set_threads(2)
    x = _rows(60, n)
    kernel, ws = build_kernel(NODE, infos_of([x]))
    out = np.full_like(x, 7.0)
    native = kernel.native([x], [out], ws)
    assert [r[0] for r in native.records] == [N.OP_REGION]
    assert replay(native) is None
    np.testing.assert_array_equal(out, _loop(x))
    T.MIN_WORK = x.size + 1
    out[...] = 7.0
    native = kernel.native([x], [out], ws)
    assert [r[0] for r in native.records] == [N.OP_CALL]
    assert replay(native) is None
    np.testing.assert_array_equal(out, _loop(x))
    assert kernel.native([x], [out.reshape(-1)], ws) is None


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("rows,n", [(1, 5), (9, 64), (9, 65), (5, 300)])
def test_team_function_called_alone_runs_every_row(rows, n):
    """softmax_team outside a region (a program's call: one thread, every row) against the dispatched loops and the
    reference."""
    cpu_device()  # the device loads the OpenMP runtime whose functions the job names (alone, nothing did yet)
    x = _rows(rows, n)
    got = np.full_like(x, 7.0)
    job = S._job(x, got)  # held through the call
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(LA.softmax_team().address)(job.ctypes.data)
    np.testing.assert_allclose(got, _dispatched(x), rtol=1e-6, atol=1e-12)
    ref = reference(NODE, [x])[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))


def test_without_openmp_the_dispatched_loops_run():
    """Without oneDNN (NNSERVE_ONEDNN=0) no OpenMP runtime is loaded and no region function can be called (a job
    names its functions): float32 Softmax and LayerNorm then run their numba loops, split or not. In a process of
    its own: this one has OpenMP loaded."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = """
import numpy as np
from op_harness import cpu_device, make_node, reference, run_kernel
from engine.devices.cpu import threads as T
device = cpu_device(onednn=False)
assert not T.regions_callable()
for shape in [(3, 10), (5000, 197)]:
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    for node in (make_node("Softmax", 1, params={"axis": -1}),
                 make_node("LayerNorm", 1, params={"normalized_ndim": 1, "eps": 1e-5})):
        got = run_kernel(node, [x], device=device)[0]
        np.testing.assert_allclose(got, reference(node, [x])[0], rtol=1e-5, atol=1e-5)
print("ok")
"""
    tests = Path(__file__).resolve().parents[3]
    env = dict(os.environ, NNSERVE_ONEDNN="0", PYTHONPATH=os.pathsep.join([str(tests), str(tests.parent)]))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
