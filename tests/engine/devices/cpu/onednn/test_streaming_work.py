"""The thread count a oneDNN primitive is created for weighs the weights it streams (threads.work_of): a
matrix-vector product (a batch-1 classifier head, a 1x1 conv on a 1x1 map) reads megabytes for few multiply-adds
and is split over the team; a small one stays on one thread. Outputs match the references either way."""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import check_kernel, make_node

from engine.devices.cpu import threads as _threads
from engine.devices.cpu.conv import kernels as conv_kernels
from engine.devices.cpu.conv import onednn as _conv_onednn
from engine.devices.cpu.onednn import blocked
from engine.devices.cpu.onednn import objects as D

if not D.available():
    pytest.skip("oneDNN (libdnnl.so.3 from the onednn-cpu-gomp wheel) is not installed", allow_module_level=True)

RNG = np.random.default_rng(29)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.fixture
def two_threads():
    before = _threads.get_threads()
    _threads.set_threads(2)
    yield
    _threads.set_threads(before)


def test_work_of_is_the_larger_of_multiply_adds_and_streamed_bytes(two_threads):
    assert _threads.work_of(10_000_000, 1000) == 10_000_000  # a conv over a map: its multiply-adds
    assert _threads.work_of(1_228_800, 4 * 1_228_800) == _threads.MACS_PER_BYTE * 4 * 1_228_800  # a GEMV
    # GhostNet's batch-1 classifier (1000x1280 float32) weighs more than FORK_WORK; a 64x64 one does not
    assert _threads.threads_for(_threads.work_of(1280 * 1000, 4 * 1280 * 1000)) == _threads.get_threads()
    assert _threads.threads_for(_threads.work_of(64 * 64, 4 * 64 * 64)) == 1


@pytest.fixture
def created(monkeypatch):
    """(primitive kind, OpenMP threads it was created for) of every primitive the test makes (the blocked layout's
    probe conv, made once per process on first use, is made before the spy)."""
    blocked.native_block()
    made: list[tuple[str, int | None]] = []
    create = D.PrimitiveDesc.create

    def spy(cls, name, *args):
        made.append((name, getattr(D._local, "threads", None)))
        return create(name, *args)
    monkeypatch.setattr(D.PrimitiveDesc, "create", classmethod(spy))
    return made


def _threads_of(made: list[tuple[str, int | None]], prefix: str) -> set[int | None]:
    return {t for name, t in made if name.startswith(prefix)}


@pytest.mark.parametrize("k,n,expected", [(1280, 1000, 2), (64, 64, 1)])
def test_batch1_gemm_is_split_by_the_weights_it_reads(two_threads, created, k, n, expected):
    node = make_node("Gemm", 1, attrs={"weight": rand(n, k), "bias": rand(n)})
    check_kernel(node, [rand(1, k)], rtol=1e-4, atol=1e-4)
    assert _threads_of(created, "dnnl_matmul") == {expected}


def test_batch1_matmul_with_a_constant_operand_is_split_by_its_bytes(two_threads, created):
    b = rand(960, 1280)
    check_kernel(make_node("MatMul", 2), [rand(1, 960), b], rtol=1e-4, atol=1e-4)
    assert _threads_of(created, "dnnl_matmul") == {2}


@pytest.mark.parametrize("c,o,expected", [(960, 1280, 2), (32, 32, 1)])
def test_pointwise_conv_on_a_1x1_map_is_split_by_its_weights(two_threads, created, monkeypatch, c, o, expected):
    monkeypatch.setattr(conv_kernels, "_use_onednn",
                        lambda backends, node, ins: backends.onednn and _conv_onednn.supported(node, ins))
    node = make_node("Conv", 1, params={"stride": [1, 1], "pads": [0, 0, 0, 0]},
                     attrs={"weight": rand(o, c, 1, 1), "bias": rand(o)})
    check_kernel(node, [rand(1, c, 1, 1)], rtol=1e-4, atol=1e-4)
    assert _threads_of(created, "dnnl_convolution") == {expected}


def test_a_reorder_weighs_the_bytes_it_copies(two_threads):
    """ToBlocked of 256 x 65 x 65 (4.3 MB each way, 1.1M elements) is split over the team; a small one is not."""
    block = blocked.native_block() or 16
    big = D.reorder_step(D.MemoryDesc.plain((1, 256, 65, 65)), blocked.blocked_md((1, 256, 65, 65), block))
    small = D.reorder_step(D.MemoryDesc.plain((1, 16, 8, 8)), blocked.blocked_md((1, 16, 8, 8), block))
    assert (big.created, small.created) == (2, 1)
    x = rand(1, 256, 65, 65)
    out = np.zeros((1, -(-256 // block), 65, 65, block), np.float32)
    big.run({D.L.ARG_SRC: x.ctypes.data, D.L.ARG_DST: out.ctypes.data})
    np.testing.assert_array_equal(out, x.reshape(1, -1, block, 65, 65).transpose(0, 1, 3, 4, 2))


def test_a_step_never_runs_on_more_threads_than_it_was_created_for(two_threads, monkeypatch):
    """A reorder made while the process's count was 1 (another instance's) runs on 1 after the count went back to 2;
    one made for 2 runs on 1 while the count is 1."""
    block = blocked.native_block() or 16
    shape = (1, 256, 65, 65)
    _threads.set_threads(1)
    made_at_one = D.reorder_step(D.MemoryDesc.plain(shape), blocked.blocked_md(shape, block))
    _threads.set_threads(2)
    made_at_two = D.reorder_step(D.MemoryDesc.plain(shape), blocked.blocked_md(shape, block))
    counts: list[int] = []
    real = D._omp_threads
    monkeypatch.setattr(D, "_omp_threads", lambda n: (counts.append(n), real(n)))
    x = rand(*shape)
    out = np.zeros((1, -(-256 // block), 65, 65, block), np.float32)
    ptrs = {D.L.ARG_SRC: x.ctypes.data, D.L.ARG_DST: out.ctypes.data}
    made_at_one.run(ptrs)
    assert counts[0] == 1
    counts.clear()
    _threads.set_threads(1)
    made_at_two.run(ptrs)
    assert counts[0] == 1
