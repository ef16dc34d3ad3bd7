"""Softmax / LogSoftmax CPU kernel vs the reference at and below max shape, infinities, float16, no
temporaries."""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import check_kernel, infer, kernel_peak_bytes, make_node

RNG = np.random.default_rng(3)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [0, 1, -1, -2])
def test_kernel_matches_reference(op, axis):
    x = (RNG.standard_normal((3, 5, 7)) * 5).astype(np.float32)
    x[0, 0, 0] = 90.0
    node = make_node(op, 1, params={"axis": axis})
    check_kernel(node, [x])
    check_kernel(node, [x[:2, :4, :3].copy()], [x])


def test_kernel_rows_sum_to_one_and_handle_infinities():
    x = RNG.standard_normal((4, 9)).astype(np.float32)
    x[1, :4] = -np.inf  # masked positions
    node = make_node("Softmax", 1, params={"axis": -1})
    check_kernel(node, [x])
    check_kernel(make_node("LogSoftmax", 1, params={"axis": 1}), [x])


def test_integer_input_gives_float32():
    x = np.arange(12, dtype=np.int64).reshape(3, 4)
    (info,) = infer(make_node("Softmax", 1, params={"axis": 1}), [x])
    assert info.dtype == np.float32
    check_kernel(make_node("Softmax", 1, params={"axis": 1}), [x])


@pytest.mark.parametrize("axis", [1, -1])
def test_kernel_allocates_no_temporaries(axis):
    x = RNG.standard_normal((4, 16, 32, 32)).astype(np.float32)
    assert kernel_peak_bytes(make_node("Softmax", 1, params={"axis": axis}), [x]) < 16 * 1024


def test_float16_runs_through_the_reference_path():
    x = RNG.standard_normal((3, 8)).astype(np.float16)
    check_kernel(make_node("Softmax", 1, params={"axis": -1}), [x], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_large_last_axis_softmax_matches_reference_with_masked_rows(op):
    """Attention-sized rows (float32 long rows for Softmax, oneDNN's primitive for LogSoftmax where installed):
    -inf entries give 0 (log: -inf), an all -inf row NaN, as torch."""
    from op_harness import build_kernel, cpu_device, infos_of, reference, run_kernel

    x = (np.random.default_rng(4).standard_normal((2, 12, 40, 77)) * 5).astype(np.float32)
    x[0, 0, 0] = -np.inf
    x[0, 1, 3, :5] = -np.inf
    node = make_node(op, 1, params={"axis": -1})
    for device in (cpu_device(), cpu_device(onednn=False)):
        got, want = run_kernel(node, [x], device=device)[0], reference(node, [x])[0]
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        finite = np.isfinite(want)
        np.testing.assert_array_equal(np.isfinite(got), finite)
        np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-5)
    fn, _ = build_kernel(node, infos_of([x], node=node))
    if op == "Softmax":
        assert fn.impl == "numba:rows-f32"
    else:
        assert fn.impl.endswith("softmax") or not cpu_device().backends.onednn


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the reference's inf - inf
@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 16, 33, 64, 65, 100, 197, 1000])
def test_float32_rows_match_the_reference_with_every_special_value(n):
    """Softmax over the last axis in float32 (devices/cpu/softmax.py: an exp across rows up to SHORT_ROW entries,
    row by row beyond) against the float64 reference, at the max shape and below, with rows as torch's softmax
    treats them: a NaN or +inf entry or every entry -inf makes the row NaN, a -inf entry among finite ones gives 0,
    huge magnitudes stay exact."""
    from op_harness import build_kernel, infos_of

    x = (RNG.standard_normal((3, 40, n)) * 8).astype(np.float32)
    x[0, 0] = -np.inf
    x[0, 1, 0] = np.nan
    x[0, 2, -1] = np.inf
    x[0, 3, 0] = -np.inf
    x[0, 4, -1], x[0, 4, 0] = -1e30, 1e30  # n = 1: the row is 1e30
    x[0, 5] = 88.0  # exp's overflow edge, shifted to 0 by the row max
    node = make_node("Softmax", 1, params={"axis": -1})
    kernel, _ = build_kernel(node, infos_of([x]))
    assert kernel.impl == "numba:rows-f32"
    check_kernel(node, [x])
    check_kernel(node, [x[:2, :17].copy()], [x])


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the reference's inf - inf
@pytest.mark.parametrize("n", [1, 2, 17, 64, 65, 130])
@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf, -np.nan])
def test_float32_rows_with_a_special_value_at_every_position(n, special):
    """A NaN, +inf or -inf at each position of a row in turn: NaN first is the case a max that skipped NaNs (a
    no-NaN fast-math flag) would get wrong."""
    x = (RNG.standard_normal((n, n)) * 4).astype(np.float32)
    x[np.arange(n), np.arange(n)] = special
    check_kernel(make_node("Softmax", 1, params={"axis": -1}), [x])


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("rows,n", [(70_000, 4), (2_000, 197)])
def test_float32_rows_in_place_and_split_over_threads(rows, n):
    """Rows enough to split over the threads (above threads.MIN_WORK elements), special rows at the chunks' ends
    and middle, the output the input's own buffer."""
    x = RNG.standard_normal((rows, n)).astype(np.float32)
    half = rows // 2
    x[5, 1] = -np.inf
    x[half - 1, 2], x[half, 0], x[half + 1] = np.nan, np.inf, -np.inf
    x[-1, 3] = np.nan
    node = make_node("Softmax", 1, params={"axis": -1})
    check_kernel(node, [x])
    check_kernel(node, [x], inplace=True)


def test_other_axes_and_log_softmax_keep_onednn_or_the_loop():
    from op_harness import build_kernel, infos_of

    x = RNG.standard_normal((5, 65)).astype(np.float32)
    for node in (make_node("LogSoftmax", 1, params={"axis": -1}), make_node("Softmax", 1, params={"axis": 0})):
        assert getattr(build_kernel(node, infos_of([x]))[0], "impl", "") != "numba:rows-f32"
        check_kernel(node, [x])


@pytest.mark.parametrize("n", [3, 100])
def test_float32_rows_into_a_strided_output_still_land_there(n):
    """An output that is not one contiguous buffer would make the row loop's reshape a copy (the result lost): the
    general loop takes it."""
    from op_harness import build_kernel, infos_of, reference

    x = RNG.standard_normal((6, n)).astype(np.float32)
    node = make_node("Softmax", 1, params={"axis": -1})
    kernel, workspace = build_kernel(node, infos_of([x]))
    out = np.zeros((6, 2 * n), np.float32)[:, ::2]
    kernel([x], [out], workspace)
    np.testing.assert_allclose(out, reference(node, [x])[0], rtol=1e-5, atol=1e-6)
