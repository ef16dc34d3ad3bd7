"""CPU kernels of the copying layout ops and Shape vs the references; the alias ops have none."""

from __future__ import annotations

import platform
import warnings
from types import SimpleNamespace

import numpy as np
import pytest
from op_harness import check_kernel, make_node, reference, run_kernel

from engine.devices.cpu import KERNELS as CPU_KERNELS
from engine.devices.cpu import shape as shape_kernels
from engine.devices.cpu.fused_calls import step_native
from engine.devices.cpu.native_program import Program
from engine.devices.cpu.onednn import binding as onednn_binding
from engine.devices.cpu.onednn import objects as onednn
from engine.ops import get_op
from engine.ops.registry import TensorInfo

RNG = np.random.default_rng(6)


def test_reshape_family_are_aliases_without_kernels():
    for op in ("Reshape", "Flatten", "Squeeze", "Unsqueeze"):
        assert get_op(op).alias and op not in CPU_KERNELS
    for op in ("Transpose", "Expand", "Tile", "Cast", "Identity"):
        assert not get_op(op).alias and op in CPU_KERNELS


@pytest.mark.parametrize("op,params,max_shape,shape", [
    ("Transpose", {"perm": [2, 0, 1]}, (4, 5, 6), (3, 2, 5)),
    ("Transpose", {"perm": None}, (4, 5, 6), (4, 5, 6)),
    ("Expand", {"shape": [2, -1, 3, 4]}, (5, 1, 4), (3, 1, 4)),
    ("Tile", {"repeats": [2, 1, 3]}, (4, 5), (2, 3)),
    ("Tile", {"repeats": [3]}, (4, 5), (1, 5)),
    ("Cast", {"to": "int64"}, (3, 4), (2, 4)),
    ("Cast", {"to": "FP16"}, (3, 4), (3, 4)),
    ("Identity", {}, (7,), (3,)),
])
def test_kernel_matches_reference(op, params, max_shape, shape):
    node = make_node(op, 1, params=params)
    big = (RNG.standard_normal(max_shape) * 3).astype(np.float32)
    small = (RNG.standard_normal(shape) * 3).astype(np.float32)
    check_kernel(node, [big])
    check_kernel(node, [small], [big])


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8, np.bool_, np.float64])
@pytest.mark.parametrize("shape,perm", [
    ((6, 2, 5, 2), [0, 2, 1, 3]),  # MobileViT's unfold: runs of 2 floats (8 bytes)
    ((3, 5, 2, 4), [2, 0, 1, 3]),  # 16 bytes of float32, 8 of float16
    ((4, 3, 8), [1, 0, 2]),  # 32 bytes of float32, 16 of float16, 8 of int8
    ((4, 3, 5), [1, 0, 2]),  # 20 bytes of float32
    ((2, 7, 3, 8), [0, 2, 1, 3]),  # a blocked layout's 8 lanes
    ((2, 8), [0, 1]),
    ((3, 4, 1), [1, 0, 2]),  # one element a row: copied as is
])
def test_transpose_keeping_the_last_axis_matches_numpy(dtype, shape, perm):
    """The last axis kept: copied as whole rows (one element of the row's bytes), on contiguous and strided inputs,
    every dtype bit for bit."""
    x = (RNG.standard_normal(shape) * 3).astype(dtype)
    node = make_node("Transpose", 1, params={"perm": perm})
    for a in (x, np.flip(x, axis=0), np.concatenate([x, x], axis=-2)[..., ::2, :]):
        got = run_kernel(node, [a])[0]
        np.testing.assert_array_equal(got, np.transpose(a, perm))


TEAM_CASES = [
    ((8, 4, 14, 14, 16), (0, 2, 3, 1, 4)),  # EfficientFormerV2's blocked heads out of a conv
    ((8, 7, 7, 8, 16), (0, 3, 1, 2, 4)),
    ((1, 8, 49, 128), (0, 1, 3, 2)),  # keys transposed
    ((3, 5, 7, 11, 13), (4, 2, 0, 3, 1)),  # odd sizes, every axis moved
    ((2, 3, 4, 5, 6, 70), (5, 4, 3, 2, 1, 0)),
    ((600, 700), (1, 0)),
    ((1, 300, 1, 800), (3, 2, 1, 0)),  # size-1 axes
]


NO_ONEDNN = pytest.mark.skipif(not onednn.available(), reason="oneDNN is not installed")


@NO_ONEDNN
@pytest.mark.parametrize("shape,perm", TEAM_CASES)
def test_team_transpose_is_numpys_bit_for_bit(shape, perm, monkeypatch):
    """The float32 transposes oneDNN's reorder runs (split over the threads) give numpy's result bit for bit, NaN
    payloads and signed zeros included, on contiguous inputs and on strided views; the path is taken whenever the
    copy is big enough to split (forced here, whatever this machine's core count)."""
    monkeypatch.setattr(shape_kernels, "threads_for", lambda work: 2)
    monkeypatch.setattr(shape_kernels, "TEAM_MAX_BYTES", 1 << 30)
    base = RNG.standard_normal((*shape[:-1], 2 * shape[-1])).astype(np.float32)
    base.view(np.uint32).ravel()[::97] = 0x7FC01234  # quiet NaNs with a payload
    base.ravel()[1::89] = -0.0
    team = shape_kernels.TeamTranspose(perm)
    for x in (np.ascontiguousarray(base[..., : shape[-1]]), base[..., : shape[-1]], base[..., ::2]):
        want = np.transpose(x, perm)
        out = np.full(want.shape, 7.0, np.float32)
        assert team.run(x, out)
        np.testing.assert_array_equal(out.view(np.uint32), np.ascontiguousarray(want).view(np.uint32))


@NO_ONEDNN
def test_team_transpose_declines_what_numpy_copies_better(monkeypatch):
    """Negative strides, broadcast (stride 0) axes, overlapping elements, 0-d, 1-d and 13-d inputs, another dtype, a
    non-contiguous output, an empty input and work too small to split or rows past TEAM_MAX_BYTES go to numpy's copy
    (run returns False and writes nothing); the kernel then still gives numpy's result. A copy that moves the last
    axis stays oneDNN's at any size."""
    monkeypatch.setattr(shape_kernels, "threads_for", lambda work: 2)
    x = RNG.standard_normal((64, 48, 40)).astype(np.float32)
    team = shape_kernels.TeamTranspose((2, 0, 1))
    cases = [x[::-1], np.broadcast_to(x[:1], x.shape), np.zeros((0, 48, 40), np.float32)]
    for a in cases:
        out = np.full((a.shape[2], a.shape[0], a.shape[1]), 7.0, np.float32)
        assert not team.run(a, out)
        assert (out == 7.0).all()
    wide = np.zeros((40, 64, 96), np.float32)
    assert not team.run(x, wide[:, :, :48])
    monkeypatch.setattr(shape_kernels, "TEAM_MAX_BYTES", x.nbytes - 4)  # rows kept: numpy's past the bound
    assert not shape_kernels.TeamTranspose((1, 0, 2)).run(x, np.empty((48, 64, 40), np.float32))
    assert shape_kernels.TeamTranspose((2, 0, 1)).run(x, out := np.empty((40, 64, 48), np.float32))  # last moved
    np.testing.assert_array_equal(out, x.transpose(2, 0, 1))
    monkeypatch.setattr(shape_kernels, "TEAM_MAX_BYTES", x.nbytes)
    assert shape_kernels.TeamTranspose((1, 0, 2)).run(x, out := np.empty((48, 64, 40), np.float32))
    np.testing.assert_array_equal(out, x.transpose(1, 0, 2))
    monkeypatch.setattr(shape_kernels, "threads_for", lambda work: 1)
    assert not shape_kernels.TeamTranspose((2, 0, 1)).run(x, np.empty((40, 64, 48), np.float32))
    overlapping = np.lib.stride_tricks.as_strided(x, (300, 64), (4, 4))  # oneDNN refuses the descriptor
    assert not shape_kernels.TeamTranspose((1, 0)).run(overlapping, np.empty((64, 300), np.float32))
    assert not shape_kernels.TeamTranspose(()).run(np.float32(3).reshape(()), np.empty((), np.float32))
    assert not shape_kernels.TeamTranspose((0,)).run(x.ravel(), np.empty(x.size, np.float32))
    deep = np.zeros((2,) * 13, np.float32)  # more axes than oneDNN's 12
    assert not shape_kernels.TeamTranspose(tuple(range(13))[::-1]).run(deep, np.empty_like(deep))
    assert not shape_kernels.TeamTranspose((2, 0, 1)).run(x.astype(np.float64), np.empty((40, 64, 48)))
    node = make_node("Transpose", 1, params={"perm": [2, 0, 1]})
    for a in cases:
        out = np.empty((a.shape[2], a.shape[0], a.shape[1]), np.float32)
        kernel = shape_kernels._copy_kernel(SimpleNamespace(onednn=True), node, [TensorInfo(a.shape, np.float32)])
        kernel([a], [out], None)
        np.testing.assert_array_equal(out, np.transpose(a, (2, 0, 1)))
    scalar, out = np.float32(3).reshape(()), np.empty((), np.float32)
    kernel = shape_kernels._copy_kernel(SimpleNamespace(onednn=True), make_node("Transpose", 1, params={"perm": []}),
                                        [TensorInfo((), np.float32)])
    kernel([scalar], [out], None)
    assert out == 3


@NO_ONEDNN
def test_recorded_transposes_take_every_size_oneDNN_can(monkeypatch):
    """What a native program runs for a float32 Transpose: run's reorder where it has one, else one made for the
    small copies too, on one thread; none for what oneDNN cannot take, another dtype, a strided output, or a row
    copy past TEAM_MAX_BYTES. Its records, replayed, give numpy's result bit for bit."""
    monkeypatch.setattr(shape_kernels, "threads_for", lambda work: 1)  # run's path: numpy's copy at every size
    x = RNG.standard_normal((3, 20, 8)).astype(np.float32)
    x.view(np.uint32).ravel()[::13] = 0x7FC01234
    team = shape_kernels.TeamTranspose((2, 0, 1))
    out = np.full((8, 3, 20), 7.0, np.float32)
    assert not team.run(x, out)
    step = team.recorded(x, out)
    assert step is not None and step.threads(4) == 1 and team.recorded(x, out) is step
    ptrs = {onednn_binding.ARG_SRC: onednn.address(x), onednn_binding.ARG_DST: onednn.address(out)}
    assert Program(step_native(step, ptrs, step).records, [step]).run() is None
    np.testing.assert_array_equal(out.view(np.uint32), np.ascontiguousarray(x.transpose(2, 0, 1)).view(np.uint32))
    assert team.recorded(x[::-1], out) is None
    assert team.recorded(x.astype(np.float64), out) is None
    assert team.recorded(x, np.empty((8, 3, 40), np.float32)[:, :, :20]) is None
    rows = shape_kernels.TeamTranspose((1, 0, 2))  # the last axis kept: numpy's row copy past TEAM_MAX_BYTES
    assert rows.recorded(x, np.empty((20, 3, 8), np.float32)) is not None
    monkeypatch.setattr(shape_kernels, "TEAM_MAX_BYTES", x.nbytes - 4)
    assert shape_kernels.TeamTranspose((1, 0, 2)).recorded(x, np.empty((20, 3, 8), np.float32)) is None


def test_transpose_of_objects_copies_references():
    """Object rows are never copied as raw bytes (their references must be counted)."""
    x = np.array([[["a", "b"], ["c", "d"]], [["e", "f"], ["g", "h"]]], dtype=object)
    out = np.empty((2, 2, 2), dtype=object)
    shape_kernels._transpose(x, (1, 0, 2), out)
    np.testing.assert_array_equal(out, x.transpose(1, 0, 2))


def test_expand_and_reshape_take_target_from_input_value():
    x = np.zeros((3, 1), np.float32)
    target = np.array([2, 3, 5], np.int64)
    ins = [TensorInfo(x.shape, x.dtype), TensorInfo((3,), np.dtype(np.int64), target)]
    assert get_op("Expand").infer(make_node("Expand", 2), ins)[0].shape == (2, 3, 5)
    ins = [TensorInfo((2, 3, 5), x.dtype), TensorInfo((2,), np.dtype(np.int64), np.array([0, -1]))]
    assert get_op("Reshape").infer(make_node("Reshape", 2), ins)[0].shape == (2, 15)
    check_kernel(make_node("Expand", 2), [x, target])


def test_shape_kernel_reports_the_actual_shape():
    node = make_node("Shape", 1, params={"start": 1, "end": None})
    check_kernel(node, [np.zeros((2, 3, 4), np.float32)], [np.zeros((2, 5, 6), np.float32)])


@pytest.mark.parametrize("to", ["int64", "int32"])
def test_float_to_int_cast_of_non_finite_values_is_the_cpu_conversion_without_a_warning(to):
    """T5's relative-position buckets take log(0) = -inf to int64 and then mask those entries out: the Cast must
    give what torch gives (x86's conversion instruction gives 'integer indefinite', INT_MIN; ARM's saturates) and
    not warn. The expected values are the instructions' documented results, not our kernel's."""
    node = make_node("Cast", 1, params={"to": to})
    x = np.array([-np.inf, np.inf, np.nan, 1e30, -2.5, 3.0], np.float32)
    lo, hi = np.iinfo(to).min, np.iinfo(to).max
    if platform.machine().lower() in ("arm64", "aarch64"):  # ARM's conversion saturates, NaN gives 0
        want = np.array([lo, hi, 0, hi, -2, 3], to)
    else:
        want = np.array([lo, lo, lo, lo, -2, 3], to)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (got,) = run_kernel(node, [x])
        (ref,) = reference(node, [x])
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(ref, want)


@pytest.mark.parametrize("indexing", ["ij", "xy"])
@pytest.mark.parametrize("sizes", [(4, 6), (3, 5, 2), (2, 3, 4, 5), (1, 7)])
def test_meshgrid_kernel_at_and_below_max_shape(indexing, sizes):
    xs = [np.random.default_rng(n).standard_normal(n).astype(np.float32) for n in sizes]
    node = make_node("Meshgrid", len(xs), len(xs), params={"indexing": indexing})
    check_kernel(node, xs)
    check_kernel(node, [x[: max(1, len(x) - 1)].copy() for x in xs], xs)


@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_meshgrid_reference_is_numpys_meshgrid(indexing):
    # numpy's meshgrid takes torch's indexing names with torch's meaning (xy: the first two dims swapped)
    xs = [np.arange(n, dtype=np.int64) * (i + 1) for i, n in enumerate((3, 4, 2))]
    node = make_node("Meshgrid", 3, 3, params={"indexing": indexing})
    for got, want in zip(reference(node, xs), np.meshgrid(*xs, indexing=indexing), strict=True):
        np.testing.assert_array_equal(got, want)
