"""Writes docs/vocabulary/pnnx_ops.txt and docs/vocabulary/tnn_layers.txt from local copies of pnnx's and TNN's
sources, so that tools/make_operators_doc.py needs no network.

    python tools/extract_vocabularies.py --ncnn <ncnn checkout> --ncnn-rev <commit> \
        --tnn <TNN checkout> --tnn-rev <commit>          # either pair alone writes that file only

pnnx (Tencent/ncnn, tools/pnnx/src): the op types its passes write, read from `type_str()` (pass_level1 nn.*,
pass_level2 F.* / Tensor.* / torch.*), from the replacement graphs of its rewrite passes, and from the types passes
assign (`op->type = "..."`, `new_operator("...")`); the pnnx.Expression functions are the ones its Python writer
expands (ir.cpp, expand_expression). Types that only exist between two passes are left out (INTERMEDIATE).

TNN (Tencent/TNN): every type string of its layer type map (source/tnn/core/layer_type.cc), each with the LayerType
it maps to and the registries that implement that LayerType (layer, x86, arm, cpu), and `onnx2tnn` on the ones its
ONNX converter writes (tools/onnx2tnn/src/core/layer: the TNN types of its REGISTER_OP_CONVERTER_NoParamNoWeight /
REGISTER_OP_CONVERTER_REDUCE lines and the strings its TNNOpType functions return). A type the converter writes
that the layer type map lacks (TNN itself cannot load it) is listed too, with LayerType `-`.
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent / "docs" / "vocabulary"

# pnnx types that a later pass always rewrites: never in a written .pnnx.param.
INTERMEDIATE = {
    "F.dropoutnd": "renamed to F.dropout2d / F.dropout3d by pass_level3/rename_F_dropoutnd.cpp",
    "aten::add": "in level-2 replacement graphs, fused into pnnx.Expression by pass_level3/fuse_expression.cpp",
    "aten::mul": "as aten::add", "aten::log": "as aten::add", "aten::square": "as aten::add",
    "aten::copy": "pass_level2/functionize.cpp, then Tensor.copy (pass_level2/Tensor_copy.cpp)",
    "aten::copy_": "as aten::copy",
    "prim::Constant": "folded into parameters and expressions",
}
# prim:: structure pnnx's Python writer handles (ir.cpp), so they can stay in a written graph.
PRIM_KEPT = ["prim::ListConstruct", "prim::ListUnpack", "prim::TupleConstruct", "prim::TupleUnpack"]
# pnnx writes any aten:: op that no level-2 pass rewrites as is (pass_level1.cpp keeps the node's kind); the set is
# open. These are the ones met in real exports.
ATEN_KEPT = {
    "aten::_transformer_encoder_layer_fwd": "torch's fused nn.TransformerEncoderLayer (eval fast path)",
    "aten::addcmul": "ConvNeXt-V2's GRN (issue 18)",
    "aten::meshgrid": "the anchor grids of ultralytics' YOLO heads in a dynamic export (issue 18)",
    "aten::new_full": "the stride tensors of ultralytics' YOLO heads in a dynamic export (issue 18)",
}
PNNX_GROUPS = [
    ("nn", "nn modules: pass_level1/nn_*.cpp (a traced module kept whole), pass_level5 fusions"),
    ("F", "torch.nn.functional: pass_level2/F_*.cpp"),
    ("Tensor", "Tensor methods: pass_level2/Tensor_*.cpp, pass_level5/fuse_slice_copy.cpp"),
    ("torch", "torch functions: pass_level2/torch_*.cpp, pass_level3 unpacking"),
    ("other", "torchvision / torchaudio: pass_level1/torchvision_*.cpp, pass_level2/torchaudio_*.cpp"),
    ("pnnx", "pnnx operators: graph inputs, outputs, constants, expressions, slice indexes"),
    ("kept", "prim:: and aten:: operators pnnx writes as is (ir.cpp writes prim:: lists and tuples; aten:: ops "
             "without a level-2 pass stay; open set, the ones met in exports)"),
    ("expr", "pnnx.Expression functions: ir.cpp expand_expression, pass_level3/fuse_expression.cpp"),
]


def _pnnx_types(src: Path) -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    files = sorted(src.glob("pass_level[1-5]/*.cpp")) + sorted(src.glob("pass_level[1-5].cpp"))
    for f in files:
        rel, text = str(f.relative_to(src)), f.read_text(errors="replace")
        for m in re.finditer(r'(?<!match_)type_str\(\)\s*const\s*\{\s*return\s*"([^"]+)"', text):
            found[m.group(1)].add(rel)
        for m in re.finditer(r"replace_pattern_graph\(\)\s*const\s*\{(.*?)\n    \}", text, re.S):
            for pattern in re.findall(r'R"PNNXIR\((.*?)\)PNNXIR"', m.group(1), re.S):
                for line in pattern.splitlines()[2:]:
                    if line.split():
                        found[line.split()[0]].add(rel)
        for m in re.finditer(r'(?:->type|\.type)\s*=\s*"([^"]+)"|new_operator(?:_before|_after)?\(\s*"([^"]+)"', text):
            found[m.group(1) or m.group(2)].add(rel)
    return found


def _expression_functions(src: Path) -> list[str]:
    text = (src / "ir.cpp").read_text(errors="replace")
    body = text[text.index("static std::string expand_expression"):]
    body = body[: body.index("\n}\n")]
    return sorted(set(re.findall(r't == "([a-z_.0-9]+)"', body)))


def _group(name: str) -> str:
    if name.startswith(("prim::", "aten::")):
        return "kept"
    head = name.split(".")[0]
    return head if head in ("nn", "F", "Tensor", "torch", "pnnx") else "other"


def _sources(files: set[str]) -> str:
    files = sorted(files)
    return " ".join(files[:3]) + (f" (+{len(files) - 3})" if len(files) > 3 else "")


def write_pnnx(src: Path, rev: str) -> Path:
    found = _pnnx_types(src)
    for name in INTERMEDIATE:
        found.pop(name, None)
    for name in PRIM_KEPT:
        found[name].add("ir.cpp")
    for name in ATEN_KEPT:
        found[name].add("pass_level1.cpp")
    lines = [
        "# Every operator type pnnx can write into a .pnnx.param, and the functions of its pnnx.Expression.",
        f"# Source: Tencent/ncnn, commit {rev}, tools/pnnx/src/ (read by tools/extract_vocabularies.py).",
        "# One name per line, then the pnnx source files it comes from; `## group: note` starts a group.",
        "# Left out, because a later pnnx pass always rewrites them: " + ", ".join(sorted(INTERMEDIATE)) + ".",
        "# Also left out: pnnx.custom_op.<ns>.<name> (pass_level4/fuse_custom_op.cpp), a user's own TorchScript op.",
    ]
    by_group: dict[str, list[str]] = defaultdict(list)
    for name in sorted(found, key=str.lower):
        by_group[_group(name)].append(f"{name}  {_sources(found[name])}")
    by_group["expr"] = [f"pnnx.Expression:{fn}  ir.cpp" for fn in _expression_functions(src)]
    for key, note in PNNX_GROUPS:
        lines += ["", f"## {key}: {note}", *by_group[key]]
    for name, why in ATEN_KEPT.items():
        lines[lines.index(next(x for x in lines if x.startswith(name + "  ")))] += f"  # {why}"
    out = DOCS / "pnnx_ops.txt"
    out.write_text("\n".join(lines) + "\n")
    return out


# TNN ---------------------------------------------------------------------------------------------------------------

_REGISTRATION = re.compile(
    r"(?:REGISTER_\w*ACC|REGISTER_(?:LAYER|ELEMENTWISE_LAYER|MULTIDIR_BROADCAST_LAYER|REDUCE_LAYER))"
    r"\(\s*\w+\s*,\s*(LAYER_[A-Z0-9_]+)|\bg_\w+\(\s*(LAYER_[A-Z0-9_]+)\s*\)")
TNN_REGISTRIES = {  # tag: folder whose registrations (REGISTER_*, *TypeLayerAccRegister g_x(LAYER_...)) count
    "layer": "source/tnn/layer",
    "x86": "source/tnn/device/x86",
    "arm": "source/tnn/device/arm",
    "cpu": "source/tnn/device/cpu",
}
SSD = {"PriorBox", "DetectionOutput", "DetectionOutputREF", "DetectionPostProcess"}
TNN_GROUPS = [
    ("ssd", "SSD layers (Caffe SSD's PriorBox and DetectionOutput, TFLite's DetectionPostProcess)"),
    ("quantized", "quantized layers (int8 and dynamic-range type strings)"),
    ("x86", "layers with an x86 acc"),
    ("cpu", "no x86 acc: the x86 device runs them with TNN's naive CPU acc (X86CpuAdapterAcc)"),
    ("arm", "ARM acc only"),
    ("none", "no CPU implementation (layer only, or not even a layer: legacy or other devices' types)"),
]


def _tnn_registered(root: Path, folder: str) -> set[str]:
    out = set()
    for f in sorted((root / folder).rglob("*")):
        if f.suffix not in (".cc", ".h"):
            continue
        for line in f.read_text(errors="replace").splitlines():
            if not line.lstrip().startswith("//"):
                out.update(a or b for a, b in _REGISTRATION.findall(line))
    return out


ONNX2TNN_LAYERS = "tools/onnx2tnn/src/core/layer"
_CONVERTER_MACRO = re.compile(r"REGISTER_OP_CONVERTER_(?:NoParamNoWeight|REDUCE)\(\s*(\w+)\s*,\s*\w+\s*\)")


def _onnx2tnn_types(root: Path) -> set[str]:
    """The TNN type strings onnx2tnn writes: its converters' registrations, and the literals its TNNOpType
    functions return or assign (`return kernel_shape.size() == 3 ? "Deconvolution3D" : "Deconvolution";`)."""
    out: set[str] = set()
    for f in sorted((root / ONNX2TNN_LAYERS).glob("*.cc")):
        text = f.read_text(errors="replace")
        out.update(_CONVERTER_MACRO.findall(text))
        for m in re.finditer(r"TNNOpType\([^)]*\)\s*\{", text):
            end, depth = m.end(), 1
            while depth and end < len(text):
                depth += {"{": 1, "}": -1}.get(text[end], 0)
                end += 1
            for line in text[m.end():end].splitlines():
                if "return" in line or re.search(r'\w\s*=\s*"', line):
                    out.update(re.findall(r'"([A-Za-z][A-Za-z0-9]*)"', line))
    return out


def _tnn_group(name: str, tags: list[str]) -> str:
    if name in SSD:
        return "ssd"
    if re.search(r"Quantiz|^Q[A-Z]", name):
        return "quantized"
    return next((t for t in ("x86", "cpu", "arm") if t in tags), "none")


def write_tnn(root: Path, rev: str) -> Path:
    text = (root / "source/tnn/core/layer_type.cc").read_text()
    table = re.search(r"global_layer_type_map = \{(.*?)\n\};", text, re.S).group(1)
    pairs = [m.groups() for line in table.splitlines() if not line.strip().startswith("//")
             for m in [re.match(r'\s*\{"([^"]+)",\s*(LAYER_[A-Z0-9_]+)\}', line)] if m]
    registered = {tag: _tnn_registered(root, folder) for tag, folder in TNN_REGISTRIES.items()}
    emitted = _onnx2tnn_types(root)
    pairs += [(name, "-") for name in sorted(emitted - {p[0] for p in pairs})]
    lines = [
        "# Every layer type string TNN reads from a .tnnproto: its layer type map, with the LayerType each maps to",
        "# and the registries implementing that LayerType: layer = source/tnn/layer (shape inference; TNN cannot",
        "# load a layer without it), x86 = source/tnn/device/x86/acc, arm = source/tnn/device/arm/acc, cpu =",
        "# source/tnn/device/cpu/acc (TNN's naive device, which x86_device.cc falls back to through X86CpuAdapterAcc).",
        f"# Source: Tencent/TNN, commit {rev}, source/tnn/core/layer_type.cc (global_layer_type_map) and the",
        "# REGISTER_* / *TypeLayerAccRegister lines of those folders (read by tools/extract_vocabularies.py).",
        f"# onnx2tnn = written by TNN's ONNX converter ({ONNX2TNN_LAYERS}); LayerType - = not in the layer type map.",
        "# One type string per line: name, LayerType, registries; `## group: note` starts a group.",
    ]
    by_group: dict[str, list[str]] = defaultdict(list)
    seen = set()
    for name, layer_type in sorted(pairs, key=lambda p: p[0].lower()):
        if name in seen:  # the map lists DequantizeNCHW4TONCHWByChannel twice; std::map keeps one
            continue
        seen.add(name)
        tags = [tag for tag in TNN_REGISTRIES if layer_type in registered[tag]]
        tags += ["onnx2tnn"] if name in emitted else []
        by_group[_tnn_group(name, tags)].append(f"{name}  {layer_type}  {' '.join(tags) or '-'}")
    for key, note in TNN_GROUPS:
        lines += ["", f"## {key}: {note}", *by_group[key]]
    out = DOCS / "tnn_layers.txt"
    out.write_text("\n".join(lines) + "\n")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ncnn", type=Path, help="a Tencent/ncnn source tree (pnnx_ops.txt is written when given)")
    ap.add_argument("--ncnn-rev", help="its commit, for the source note")
    ap.add_argument("--tnn", type=Path, help="a Tencent/TNN source tree (tnn_layers.txt is written when given)")
    ap.add_argument("--tnn-rev", help="its commit, for the source note")
    args = ap.parse_args()
    for tree, rev in ((args.ncnn, args.ncnn_rev), (args.tnn, args.tnn_rev)):
        if tree is not None and rev is None:
            ap.error(f"{tree}: give its commit too (--ncnn-rev / --tnn-rev)")
    DOCS.mkdir(parents=True, exist_ok=True)
    if args.ncnn is not None:
        print(write_pnnx(args.ncnn / "tools" / "pnnx" / "src", args.ncnn_rev))
    if args.tnn is not None:
        print(write_tnn(args.tnn, args.tnn_rev))


if __name__ == "__main__":
    main()
