"""ConvBlocked's oneDNN kernel against Conv's numpy float64 reference (conv_reference on the unblocked data) and
against its own op reference, over geometries: channels off the block, groups, depthwise, stride, dilation,
residual, activations, a plain side, and smaller batches after the max shape."""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import build_kernel, get_op

from engine.devices.cpu.conv import blocked as conv_blocked_kernel
from engine.devices.cpu.conv import direct
from engine.devices.cpu.conv import onednn as onednn_conv
from engine.devices.cpu.conv.onednn import ConvSpec, Plan, is_jit, is_reference, prefers_own_layouts, primitive_impl
from engine.devices.cpu.layout.blocked_ops import to_blocked, to_plain
from engine.devices.cpu.layout.conv_blocked import geometry
from engine.devices.cpu.onednn import binding as L
from engine.devices.cpu.onednn import blocked as _onednn_blocked
from engine.devices.cpu.onednn import objects as onednn
from engine.devices.cpu.onednn.blocked import blocked_md
from engine.ir import Node
from engine.ops.conv import conv_reference
from engine.ops.registry import TensorInfo

if not onednn.available():
    pytest.skip("oneDNN (libdnnl.so.3 from the onednn-cpu-gomp wheel) is not installed", allow_module_level=True)

B = _onednn_blocked.native_block() or 16
OP = get_op("ConvBlocked")
rng = np.random.default_rng(11)


def make(c: int, o: int, k: int = 3, stride: int = 1, groups: int = 1, dilation: int = 1, act=None,
         act_params=None, src_blocked=True, dst_blocked=True, bias=True) -> tuple[Node, Node]:
    """(ConvBlocked node, the same conv as a plain Conv node)."""
    w = (rng.standard_normal((o, c // groups, k, k)) / np.sqrt(c * k * k / groups)).astype(np.float32)
    pad = dilation * (k // 2)
    params = {"stride": (stride, stride), "pads": (pad, pad, pad, pad), "dilation": (dilation, dilation),
              "groups": groups, "activation": act, "activation_params": act_params or {}}
    attrs = {"weight": w}
    if bias:
        attrs["bias"] = rng.standard_normal(o).astype(np.float32)
    blocked = Node("ConvBlocked", "cb", params=dict(params, src_blocked=src_blocked, dst_blocked=dst_blocked,
                                                     block=B), attrs=attrs)
    return blocked, Node("Conv", "c", params=params, attrs=attrs)


def run_case(node: Node, plain: Node, shapes: list[tuple[int, ...]], residual: bool, impl: str = "onednn:",
             device=None) -> None:
    """Builds at shapes[0] (the max) on `device` (default: the default CPU device) and runs every shape in order on
    the one kernel and workspace; the kernel built at the max shape reports `impl`."""
    p = node.params
    c, o = plain.attrs["weight"].shape[1] * p["groups"], plain.attrs["weight"].shape[0]
    kernel = workspace = None
    for shape in shapes:
        x = rng.standard_normal(shape).astype(np.float32)
        want = conv_reference(plain, [x])[0]
        z = rng.standard_normal(want.shape).astype(np.float32) if residual else None
        if residual:
            want = conv_reference(plain, [x, z])[0]
        ins = [to_blocked(x, B) if p["src_blocked"] else x]
        if residual:
            ins.append(to_blocked(z, B) if p["dst_blocked"] else z)
        infos = [TensorInfo(a.shape, a.dtype) for a in ins]
        out_info = OP.infer(node, infos)[0]
        if kernel is None:
            kernel, workspace = build_kernel(node, infos, device)
            assert kernel.impl.startswith(impl) and "ref" not in kernel.impl, kernel.impl
        out = np.full(out_info.shape, np.nan, np.float32)  # the kernel must write every element
        kernel(ins, [out], workspace)
        assert np.isfinite(out).all()
        got = to_plain(out, o) if p["dst_blocked"] else out
        tol = 1e-4 * max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=tol, err_msg=f"{shape} c={c} o={o}")
        ref = OP.reference(node, ins)[0]
        assert ref.shape == out.shape
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=tol)  # padding lanes included (zeros)


CASES = [
    # c, o, k, stride, groups, dilation, act, act_params
    pytest.param(32, 32, 3, 1, 1, 1, "relu", None, id="3x3"),
    pytest.param(24, 40, 3, 1, 1, 1, "relu6", None, id="3x3-channels-off-block"),
    pytest.param(40, 40, 3, 2, 40, 1, "silu", None, id="depthwise-s2-off-block"),
    pytest.param(48, 48, 3, 1, 48, 1, "hardswish", None, id="depthwise"),
    pytest.param(32, 64, 3, 1, 2, 1, "sigmoid", None, id="groups-2"),
    pytest.param(16, 16, 3, 1, 1, 2, "leaky_relu", {"alpha": 0.1}, id="dilation-2"),
    pytest.param(20, 36, 1, 1, 1, 1, "clip", {"min": -0.5, "max": 0.5}, id="1x1"),
    pytest.param(16, 24, 1, 2, 1, 1, "gelu", {"approximate": "none"}, id="1x1-s2-gelu"),
    pytest.param(32, 16, 5, 2, 1, 1, "elu", {"alpha": 1.0}, id="5x5-s2-elu"),
    pytest.param(16, 16, 3, 1, 1, 1, "tanh", None, id="tanh"),
    # oneDNN has only its reference kernel for these on nChw{B}c sides: the plan reorders into its own layouts
    pytest.param(32, 32, 3, 1, 1, 12, "relu", None, id="aspp-dilation-12"),
    pytest.param(32, 32, 3, 1, 32, 6, None, None, id="depthwise-dilation-6"),
    pytest.param(8, 16, 3, 1, 1, 1, "relu", None, id="8-channels"),
    pytest.param(3, 16, 3, 2, 1, 1, None, None, id="3-channels-blocked"),
]


@pytest.mark.parametrize("c,o,k,stride,groups,dilation,act,act_params", CASES)
def test_blocked_both_sides(c, o, k, stride, groups, dilation, act, act_params):
    node, plain = make(c, o, k, stride, groups, dilation, act, act_params)
    blocked_in = (3, -(-c // B), 9, 9, B)
    kind = direct.kind(geometry(node, blocked_in))
    gemm = kind in ("depthwise", "grouped") and not is_jit(primitive_impl(ConvSpec(node, False, geometry, B, True,
                                                                                   True), blocked_in))
    direct_impl = "direct:depthwise-blocked" if kind == "depthwise" and stride == 1 else f"plain+direct:{kind}"
    run_case(node, plain, [(3, c, 9, 9), (1, c, 9, 9)], residual=False, impl=direct_impl if gemm else "onednn:")


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("src_blocked,dst_blocked", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("c,groups,stride,dilation", [(48, 48, 1, 12), (20, 20, 2, 1), (16, 16, 1, 6),
                                                     (32, 8, 1, 1), (24, 12, 2, 2)])
def test_depthwise_or_grouped_without_a_jit_kernel_runs_the_direct_kernel_on_plain_copies(
        c, groups, stride, dilation, src_blocked, dst_blocked, residual, monkeypatch):
    """A depthwise or grouped conv oneDNN has only its gemm-based kernel for (dilation 6 and more, groups of
    fewer channels than a block, on AVX2; forced here on every host): the direct numba kernel between NCHW copies
    of the blocked sides, or, depthwise with both sides blocked, the numba loop on the blocked values themselves;
    channels off the block (zero padding lanes written), activation and residual, smaller batches after the max."""
    monkeypatch.setattr(conv_blocked_kernel, "is_jit", lambda impl: False)
    node, plain = make(c, c, 3, stride=stride, groups=groups, dilation=dilation, act="relu6",
                       src_blocked=src_blocked, dst_blocked=dst_blocked)
    hw = 2 * dilation + 5
    on_blocks = groups == c and src_blocked and dst_blocked and stride == 1
    run_case(node, plain, [(2, c, hw, hw), (1, c, hw - 2, hw), (2, c, hw, hw)], residual=residual,
             impl="direct:depthwise-blocked" if on_blocks else "plain+direct:" + ("depthwise" if groups == c
                                                                                 else "grouped"))


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("src_blocked,dst_blocked", [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("c,groups,stride", [(32, 8, 1), (20, 20, 2)])
def test_the_direct_kernel_on_plain_copies_replays_its_run(c, groups, stride, src_blocked, dst_blocked, residual,
                                                            monkeypatch):
    """Its records (the plain copies' reorders, the direct loop, the copy back) replay the run's numbers bit for
    bit, every output lane written; with a partial last block (20 channels) a copy to NCHW has no records (it
    runs numpy for the last block's lanes), and the kernel offers none."""
    from op_harness import replay

    monkeypatch.setattr(conv_blocked_kernel, "is_jit", lambda impl: False)
    node, _ = make(c, c, 3, stride=stride, groups=groups, act="relu6", src_blocked=src_blocked,
                   dst_blocked=dst_blocked)
    x = rng.standard_normal((2, c, 9, 11)).astype(np.float32)
    ins = [to_blocked(x, B) if src_blocked else x]
    out_plain = OP.infer(Node("ConvBlocked", "cb", params=dict(node.params, src_blocked=False, dst_blocked=False),
                              attrs=node.attrs), [TensorInfo(x.shape, x.dtype)])[0].shape
    if residual:
        z = rng.standard_normal(out_plain).astype(np.float32)
        ins.append(to_blocked(z, B) if dst_blocked else z)
    infos = [TensorInfo(a.shape, a.dtype) for a in ins]
    kernel, workspace = build_kernel(node, infos)
    assert kernel.impl.startswith("plain+direct:")
    out = np.full(OP.infer(node, infos)[0].shape, np.nan, np.float32)
    kernel(ins, [out], workspace)
    want = out.copy()
    out[...] = np.nan
    native = kernel.native(ins, [out], workspace)  # a partial block's copy to NCHW too (_WholeBlocksToPlain)
    assert native is not None and replay(native) is None
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("act", [None, "relu"])
@pytest.mark.parametrize("dst_blocked", [True, False])
def test_residual_in_the_output_layout(act, dst_blocked):
    node, plain = make(24, 40, 3, act=act, dst_blocked=dst_blocked)
    run_case(node, plain, [(2, 24, 7, 7), (1, 24, 7, 7), (2, 24, 7, 7)], residual=True)


@pytest.mark.parametrize("src_blocked,dst_blocked", [(False, True), (True, False)])
def test_one_plain_side(src_blocked, dst_blocked):
    c = 3 if not src_blocked else 32
    node, plain = make(c, 24, 3, stride=2, act="relu", src_blocked=src_blocked, dst_blocked=dst_blocked)
    run_case(node, plain, [(2, c, 16, 16), (1, c, 16, 16)], residual=False)


@pytest.mark.parametrize("src_blocked,dst_blocked", [(True, False), (False, True)])
def test_depthwise_with_one_plain_side(src_blocked, dst_blocked):
    node, plain = make(48, 48, 7, groups=48, act="relu", src_blocked=src_blocked, dst_blocked=dst_blocked)
    run_case(node, plain, [(2, 48, 12, 12), (1, 48, 12, 12)], residual=False)


@pytest.mark.parametrize("c,stride", [(40, 1), (40, 2), (1024, 1)])
@pytest.mark.parametrize("src_blocked,dst_blocked", [(True, False), (False, True)])
def test_depthwise_one_plain_side_runs_blocked_with_residual(c, stride, src_blocked, dst_blocked):
    """EfficientFormerV2's 3x3 depthwise convs with a residual before a plain consumer: both sides of the
    primitive nChw{B}c (its jit_dw kernel; on its own layouts it picked brdgmm_dw on NHWC, whose reorders from
    and to NCHW cost twice the conv), the plain side and the residual reordered."""
    node, plain = make(c, c, 3, stride=stride, groups=c, src_blocked=src_blocked, dst_blocked=dst_blocked)
    hw = 7 if c > 64 else 11
    run_case(node, plain, [(3, c, hw, hw), (1, c, hw, hw)], residual=True)
    blocked_in = (1, -(-c // B), hw, hw, B)
    plan = Plan(ConvSpec(node, True, geometry, B, src_blocked, dst_blocked), blocked_in if src_blocked else
                (1, c, hw, hw))
    both_blocked = Node("ConvBlocked", "cb", params=dict(node.params, src_blocked=True, dst_blocked=True),
                        attrs=node.attrs)
    both = primitive_impl(ConvSpec(both_blocked, True, geometry, B, True, True), blocked_in)
    if not is_reference(both):  # what oneDNN runs on nChw{B}c sides, the plain side's reorder apart
        assert plan.impl == both
        assert plan.pd.md(L.QUERY_SRC_MD) == blocked_md((1, c, hw, hw), B)
        assert plan.pd.md(L.QUERY_DST_MD) == blocked_md(plan.geo.out_shape, B)


@pytest.mark.parametrize("dst_blocked", [True, False])
def test_residual_through_reordered_sides(dst_blocked):
    """A dilated conv runs on oneDNN's own layouts: the blocked residual is reordered into its dst first."""
    node, plain = make(32, 32, 3, dilation=12, act="relu", dst_blocked=dst_blocked)
    run_case(node, plain, [(2, 32, 13, 13), (1, 32, 13, 13)], residual=True)


def test_without_bias():
    node, plain = make(16, 16, 3, bias=False)
    run_case(node, plain, [(1, 16, 6, 6)], residual=False)


def test_infer_rejects_a_wrong_physical_shape():
    from engine.errors import ShapeError
    node, _ = make(24, 24)
    with pytest.raises(ShapeError, match="blocked input for 24 channels"):
        OP.infer(node, [TensorInfo((1, 1, 5, 5, B), np.float32)])


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("src_blocked", [True, False])
def test_few_pixels_many_channels_run_on_onednn_own_layouts(residual, src_blocked):
    """A 3x3 s2 conv of 256 channels to 7x7 at batch 1 (SMALL_MAP_PIXELS): on AVX2 `brgconv` on the layouts oneDNN
    picks, the blocked sides reordered in and out; a smaller map on the same kernel and workspace. Every CPU checks
    the numbers."""
    node, plain = make(256, 256, 3, stride=2, act="relu", src_blocked=src_blocked)
    one = (1, 256 // B, 14, 14, B) if src_blocked else (1, 256, 14, 14)
    assert prefers_own_layouts(geometry(node, one))
    if primitive_impl(ConvSpec(node, residual, geometry, B, src_blocked, True), one) == "jit:avx2":
        own = ConvSpec(node, residual, geometry, B, src_blocked, True, own_layouts=True)
        assert primitive_impl(own, one).startswith("brgconv")
    run_case(node, plain, [(1, 256, 14, 14), (1, 256, 9, 11)], residual)


def test_own_layouts_are_judged_at_the_max_shape(monkeypatch):
    """Built at batch 4 (196 output pixels: the blocked kernel), batch 1 keeps that kernel rather than switching to
    `brgconv`, whose reorder buffers and weights the max shape's workspace does not hold: nothing is allocated
    after the build."""
    node, plain = make(256, 256, 3, stride=2, act="relu")
    xs = [rng.standard_normal((n, 256, 14, 14)).astype(np.float32) for n in (4, 1)]
    ins = [to_blocked(x, B) for x in xs]
    kernel, workspace = build_kernel(node, [TensorInfo(ins[0].shape, ins[0].dtype)])
    allocated: list[int] = []
    real = onednn.aligned_buffer
    monkeypatch.setattr(onednn, "aligned_buffer", lambda n: allocated.append(n) or real(n))
    for x, xb in zip(xs, ins, strict=True):
        out = np.full(OP.infer(node, [TensorInfo(xb.shape, xb.dtype)])[0].shape, np.nan, np.float32)
        kernel([xb], [out], workspace)
        want = conv_reference(plain, [x])[0]
        np.testing.assert_allclose(to_plain(out, 256), want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    assert allocated == []


def _bound_kernel(node: Node, shape: tuple[int, ...], residual: bool = False):
    x = to_blocked(rng.standard_normal(shape).astype(np.float32), B)
    ins = [x]
    out_shape = OP.infer(node, [TensorInfo(x.shape, x.dtype)])[0].shape
    if residual:
        ins.append(rng.standard_normal(out_shape).astype(np.float32))
    kernel, workspace = build_kernel(node, [TensorInfo(a.shape, a.dtype) for a in ins])
    return kernel, workspace, ins, out_shape


def _shortcuts(monkeypatch) -> list:
    calls = []
    real = Plan.execute_bound
    monkeypatch.setattr(Plan, "execute_bound", lambda self: (calls.append(self), real(self))[1])
    return calls


@pytest.mark.parametrize("c,o,k,groups", [(32, 48, 1, 1), (32, 32, 3, 32), (16, 24, 3, 1)])
def test_runs_on_the_same_arrays_take_the_bound_shortcut(c, o, k, groups, monkeypatch):
    """A second run on the same arena arrays executes the primitive alone (BoundRuns) and still reads the values the
    input holds now; runs on other arrays of the same shape, on a non-contiguous copy, and back on the first arrays
    all give the reference (a full run in between re-points the plan's memories, and the shortcut must not run
    on those pointers for the first arrays)."""
    monkeypatch.setattr(conv_blocked_kernel.W, "eligible", lambda *a: False)  # the oneDNN plan, not Winograd
    node, plain = make(c, o, k, groups=groups, act="relu")
    kernel, ws, ins, out_shape = _bound_kernel(node, (1, c, 9, 9))
    calls = _shortcuts(monkeypatch)
    out_a, out_b = np.empty(out_shape, np.float32), np.empty(out_shape, np.float32)
    x_a, x_b = ins[0], to_blocked(rng.standard_normal((1, c, 9, 9)).astype(np.float32), B)
    wide = np.zeros((*x_a.shape[:-1], 2 * B), np.float32)
    strided = wide[..., ::2]  # not contiguous: the kernel copies it, and must not remember the copy

    def check(x, out):
        kernel([x], [out], ws)
        want = OP.reference(node, [np.ascontiguousarray(x)])[0]
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))

    check(x_a, out_a)
    assert not calls
    if not next(iter(kernel.plans.values())).direct:
        pytest.skip("oneDNN reorders this conv's sides here: the shortcut does not apply")
    check(x_a, out_a)
    assert len(calls) == 1
    x_a[...] = to_blocked(rng.standard_normal((1, c, 9, 9)).astype(np.float32), B)  # new values, same array
    check(x_a, out_a)
    assert len(calls) == 2
    check(x_b, out_b)
    check(x_a, out_a)
    strided[...] = x_b
    check(strided, out_b)
    check(strided, out_b)
    check(x_a, out_a)
    check(x_a, out_a)
    assert len(calls) == 3  # only the repeat on x_a after a full run on x_a


def test_residual_and_late_activation_never_take_the_shortcut(monkeypatch):
    """A residual is copied into the output every run and a late activation applied after the primitive, so those
    kernels always take the full run."""
    monkeypatch.setattr(conv_blocked_kernel.W, "eligible", lambda *a: False)
    monkeypatch.setattr(onednn_conv, "conv_post_op", lambda name, params: None)  # every activation late
    calls = _shortcuts(monkeypatch)
    for residual, act in ((True, None), (False, "silu")):
        node, plain = make(16, 16, 1, act=act)
        kernel, ws, ins, out_shape = _bound_kernel(node, (1, 16, 6, 6), residual)
        out = np.empty(out_shape, np.float32)
        for _ in range(3):
            kernel(ins, [out], ws)
        want = OP.reference(node, ins)[0]
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))
    assert not calls
