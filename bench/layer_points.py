"""The points of bench/layers.py's sweep, and each point's single-layer graph twice: as ONNX (onnx.helper, for ONNX
Runtime) and as a canonical nnserve Graph (the ops pnnx's lowering emits for the same layer).

A point is a dict: `kind` (conv, conv1d, tconv, pool, resize, attention, softmax) and that kind's parameters; `name`
says them in a few words. Weights and inputs are drawn from a seed derived from the name, so both engines' processes
compute the same function on the same data and the driver can compare their outputs.
`context` (conv only): "plain" is the layer alone, as nnserve runs it alone (NCHW in and out); "blocked" is the
layer as it runs inside a network, its input and output in the CPU's blocked layout (nnserve's layout rewrite
forced on; ONNX Runtime runs the same graph and does its own layout transform).
"""

from __future__ import annotations

import zlib

import numpy as np

FLOAT = np.float32


def name_of(p: dict) -> str:
    kind = p["kind"]
    if kind in ("conv", "conv1d", "tconv"):
        k = p["k"]
        extra = "".join([f" s{p['stride']}" if p.get("stride", 1) != 1 else "",
                         f" d{p['dilation']}" if p.get("dilation", 1) != 1 else "",
                         (" dw" if p.get("groups", 1) == p["c"] == p["o"] else f" g{p['groups']}")
                         if p.get("groups", 1) != 1 else ""])
        size = p["hw"] if kind != "conv1d" else p["length"]
        ctx = f" [{p['context']}]" if kind == "conv" else ""
        return f"{kind} {k}x{k if kind != 'conv1d' else 1}{extra} {p['c']}->{p['o']} @{size}{ctx}"
    if kind == "pool":
        if p["mode"].startswith("global"):
            return f"{p['mode']}pool {p['c']} @{p['hw']}"
        return f"{p['mode']}pool {p['k']}x{p['k']} s{p['stride']} p{p['pad']} {p['c']} @{p['hw']}"
    if kind == "resize":
        return f"resize {p['mode']} x{p['scale']} {p['c']} @{p['hw']}"
    if kind == "softmax":
        return f"softmax {p['rows']}x{p['n']}"
    mask = f" {p['mask']}" if p.get("mask") else ""
    return f"attention h{p['heads']} L{p['L']} S{p['S']} d{p['dim']}{mask}"


def rng_of(p: dict) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name_of(p).encode()))


# -- the sweep -------------------------------------------------------------------------------------------------
def conv(c, o, k, hw, stride=1, dilation=1, groups=1, context="plain") -> dict:
    return {"kind": "conv", "c": c, "o": o, "k": k, "hw": hw, "stride": stride, "dilation": dilation,
            "groups": groups, "context": context}


def both(**kw) -> list[dict]:
    return [conv(**kw, context="plain"), conv(**kw, context="blocked")]


def conv1d(c, o, k, length, stride=1, dilation=1, groups=1) -> dict:
    return {"kind": "conv1d", "c": c, "o": o, "k": k, "length": length, "stride": stride, "dilation": dilation,
            "groups": groups}


def tconv(c, o, k, hw, stride=2, pad=0, output_padding=0, groups=1) -> dict:
    return {"kind": "tconv", "c": c, "o": o, "k": k, "hw": hw, "stride": stride, "pad": pad,
            "output_padding": output_padding, "groups": groups}


def pool(mode, c, hw, k=0, stride=1, pad=0) -> dict:
    return {"kind": "pool", "mode": mode, "c": c, "hw": hw, "k": k, "stride": stride, "pad": pad}


def resize(mode, c, hw, scale=2) -> dict:
    return {"kind": "resize", "mode": mode, "c": c, "hw": hw, "scale": scale}


def attention(heads, L, S, dim, mask=None) -> dict:
    return {"kind": "attention", "heads": heads, "L": L, "S": S, "dim": dim, "mask": mask}


def softmax(rows, n) -> dict:
    """Softmax over the last axis of (1, rows, n): a detector's class scores, a classifier's, attention-like rows."""
    return {"kind": "softmax", "rows": rows, "n": n}


def quick_points() -> list[dict]:
    """The known cliffs (issue 19) and their neighbours: a few minutes."""
    return [
        *both(c=256, o=256, k=3, hw=65, dilation=12), conv(256, 256, 3, 65, dilation=24, context="blocked"),
        conv(256, 256, 3, 65, dilation=36, context="blocked"),
        *both(c=8, o=16, k=3, hw=160), conv(3, 8, 3, 320, stride=2, context="blocked"),
        conv(96, 96, 5, 56, groups=96, context="blocked"), conv(96, 96, 7, 56, groups=96, context="blocked"),
        conv(240, 240, 5, 14, stride=2, groups=240, context="blocked"), conv(32, 32, 7, 112, groups=32),
        conv1d(80, 384, 3, 3000), conv1d(1, 512, 10, 16000, stride=5),
        tconv(64, 32, 4, 64, stride=2, pad=1), pool("max", 64, 112, 3, 2, 1), resize("bilinear", 64, 128),
        attention(8, 1024, 1024, 64), attention(8, 1829, 1829, 32), attention(8, 4096, 77, 40),
        attention(8, 4096, 4096, 40), attention(12, 512, 512, 64, mask="padding"),
        attention(12, 1024, 1024, 64, mask="causal"),
    ]


def full_points() -> list[dict]:
    pts: list[dict] = []
    # dense convs: kernel 1-7, stride 1-2, channels 3..1024 incl. small and odd ones, spatial 7..640
    for c, o, hw in [(3, 16, 640), (3, 32, 224), (3, 24, 224), (8, 16, 160), (16, 16, 112), (17, 33, 31),
                     (24, 40, 28), (32, 64, 56), (64, 64, 56), (128, 128, 28), (256, 256, 14), (512, 512, 7)]:
        for k, s in [(3, 1), (3, 2)]:
            if c == 3 and s == 1:
                continue
            pts += both(c=c, o=o, k=k, hw=hw, stride=s)
    for k in (1, 5, 7):
        for s in (1, 2):
            pts += both(c=32, o=64, k=k, hw=56, stride=s)
    pts += both(c=3, o=64, k=7, hw=224, stride=2)  # ResNet stem
    pts += both(c=1024, o=1024, k=1, hw=7) + both(c=320, o=1280, k=1, hw=7) + both(c=96, o=24, k=1, hw=56)
    # dilation 1-36 (DeepLab's ASPP, dilated backbones)
    for d in (2, 6, 12, 24, 36):
        pts += both(c=256, o=256, k=3, hw=65 if d >= 12 else 33, dilation=d)
    pts += both(c=64, o=64, k=3, hw=56, dilation=2)
    # groups: grouped, depthwise (kernel 3-7, stride 1-2), depthwise with a multiplier
    for c, g, hw in [(64, 2, 56), (128, 32, 28), (256, 4, 14), (96, 3, 28)]:
        pts += both(c=c, o=c, k=3, hw=hw, groups=g)
    for k in (3, 5, 7):
        for c, hw in [(32, 112), (96, 56), (144, 28), (384, 14), (672, 7)]:
            pts += both(c=c, o=c, k=k, hw=hw, groups=c)
        pts += both(c=96, o=96, k=k, hw=56, stride=2, groups=96)
    pts += both(c=20, o=20, k=3, hw=56, groups=20) + both(c=32, o=64, k=3, hw=56, groups=32)
    pts += both(c=256, o=256, k=3, hw=65, dilation=12, groups=256)
    # 1-D convs (audio stems and encoders)
    pts += [conv1d(80, 384, 3, 3000), conv1d(384, 384, 3, 3000, stride=2), conv1d(1, 512, 10, 16000, stride=5),
            conv1d(512, 512, 3, 3199, stride=2), conv1d(512, 512, 2, 49, stride=2), conv1d(768, 768, 128, 49,
                                                                                           groups=16),
            conv1d(256, 256, 31, 500, groups=256), conv1d(64, 64, 7, 1024), conv1d(64, 64, 5, 1024, dilation=4)]
    # transposed convs
    pts += [tconv(64, 32, 4, 32, 2, 1), tconv(256, 128, 2, 16, 2), tconv(32, 16, 3, 64, 2, 1, 1),
            tconv(16, 3, 4, 128, 2, 1), tconv(64, 64, 4, 32, 2, 1, groups=64), tconv(512, 256, 2, 32, 2)]
    # pooling
    pts += [pool("max", 64, 112, 3, 2, 1), pool("max", 128, 56, 2, 2), pool("max", 256, 20, 5, 1, 2),
            pool("avg", 192, 28, 3, 1, 1), pool("avg", 256, 56, 2, 2), pool("globalavg", 1280, 7),
            pool("globalavg", 2048, 7), pool("globalmax", 512, 14), pool("max", 3, 640, 2, 2)]
    # resize
    pts += [resize("nearest", 256, 20), resize("nearest", 128, 40), resize("bilinear", 64, 128),
            resize("bilinear", 21, 65, 4), resize("bilinear", 256, 33, 8), resize("nearest", 3, 320)]
    # attention: lengths 16-4096, heads x dim as ViT/BERT (12x64), DETR (8x32), UNet (8x40), masks
    for L in (16, 64, 197, 256, 1024, 1829, 4096):
        pts.append(attention(8 if L != 197 else 12, L, L, 64 if L != 1829 else 32))
    pts += [attention(8, 4096, 4096, 40), attention(8, 4096, 77, 40), attention(8, 1024, 77, 80),
            attention(12, 512, 512, 64, mask="padding"), attention(12, 1024, 1024, 64, mask="causal"),
            attention(4, 3136, 49, 64), attention(64, 49, 49, 32)]
    # softmax alone: UltraFace's 2 classes, 4 and 16 bins, a classifier's 1000, attention-sized rows
    pts += [softmax(4420, 2), softmax(2210, 4), softmax(33600, 16), softmax(1, 1000), softmax(2364, 197)]
    return pts


# -- ONNX ------------------------------------------------------------------------------------------------------
def _conv_pads(p: dict) -> list[int]:
    pad = p.get("dilation", 1) * (p["k"] // 2)
    return [pad, pad]


def weights(p: dict) -> dict[str, np.ndarray]:
    """The layer's weights and its inputs, the same in both engines' processes."""
    rng = rng_of(p)
    kind = p["kind"]
    out: dict[str, np.ndarray] = {}
    if kind in ("conv", "conv1d"):
        c, o, k, g = p["c"], p["o"], p["k"], p["groups"]
        kshape = (k, k) if kind == "conv" else (k,)
        out["w"] = (rng.standard_normal((o, c // g, *kshape)) / np.sqrt(c // g * k * len(kshape))).astype(FLOAT)
        out["b"] = rng.standard_normal(o).astype(FLOAT) * 0.1
        size = (p["hw"], p["hw"]) if kind == "conv" else (p["length"],)
        out["x"] = rng.standard_normal((1, c, *size)).astype(FLOAT)
    elif kind == "tconv":
        c, o, k, g = p["c"], p["o"], p["k"], p["groups"]
        out["w"] = (rng.standard_normal((c, o // g, k, k)) / np.sqrt(c * k)).astype(FLOAT)
        out["b"] = rng.standard_normal(o).astype(FLOAT) * 0.1
        out["x"] = rng.standard_normal((1, c, p["hw"], p["hw"])).astype(FLOAT)
    elif kind in ("pool", "resize"):
        out["x"] = rng.standard_normal((1, p["c"], p["hw"], p["hw"])).astype(FLOAT)
    elif kind == "softmax":
        out["x"] = (rng.standard_normal((1, p["rows"], p["n"])) * 3).astype(FLOAT)
    else:
        h, d = p["heads"], p["dim"]
        out["q"] = rng.standard_normal((1, h, p["L"], d)).astype(FLOAT)
        out["k"] = rng.standard_normal((1, h, p["S"], d)).astype(FLOAT)
        out["v"] = rng.standard_normal((1, h, p["S"], d)).astype(FLOAT)
        if p.get("mask") == "padding":  # the last quarter of the keys padded, additive (BERT's extended mask)
            m = np.zeros((1, 1, 1, p["S"]), FLOAT)
            m[..., p["S"] * 3 // 4:] = np.finfo(FLOAT).min
            out["mask"] = m
        elif p.get("mask") == "causal":
            out["mask"] = np.triu(np.full((p["L"], p["S"]), -np.inf, FLOAT), 1)
    return out


def input_names(p: dict) -> list[str]:
    return ["q", "k", "v"] if p["kind"] == "attention" else ["x"]


def onnx_model(p: dict):
    """The layer as an ONNX ModelProto (opset 17)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = weights(p)
    kind = p["kind"]
    inits, nodes = [], []
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(w[n].shape)) for n in input_names(p)]

    def const(name: str, arr: np.ndarray) -> str:
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    if kind in ("conv", "conv1d"):
        pads = _conv_pads(p) if kind == "conv" else _conv_pads(p)[:1]
        nd = len(pads)
        nodes.append(helper.make_node("Conv", ["x", const("w", w["w"]), const("b", w["b"])], ["y"],
                                      pads=pads * 2, strides=[p["stride"]] * nd, dilations=[p["dilation"]] * nd,
                                      group=p["groups"]))
    elif kind == "tconv":
        nodes.append(helper.make_node("ConvTranspose", ["x", const("w", w["w"]), const("b", w["b"])], ["y"],
                                      pads=[p["pad"]] * 4, strides=[p["stride"]] * 2,
                                      output_padding=[p["output_padding"]] * 2, group=p["groups"]))
    elif kind == "pool":
        mode = p["mode"]
        if mode.startswith("global"):
            nodes.append(helper.make_node("GlobalAveragePool" if mode == "globalavg" else "GlobalMaxPool", ["x"],
                                          ["y"]))
        else:
            op = "MaxPool" if mode == "max" else "AveragePool"
            extra = {} if mode == "max" else {"count_include_pad": 1}
            nodes.append(helper.make_node(op, ["x"], ["y"], kernel_shape=[p["k"]] * 2, strides=[p["stride"]] * 2,
                                          pads=[p["pad"]] * 4, **extra))
    elif kind == "resize":
        scales = const("scales", np.array([1, 1, p["scale"], p["scale"]], FLOAT))
        if p["mode"] == "nearest":  # torch's nearest: floor(dst * in / out)
            attrs = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
        else:  # torch's bilinear, align_corners=False
            attrs = {"mode": "linear", "coordinate_transformation_mode": "pytorch_half_pixel"}
        nodes.append(helper.make_node("Resize", ["x", "", scales], ["y"], **attrs))
    elif kind == "softmax":
        nodes.append(helper.make_node("Softmax", ["x"], ["y"], axis=-1))
    else:
        nodes.append(helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]))
        nodes.append(helper.make_node("MatMul", ["q", "kt"], ["s0"]))
        nodes.append(helper.make_node("Mul", ["s0", const("scale", np.array(p["dim"] ** -0.5, FLOAT))], ["s1"]))
        last = "s1"
        if "mask" in w:
            nodes.append(helper.make_node("Add", ["s1", const("mask", w["mask"])], ["s2"]))
            last = "s2"
        nodes.append(helper.make_node("Softmax", [last], ["p"], axis=-1))
        nodes.append(helper.make_node("MatMul", ["p", "v"], ["y"]))
    rank = 3 if kind in ("conv1d", "softmax") else 4
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, [f"d{i}" for i in range(rank)])
    graph = helper.make_graph(nodes, "layer", ins, [out], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


# -- nnserve ---------------------------------------------------------------------------------------------------
def nnserve_graph(p: dict):
    """The layer as a canonical Graph: the ops pnnx's lowering emits for it (Conv1d as Unsqueeze / Conv / Squeeze,
    attention as MatMul / Mul / Softmax / MatMul as torch code without F.scaled_dot_product_attention writes it)."""
    from engine.ir import Graph

    w = weights(p)
    kind = p["kind"]
    g = Graph(meta={"format": "canonical"})
    g.inputs = [g.value(n, w[n].shape, FLOAT) for n in input_names(p)]
    x = g.inputs[0]
    act = {"activation": None, "activation_params": {}}
    if kind in ("conv", "conv1d"):
        pad = _conv_pads(p)[0]
        one = kind == "conv1d"
        params = {"stride": [1 if one else p["stride"], p["stride"]], "pads": [0 if one else pad, pad] * 2,
                  "dilation": [1 if one else p["dilation"], p["dilation"]], "groups": p["groups"], **act}
        wt = w["w"][:, :, None, :] if one else w["w"]
        if one:
            x = g.add_node("Unsqueeze", [x], params={"axes": [2]}).outputs[0]
        y = g.add_node("Conv", [x], params=params, attrs={"weight": wt, "bias": w["b"]}).outputs[0]
        if one:
            y = g.add_node("Squeeze", [y], params={"axes": [2]}).outputs[0]
    elif kind == "tconv":
        params = {"stride": [p["stride"]] * 2, "pads": [p["pad"]] * 4, "output_padding": [p["output_padding"]] * 2,
                  "dilation": [1, 1], "groups": p["groups"], **act}
        y = g.add_node("ConvTranspose", [x], params=params, attrs={"weight": w["w"], "bias": w["b"]}).outputs[0]
    elif kind == "pool":
        mode = p["mode"]
        if mode.startswith("global"):
            y = g.add_node("GlobalAvgPool" if mode == "globalavg" else "GlobalMaxPool", [x]).outputs[0]
        else:
            params = {"kernel": [p["k"]] * 2, "stride": [p["stride"]] * 2, "pads": [p["pad"]] * 4,
                      "ceil_mode": False}
            if mode == "avg":
                params["count_include_pad"] = True
            y = g.add_node("MaxPool" if mode == "max" else "AvgPool", [x], params=params).outputs[0]
    elif kind == "resize":
        params = {"mode": p["mode"], "scale": [float(p["scale"])] * 2, "align_corners": False}
        y = g.add_node("Resize", [x], params=params).outputs[0]
    elif kind == "softmax":
        y = g.add_node("Softmax", [x], params={"axis": -1}).outputs[0]
    else:
        q, k, v = g.inputs
        kt = g.add_node("Transpose", [k], params={"perm": [0, 1, 3, 2]}).outputs[0]
        s = g.add_node("MatMul", [q, kt]).outputs[0]
        s = g.add_node("Mul", [s, g.const(np.array(p["dim"] ** -0.5, FLOAT))]).outputs[0]
        if "mask" in w:
            s = g.add_node("Add", [s, g.const(w["mask"])]).outputs[0]
        pr = g.add_node("Softmax", [s], params={"axis": -1}).outputs[0]
        y = g.add_node("MatMul", [pr, v]).outputs[0]
    g.outputs = [y]
    return g
