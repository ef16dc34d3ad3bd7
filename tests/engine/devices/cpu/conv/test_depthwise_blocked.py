"""The depthwise conv on blocked values (engine/devices/cpu/conv/depthwise_blocked.py) against Conv's numpy float64
reference on the unblocked data: dilations up to an ASPP head's 36, strides, asymmetric and oversized pads (taps
wholly outside the map), kernels 1-7 and non-square, stride 1 (a strided one is refused: blocked.py then copies to
NCHW), blocks of 8 and 16 with channels off the block (padding lanes
must come out zero), every fused activation, a residual, and a smaller input after the max."""

from __future__ import annotations

import numpy as np
import pytest

from engine.devices.cpu import threads
from engine.devices.cpu.conv import depthwise_blocked as DB
from engine.devices.cpu.layout.blocked_ops import to_blocked, to_plain
from engine.errors import KernelError
from engine.ir import Node
from engine.ops.conv import conv_reference
from engine.ops.conv_geometry import conv_geom

rng = np.random.default_rng(5)


def make(c: int, kh: int, kw: int, stride=(1, 1), dilation=(1, 1), pads=(0, 0, 0, 0), act=None, act_params=None,
         bias=True) -> Node:
    attrs = {"weight": rng.standard_normal((c, 1, kh, kw)).astype(np.float32)}
    if bias:
        attrs["bias"] = rng.standard_normal(c).astype(np.float32)
    return Node("Conv", "dw", params={"stride": stride, "dilation": dilation, "pads": pads, "groups": c,
                                      "activation": act, "activation_params": act_params or {}}, attrs=attrs)


def check(node: Node, block: int, shapes: list[tuple[int, ...]], residual: bool = False) -> None:
    c = node.attrs["weight"].shape[0]
    conv = DB.BlockedDepthwise(node.attrs["weight"], node.attrs.get("bias"), node.params["activation"],
                               node.params["activation_params"], block,
                               lambda shape: conv_geom(node, (shape[0], c, shape[2], shape[3])))
    for shape in shapes:
        x = rng.standard_normal(shape).astype(np.float32)
        geo = conv_geom(node, shape)
        z = rng.standard_normal(geo.out_shape).astype(np.float32) if residual else None
        want = conv_reference(node, [x] + ([z] if residual else []))[0]
        out = np.full((geo.n, -(-c // block), geo.oh, geo.ow, block), np.nan, np.float32)  # every lane written
        conv.run(to_blocked(x, block), None if z is None else to_blocked(z, block), out)
        assert np.isfinite(out).all()
        if c % block:
            assert not out[:, -1, :, :, c % block:].any(), "padding lanes must be zero"
        tol = 1e-5 * max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(to_plain(out, c), want, rtol=1e-5, atol=tol, err_msg=f"{shape}")


@pytest.mark.parametrize("block", [16, 8])
@pytest.mark.parametrize("c,k,dilation,hw", [
    (256, 3, 12, 33), (48, 3, 6, 21), (20, 3, 24, 30), (36, 3, 36, 40),  # ASPP-like, channels off the block
    (24, 5, 2, 23), (40, 7, 1, 14), (17, 3, 4, 26), (16, 1, 1, 9), (16, 3, 1, 70),  # 70 wide: runs past one chunk
])
def test_geometries(block, c, k, dilation, hw):
    pad = dilation * (k // 2)
    node = make(c, k, k, (1, 1), (dilation, dilation), (pad, pad, pad, pad), "relu6")
    check(node, block, [(2, c, hw, hw + 3), (1, c, hw - 2, hw)])


def test_asymmetric_pads_and_non_square_kernel():
    """Pads larger than the dilated reach (taps wholly outside the map on some rows and columns) and uneven ones;
    a map of more rows than a band."""
    node = make(24, 3, 5, dilation=(7, 3), pads=(9, 2, 0, 11))
    check(node, 16, [(1, 24, 19, 10)])


def test_a_strided_conv_is_not_taken():
    node = make(24, 3, 3, stride=(2, 2), dilation=(6, 6), pads=(6, 6, 6, 6))
    assert not DB.BlockedDepthwise.applies(conv_geom(node, (1, 24, 20, 20)))
    assert DB.BlockedDepthwise.applies(conv_geom(make(24, 3, 3, dilation=(6, 6)), (1, 24, 20, 20)))


def test_a_map_smaller_than_the_dilation():
    """Dilation 24 on a 5x5 map: only the centre tap ever lands inside (the others read padding)."""
    node = make(32, 3, 3, dilation=(24, 24), pads=(24, 24, 24, 24))
    check(node, 16, [(1, 32, 5, 5)])


ACTIVATIONS = [("relu", None), ("relu6", None), ("clip", {"min": 0.2, "max": 0.8}), ("leaky_relu", {"alpha": 0.1}),
               ("sigmoid", None), ("silu", None), ("hardsigmoid", None), ("hardswish", None), ("tanh", None),
               ("elu", {"alpha": 1.0}), ("gelu", {"approximate": "none"}), ("gelu", {"approximate": "tanh"})]


@pytest.mark.parametrize("act,params", ACTIVATIONS, ids=[f"{a}-{p}" if p else a for a, p in ACTIVATIONS])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_activations_and_residual(act, params, residual):
    """Each fused activation after bias + residual; sigmoid(0), hardsigmoid(0) and clip(0) are not 0, so the
    padding lanes of the 20-channel output must be cleared after it."""
    node = make(20, 3, 3, dilation=(6, 6), pads=(6, 6, 6, 6), act=act, act_params=params)
    check(node, 16, [(2, 20, 15, 15)], residual=residual)


def test_an_activation_the_loop_does_not_know_runs_after_it(monkeypatch):
    """An activation without a numba code runs through apply_activation over the whole output, padding lanes
    cleared again."""
    monkeypatch.setattr(DB.E, "act_code", lambda name, params: None)
    node = make(20, 3, 3, dilation=(6, 6), pads=(6, 6, 6, 6), act="sigmoid")
    check(node, 16, [(1, 20, 15, 15)], residual=True)


def test_without_bias():
    node = make(18, 3, 3, dilation=(12, 12), pads=(12, 12, 12, 12), bias=False)
    check(node, 16, [(1, 18, 20, 20)])


def test_a_block_of_4_lanes():
    """A block width the fixed-lane loops of other kernels do not special-case: the generic lane loop."""
    node = make(10, 3, 3, dilation=(6, 6), pads=(6, 6, 6, 6), act="sigmoid")
    check(node, 4, [(3, 10, 14, 13), (1, 10, 9, 9)])


def test_split_over_more_threads_than_items_divide():
    """The items (image, block, band of rows) split into 3 chunks of uneven length: each chunk makes its own tiles
    and writes its own rows."""
    previous = threads.get_threads()
    threads.set_threads(3)
    try:
        node = make(40, 3, 3, dilation=(12, 12), pads=(12, 12, 12, 12), act="relu")
        check(node, 16, [(2, 40, 47, 45)], residual=True)  # 2 x 3 blocks x 6 bands = 36 items, above MIN_WORK
    finally:
        threads.set_threads(previous)


def test_non_finite_padding_lanes_of_the_input_do_not_reach_the_output():
    """An input whose padding lanes hold inf (a producer that broke the zero-lane rule) gives 0 * inf = NaN there;
    the output's padding lanes are still zero, so a following conv cannot spread it."""
    node = make(20, 3, 3, dilation=(6, 6), pads=(6, 6, 6, 6))
    conv = DB.BlockedDepthwise(node.attrs["weight"], node.attrs["bias"], None, None, 16,
                               lambda shape: conv_geom(node, (shape[0], 20, shape[2], shape[3])))
    x = rng.standard_normal((1, 20, 15, 15)).astype(np.float32)
    xb = to_blocked(x, 16)
    xb[:, -1, :, :, 20 % 16:] = np.inf
    out = np.full((1, 2, 15, 15, 16), np.nan, np.float32)
    conv.run(xb, None, out)
    assert not out[:, -1, :, :, 20 % 16:].any()
    np.testing.assert_allclose(to_plain(out, 20), conv_reference(node, [x])[0], rtol=1e-5, atol=1e-4)


def test_arrays_of_another_shape_are_refused():
    """The loop reads without bounds checks: an output or residual of the wrong shape is an error, not a read or
    write past its end."""
    node = make(20, 3, 3, dilation=(6, 6), pads=(6, 6, 6, 6))
    conv = DB.BlockedDepthwise(node.attrs["weight"], node.attrs["bias"], None, None, 16,
                               lambda shape: conv_geom(node, (shape[0], 20, shape[2], shape[3])))
    x = np.zeros((1, 2, 15, 15, 16), np.float32)
    with pytest.raises(KernelError, match="want output"):
        conv.run(x, None, np.zeros((1, 2, 15, 14, 16), np.float32))
    with pytest.raises(KernelError, match="residual"):
        conv.run(x, np.zeros((1, 2, 14, 15, 16), np.float32), np.zeros((1, 2, 15, 15, 16), np.float32))
    with pytest.raises(KernelError):
        conv.run(np.zeros((1, 1, 15, 15, 16), np.float32), None, np.zeros((1, 2, 15, 15, 16), np.float32))


def test_inside_a_network_through_the_layout_rewrite():
    """A separable atrous block as DeepLab's heads have it (1x1, 3x3 depthwise at dilation 12 with ReLU, 1x1) built
    as a graph and run by an instance: the layout rewrite keeps the depthwise conv between blocked sides, where
    oneDNN has no jit kernel for it (forced here on every host), so it runs this loop; the output matches the chain
    of Conv's float64 references, at the max shape and a smaller one."""
    from engine.devices.cpu.onednn import objects as onednn
    from engine.ir import Graph
    from engine.runtime.loading import prepare
    from engine.runtime.model import Model

    if not onednn.available():
        pytest.skip("oneDNN (libdnnl.so.3) is not installed: no blocked layout")
    def pointwise(c: int, o: int) -> Node:
        return Node("Conv", "pw", params={"stride": (1, 1), "dilation": (1, 1), "pads": (0, 0, 0, 0), "groups": 1,
                                          "activation": None, "activation_params": {}},
                    attrs={"weight": (rng.standard_normal((o, c, 1, 1)) / np.sqrt(c)).astype(np.float32),
                           "bias": rng.standard_normal(o).astype(np.float32)})

    convs = [pointwise(24, 40), make(40, 3, 3, dilation=(12, 12), pads=(12, 12, 12, 12), act="relu"),
             pointwise(40, 16)]
    g = Graph(meta={"format": "canonical"})
    g.inputs = [g.value("x", (-1, 24, -1, -1), np.float32)]  # batch and map dynamic within the max
    y = g.inputs[0]
    for c in convs:
        y = g.add_node("Conv", [y], params=dict(c.params), attrs=dict(c.attrs)).outputs[0]
    g.outputs = [y]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("engine.devices.cpu.conv.blocked.is_jit", lambda impl: False)
        inst = Model(prepare(g)).instance("cpu", max_shapes={"x": (2, 24, 29, 31)})
    impls = [getattr(c.kernel, "impl", "") for c in inst._compiled.nodes if c.node.op_type == "ConvBlocked"]
    assert "direct:depthwise-blocked" in impls, impls
    for shape in [(2, 24, 29, 31), (1, 24, 20, 17)]:
        x = rng.standard_normal(shape).astype(np.float32)
        want = x
        for c in convs:
            want = conv_reference(c, [want])[0]
        got = inst.run({"x": x})[inst.graph.outputs[0].name]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


@pytest.mark.parametrize("threads_n", [2, 3])
@pytest.mark.parametrize("c,residual", [(40, True), (32, False)])
def test_native_region_and_records_give_the_python_loops_bits(c, residual, threads_n, monkeypatch, request):
    """The loop split as one native region (depthwise_blocked_team, forced on over 2 and 3 threads) and recorded
    into a native program: bit for bit the one-thread Python loop's output, padding lanes zero, with a residual,
    at the max shape and below."""
    from op_harness import cpu_device, replay

    from engine.devices.cpu import native_program as N

    cpu_device()
    if threads.pool_kind(threads.get_policy(), threads._openmp is not None) != "openmp":
        pytest.skip("our kernels do not run on OpenMP's team here (no oneDNN, or the `short` wait policy)")
    node = make(c, 3, 3, dilation=(12, 12), pads=(12, 12, 12, 12), act="relu6")
    conv = DB.BlockedDepthwise(node.attrs["weight"], node.attrs["bias"], "relu6", {}, 16,
                               lambda shape: conv_geom(node, (shape[0], c, shape[2], shape[3])))
    previous = threads.get_threads()
    request.addfinalizer(lambda: threads.set_threads(previous))
    ran: list[bool] = []
    real = DB.run_native
    for shape in [(2, c, 29, 31), (1, c, 17, 20)]:
        x = to_blocked(rng.standard_normal(shape).astype(np.float32), 16)
        out_shape = (shape[0], -(-c // 16), shape[2], shape[3], 16)
        z = rng.standard_normal(out_shape).astype(np.float32) if residual else None
        if z is not None:
            z[:, -1, :, :, c % 16 or 16:] = 0
        with monkeypatch.context() as m:  # one thread, from Python: the reference bits
            m.setattr(DB, "native_regions", lambda: False)
            m.setattr(threads, "MIN_WORK", 1 << 62)
            want = np.full(out_shape, np.nan, np.float32)
            conv.run(x, z, want)
        threads.set_threads(threads_n)
        ran.clear()
        with monkeypatch.context() as m:
            m.setattr(DB, "run_native", lambda fn, job: ran.append(real(fn, job)) or ran[-1])
            m.setattr(DB, "native_regions", lambda: True)
            m.setattr(threads, "native_regions", lambda: True)
            m.setattr(DB, "NATIVE_BLOCKED_TAPS", 0)
            out = np.full(out_shape, np.nan, np.float32)
            conv.run(x, z, out)
            assert ran == [True]
            np.testing.assert_array_equal(out, want)
            if c % 16:
                assert not out[:, -1, :, :, c % 16:].any()
            out[...] = np.nan
            native = conv.records(x, z, out)
            assert [r[0] for r in native.records] == [N.OP_REGION] and replay(native) is None
            np.testing.assert_array_equal(out, want)
        threads.set_threads(previous)
