"""The Writer: blob and layer names, the shapes the file will record, the layers and resources rules emit, and the
text of the `.tnnproto` and bytes of the `.tnnmodel` they make (write.py drives it node by node).

Both format versions: v2 writes rank and data type on the input line, dims in every buffer and a constant
map; v1 has neither, so constants that cannot live inside a layer's own resource are refused there. With
`fp16` the layer weights TNN's converter would store as half (conv, deconv, BN, inner product, constant map)
are rounded to IEEE half; the reader widens them back exactly. Ops TNN cannot express raise
UnsupportedOpError naming the node.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from engine.errors import EngineError, UnsupportedOpError
from engine.formats.tnn.constants import DTYPE_CODES, MAGIC_V1, MAGIC_V2, layer_enum
from engine.formats.tnn.serializer import Serializer
from engine.ir import Graph, Node, Value
from engine.ops.registry import TensorInfo
from engine.passes.infer_shapes import infer_infos

_BAD = re.compile(r'[\s,":]')
# resource items: ("name",) (the layer's own name again) | ("int", i) | ("raw", array, may_be_half)
Item = tuple


class Writer:
    def __init__(self, graph: Graph, version: int, fp16: bool, input_shapes: dict | None = None):
        if version not in (1, 2):
            raise EngineError(f"TNN format version must be 1 or 2, got {version}")
        self.graph, self.version, self.fp16 = graph, version, fp16
        self.lines: list[str] = []
        self.resources: list[tuple[str, str, list[Item]]] = []
        self.consts: dict[str, np.ndarray] = {}
        self.blob_scales: dict[str, np.ndarray] = {}  # int8 blobs: their `<blob>_scale_data_` resources
        self._names: dict[int, str] = {}
        self._used: set[str] = set()
        self._layer_names: set[str] = set()
        self._blobs: list[str] = []
        self.node: Node | None = None
        self.infos = _infer(graph, input_shapes or {})
        for v in [*graph.inputs, *graph.outputs]:  # the model's own names win any clash
            if not v.is_const:
                self.name(v)

    # -- names and shapes ---------------------------------------------------------------------------------------
    def _unique(self, base: str, used: set[str] | None = None) -> str:
        """A name with TNN's forbidden characters replaced, unique among blob (or layer) names."""
        used = self._used if used is None else used
        name = _BAD.sub("_", base) or "blob"
        candidate, k = name, 1
        while candidate in used:
            candidate, k = f"{name}_{k}", k + 1
        used.add(candidate)
        return candidate

    def name(self, v: Value) -> str:
        if id(v) not in self._names:
            if v.is_const:
                return self.const_blob(v)
            self._names[id(v)] = self._unique(v.name)
            self._blobs.append(self._names[id(v)])
        return self._names[id(v)]

    def alias(self, v: Value, same_as: Value) -> None:
        """`v` is the same blob as `same_as` (identities write no layer)."""
        self._names[id(v)] = self.name(same_as)

    def tmp(self, suffix: str = "t") -> str:
        name = self._unique(f"{self.node.name if self.node else 'x'}/{suffix}")
        self._blobs.append(name)
        return name

    def shape(self, v: Value) -> tuple[int, ...]:
        if v.is_const:
            return tuple(v.const.shape)
        info = self.infos.get(v)
        if info is None:
            self.unsupported("without a known input shape")
        return tuple(info.shape)

    def const_of(self, v: Value) -> np.ndarray | None:
        if v.is_const:
            return np.asarray(v.const)
        info = self.infos.get(v)
        return None if info is None or info.value is None else np.asarray(info.value)

    def const_blob(self, v: Value) -> str:
        """A constant operand as an entry of the constant map (v2 only)."""
        if self.version == 1:
            self.unsupported(f"with constant input {v.name!r} (v1 files have no constant map)")
        if id(v) not in self._names:
            name = self._unique(v.name)
            self._names[id(v)] = name
            self.consts[name] = np.asarray(v.const)
        return self._names[id(v)]

    def unsupported(self, what: str = ""):
        node = self.node
        op = node.op_type if node else "?"
        message = f"{op} {what}".strip() + ("" if "file" in what else " in a TNN file")
        raise UnsupportedOpError(message, node.name if node else "", node.where() if node else "")

    # -- emitting ------------------------------------------------------------------------------------------------
    def layer(self, ltype: str, inputs: list[str], outputs: list[str], params: list[Any] = (),
              resource: list[Item] | None = None, name: str | None = None) -> str:
        lname = self._unique(name or (self.node.name if self.node else ltype), self._layer_names)
        tokens = [ltype, lname, str(len(inputs)), str(len(outputs)), *inputs, *outputs, *(_fmt(p) for p in params)]
        self.lines.append(" ".join(tokens))
        if resource is not None:
            self.resources.append((ltype, lname, resource))
        return lname

    def raw(self, arr: np.ndarray, may_be_half: bool = True) -> Item:
        return ("raw", np.asarray(arr), may_be_half)

    def new_const(self, data: np.ndarray, suffix: str) -> str:
        """A constant-map entry made up by the writer (v2 only), e.g. LayerNorm's default gamma."""
        if self.version == 1:
            self.unsupported("(needs a constant map, which v1 files lack)")
        name = self._unique(f"{self.node.name}/{suffix}")
        self.consts[name] = np.asarray(data)
        return name

    # -- output --------------------------------------------------------------------------------------------------
    def proto_text(self) -> str:
        magic = MAGIC_V2 if self.version == 2 else MAGIC_V1
        ins = " : ".join(self._input_spec(v) for v in self.graph.inputs)
        outs = " ".join(self.name(v) for v in self.graph.outputs)
        blobs = " ".join(sorted(self._blobs))
        records = [f"1 {len(self._blobs)} 1 {magic}", ins, f" {blobs}", outs, f" {len(self.lines)}", *self.lines]
        return "".join(f'"{r} ,"\n' for r in records)

    def _input_spec(self, v: Value) -> str:
        dims = list(self.shape(v))
        if self.version == 1:
            return " ".join([self.name(v), *map(str, dims)])
        code = DTYPE_CODES.get(np.dtype(v.dtype), 0)
        return " ".join([self.name(v), str(len(dims)), *map(str, dims), str(code)])

    def model_bytes(self) -> bytes:
        s = Serializer(self.version)
        s.u32(s.magic)
        s.i32(len(self.resources))
        for ltype, lname, items in self.resources:
            s.i32(layer_enum(ltype))
            s.string(ltype)
            s.string(lname)
            for item in items:
                self._put(s, ("str", lname) if item[0] == "name" else item)
        if self.consts:
            s.u32(s.magic)
            s.i32(len(self.consts))
            for name, data in self.consts.items():
                s.string(name)
                self._put(s, self.raw(data))
        return s.getvalue()

    def _put(self, s: Serializer, item: Item) -> None:
        kind = item[0]
        if kind == "str":
            s.string(item[1])
        elif kind == "int":
            s.i32(int(item[1]))
        else:
            arr = item[1]
            if arr.dtype == np.int64:  # TNN stores integer constants as int32
                arr = arr.astype(np.int32)
            elif arr.dtype.kind == "f" and arr.dtype != np.float32:
                arr = arr.astype(np.float32)
            s.raw(arr, fp16=self.fp16 and item[2])


def _fmt(p: Any) -> str:
    if isinstance(p, bool):
        return str(int(p))
    if isinstance(p, float | np.floating):
        return repr(float(p)) if np.isfinite(p) else ("1.79769e+308" if p > 0 else "-1.79769e+308")
    return str(p)


def _infer(graph: Graph, input_shapes: dict) -> dict[Value, TensorInfo]:
    """Shapes at the input shapes the file will record (TNN files fix every input dim)."""
    inputs = {}
    for v in graph.inputs:
        shape = input_shapes.get(v.name, v.shape)
        if shape is None or v.dtype is None or any(d is None or d < 0 for d in shape):
            raise EngineError(f"{graph.path}: input {v.name!r} has shape {v.shape}; a TNN file records fixed "
                              f"dims, pass input_shapes={{{v.name!r}: (...)}}")
        inputs[v] = TensorInfo(tuple(int(d) for d in shape), np.dtype(v.dtype))
    return infer_infos(graph, inputs)


def io_names(w: Writer, node: Node) -> tuple[str, str]:
    return w.name(node.inputs[0]), w.name(node.outputs[0])


def single_layer(w: Writer, node: Node, ltype: str, params: list | None = None, resource: list | None = None) -> None:
    """A single-input, single-output layer."""
    x, y = io_names(w, node)
    w.layer(ltype, [x], [y], params or [], resource)
