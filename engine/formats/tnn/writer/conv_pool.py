"""Writer rules for convolutions and pooling: Conv / ConvTranspose -> Convolution / Deconvolution (with the PadV2,
StridedSliceV2, Add and activation layers TNN needs around them), MaxPool / AvgPool / Global*Pool / Adaptive*Pool
-> Pooling."""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.writer.activations import activation
from engine.formats.tnn.writer.core import Writer
from engine.formats.tnn.writer.registry import writes
from engine.ir import Node
from engine.ops.spatial import pads4, pair

FUSED_ACT = {None: 0, "relu": 1, "relu6": 2, "silu": 256}
PAD_CODES = {"constant": 0, "zeros": 0, "reflect": 1, "edge": 2, "replicate": 2}


def _spatial_pads(w: Writer, node: Node, x: str) -> tuple[str, int, int, int]:
    """(input blob, ph, pw, pad_type): asymmetric or non-zero padding becomes a PadV2 layer first."""
    auto = node.params.get("auto_pad")
    if auto in ("same_upper", "valid"):
        return x, 0, 0, 0 if auto == "same_upper" else 1
    if auto not in (None, "notset", "NOTSET"):
        w.unsupported(f"with auto_pad {auto!r}")
    t, l, b, r = pads4(node)
    mode = node.params.get("pad_mode", "zeros")
    if (t, l) == (b, r) and mode == "zeros":
        return x, t, l, -1
    if mode not in PAD_CODES:
        w.unsupported(f"with pad_mode {mode!r}")
    padded = w.tmp("pad")
    w.layer("PadV2", [x], [padded], [4, 0, 0, t, l, 0, 0, b, r, PAD_CODES[mode], 0.0], name=f"{node.name}/pad")
    return padded, 0, 0, -1


@writes("Conv", "ConvTranspose")
def conv(w: Writer, node: Node) -> None:
    deconv = node.op_type == "ConvTranspose"
    weight, bias = node.attrs["weight"], node.attrs.get("bias")
    g = int(node.params.get("groups", 1) or 1)
    (sh, sw), (dh, dw) = pair(node, "stride", 1), pair(node, "dilation", 1)
    crop = None
    if deconv:
        i_total, og, kh, kw = weight.shape
        ic, oc = i_total // g, og * g
        if node.params.get("auto_pad") not in (None, "notset"):
            w.unsupported("with auto_pad")
        t, l, b, r = pads4(node)
        x, ph, pw, pad_type = w.name(node.inputs[0]), t, l, -1
        if (t, l) != (b, r) or any(pair(node, "output_padding", 0)):
            # TNN pads deconvolutions symmetrically only: compute the full output, then cut the window out
            ph, pw, crop = 0, 0, (t, l, *w.shape(node.outputs[0])[2:])
    else:
        oc, ic, kh, kw = weight.shape
        x, ph, pw, pad_type = _spatial_pads(w, node, w.name(node.inputs[0]))
    act, z = node.params.get("activation"), node.inputs[1] if len(node.inputs) > 1 else None
    fused = act in FUSED_ACT and z is None
    out = w.name(node.outputs[0])
    conv_out = out if (fused or (act is None and z is None)) and crop is None else w.tmp("conv")
    params = [g, ic, oc, kh, kw, sh, sw, ph, pw, int(bias is not None), pad_type, dh, dw,
              FUSED_ACT[act] if fused else 0]
    res = [("name",), ("int", int(bias is not None)), w.raw(weight)] + ([w.raw(bias)] if bias is not None else [])
    w.layer("Deconvolution" if deconv else "Convolution", [x], [conv_out], params, res)
    if crop is not None:
        t, l, oh, ow = crop
        cropped = out if fused or act is None else w.tmp("crop")
        w.layer("StridedSliceV2", [conv_out], [cropped], [2, t, l, 2, t + oh, l + ow, 2, 2, 3, 2, 1, 1],
                name=f"{node.name}/crop")
        conv_out = cropped
    if z is not None:
        sum_out = out if act is None else w.tmp("sum")
        w.layer("Add", [conv_out, w.name(z)], [sum_out], [-1], name=f"{node.name}/residual")
        conv_out = sum_out
    if not fused and act is not None:
        activation(w, act, node.params.get("activation_params"), conv_out, out)


@writes("MaxPool", "AvgPool")
def pooling(w: Writer, node: Node) -> None:
    kh, kw = pair(node, "kernel", 0)
    sh, sw = (kh, kw) if node.params.get("stride") in (None, [], ()) else pair(node, "stride", 1)
    if pair(node, "dilation", 1) != (1, 1) or node.params.get("divisor_override"):
        w.unsupported("with dilation or a divisor override")
    is_avg = node.op_type == "AvgPool"
    include = is_avg and node.params.get("count_include_pad", True)
    x, (t, l, b, r), auto = w.name(node.inputs[0]), pads4(node), node.params.get("auto_pad")
    if auto in ("same_upper", "valid"):
        ph, pw, pad_type = 0, 0, 0 if auto == "same_upper" else 1
    elif (t, l) == (b, r) and not (include and (t or l)):
        ph, pw, pad_type = t, l, -1
    elif is_avg and not include:
        w.unsupported("with asymmetric pads that must not be averaged")
    else:  # TNN never averages padding and only pads symmetrically: pad explicitly first
        x, ph, pw, pad_type = _explicit_pad(w, node, x, 0.0 if is_avg else -3.4e38)
    ceil = int(bool(node.params.get("ceil_mode")))
    _check_pool_size(w, node, (kh, kw), (sh, sw), (ph, pw), ceil, pad_type)
    w.layer("Pooling", [x], [w.name(node.outputs[0])],
            [int(is_avg), kh, kw, sh, sw, ph, pw, -1, -1, pad_type, ceil, 0, -1, -1])


def _explicit_pad(w: Writer, node: Node, x: str, fill: float) -> tuple[str, int, int, int]:
    t, l, b, r = pads4(node)
    padded = w.tmp("pad")
    w.layer("PadV2", [x], [padded], [4, 0, 0, t, l, 0, 0, b, r, 0, fill], name=f"{node.name}/pad")
    return padded, 0, 0, -1


def _check_pool_size(w: Writer, node: Node, k, s, p, ceil: int, pad_type: int) -> None:
    """TNN's output size formula lacks torch's ceil-mode correction: refuse where the two disagree."""
    if pad_type != -1:
        return
    rnd = np.ceil if ceil else np.floor
    shape, out = w.shape(node.inputs[0]), w.shape(node.outputs[0])
    pads = pads4(node)
    extra = (pads[0] + pads[2] - 2 * p[0], pads[1] + pads[3] - 2 * p[1])
    tnn = tuple(int(rnd((shape[2 + i] + extra[i] + 2 * p[i] - k[i]) / s[i] + 1)) for i in range(2))
    if tnn != tuple(out[2:]):
        w.unsupported(f"whose output size {tuple(out[2:])} TNN would compute as {tnn}")


@writes("GlobalAvgPool", "GlobalMaxPool")
def global_pool(w: Writer, node: Node) -> None:
    t = 0 if "Max" in node.op_type else 1
    w.layer("Pooling", [w.name(node.inputs[0])], [w.name(node.outputs[0])],
            [t, 0, 0, 1, 1, 0, 0, -1, -1, -1, 0, 0, -1, -1])


@writes("AdaptiveAvgPool", "AdaptiveMaxPool")
def adaptive_pool(w: Writer, node: Node) -> None:
    oh, ow = w.shape(node.outputs[0])[2:]
    if (oh, ow) == (1, 1):
        return global_pool(w, node)
    h, wd = w.shape(node.inputs[0])[2:]
    is_avg = int(node.op_type == "AdaptiveAvgPool")
    if h % oh == 0 and wd % ow == 0:  # even bins: a plain pooling window
        kh, kw = h // oh, wd // ow
        return w.layer("Pooling", [w.name(node.inputs[0])], [w.name(node.outputs[0])],
                       [is_avg, kh, kw, kh, kw, 0, 0, -1, -1, -1, 0, 0, -1, -1])
    if not is_avg:
        w.unsupported("with uneven bins (TNN's adaptive pooling only averages)")
    w.layer("Pooling", [w.name(node.inputs[0])], [w.name(node.outputs[0])],
            [1, 0, 0, 1, 1, 0, 0, -1, -1, -1, 0, 1, oh, ow])
