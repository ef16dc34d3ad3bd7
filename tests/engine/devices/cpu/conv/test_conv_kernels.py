"""Conv and ConvTranspose CPU kernels (direct paths: GEMM, im2col, depthwise, Winograd F(2x2); oneDNN where it
runs) vs the references: every path and fused activation, smaller shapes, threads, workspace sizing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from op_harness import (
    build_kernel,
    check_kernel,
    cpu_device,
    infer,
    kernel_workspace,
    load_cases,
    make_node,
    reference,
    run_kernel,
)

from engine.devices.cpu.conv import direct
from engine.errors import KernelError
from engine.ops.conv_geometry import conv_geom
from engine.ops.epilogue import EPILOGUES
from engine.ops.registry import TensorInfo

GOLDENS = Path(__file__).resolve().parents[4] / "fixtures" / "ops" / "spatial.npz"
CASES = load_cases(GOLDENS, {"Conv", "ConvTranspose"})
RNG = np.random.default_rng(7)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def conv_node(c: int, o: int, k=(3, 3), bias: bool = True, residual: bool = False, **params):
    g = params.get("groups", 1)
    attrs = {"weight": rand(o, c // g, *k)}
    if bias:
        attrs["bias"] = rand(o)
    return make_node("Conv", 2 if residual else 1, params=params, attrs=attrs)


DIRECT = cpu_device(onednn=False)  # the numpy/numba paths (oneDNN's: test_onednn_conv.py)


def workspace_of(node, x: np.ndarray, device=None) -> int:
    return kernel_workspace(node, [TensorInfo(x.shape, x.dtype)], device)


def test_goldens_cover_every_kernel_path():
    kinds = {direct.kind(conv_geom(c.node(), c.inputs[0].shape)) for c in CASES if c.op == "Conv"}
    assert kinds == {"gemm", "depthwise", "grouped", "im2col"}
    assert sum(c.op == "ConvTranspose" for c in CASES) >= 5


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_kernel_matches_reference(case):
    check_kernel(case.node(), case.inputs, rtol=1e-4, atol=1e-5)


KERNEL_CONFIGS = {
    "gemm": dict(c=6, o=5, k=(1, 1)),
    "gemm_groups_relu": dict(c=6, o=4, k=(1, 1), groups=2, activation="relu"),
    "im2col_s2_relu6": dict(c=5, o=7, stride=(2, 2), pads=(1, 1, 1, 1), activation="relu6"),
    "im2col_groups_dil": dict(c=6, o=9, groups=3, dilation=(2, 1), pads=(2, 0, 1, 2)),
    "im2col_reflect": dict(c=3, o=4, pads=(1, 1, 1, 1), pad_mode="reflect", activation="silu"),
    "im2col_circular_s2": dict(c=3, o=4, stride=(2, 1), pads=(1, 2, 1, 2), pad_mode="circular"),
    "im2col_replicate_same": dict(c=3, o=4, k=(4, 3), pad_mode="replicate", auto_pad="same_lower", stride=(2, 2)),
    "depthwise_s2": dict(c=8, o=8, groups=8, stride=(2, 2), pads=(1, 1, 1, 1), activation="leaky_relu",
                         activation_params={"alpha": 0.2}),
    "depthwise_dil_hswish": dict(c=4, o=4, groups=4, k=(5, 5), dilation=(2, 2), pads=(4, 4, 4, 4),
                                 activation="hardswish"),
    "depthwise_clip": dict(c=3, o=3, groups=3, pads=(0, 1, 2, 1), activation="clip",
                           activation_params={"min": -0.5, "max": 0.25}),
}


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("name", sorted(KERNEL_CONFIGS))
def test_kernel_built_at_max_runs_smaller(name, residual):
    cfg = dict(KERNEL_CONFIGS[name])
    c, o = cfg.pop("c"), cfg.pop("o")
    node = conv_node(c, o, cfg.pop("k", (3, 3)), residual=residual, **cfg)
    big, small = rand(2, c, 13, 12), rand(1, c, 7, 5)
    maxes, ins = [big], [small]
    if residual:
        maxes.append(rand(*infer(node, [big])[0].shape))
        ins.append(rand(*infer(node, [small])[0].shape))
    check_kernel(node, ins, maxes, rtol=1e-4, atol=1e-5)
    check_kernel(node, maxes, maxes, rtol=1e-4, atol=1e-5)


def test_im2col_tiles_over_rows_with_a_small_budget(monkeypatch):
    node = conv_node(3, 4, pads=(1, 1, 1, 1), stride=(1, 2))
    x = rand(2, 3, 11, 9)
    full = workspace_of(node, x, DIRECT)
    monkeypatch.setattr(direct, "WORKSPACE_BUDGET", 256)
    small = workspace_of(node, x, DIRECT)
    assert small < full and small == 27 * 5 * 4  # one output row of 5 pixels, K = 3*3*3
    check_kernel(node, [x], rtol=1e-4, atol=1e-5, device=DIRECT)
    tnode = make_node("ConvTranspose", 1, params={"stride": [2, 2], "pads": [1, 1, 1, 1]},
                      attrs={"weight": rand(3, 2, 3, 3), "bias": rand(2)})
    check_kernel(tnode, [x], rtol=1e-4, atol=1e-5, device=DIRECT)


def test_gemm_and_depthwise_need_no_workspace():
    x = rand(1, 4, 6, 6)
    for node in (conv_node(4, 6, (1, 1)), conv_node(4, 4, groups=4, pads=(1, 1, 1, 1))):
        assert workspace_of(node, x, DIRECT) == 0


@pytest.mark.parametrize("cfg", [dict(stride=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]),
                                 dict(stride=[3, 2], dilation=[1, 2], groups=2, pads=[0, 1, 2, 0]),
                                 dict(stride=[1, 1], activation="relu6")])
def test_tconv_kernel_built_at_max_runs_smaller(cfg):
    g = cfg.get("groups", 1)
    node = make_node("ConvTranspose", 1, params=cfg, attrs={"weight": rand(4, 6 // g, 3, 3), "bias": rand(6)})
    big, small = rand(2, 4, 9, 8), rand(1, 4, 4, 3)
    check_kernel(node, [small], [big], rtol=1e-4, atol=1e-5)
    check_kernel(node, [big], [big], rtol=1e-4, atol=1e-5)


def test_float64_input_falls_back_to_reference():
    node = conv_node(3, 5, pads=(1, 1, 1, 1), activation="relu")
    x = RNG.standard_normal((1, 3, 5, 6))
    got = run_kernel(node, [x])[0]
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, reference(node, [x])[0], rtol=1e-12)


def test_kernel_refuses_an_input_beyond_its_workspace():
    node = conv_node(3, 4, pads=(1, 1, 1, 1))
    small = TensorInfo((1, 3, 4, 4), np.dtype(np.float32))
    fn, ws = build_kernel(node, [small])
    x = rand(1, 3, 30, 30)
    with pytest.raises(KernelError, match="workspace"):
        fn([x], [np.empty((1, 4, 30, 30), np.float32)], ws)


@pytest.fixture
def split_everything(monkeypatch):
    """Every kernel call is split over 3 threads, whatever its size."""
    from engine.devices.cpu import threads as _threads
    before = _threads.get_threads()
    monkeypatch.setattr(_threads, "MIN_WORK", 0)
    _threads.set_threads(3)
    yield
    _threads.set_threads(before)


@pytest.mark.parametrize("name", ["gemm_groups_relu", "im2col_groups_dil", "depthwise_s2", "im2col_reflect"])
def test_kernels_split_over_threads(split_everything, name):
    cfg = dict(KERNEL_CONFIGS[name])
    c, o = cfg.pop("c"), cfg.pop("o")
    node = conv_node(c, o, cfg.pop("k", (3, 3)), **cfg)
    check_kernel(node, [rand(2, c, 9, 8)], rtol=1e-4, atol=1e-5)
    tnode = make_node("ConvTranspose", 1, params={"stride": [2, 2], "groups": 2},
                      attrs={"weight": rand(4, 3, 3, 3), "bias": rand(6)})
    check_kernel(tnode, [rand(2, 4, 5, 4)], rtol=1e-4, atol=1e-5)


ACT_PARAMS = {"leaky_relu": {"alpha": 0.2}, "clip": {"min": -0.5, "max": 1.5}, "elu": {"alpha": 0.7},
              "hardsigmoid": {"alpha": 0.2, "beta": 0.4}, "gelu": {"approximate": "tanh"}}


@pytest.mark.parametrize("act", sorted(EPILOGUES) + ["gelu_none"])
@pytest.mark.parametrize("path", ["gemm", "depthwise", "depthwise_s2", "im2col"])
@pytest.mark.parametrize("device", [None, DIRECT], ids=["onednn_on", "onednn_off"])
def test_every_fused_activation_in_every_path(act, path, device):
    name, params = ("gelu", {"approximate": "none"}) if act == "gelu_none" else (act, ACT_PARAMS.get(act))
    cfg = {"gemm": dict(k=(1, 1)), "depthwise": dict(groups=4, pads=(1, 1, 1, 1)),
           "depthwise_s2": dict(groups=4, pads=(1, 1, 1, 1), stride=(2, 2)), "im2col": dict(stride=(2, 1))}
    node = conv_node(4, 4, residual=True, activation=name, activation_params=params, **cfg[path])
    x = rand(1, 4, 6, 5) * 3
    z = rand(*infer(node, [x])[0].shape)
    check_kernel(node, [x, z], rtol=1e-4, atol=1e-5, device=device)


@pytest.mark.parametrize("cfg,shape", [
    (dict(pads=(1, 1, 1, 1), activation="relu"), (2, 16, 9, 7)),  # odd sizes: cropped last tiles
    (dict(pads=(0, 2, 1, 0)), (1, 16, 8, 10)),  # asymmetric pads
    (dict(auto_pad="same_lower", activation="silu"), (1, 16, 6, 5)),
])
def test_winograd_matches_reference(cfg, shape):
    node = conv_node(shape[1], 20, residual=True, **cfg)
    big = rand(*shape[:2], shape[2] + 7, shape[3] + 6)
    assert direct.kind(conv_geom(node, big.shape)) == "winograd"  # built there, run below the tile threshold
    x = rand(*shape)
    zs = [rand(*infer(node, [a])[0].shape) for a in (x, big)]
    check_kernel(node, [x, zs[0]], [big, zs[1]], rtol=1e-4, atol=1e-5)
    check_kernel(node, [big, zs[1]], rtol=1e-4, atol=1e-5)


def test_winograd_blocks_of_tiles(monkeypatch):
    monkeypatch.setattr(direct, "WORKSPACE_BUDGET", 4096)
    monkeypatch.setattr(direct, "WINOGRAD_MIN_TILES", 3)
    node = conv_node(16, 16, pads=(1, 1, 1, 1))
    x = rand(1, 16, 9, 11)
    assert workspace_of(node, x, DIRECT) == 16 * 32 * 6 * 4  # one row of 6 tiles per block
    check_kernel(node, [x], rtol=1e-4, atol=1e-5, device=DIRECT)


def test_winograd_weight_transform_against_direct_products():
    from engine.devices.cpu.conv.winograd import transform_weights
    w = rand(2, 3, 3, 3)
    g = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])
    u = transform_weights(w).reshape(4, 4, 2, 3)
    np.testing.assert_allclose(u[:, :, 1, 2], g @ w[1, 2] @ g.T, rtol=1e-6)


def test_small_channel_3x3_stays_on_im2col():
    assert direct.kind(conv_geom(conv_node(3, 8, pads=(1, 1, 1, 1)), (1, 3, 8, 8))) == "im2col"


@pytest.mark.parametrize("cfg,shape", [
    (dict(stride=(1, 2), pads=(1, 0, 2, 1)), (1, 3, 7, 9)),  # mixed stride: two column phases, one row phase
    (dict(pads=(1, 1, 1, 1), activation="relu6"), (1, 2, 3, 70)),  # wide rows: one strip of three
    (dict(stride=(2, 2), dilation=(2, 1), pads=(0, 1, 2, 2)), (2, 3, 11, 10)),  # stride 2: even/odd planes
    (dict(stride=(2, 2), pads=(1, 1, 1, 1)), (1, 3, 4, 4)),
    (dict(stride=(2, 2), k=(5, 5), pads=(2, 2, 2, 2)), (1, 3, 11, 12)),  # 25 taps: passes of 9 + 9 + 7
    (dict(stride=(2, 2), k=(2, 4), pads=(0, 1, 1, 2)), (1, 3, 8, 9)),
    (dict(k=(1, 5), pads=(0, 2, 0, 2)), (1, 3, 6, 7)),  # 5 taps: one pass with four unused
    (dict(k=(2, 1), pads=(1, 0, 0, 0)), (1, 3, 5, 6)),  # two taps
    (dict(k=(7, 7), pads=(3, 3, 3, 3), activation="hardswish"), (1, 2, 9, 11)),  # 49 taps: six passes
    (dict(stride=(3, 3), k=(5, 5), pads=(2, 2, 2, 2)), (1, 3, 11, 13)),
    (dict(dilation=(3, 2), pads=(3, 0, 3, 4)), (1, 3, 8, 9)),
    (dict(dilation=(12, 12), pads=(12, 12, 12, 12)), (1, 2, 65, 65)),  # ASPP's
    (dict(pads=(1, 1, 1, 1)), (1, 2, 150, 20)),  # 150 rows of 22: strips of 93 and 57 rows
    (dict(stride=(2, 2), pads=(0, 0, 0, 0)), (1, 2, 9, 9)),  # no padding: the last row and column unread
])
@pytest.mark.parametrize("device", [None, DIRECT], ids=["onednn_on", "onednn_off"])
def test_depthwise_variants(cfg, shape, device):
    """With oneDNN off every depthwise conv runs the numba loops (with it on, only those oneDNN has no jit kernel
    for: dilation 6 and more)."""
    args = dict(cfg)
    c = shape[1]
    node = conv_node(c, c, args.pop("k", (3, 3)), groups=c, **args)
    assert direct.kind(conv_geom(node, shape)) == "depthwise"
    check_kernel(node, [rand(*shape)], rtol=1e-4, atol=1e-5, device=device)
    bigger = (shape[0] + 1, c, shape[2] + 3, shape[3] + 2)
    check_kernel(node, [rand(*shape)], [rand(*bigger)], rtol=1e-4, atol=1e-5, device=device)


@pytest.mark.parametrize("act", ["relu6", "hardswish", None])
def test_wide_depthwise_with_residual(act):
    """A wide stride-1 map (several strips of rows) with a residual and a cheap or a late activation, two
    images."""
    node = conv_node(3, 3, (3, 3), groups=3, pads=(1, 1, 1, 1), residual=True, activation=act)
    x = rand(2, 3, 70, 90) * 3
    z = rand(*infer(node, [x])[0].shape)
    check_kernel(node, [x, z], rtol=1e-4, atol=1e-5, device=DIRECT)


def unaligned(a: np.ndarray) -> np.ndarray:
    """A read-only copy of `a` at an odd byte offset, as weights read straight from a model file can be."""
    raw = np.zeros(a.nbytes + 3, np.uint8)
    view = raw[3:].view(a.dtype).reshape(a.shape)
    view[...] = a
    view.flags.writeable = False
    return view


@pytest.mark.parametrize("k,groups", [((3, 3), 1), ((1, 1), 1), ((3, 3), 4), ((3, 3), 32)])
def test_unaligned_file_weights_are_packed_once(k, groups):
    import tracemalloc
    w, b = unaligned(rand(32, 32 // groups, *k)), unaligned(rand(32))
    assert not w.flags.aligned
    node = make_node("Conv", 1, params={"pads": [1, 1, 1, 1] if k == (3, 3) else [0] * 4, "groups": groups},
                     attrs={"weight": w, "bias": b})
    x = rand(1, 32, 6, 6)
    check_kernel(node, [x], rtol=1e-4, atol=1e-5)
    info = [TensorInfo(x.shape, x.dtype)]
    fn, ws = build_kernel(node, info)
    out = np.empty(infer(node, [x])[0].shape, np.float32)
    fn([x], [out], ws)
    tracemalloc.start()
    fn([x], [out], ws)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < max(w.nbytes // 2, 2048), f"a kernel call allocated {peak} bytes"


@pytest.mark.parametrize("block_tiles", [8, 40])  # blocks straddling images; blocks holding several images
def test_winograd_blocks_span_images(monkeypatch, block_tiles):
    monkeypatch.setattr(direct, "WINOGRAD_BLOCK_TILES", block_tiles)
    node = conv_node(16, 20, pads=(1, 1, 1, 1), residual=True, activation="relu")
    x = rand(3, 16, 5, 7)  # 3 x 4 tiles per image: 9 tile rows over the batch
    assert direct.kind(conv_geom(node, x.shape)) == "winograd"
    z = rand(*infer(node, [x])[0].shape)
    check_kernel(node, [x, z], rtol=1e-4, atol=1e-5)


def test_small_maps_take_winograd_only_in_a_batch():
    node = conv_node(32, 32, pads=(1, 1, 1, 1))
    assert direct.kind(conv_geom(node, (1, 32, 7, 7))) == "im2col"  # 16 tiles: too few for one GEMM
    assert direct.kind(conv_geom(node, (8, 32, 7, 7))) == "winograd"  # 128 tiles across the batch


# Grouped convs of few channels per group (direct.kind "grouped", loops.grouped): phase-split planes for every
# stride, taps in threes and the remainder, channel multipliers, dilation, asymmetric pads, residual, activations.
GROUPED_CONFIGS = {
    "g32_4x4_3x3": dict(c=128, o=128, groups=32, pads=(1, 1, 1, 1), activation="relu"),
    "multiplier_2": dict(c=8, o=16, groups=8, pads=(1, 1, 1, 1)),
    "s2_3x3": dict(c=16, o=16, groups=4, stride=(2, 2), pads=(1, 1, 1, 1), activation="silu"),
    "s3_5x5_dil2": dict(c=12, o=6, groups=3, k=(5, 5), stride=(3, 3), dilation=(2, 2), pads=(4, 3, 2, 4)),
    "rect_s21_asym": dict(c=6, o=9, groups=3, k=(2, 4), stride=(2, 1), pads=(0, 2, 1, 1), activation="hardswish"),
    "1x1_s2": dict(c=16, o=32, groups=4, k=(1, 1), stride=(2, 2)),
    "1x1_s7_one_phase_read": dict(c=8, o=8, groups=4, k=(1, 1), stride=(7, 6), pads=(1, 0, 0, 2)),
    "8_per_group_no_bias": dict(c=16, o=16, groups=2, pads=(1, 1, 1, 1), bias=False,
                                activation="gelu", activation_params={"approximate": "none"}),
}


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("name", sorted(GROUPED_CONFIGS))
def test_grouped_matches_reference(name, residual):
    cfg = dict(GROUPED_CONFIGS[name])
    c, o = cfg.pop("c"), cfg.pop("o")
    node = conv_node(c, o, cfg.pop("k", (3, 3)), bias=cfg.pop("bias", True), residual=residual, **cfg)
    big = rand(2, c, 17, 15)
    assert direct.kind(conv_geom(node, big.shape)) == "grouped"
    check_path(node, big, rand(1, c, 9, 12), "direct:grouped", DIRECT)


def check_path(node, big: np.ndarray, small: np.ndarray, impl: str, device) -> None:
    """The kernel built at `big` (plus a residual when the node takes one) reports `impl` and matches the
    reference at `small` and at `big`."""
    maxes, ins = [big], [small]
    if len(node.inputs) > 1:
        maxes.append(rand(*infer(node, [big])[0].shape))
        ins.append(rand(*infer(node, [small])[0].shape))
    kernel, _ = build_kernel(node, [TensorInfo(a.shape, a.dtype) for a in maxes], device)
    assert kernel.impl == impl
    check_kernel(node, ins, maxes, rtol=1e-4, atol=1e-5, device=device)
    check_kernel(node, maxes, maxes, rtol=1e-4, atol=1e-5, device=device)


def test_grouped_bounds():
    """More than GROUPED_MAX_CHANNELS inputs per group, or a pad mode other than zeros: im2col per group."""
    assert direct.kind(conv_geom(conv_node(16, 16, groups=2), (1, 16, 9, 9))) == "grouped"
    assert direct.kind(conv_geom(conv_node(18, 18, groups=2), (1, 18, 9, 9))) == "im2col"
    assert direct.kind(conv_geom(conv_node(8, 8, groups=2, pad_mode="reflect", pads=(1, 1, 1, 1)),
                                 (1, 8, 9, 9))) == "im2col"


# Stems (direct.is_stem): few inputs per output into many channels, the bias a row of ones in the GEMM; taken
# with oneDNN on or off. Every attribute variant against the reference.
STEM_CONFIGS = {
    "conv1d_k10_s5": dict(c=1, k=(1, 10), stride=(1, 5)),
    "conv1d_k10_s5_no_bias": dict(c=1, k=(1, 10), stride=(1, 5), bias=False),
    "conv1d_k3_pad_dil": dict(c=2, k=(1, 3), pads=(0, 2, 0, 1), dilation=(1, 2)),
    "gray_3x3_s2_relu": dict(c=1, stride=(2, 2), pads=(1, 1, 1, 1), activation="relu"),
    "gray_3x3_gelu": dict(c=1, pads=(1, 1, 1, 1), activation="gelu", activation_params={"approximate": "none"}),
    "gray_4x4_reflect_silu": dict(c=1, k=(4, 4), pads=(1, 2, 2, 1), pad_mode="reflect", activation="silu"),
    "conv1d_16_taps_hswish": dict(c=4, k=(1, 4), stride=(1, 2), activation="hardswish"),
}


@pytest.mark.parametrize("device", [None, DIRECT], ids=["onednn_on", "onednn_off"])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("name", sorted(STEM_CONFIGS))
def test_stem_matches_reference(name, residual, device):
    cfg = dict(STEM_CONFIGS[name])
    c = cfg.pop("c")
    node = conv_node(c, 64, cfg.pop("k", (3, 3)), bias=cfg.pop("bias", True), residual=residual, **cfg)
    big = rand(2, c, 9, 40)
    assert direct.is_stem(conv_geom(node, big.shape))
    check_path(node, big, rand(1, c, 5, 23), "direct:stem", device)


def test_stem_bounds():
    """More than STEM_MAX_TAPS inputs per output, fewer than STEM_MIN_CHANNELS outputs, or groups: no stem."""
    assert direct.is_stem(conv_geom(conv_node(1, 64, (1, 16)), (1, 1, 1, 40)))
    assert not direct.is_stem(conv_geom(conv_node(1, 64, (1, 17)), (1, 1, 1, 40)))
    assert not direct.is_stem(conv_geom(conv_node(1, 63, (1, 10)), (1, 1, 1, 40)))
    assert not direct.is_stem(conv_geom(conv_node(2, 64, (1, 3), groups=2), (1, 2, 1, 40)))


@pytest.mark.parametrize("k,stride,groups", [((5, 5), 1, 4), ((7, 7), 1, 4), ((2, 2), 2, 4), ((5, 5), 2, 4),
                                             ((1, 4), 1, 4), ((3, 5), 1, 2), ((2, 2), 2, 2)])
@pytest.mark.parametrize("device", [None, DIRECT], ids=["onednn_on", "onednn_off"])
def test_depthwise_and_grouped_keep_an_inf_input_inf(k, stride, groups, device):
    """An inf in the input gives inf (never NaN) wherever positive weights reach it: the passes padded with
    zero-weight taps must not multiply that inf by 0 (groups 4 of 4 channels: depthwise; 2: grouped)."""
    node = conv_node(4, 4, k, groups=groups, stride=(stride, stride), pads=(2, 2, 2, 2))
    node.attrs["weight"] = np.abs(node.attrs["weight"]) + 0.1
    x = np.ones((1, 4, 30, 30), np.float32)
    x[0, 1, 3, 4], x[0, 2, 10, 9] = np.inf, -np.inf
    got, want = run_kernel(node, [x], device=device)[0], reference(node, [x])[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[np.isinf(want)], want[np.isinf(want)])
    assert np.isinf(want).any() and not np.isnan(want).any()
