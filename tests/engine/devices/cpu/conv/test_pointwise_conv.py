"""Plain 1x1 convolutions on oneDNN's matmul (devices/cpu/conv/pointwise.py) against the float64 reference: bias
or none, a residual, fused and late activations with their special values, batches and maps below the max shape,
a native program's records, and the convs it must leave to other paths."""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import build_kernel, check_kernel, cpu_device, infos_of, make_node, reference, replay

from engine.errors import KernelError

RNG = np.random.default_rng(11)
pytestmark = pytest.mark.skipif(not cpu_device().backends.onednn, reason="oneDNN is not installed")


def _node(c: int, o: int, *, bias=True, act=None, act_params=None, residual=False, k=1, stride=1, pads=0, groups=1):
    attrs = {"weight": RNG.standard_normal((o, c // groups, k, k)).astype(np.float32) / np.sqrt(c)}
    if bias:
        attrs["bias"] = RNG.standard_normal(o).astype(np.float32)
    params = {"stride": [stride, stride], "pads": [pads] * 4, "groups": groups, "activation": act,
              "activation_params": act_params or {}}
    return make_node("Conv", 2 if residual else 1, params=params, attrs=attrs)


def _inputs(node, n: int, c: int, o: int, h: int, w: int) -> list[np.ndarray]:
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    return [x] + ([RNG.standard_normal((n, o, h, w)).astype(np.float32)] if len(node.inputs) > 1 else [])


def _impl(node, ins) -> str:
    return build_kernel(node, infos_of(ins, node=node))[0].impl


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("act", [None, "relu", "relu6", "silu", "sigmoid", "gelu", "hardsigmoid", "leaky_relu"])
def test_matches_the_reference_at_and_below_the_max_shape(bias, residual, act):
    c, o = 24, 40
    node = _node(c, o, bias=bias, act=act, residual=residual)
    ins = _inputs(node, 3, c, o, 9, 11)
    assert _impl(node, ins).startswith("onednn-matmul:")
    check_kernel(node, ins, rtol=1e-5, atol=1e-5)
    check_kernel(node, [a[:2, :, :4, :7].copy() for a in ins], ins, rtol=1e-5, atol=1e-5)  # another plan
    check_kernel(node, [a[:1].copy() for a in ins], ins, rtol=1e-5, atol=1e-5)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("act", ["relu", "relu6", "silu"])
def test_special_values_keep_the_references_meaning(act):
    """NaN stays NaN through the clamps, huge values saturate as the reference's: the fused eltwise chains
    (onednn/eltwise.py, whose documented limit is an infinite pre-activation) on the matmul as on a conv."""
    node = _node(4, 6, act=act)
    x = RNG.standard_normal((1, 4, 3, 5)).astype(np.float32)
    x[0, 0, 0, 0], x[0, 1, 1, 2], x[0, 2, 2, 4] = np.nan, 1e30, -1e30
    got = build_and_run(node, [x])
    want = reference(node, [x])[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=1e-5, atol=1e-5)


def build_and_run(node, ins) -> np.ndarray:
    fn, ws = build_kernel(node, infos_of(ins, node=node))
    out = np.full(reference(node, ins)[0].shape, 7.0, np.float32)
    fn(ins, [out], ws)
    return out


@pytest.mark.parametrize("act", [None, "relu", "silu", "hardsigmoid"])
@pytest.mark.parametrize("residual", [False, True])
def test_records_replay_every_image(act, residual):
    """A native program's records re-point the primitive per image: the batch's every image written, the same
    numbers as the kernel's run, a late activation (hard-sigmoid: our pass after the primitive) included."""
    c, o = 16, 32
    node = _node(c, o, act=act, residual=residual)
    ins = _inputs(node, 3, c, o, 6, 6)
    fn, ws = build_kernel(node, infos_of(ins, node=node))
    want = np.empty((3, o, 6, 6), np.float32)
    fn(ins, [want], ws)
    out = np.full_like(want, 7.0)
    native = fn.native(ins, [out], ws)
    assert replay(native) is None
    np.testing.assert_array_equal(out, want)
    np.testing.assert_allclose(out, reference(node, ins)[0], rtol=1e-5, atol=1e-5)
    assert fn.native([ins[0][:, :, ::2].copy()] + ins[1:], [out], ws) is None  # no plan for that map yet
    assert fn.native([ins[0][:, :, :, ::-1]] + ins[1:], [out], ws) is None  # not contiguous


def test_a_strided_input_is_copied_and_a_larger_one_refused():
    node = _node(8, 4)
    big = RNG.standard_normal((2, 8, 10, 12)).astype(np.float32)
    fn, ws = build_kernel(node, infos_of([big[:, :, :5, :6]], node=node))
    x = big[:, :, ::2, ::2]
    out = np.empty((2, 4, 5, 6), np.float32)
    fn([x], [out], ws)
    np.testing.assert_allclose(out, reference(node, [np.ascontiguousarray(x)])[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(KernelError, match="beyond the max shape"):
        fn([big], [np.empty((2, 4, 10, 12), np.float32)], ws)


def test_other_convs_keep_their_paths():
    """Strided, padded, grouped and kxk convs are not 1x1 GEMMs; without oneDNN a 1x1 conv is the direct GEMM."""
    x = RNG.standard_normal((1, 8, 6, 6)).astype(np.float32)
    for node in (_node(8, 8, stride=2), _node(8, 8, pads=1), _node(8, 8, groups=2), _node(8, 8, k=3, pads=1)):
        assert not _impl(node, [x]).startswith("onednn-matmul")
    node = _node(8, 8)
    fn, _ = build_kernel(node, infos_of([x], node=node), cpu_device(onednn=False))
    assert fn.impl == "direct:gemm"
