"""The grouped attention path split as one native OpenMP region (attention._run_team, loops/attention.attend_team):
the same outputs as the reference on random cases, every chunk run once whatever team OpenMP gives, and the
Python items wherever the region does not apply (a mask that is not float32, our own pool)."""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest
from op_harness import assert_close, build_kernel, cpu_device, infos_of, make_node, reference

from engine.devices.cpu import attention as fused
from engine.devices.cpu import threads as pool
from engine.devices.cpu.loops import attention as A
from engine.errors import KernelError

pytestmark = [
    pytest.mark.skipif(fused.numpy_cblas() is None,
                       reason="numpy's BLAS is not an OpenBLAS whose cblas_sgemm is known (no nogil path)"),
]


def _on_openmp_team() -> bool:
    """Whether our kernels' splits run on OpenMP's team here (the default device loads oneDNN and says so)."""
    cpu_device()
    return pool.pool_kind(pool.get_policy(), pool._openmp is not None) == "openmp"


def _x(rng, *shape) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


@pytest.fixture
def native(monkeypatch, request):
    """Every grouped run split, on the native region even where the team sleeps (the suite's setting); records
    what `_run_team` answered."""
    if not _on_openmp_team():
        pytest.skip("our kernels do not run on OpenMP's team here (no oneDNN, or the `short` wait policy)")
    answers: list[bool] = []
    real = fused._run_team

    def spy(*args):
        answers.append(real(*args))
        return answers[-1]
    monkeypatch.setattr(fused, "_run_team", spy)
    monkeypatch.setattr(fused, "native_regions", lambda: True)
    monkeypatch.setattr(fused, "NATIVE_SPLIT_WORK", 0)
    monkeypatch.setattr(fused, "DNN_MIN_SCORES", 1 << 40)  # every size on the nogil path, not oneDNN's GEMMs
    monkeypatch.setattr(pool, "MIN_WORK", 0)
    before = pool.get_threads()
    request.addfinalizer(lambda: pool.set_threads(before))
    return answers


@pytest.mark.parametrize("seed", range(24))
def test_native_team_matches_the_reference(seed, native):
    """2-D to 4-D operands, odd sizes, a float32 mask broadcast over heads with rows that attend to nothing, causal,
    scales of either sign, a NaN key, q/k/v/out through a (B, T, H, D) layout's strides, 2 or 3 threads, a smaller
    run after the max: the region ran (mask float32 or none) and the output is the reference's."""
    rng = np.random.default_rng(7000 + seed)
    pool.set_threads(int(rng.integers(2, 4)))
    rank = int(rng.choice([2, 3, 4, 4]))
    b, h = int(rng.integers(1, 4)), int(rng.integers(1, 6))
    L, S = int(rng.choice([1, 7, 16, 33, 64, 100])), int(rng.choice([1, 5, 17, 64, 130]))
    e, dv = int(rng.choice([4, 8, 20, 64])), int(rng.choice([4, 16, 24]))
    strided = rank == 4 and bool(rng.random() < 0.4)
    lead = {2: (), 3: (h,), 4: (b, h)}[rank]
    if strided:
        q = _x(rng, b, L, h, e).transpose(0, 2, 1, 3)
        k, v = (_x(rng, b, S, h, d).transpose(0, 2, 1, 3) for d in (e, dv))
    else:
        q, k, v = _x(rng, *lead, L, e), _x(rng, *lead, S, e), _x(rng, *lead, S, dv)
    if rng.random() < 0.3:
        k.reshape(-1, S, e)[0, int(rng.integers(0, S)), 0] = np.nan
    inputs = [q, k, v]
    if rng.random() < 0.5:
        m = np.where(rng.random((*lead[:-1], 1, L, S) if lead else (L, S)) > 0.2, 0.5, -np.inf).astype(np.float32)
        m[..., 0, :] = -np.inf  # a row with nothing to attend to
        inputs.append(m)
    params = {"is_causal": bool(rng.random() < 0.3), "masked_rows": "nan" if rng.random() < 0.5 else "zero",
              "scale": None if rng.random() < 0.5 else float(rng.choice([0.1, -3.0]))}
    node = make_node("Attention", len(inputs), params=params)
    kernel, workspace = build_kernel(node, infos_of(inputs))
    for sub in (inputs, [a[..., :max(1, a.shape[-2] * 2 // 3), :] if i < 3 else a for i, a in enumerate(inputs)]):
        if len(sub) > 3:
            sub[3] = sub[3][..., :sub[0].shape[-2], :sub[1].shape[-2]]
        out = (np.empty((b, sub[0].shape[-2], h, dv), np.float32).transpose(0, 2, 1, 3) if strided
               else np.empty((*lead, sub[0].shape[-2], dv), np.float32))
        native.clear()
        kernel(sub, [out], workspace)
        assert_close(out, reference(node, sub)[0], 1e-4, 1e-5, f"seed {seed} shapes {[a.shape for a in sub]}")
        assert native and all(native), native  # every split run went to the region


def test_a_bool_mask_keeps_the_python_items(native):
    """attend_team is compiled for float32 masks only: a bool one runs the split from Python, as before."""
    rng = np.random.default_rng(3)
    pool.set_threads(2)
    q, k, v = _x(rng, 2, 4, 40, 16), _x(rng, 2, 4, 40, 16), _x(rng, 2, 4, 40, 8)
    m = rng.random((2, 1, 40, 40)) > 0.3
    node = make_node("Attention", 4)
    kernel, workspace = build_kernel(node, infos_of([q, k, v, m]))
    out = np.empty((2, 4, 40, 8), np.float32)
    kernel([q, k, v, m], [out], workspace)
    assert_close(out, reference(node, [q, k, v, m])[0], 1e-4, 1e-5)
    assert native == []  # never asked: the split went to parallel_for


def test_every_chunk_runs_once_on_a_smaller_team(native, monkeypatch):
    """OpenMP may give a region fewer threads than asked: the threads it gives run every chunk between them. Here
    the region function runs on the calling thread alone, told it is thread 0 of 1: it runs all the chunks."""
    rng = np.random.default_rng(5)
    pool.set_threads(3)
    alone = [ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 0), ctypes.CFUNCTYPE(ctypes.c_int)(lambda: 1)]
    monkeypatch.setattr(pool, "openmp_thread_functions",  # the words region_job writes
                        lambda: tuple(ctypes.cast(f, ctypes.c_void_p).value for f in alone))

    def on_this_thread(fn, job):
        ctypes.CFUNCTYPE(None, ctypes.c_void_p)(fn)(job.ctypes.data)
        return True
    monkeypatch.setattr(fused, "run_native", on_this_thread)
    q, k, v = _x(rng, 1, 6, 48, 16), _x(rng, 1, 6, 48, 16), _x(rng, 1, 6, 48, 8)
    node = make_node("Attention", 3)
    kernel, workspace = build_kernel(node, infos_of([q, k, v]))
    out = np.full((1, 6, 48, 8), np.nan, np.float32)
    kernel([q, k, v], [out], workspace)
    assert native == [True]
    assert_close(out, reference(node, [q, k, v])[0], 1e-4, 1e-5)


def test_the_region_function_reads_the_job_layout_it_was_compiled_for():
    """The job's word indices are distinct and within JOB_LEN (a layout change that overlaps two fields would
    feed one field's value to another)."""
    words = [A.JOB_THREAD_NUM, A.JOB_NUM_THREADS, A.JOB_GEMM, A.JOB_WIDE, A.JOB_CHUNKS, A.JOB_TABLE, A.JOB_OFFSETS,
             A.JOB_PTRS, A.JOB_STRIDES, A.JOB_MASK, *range(A.JOB_MASK_SHAPE, A.JOB_MASK_SHAPE + 4),
             *range(A.JOB_MASK_STRIDES, A.JOB_MASK_STRIDES + 4), A.JOB_KIND, A.JOB_CAUSAL, A.JOB_NAN_ROWS,
             A.JOB_SCALE, A.JOB_S, A.JOB_E, A.JOB_DV, A.JOB_SLOTS, A.JOB_S_LEN, A.JOB_L_LEN, A.JOB_ERROR]
    assert sorted(words) == list(range(A.JOB_LEN))


def test_a_run_without_a_mask_and_one_with_do_not_share_a_job(native):
    """Called directly, a mask input may be None on one run and a float32 mask on the next, at the same shapes: each
    run gets the job of its own mask kind (the mask is not silently left out)."""
    rng = np.random.default_rng(11)
    pool.set_threads(2)
    q, k, v = _x(rng, 1, 4, 32, 16), _x(rng, 1, 4, 32, 16), _x(rng, 1, 4, 32, 8)
    m = np.where(rng.random((1, 1, 32, 32)) > 0.5, 0.0, -np.inf).astype(np.float32)
    node = make_node("Attention", 4)
    kernel, workspace = build_kernel(node, infos_of([q, k, v, m]))
    for mask in (None, m, None):
        out = np.empty((1, 4, 32, 8), np.float32)
        kernel([q, k, v, mask], [out], workspace)
        want = reference(make_node("Attention", 3), [q, k, v])[0] if mask is None else reference(node, [q, k, v, m])[0]
        assert_close(out, want, 1e-4, 1e-5)
    assert native == [True, True, True]


def test_an_item_its_slot_cannot_hold_is_an_error_not_a_silent_output(native, monkeypatch):
    """The region function raises nothing: a thread that meets an item larger than its slot sets the job's error word
    and the kernel raises, naming the node (here the slots are told smaller than they are)."""
    rng = np.random.default_rng(13)
    pool.set_threads(2)
    real_init = fused._TeamJob.__init__

    def small_slots(self, *args):
        real_init(self, *args)
        self.job[A.JOB_S_LEN] = 1
    monkeypatch.setattr(fused._TeamJob, "__init__", small_slots)
    q, k, v = _x(rng, 1, 4, 32, 16), _x(rng, 1, 4, 32, 16), _x(rng, 1, 4, 32, 8)
    node = make_node("Attention", 3)
    kernel, workspace = build_kernel(node, infos_of([q, k, v]))
    with pytest.raises(KernelError, match=re.escape(node.where()) + ".*outgrew its slot"):
        kernel([q, k, v], [np.empty((1, 4, 32, 8), np.float32)], workspace)
