"""Writes tests/fixtures/ops/spatial.npz: torch outputs for the spatial ops on small, awkward shapes.

Run with the dev environment (torch): `.venv-dev/bin/python tools/make_op_goldens_spatial.py`.
Each case stores `<case>/op` (canonical op name), `<case>/params` (JSON of the SPEC params),
`<case>/in<i>` (inputs), `<case>/attr_<name>` (weight, bias) and `<case>/out0` (torch's result), the layout
tests/op_harness.load_cases reads.
Where torch lacks a form (asymmetric pads, auto_pad with stride) the case is built from torch primitives
(F.pad, then the op with no padding; a full transposed conv, then a crop).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "ops" / "spatial.npz"
rng = np.random.default_rng(1234)
CASES: dict[str, np.ndarray] = {}

ACTS = {
    None: lambda y: y,
    "relu": F.relu,
    "relu6": F.relu6,
    "leaky_relu": lambda y: F.leaky_relu(y, 0.1),
    "hardswish": F.hardswish,
    "silu": F.silu,
    "sigmoid": torch.sigmoid,
    "gelu": F.gelu,
}
ACT_PARAMS = {"leaky_relu": {"alpha": 0.1}}


def arr(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def add(
    name: str,
    op: str,
    params: dict,
    inputs: list[np.ndarray],
    out: torch.Tensor | np.ndarray,
    attrs: dict | None = None,
) -> None:
    assert f"{name}/op" not in CASES, name
    CASES[f"{name}/op"] = np.array(op)
    CASES[f"{name}/params"] = np.array(json.dumps(params))
    for i, a in enumerate(inputs):
        CASES[f"{name}/in{i}"] = a
    for k, a in (attrs or {}).items():
        CASES[f"{name}/attr_{k}"] = a
    CASES[f"{name}/out0"] = out.detach().numpy() if isinstance(out, torch.Tensor) else out


def same_pads(size, kernel, stride, dilation, upper: bool) -> list[int]:
    """ONNX auto_pad SAME_UPPER / SAME_LOWER as (t, l, b, r)."""
    begin, end = [], []
    for n, k, s, d in zip(size, kernel, stride, dilation, strict=True):
        total = max((math.ceil(n / s) - 1) * s + d * (k - 1) + 1 - n, 0)
        begin.append(total // 2 if upper else total - total // 2)
        end.append(total - begin[-1])
    return [begin[0], begin[1], end[0], end[1]]


# -- Conv --------------------------------------------------------------------------------------------
def conv_case(
    name,
    x_shape,
    o,
    k,
    *,
    stride=(1, 1),
    pads=(0, 0, 0, 0),
    dilation=(1, 1),
    groups=1,
    bias=True,
    pad_mode="zeros",
    auto_pad=None,
    act=None,
    residual=False,
    torch_same=False,
):
    x = arr(*x_shape)
    w = arr(o, x_shape[1] // groups, *k)
    b = arr(o) if bias else None
    if auto_pad in ("same_upper", "same_lower"):
        pads = same_pads(x_shape[2:], k, stride, dilation, auto_pad == "same_upper")
    elif auto_pad == "valid":
        pads = (0, 0, 0, 0)
    pt, pl, pb, pr = pads
    xt = t(x)
    if torch_same:
        y = F.conv2d(xt, t(w), None if b is None else t(b), stride, "same", dilation, groups)
    else:
        torch_mode = {"zeros": "constant", "reflect": "reflect", "replicate": "replicate", "circular": "circular"}
        xt = F.pad(xt, (pl, pr, pt, pb), mode=torch_mode[pad_mode])
        y = F.conv2d(xt, t(w), None if b is None else t(b), stride, 0, dilation, groups)
    inputs = [x]
    if residual:
        z = arr(*y.shape)
        y = y + t(z)
        inputs.append(z)
    y = ACTS[act](y)
    params = {
        "stride": list(stride),
        "pads": list(pads),
        "dilation": list(dilation),
        "groups": groups,
        "pad_mode": pad_mode,
        "activation": act,
        "activation_params": ACT_PARAMS.get(act),
    }
    if auto_pad or torch_same:
        params["auto_pad"] = auto_pad or "same_upper"
        params["pads"] = [0, 0, 0, 0]
    attrs = {"weight": w} if b is None else {"weight": w, "bias": b}
    add(name, "Conv", params, inputs, y, attrs)


def conv_cases():
    conv_case("conv_basic", (2, 3, 7, 9), 5, (3, 3), pads=(1, 1, 1, 1))
    conv_case("conv_s2_asym", (1, 5, 8, 7), 6, (3, 3), stride=(2, 2), pads=(0, 1, 2, 0))
    conv_case("conv_dil_groups", (2, 6, 9, 8), 9, (3, 3), stride=(1, 2), pads=(2, 1, 2, 1), dilation=(2, 1), groups=3)
    conv_case("conv_rect", (1, 3, 6, 11), 4, (2, 4), stride=(2, 3), pads=(1, 0, 0, 2), bias=False)
    conv_case("conv_dw_s2", (2, 7, 9, 11), 7, (3, 3), stride=(2, 2), pads=(1, 1, 1, 1), groups=7)
    conv_case("conv_dw_k5_dil", (1, 5, 10, 9), 5, (5, 5), pads=(4, 4, 4, 4), dilation=(2, 2), groups=5)
    conv_case("conv_dw_mult2", (1, 4, 7, 7), 8, (5, 5), pads=(2, 2, 2, 2), groups=4)
    conv_case("conv_1x1", (2, 5, 6, 7), 7, (1, 1), bias=False)
    conv_case("conv_1x1_groups", (1, 6, 5, 5), 4, (1, 1), groups=2)
    conv_case("conv_1x1_s2", (1, 5, 7, 9), 3, (1, 1), stride=(2, 2))
    conv_case("conv_reflect", (1, 3, 7, 6), 5, (3, 3), pads=(1, 1, 1, 1), pad_mode="reflect")
    conv_case("conv_replicate", (1, 3, 7, 6), 4, (5, 5), pads=(2, 2, 2, 2), pad_mode="replicate")
    conv_case("conv_circular_s2", (2, 3, 8, 7), 5, (3, 3), stride=(2, 2), pads=(1, 1, 1, 1), pad_mode="circular")
    conv_case("conv_dw_reflect", (1, 4, 6, 6), 4, (3, 3), pads=(1, 1, 1, 1), groups=4, pad_mode="reflect")
    conv_case("conv_same_upper_s2", (1, 3, 8, 7), 5, (3, 3), stride=(2, 2), auto_pad="same_upper")
    conv_case("conv_same_lower_s2", (1, 3, 8, 7), 5, (4, 4), stride=(2, 2), auto_pad="same_lower")
    conv_case("conv_valid", (1, 3, 8, 7), 5, (3, 2), stride=(2, 1), auto_pad="valid")
    conv_case("conv_torch_same_even", (1, 3, 7, 8), 5, (4, 4), dilation=(2, 1), torch_same=True)
    conv_case("conv_relu6_res", (2, 3, 7, 9), 5, (3, 3), pads=(1, 1, 1, 1), act="relu6", residual=True)
    conv_case("conv_leaky", (1, 4, 6, 5), 6, (3, 3), pads=(1, 1, 1, 1), act="leaky_relu")
    conv_case("conv_hswish_res_1x1", (1, 6, 5, 5), 6, (1, 1), act="hardswish", residual=True)
    conv_case("conv_dw_relu_res", (1, 6, 7, 5), 6, (3, 3), pads=(1, 1, 1, 1), groups=6, act="relu", residual=True)
    conv_case("conv_silu_groups", (1, 4, 6, 6), 6, (3, 3), stride=(2, 2), pads=(1, 1, 1, 1), groups=2, act="silu")
    conv_case("conv_gelu", (1, 3, 5, 5), 2, (3, 3), act="gelu")


# -- ConvTranspose -----------------------------------------------------------------------------------
def tconv_case(
    name,
    x_shape,
    o,
    k,
    *,
    stride=(1, 1),
    pads=(0, 0, 0, 0),
    output_padding=(0, 0),
    dilation=(1, 1),
    groups=1,
    bias=True,
    act=None,
):
    x = arr(*x_shape)
    w = arr(x_shape[1], o // groups, *k)
    b = arr(o) if bias else None
    # Full transposed conv, then crop (t, l) .. (b, r): torch only has symmetric pads.
    full = F.conv_transpose2d(t(x), t(w), None if b is None else t(b), stride, 0, output_padding, groups, dilation)
    pt, pl, pb, pr = pads
    y = ACTS[act](full[:, :, pt : full.shape[2] - pb, pl : full.shape[3] - pr])
    params = {
        "stride": list(stride),
        "pads": list(pads),
        "output_padding": list(output_padding),
        "dilation": list(dilation),
        "groups": groups,
        "activation": act,
        "activation_params": ACT_PARAMS.get(act),
    }
    attrs = {"weight": w} if b is None else {"weight": w, "bias": b}
    add(name, "ConvTranspose", params, [x], y, attrs)


def tconv_cases():
    tconv_case("tconv_s2_op1", (2, 4, 5, 6), 6, (3, 3), stride=(2, 2), pads=(1, 1, 1, 1), output_padding=(1, 1))
    tconv_case("tconv_groups_dil", (1, 4, 4, 5), 6, (3, 2), stride=(2, 3), pads=(1, 0, 1, 0), dilation=(1, 2), groups=2)
    tconv_case("tconv_asym", (1, 3, 5, 4), 5, (3, 3), stride=(2, 2), pads=(0, 1, 2, 0), output_padding=(1, 0))
    tconv_case("tconv_dw_up", (1, 3, 4, 5), 3, (4, 4), stride=(2, 2), pads=(1, 1, 1, 1), groups=3, bias=False)
    tconv_case("tconv_relu", (2, 5, 3, 3), 7, (2, 2), stride=(2, 2), act="relu")
    tconv_case("tconv_s1", (1, 3, 6, 5), 4, (3, 3), pads=(1, 1, 1, 1), act="leaky_relu")


# -- Gemm / MatMul -----------------------------------------------------------------------------------
def linear_cases():
    gemms = (
        ("gemm_2d", (3, 5), 7, True, None),
        ("gemm_3d_relu", (2, 3, 6), 5, True, "relu"),
        ("gemm_nobias_gelu", (4, 9), 3, False, "gelu"),
        ("gemm_sigmoid", (1, 1, 8), 4, True, "sigmoid"),
    )
    for name, x_shape, n, bias, act in gemms:
        x, w = arr(*x_shape), arr(n, x_shape[-1])
        b = arr(n) if bias else None
        y = ACTS[act](F.linear(t(x), t(w), None if b is None else t(b)))
        attrs = {"weight": w} if b is None else {"weight": w, "bias": b}
        add(name, "Gemm", {"activation": act, "activation_params": ACT_PARAMS.get(act)}, [x], y, attrs)
    for name, a_shape, b_shape in (
        ("matmul_2d", (3, 4), (4, 5)),
        ("matmul_bcast", (2, 1, 3, 4), (5, 4, 6)),
        ("matmul_vec_mat", (4,), (3, 4, 2)),
        ("matmul_mat_vec", (2, 3, 4), (4,)),
        ("matmul_vec_vec", (6,), (6,)),
    ):
        a, b = arr(*a_shape), arr(*b_shape)
        add(name, "MatMul", {}, [a, b], torch.matmul(t(a), t(b)))


# -- pooling -----------------------------------------------------------------------------------------
def pool_cases():
    def maxp(name, shape, k, s, pads=(0, 0, 0, 0), dilation=(1, 1), ceil=False, auto_pad=None):
        x = arr(*shape)
        params = {
            "kernel": list(k),
            "stride": list(s),
            "pads": list(pads),
            "dilation": list(dilation),
            "ceil_mode": ceil,
        }
        if auto_pad:
            pads = same_pads(shape[2:], k, s, dilation, auto_pad == "same_upper")
            params.update(auto_pad=auto_pad, pads=[0, 0, 0, 0])
        if pads[0] == pads[2] and pads[1] == pads[3]:
            y = F.max_pool2d(t(x), k, s, (pads[0], pads[1]), dilation, ceil_mode=ceil)
        else:
            y = F.max_pool2d(
                F.pad(t(x), (pads[1], pads[3], pads[0], pads[2]), value=-math.inf), k, s, 0, dilation, ceil_mode=ceil
            )
        add(name, "MaxPool", params, [x], y)

    maxp("maxpool_k3s2p1", (2, 3, 9, 8), (3, 3), (2, 2), (1, 1, 1, 1))
    maxp("maxpool_ceil", (1, 4, 8, 7), (3, 3), (2, 2), ceil=True)
    maxp("maxpool_ceil_pad", (1, 2, 10, 9), (3, 2), (2, 2), (1, 1, 1, 1), ceil=True)
    maxp("maxpool_dil", (1, 3, 9, 10), (3, 3), (1, 2), (1, 1, 1, 1), dilation=(2, 2))
    maxp("maxpool_rect_asym", (2, 3, 7, 9), (2, 3), (1, 2), (0, 1, 1, 0))
    maxp("maxpool_same_upper", (1, 3, 7, 8), (3, 3), (2, 2), auto_pad="same_upper")

    def avgp(name, shape, k, s, pad=(0, 0), ceil=False, include=True, divisor=None):
        x = arr(*shape)
        y = F.avg_pool2d(t(x), k, s, pad, ceil, include, divisor)
        params = {
            "kernel": list(k),
            "stride": list(s),
            "pads": [pad[0], pad[1], pad[0], pad[1]],
            "ceil_mode": ceil,
            "count_include_pad": include,
            "divisor_override": divisor,
        }
        add(name, "AvgPool", params, [x], y)

    avgp("avgpool_k3s2p1", (2, 3, 9, 8), (3, 3), (2, 2), (1, 1))
    avgp("avgpool_nopadcount", (1, 3, 9, 8), (3, 3), (2, 2), (1, 1), include=False)
    avgp("avgpool_ceil_pad", (1, 2, 10, 9), (3, 3), (2, 2), (1, 1), ceil=True)
    avgp("avgpool_ceil_pad_excl", (1, 2, 10, 9), (3, 2), (2, 2), (1, 1), ceil=True, include=False)
    avgp("avgpool_ceil_nopad", (1, 3, 8, 7), (3, 3), (2, 2), ceil=True)
    avgp("avgpool_divisor", (1, 2, 7, 7), (2, 3), (2, 1), (1, 1), divisor=5)
    for op, fn in (
        ("GlobalAvgPool", lambda x: x.mean((2, 3), keepdim=True)),
        ("GlobalMaxPool", lambda x: x.amax((2, 3), keepdim=True)),
    ):
        x = arr(2, 5, 7, 9)
        add(op.lower(), op, {}, [x], fn(t(x)))
    for op, fn in (("AdaptiveAvgPool", F.adaptive_avg_pool2d), ("AdaptiveMaxPool", F.adaptive_max_pool2d)):
        for i, (shape, size) in enumerate(
            (
                ((2, 3, 7, 9), (3, 4)),
                ((1, 2, 5, 5), (3, 2)),
                ((1, 2, 3, 3), (5, 4)),
                ((1, 3, 6, 10), (None, 3)),
                ((1, 2, 7, 7), (1, 1)),
            )
        ):
            x = arr(*shape)
            add(f"{op.lower()}_{i}", op, {"output_size": list(size)}, [x], fn(t(x), size))


# -- resize --------------------------------------------------------------------------------------------
def resize_cases():
    specs = [
        ("nearest_size_up", (2, 3, 7, 9), "nearest", None, {"size": (10, 13)}),
        ("nearest_size_down", (1, 2, 7, 9), "nearest", None, {"size": (3, 4)}),
        ("nearest_scale2", (1, 2, 4, 5), "nearest", None, {"scale": (2.0, 2.0)}),
        ("nearest_scale1_5", (1, 2, 5, 7), "nearest", None, {"scale": (1.5, 1.5)}),
        ("nearest_scale1_2_same", (1, 2, 3, 5), "nearest", None, {"scale": (1.2, 1.3)}),
        ("nearest_scale_frac", (1, 2, 9, 10), "nearest", None, {"scale": (0.5, 0.7)}),
        ("bilinear_size", (2, 3, 7, 9), "bilinear", False, {"size": (11, 5)}),
        ("bilinear_size_ac", (1, 3, 7, 9), "bilinear", True, {"size": (11, 5)}),
        ("bilinear_scale2", (1, 2, 5, 6), "bilinear", False, {"scale": (2.0, 2.0)}),
        ("bilinear_scale_frac", (1, 2, 9, 10), "bilinear", False, {"scale": (0.6, 1.7)}),
        ("bilinear_to1", (1, 2, 5, 6), "bilinear", False, {"size": (1, 1)}),
        ("bilinear_ac_to1", (1, 2, 5, 6), "bilinear", True, {"size": (1, 3)}),
        ("bicubic_size", (1, 3, 6, 7), "bicubic", False, {"size": (9, 5)}),
        ("bicubic_size_ac", (1, 2, 6, 7), "bicubic", True, {"size": (9, 11)}),
        ("bicubic_scale", (1, 2, 5, 4), "bicubic", False, {"scale": (2.5, 1.5)}),
        ("nearest_exact_size_down", (1, 2, 7, 9), "nearest-exact", None, {"size": (3, 4)}),
        ("nearest_exact_size_up", (1, 2, 4, 5), "nearest-exact", None, {"size": (9, 7)}),
        ("nearest_exact_scale_frac", (1, 2, 9, 10), "nearest-exact", None, {"scale": (0.5, 1.7)}),
    ]
    for name, shape, mode, ac, how in specs:
        x = arr(*shape)
        kwargs = {"mode": mode}
        if ac is not None:
            kwargs["align_corners"] = ac
        if "size" in how:
            y = F.interpolate(t(x), size=how["size"], **kwargs)
        else:
            y = F.interpolate(t(x), scale_factor=how["scale"], **kwargs)
        params = {"mode": mode, "align_corners": bool(ac), **{k: list(v) for k, v in how.items()}}
        add(f"resize_{name}", "Resize", params, [x], y)
    for name, shape, r in (("pixelshuffle_r2", (2, 12, 3, 5), 2), ("pixelshuffle_r3", (1, 18, 2, 3), 3)):
        x = arr(*shape)
        add(name, "PixelShuffle", {"upscale": r}, [x], F.pixel_shuffle(t(x), r))
    for name, shape, g in (("channelshuffle_g3", (2, 6, 3, 4), 3), ("channelshuffle_g2", (1, 10, 2, 3), 2)):
        x = arr(*shape)
        add(name, "ChannelShuffle", {"groups": g}, [x], F.channel_shuffle(t(x), g))


# -- pad ---------------------------------------------------------------------------------------------------
def pad_cases():
    specs = [
        ("pad_constant_4d", (2, 3, 4, 5), (0, 1, 2, 0, 0, 2, 1, 3), "constant", 1.5),
        ("pad_constant_crop", (1, 3, 6, 7), (0, 0, -1, 2, 0, 0, 1, -3), "constant", 0.0),
        ("pad_reflect", (1, 2, 5, 6), (0, 0, 2, 1, 0, 0, 4, 5), "reflect", 0.0),
        ("pad_edge", (2, 2, 4, 3), (0, 0, 3, 0, 0, 0, 1, 4), "edge", 0.0),
        ("pad_circular", (1, 3, 4, 5), (0, 0, 2, 5, 0, 0, 4, 1), "circular", 0.0),
        ("pad_reflect_3d", (2, 3, 7), (0, 0, 3, 0, 0, 6), "reflect", 0.0),
        ("pad_edge_3d", (1, 4, 5), (0, 0, 0, 0, 0, 7), "edge", 0.0),
    ]
    torch_mode = {"constant": "constant", "reflect": "reflect", "edge": "replicate", "circular": "circular"}
    for name, shape, pads, mode, value in specs:
        x = arr(*shape)
        rank = len(shape)
        torch_pads = []
        for d in reversed(range(rank)):
            torch_pads += [pads[d], pads[d + rank]]
        while len(torch_pads) > 2 and mode != "constant" and torch_pads[-1] == torch_pads[-2] == 0:
            torch_pads = torch_pads[:-2]  # non-constant modes only pad trailing dims in torch
        kw = {"value": value} if mode == "constant" else {}
        y = F.pad(t(x), torch_pads, mode=torch_mode[mode], **kw)
        add(name, "Pad", {"pads": list(pads), "mode": mode, "value": value}, [x], y)


def main() -> None:
    torch.manual_seed(0)
    conv_cases()
    tconv_cases()
    linear_cases()
    pool_cases()
    resize_cases()
    pad_cases()
    CASES["meta"] = np.array(json.dumps({"torch": torch.__version__}))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **CASES)
    n = sum(k.endswith("/op") for k in CASES)
    print(f"wrote {OUT.relative_to(OUT.parents[3])}: {n} cases, {OUT.stat().st_size} bytes")


if __name__ == "__main__":
    main()
