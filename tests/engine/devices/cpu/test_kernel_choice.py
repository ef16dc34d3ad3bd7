"""No supported conv, pool, resize or attention falls onto a reference path without saying so.

Over a grid of the parameters users' models use (kernel 1-7 and 1-D, stride 1-2, dilation 1-36, dense / grouped /
depthwise, channels from 3 including odd counts and fewer than a block, NCHW and blocked sides, transposed
convolutions, every pooling kind, resize modes, attention with and without masks, one key tile and several), the
kernel the CPU device builds names an optimized path in `impl` (a oneDNN jit implementation, never oneDNN's `ref`
one; Winograd; the direct numba/BLAS paths; the fused attention) and is not a fallback (`is_fallback`: a numpy
reference, which the per-op profile lists). Only the choice is asserted, never a time; building every kernel of
the grid takes a few seconds. Dilated convolutions, 8-channel inputs in 16-lane blocks and depthwise convolutions
with one plain side once ran oneDNN's reference kernel (hundreds of times slower) on blocked sides.
"""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import cpu_device, get_op

from engine.devices.cpu.onednn import objects as onednn
from engine.devices.cpu.onednn.blocked import native_block
from engine.ir import Node, Value
from engine.ops.registry import TensorInfo

F32 = np.float32
HW = 19  # small maps: the path depends on the geometry, not on the size, and builds stay cheap
BLOCK = native_block() or 16  # the CPU's channel block (16 when oneDNN is missing: those tests then skip)


def _conv(op: str, c: int, o: int, k: int | tuple, stride=1, dilation=1, groups=1, **extra) -> Node:
    kh, kw = (k, k) if isinstance(k, int) else k
    pads = [dilation * (kh // 2), dilation * (kw // 2)] * 2
    w = np.zeros((o, c // groups, kh, kw) if op != "ConvTranspose" else (c, o // groups, kh, kw), F32)
    params = {"stride": [stride, stride], "pads": pads, "dilation": [dilation, dilation], "groups": groups,
              "activation": "relu", "activation_params": {}, **extra}
    return Node(op, f"{op.lower()}_grid", [Value("x")], [Value("y")], params, {"weight": w, "bias": np.zeros(o, F32)},
                source="grid:1")


# (c, o, k, stride, dilation, groups): dense, small and odd channels, grouped, depthwise, dilated (ASPP), 1-D
CONVS = [
    *[(c, o, k, s, 1, 1) for c, o in [(3, 16), (8, 16), (17, 33), (64, 64)] for k in (1, 3, 5, 7) for s in (1, 2)],
    *[(c, c, 3, 1, d, 1) for c in (8, 64) for d in (2, 6, 12, 24, 36)],
    *[(c, c, k, s, 1, c) for c in (8, 20, 96) for k in (3, 5, 7) for s in (1, 2)],
    *[(96, 96, 3, 1, d, 96) for d in (2, 12)],
    (64, 64, 3, 1, 1, 2), (128, 128, 3, 1, 1, 32), (96, 96, 3, 2, 1, 3), (32, 64, 3, 1, 1, 32), (64, 64, 3, 1, 6, 4),
    (80, 96, (1, 3), 1, 1, 1), (64, 64, (1, 7), 1, 1, 64), (1, 32, (1, 10), 5, 1, 1),
]


def conv_id(p) -> str:
    c, o, k, s, d, g = p
    return f"{c}-{o}-k{k}-s{s}-d{d}-g{g}"


def assert_optimized(kernel, what: str) -> None:
    impl = getattr(kernel, "impl", None)
    assert not getattr(kernel, "is_fallback", False), f"{what}: a reference fallback ({impl})"
    assert impl is not None, f"{what}: the kernel does not name its path"
    assert "ref" not in impl, f"{what}: {impl}"


def build(node: Node, shapes: list[tuple], dtypes=None, device=None):
    infos = [TensorInfo(s, np.dtype(d)) for s, d in zip(shapes, dtypes or [F32] * len(shapes), strict=True)]
    return (device or cpu_device()).build_kernel(node, get_op(node.op_type), infos)


@pytest.mark.parametrize("p", CONVS, ids=conv_id)
def test_conv_takes_an_optimized_path(p):
    c, o, k, s, d, g = p
    x = (1, c, 1 if isinstance(k, tuple) else HW, 3000 if isinstance(k, tuple) and k[1] == 10 else HW)
    node = _conv("Conv", c, o, k, s, d, g)
    assert_optimized(build(node, [x]), f"Conv {conv_id(p)}")


def blocked_cases() -> list:
    """(conv, src_blocked, dst_blocked) as the layout rewrite makes them: a plain input only for images of fewer
    channels than a block, groups only when dense, depthwise or filling whole blocks (convertible_conv)."""
    cases = []
    for p in CONVS:
        c, o, k, s, d, g = p
        if isinstance(k, tuple) or not (g == 1 or c == o == g or ((c // g) % BLOCK == 0 and (o // g) % BLOCK == 0)):
            continue
        cases += [pytest.param(p, src, dst, id=f"{conv_id(p)}-{'b' if src else 'p'}{'b' if dst else 'p'}")
                  for src, dst in [(True, True), (True, False), (False, True)] if src or c < BLOCK]
    return cases


@pytest.mark.skipif(not onednn.available(), reason="the blocked layout needs oneDNN")
@pytest.mark.parametrize("p,src,dst", blocked_cases())
def test_blocked_conv_takes_an_optimized_path(p, src, dst):
    c, o, k, s, d, g = p
    node = _conv("ConvBlocked", c, o, k, s, d, g, src_blocked=src, dst_blocked=dst, block=BLOCK)
    x = (1, -(-c // BLOCK), HW, HW, BLOCK) if src else (1, c, HW, HW)
    assert_optimized(build(node, [x]), f"ConvBlocked {conv_id(p)} src_blocked={src} dst_blocked={dst}")


@pytest.mark.parametrize("c,o,k,stride,pad,out_pad,groups", [
    (64, 32, 4, 2, 1, 0, 1), (256, 128, 2, 2, 0, 0, 1), (32, 16, 3, 2, 1, 1, 1), (16, 3, 4, 2, 1, 0, 1),
    (64, 64, 4, 2, 1, 0, 64), (8, 8, 3, 1, 1, 0, 1), (17, 5, 5, 3, 2, 2, 1),
])
def test_transposed_conv_takes_an_optimized_path(c, o, k, stride, pad, out_pad, groups):
    node = _conv("ConvTranspose", c, o, k, stride, 1, groups)
    node.params.update(pads=[pad] * 4, output_padding=[out_pad] * 2)
    assert_optimized(build(node, [(1, c, HW, HW)]), f"ConvTranspose {c}->{o} k{k} s{stride}")


POOLS = [
    ("MaxPool", {"kernel": (3, 3), "stride": (2, 2), "pads": (1, 1, 1, 1)}),
    ("MaxPool", {"kernel": (2, 2), "stride": (2, 2)}),
    ("MaxPool", {"kernel": (5, 5), "stride": (1, 1), "pads": (2, 2, 2, 2)}),
    ("MaxPool", {"kernel": (3, 3), "stride": (2, 2), "ceil_mode": True}),
    ("MaxPool", {"kernel": (2, 2), "stride": (1, 1), "dilation": (2, 2)}),
    ("AvgPool", {"kernel": (3, 3), "stride": (1, 1), "pads": (1, 1, 1, 1)}),
    ("AvgPool", {"kernel": (3, 3), "stride": (2, 2), "pads": (1, 1, 1, 1), "count_include_pad": False}),
    ("AvgPool", {"kernel": (3, 3), "stride": (2, 2), "pads": (1, 1, 1, 1), "ceil_mode": True}),
    ("AvgPool", {"kernel": (2, 2), "stride": (2, 2), "divisor_override": 3}),
    ("GlobalAvgPool", {}), ("GlobalMaxPool", {}),
    ("AdaptiveAvgPool", {"output_size": (3, 5)}), ("AdaptiveMaxPool", {"output_size": (2, 2)}),
]


@pytest.mark.parametrize("op,params", POOLS, ids=[f"{o}-{i}" for i, (o, _) in enumerate(POOLS)])
@pytest.mark.parametrize("channels", [3, 64])
def test_pool_takes_an_optimized_path(op, params, channels):
    node = Node(op, "pool_grid", [Value("x")], [Value("y")], dict(params), source="grid:1")
    assert_optimized(build(node, [(2, channels, HW, HW)]), f"{op} {params}")


@pytest.mark.skipif(not onednn.available(), reason="the blocked layout needs oneDNN")
@pytest.mark.parametrize("op,params", [
    ("MaxPoolBlocked", {"kernel": (3, 3), "stride": (2, 2), "pads": (1, 1, 1, 1)}),
    ("MaxPoolBlocked", {"kernel": (2, 3), "stride": (1, 2), "pads": (0, 1, 1, 0), "dilation": (2, 1)}),
    ("GlobalPoolBlocked", {"mode": "avg"}), ("GlobalPoolBlocked", {"mode": "max"}),
])
def test_blocked_pool_takes_an_optimized_path(op, params):
    node = Node(op, "pool_grid", [Value("x")], [Value("y")], dict(params), source="grid:1")
    assert_optimized(build(node, [(2, 3, HW, HW, BLOCK)]), f"{op} {params}")


@pytest.mark.parametrize("mode", ["nearest", "nearest_exact", "bilinear", "bicubic"])
@pytest.mark.parametrize("scale", [2.0, 0.5, 1.7])
def test_resize_takes_an_optimized_path(mode, scale):
    node = Node("Resize", "resize_grid", [Value("x")], [Value("y")], {"mode": mode, "scale": [scale, scale]},
                source="grid:1")
    assert_optimized(build(node, [(1, 8, HW, HW)]), f"Resize {mode} x{scale}")


@pytest.mark.parametrize("L,S", [(16, 16), (197, 197), (1024, 77), (64, 2000)])
@pytest.mark.parametrize("mask", [None, "bool", "float", "causal"])
def test_attention_runs_fused(L, S, mask):
    shapes = [(1, 4, L, 32), (1, 4, S, 32), (1, 4, S, 32)]
    dtypes = [F32] * 3
    if mask in ("bool", "float"):
        shapes.append((1, 1, L, S))
        dtypes.append(np.bool_ if mask == "bool" else F32)
    node = Node("Attention", "attention_grid", [Value(f"in{i}") for i in range(len(shapes))], [Value("y")],
                {"is_causal": mask == "causal"}, source="grid:1")
    assert build(node, shapes, dtypes).impl == "fused-attention"


def test_a_rare_dtype_is_a_marked_fallback():
    """float64 convolutions run the reference's sums: marked, so the profile lists them."""
    node = _conv("Conv", 8, 8, 3)
    kernel = build(node, [(1, 8, HW, HW)], [np.float64])
    assert kernel.is_fallback and kernel.impl == "reference"


@pytest.mark.skipif(not native_block(), reason="the rule weighs oneDNN's blocks")
@pytest.mark.parametrize("c,hw,stride,direct", [
    (BLOCK + 4, 56, 1, True),  # a partial last block over a large map: the direct loop
    (BLOCK // 2, 28, 1, True),
    (2 * BLOCK, 56, 1, False),  # whole blocks: oneDNN
    (BLOCK + 4, 14, 1, False),  # a small map: oneDNN
    (BLOCK + 4, 56, 2, False),  # stride 2: oneDNN
])
def test_depthwise_with_a_partial_block_over_a_large_map_runs_direct(c, hw, stride, direct):
    node = _conv("Conv", c, c, 3, stride, 1, c)
    impl = build(node, [(1, c, hw, hw)]).impl
    assert impl.startswith("direct") == direct, impl
