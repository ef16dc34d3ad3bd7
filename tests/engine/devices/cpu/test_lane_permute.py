"""loops/lane_permute.py's permute_merge against numpy, at each width, natively where this CPU has the permute and
lane by lane where it does not (the form every other CPU compiles); NaN payloads and signed zeros kept bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from engine.devices.cpu.loops import lane_permute

rng = np.random.default_rng(5)


def _merge_function(width: int):
    """A fresh njit function (compiled on its first call, after any monkeypatch) applying permute_merge to arrays."""
    @njit
    def merge(dst, src, idx, mask, first):
        lane_permute.permute_merge(dst.ctypes.data, src.ctypes.data, idx.ctypes.data, mask, first, width)
    return merge


def _expected(dst, src, idx, mask, first):
    keep = np.zeros_like(dst) if first else dst
    bits = (mask >> np.arange(len(dst))) & 1
    return np.where(bits.astype(bool), src[idx], keep)


@pytest.mark.parametrize("width,native", [(4, False), (8, False), (16, False), (8, True), (16, True)])
def test_permute_merge_matches_numpy(width, native, monkeypatch):
    if native and not lane_permute.native_width(width):
        pytest.skip(f"no native {width}-lane permute on this CPU (only the lane-by-lane form is compiled here)")
    if not native:
        monkeypatch.setattr(lane_permute, "native_width", lambda w: False)
    merge = _merge_function(width)
    src = rng.standard_normal(width).astype(np.float32)
    src[0] = np.frombuffer(np.uint32(0x7FC01234).tobytes(), np.float32)[0]  # a NaN with a payload
    src[-1] = -0.0
    for trial in range(20):
        idx = rng.integers(0, width, width).astype(np.int32)
        mask = int(rng.integers(0, 1 << width))
        first = bool(trial % 2)
        dst = rng.standard_normal(width).astype(np.float32)
        want = _expected(dst, src, idx, mask, first)
        merge(dst, src, idx, mask, first)
        assert dst.view(np.uint32).tolist() == want.view(np.uint32).tolist()


def test_native_widths_follow_the_target_features(monkeypatch):
    def flags(*f):
        monkeypatch.setattr(lane_permute, "_target_flags", lambda: f)

    flags("+avx2", "-avx512f")
    assert lane_permute.native_width(8) and not lane_permute.native_width(16) and not lane_permute.native_width(4)
    flags("+avx512f", "+avx2", "+evex512")
    assert lane_permute.native_width(16) and lane_permute.native_width(8)
    flags("+avx512f", "+avx2", "-evex512")  # LLVM 18's 256-bit-only AVX-512 (AVX10/256)
    assert not lane_permute.native_width(16) and lane_permute.native_width(8)
    flags("+avx512f", "+avx2")  # an LLVM before evex512 existed
    assert lane_permute.native_width(16)
    flags("+neon")
    assert not any(lane_permute.native_width(w) for w in (4, 8, 16))


def test_the_gate_reads_numbas_own_features(monkeypatch):
    """numba turns every AVX feature off on CPUs it does not trust with AVX (NUMBA_ENABLE_AVX=0, some cloud VMs'
    CPU names): the gate sees what numba compiles for, not the raw host, so no AVX instruction is ever emitted
    there."""
    monkeypatch.setattr(lane_permute.config, "CPU_FEATURES", None)
    monkeypatch.setattr(lane_permute.codegen, "get_host_cpu_features", lambda: "+sse4.2,-avx,-avx2,-avx512f")
    lane_permute._target_flags.cache_clear()
    try:
        assert not lane_permute.native_width(8) and not lane_permute.native_width(16)
    finally:
        monkeypatch.undo()
        lane_permute._target_flags.cache_clear()
