"""Reader for pnnx models: `x.pnnx.param` (graph text) + `x.pnnx.bin` (stored zip of weights) -> Graph.

The grammar and what the converter really writes are in ../shared/docs/pnnx-format.md. Nodes keep the pnnx type
verbatim with a `pnnx:` prefix (`pnnx:nn.Conv2d`); lowering/ (beside this file) maps them to canonical ops.
pnnx.Input / pnnx.Output become the graph's inputs (in0, in1, ...) and outputs (out0, ...); pnnx.Attribute
becomes a const value; a prim::TupleConstruct feeding pnnx.Output is flattened.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import ModelFormatError
from engine.formats.model_files import empty_array, read_file_bytes
from engine.formats.pnnx.param_values import annotation_dtype, clip, parse_annotation, parse_param, size
from engine.formats.pnnx.zip_archive import StoredZip
from engine.ir import Graph, Value

MAGIC = "7767517"
# Types whose `expr` param is an expression, not a list: pnnx's own reader garbles `[size(@0,2),size(@0,3)]`.
RAW_EXPR_TYPES = {"pnnx.Expression", "Tensor.index"}


def bin_path_for(param_path: str | Path) -> Path:
    """`x.pnnx.param` -> `x.pnnx.bin` (any `.param` suffix becomes `.bin`)."""
    p = Path(param_path)
    return p.with_name(p.name[: -len(".param")] + ".bin") if p.name.endswith(".param") else p.with_name(p.name + ".bin")


def load_graph(param_path: str | Path) -> Graph:
    """Parses a .pnnx.param file and the weights beside it. Malformed input raises ModelFormatError."""
    return _Reader(Path(param_path)).read()


class _Reader:
    def __init__(self, path: Path):
        self.path = path
        self.graph = Graph(path=str(path))
        self.values: dict[str, Value] = {}
        self.tuples: dict[str, list[Value]] = {}
        self.zip: StoredZip | None = None
        self.line = 0

    def fail(self, msg: str) -> ModelFormatError:
        return ModelFormatError(str(self.path), msg, line=self.line or None)

    # -- file level -------------------------------------------------------------------------------------
    def read(self) -> Graph:
        try:
            return self._read()
        finally:  # the loaded graph owns its weights: nothing stays open on the files
            if self.zip is not None:
                self.zip.close()

    def _read(self) -> Graph:
        lines = self._read_lines()
        n_ops, n_operands = self._header(lines)
        body = [(i, text) for i, text in enumerate(lines[2:], start=3) if text.strip()]
        if len(body) != n_ops:
            self.line = body[n_ops][0] if len(body) > n_ops else len(lines)
            raise self.fail(f"header announces {n_ops} operators, file has {len(body)} operator lines")
        for self.line, text in body:
            try:
                self._operator(text)
            except ValueError as e:  # grammar helpers report with ValueError; add file and line
                raise self.fail(str(e)) from None
        if not self.graph.outputs:
            self.line = len(lines)  # the end of the file, where the missing operator would be
            raise self.fail("the graph has no outputs (no pnnx.Output operator)")
        self.line = 0
        self._name_outputs()
        self.graph.meta = {"format": "pnnx", "operators": n_ops, "operands": n_operands,
                           "weights": bin_path_for(self.path).name if self.zip else None}
        return self.graph

    def _read_lines(self) -> list[str]:
        raw = read_file_bytes(self.path, "cannot read model file")
        try:
            return raw.decode("utf-8").splitlines()
        except UnicodeDecodeError as e:
            raise ModelFormatError(str(self.path), "not a text file (invalid UTF-8)", offset=e.start) from None

    def _header(self, lines: list[str]) -> tuple[int, int]:
        # "7767517" then "<operator_count> <operand_count>"
        self.line = 1
        if not lines or lines[0].strip() != MAGIC:
            raise self.fail(f"bad magic {lines[0].strip()[:20]!r}, expected {MAGIC}" if lines else "empty file")
        self.line = 2
        counts = lines[1].split() if len(lines) > 1 else []
        if len(counts) != 2 or not all(c.isdigit() and c.isascii() for c in counts):
            raise self.fail("second line must be '<operator_count> <operand_count>'")
        try:
            return size(counts[0], "operator count"), size(counts[1], "operand count")
        except ValueError as e:
            raise self.fail(str(e)) from None

    # -- one operator line --------------------------------------------------------------------------------
    def _operator(self, text: str) -> None:
        # "nn.Conv2d convbn2d_0 1 1 0 1 bias=True ... @weight=(16,3,7,7)f32 $input=0 #0=(1,3,64,64)f32 #1=..."
        tok = text.split()
        if len(tok) < 4 or not all(t.isdigit() and t.isascii() for t in tok[2:4]):
            raise self.fail("operator line must start with '<type> <name> <n_in> <n_out>'")
        op_type, name, n_in, n_out = tok[0], tok[1], size(tok[2], "input count"), size(tok[3], "output count")
        if len(tok) < 4 + n_in + n_out:
            raise self.fail(f"{name}: expects {n_in} inputs and {n_out} outputs, line has {len(tok) - 4} fields")
        in_names, out_names = tok[4 : 4 + n_in], tok[4 + n_in : 4 + n_in + n_out]
        params, attrs, args, notes = self._items(op_type, tok[4 + n_in + n_out :])
        inputs = [self._use(n) for n in in_names]
        outputs = [self._produce(n) for n in out_names]
        for operand, (shape, code) in notes.items():
            self._annotate(operand, in_names, out_names, shape, code)
        self._build(op_type, name, in_names, inputs, outputs, params, attrs, args)

    def _items(self, op_type: str, items: list[str]):
        params: dict[str, Any] = {}
        attrs: dict[str, tuple[tuple[int, ...], str]] = {}
        args: list[tuple[str, str]] = []
        notes: dict[str, tuple[tuple[int, ...], str]] = {}
        for item in items:
            key, eq, value = item.partition("=")
            if not eq or not key or not value or (key[0] in "@$#" and len(key) == 1):
                raise self.fail(f"malformed item {clip(item)}, expected key=value")
            if key[0] == "@":
                attrs[key[1:]] = parse_annotation(value, allow_unknown=False)
            elif key[0] == "$":
                args.append((key[1:], value))  # (argument name, operand)
            elif key[0] == "#":
                notes[key[1:]] = parse_annotation(value)
            elif key == "expr" and op_type in RAW_EXPR_TYPES:
                params[key] = value
            else:
                params[key] = parse_param(value)
        return params, attrs, args, notes

    def _use(self, operand: str) -> Value | list[Value]:
        if operand in self.values:
            return self.values[operand]
        if operand in self.tuples:
            return self.tuples[operand]
        raise self.fail(f"operand {operand!r} is used before any operator produces it")

    def _produce(self, operand: str) -> Value:
        if operand in self.values or operand in self.tuples:
            raise self.fail(f"operand {operand!r} is produced twice")
        v = self.graph.value(operand)
        self.values[operand] = v
        return v

    def _annotate(self, operand: str, ins: list[str], outs: list[str], shape: tuple[int, ...], code: str) -> None:
        if operand not in ins and operand not in outs:
            raise self.fail(f"annotation #{operand} names an operand this operator does not use")
        v = self.values.get(operand)
        if v is None or v.is_const:  # tuples carry no shape; constants know theirs
            return
        v.shape, v.dtype = shape, annotation_dtype(code)

    def _build(self, op_type, name, in_names, inputs, outputs, params, attrs, args) -> None:
        if op_type == "pnnx.Input":
            self._arity(name, inputs, outputs, 0, 1)
            outputs[0].name = f"in{len(self.graph.inputs)}"
            self.graph.inputs.append(outputs[0])
        elif op_type == "pnnx.Output":
            self._arity(name, [], outputs, 0, 0)
            for v in inputs:
                self.graph.outputs.extend(v if isinstance(v, list) else [v])
        elif op_type == "pnnx.Attribute":
            self._arity(name, inputs, outputs, 0, 1)
            if "data" not in attrs:
                raise self.fail(f"pnnx.Attribute {name!r} has no @data item")
            data = self._weight(name, "data", *attrs["data"])
            outputs[0].const, outputs[0].shape, outputs[0].dtype = data, tuple(data.shape), data.dtype
        elif op_type == "prim::TupleConstruct":
            self._arity(name, [], outputs, 0, 1)
            del self.values[outputs[0].name]
            self.tuples[outputs[0].name] = [x for v in inputs for x in (v if isinstance(v, list) else [v])]
        else:
            self._node(op_type, name, in_names, inputs, outputs, params, attrs, args)

    def _node(self, op_type, name, in_names, inputs, outputs, params, attrs, args) -> None:
        where = f"{self.path.name}:{self.line}"
        if any(isinstance(v, list) for v in inputs):
            raise self.fail(f"{name}: a prim::TupleConstruct result can only feed pnnx.Output")
        # Each `$arg=operand` tags the first untagged input reading that operand (one may feed an op twice).
        tagged: list[str | None] = [None] * len(in_names)
        for arg, operand in args:
            free = [i for i, n in enumerate(in_names) if n == operand and tagged[i] is None]
            if not free:
                raise self.fail(f"${arg}={operand}: operand {operand!r} is not an (untagged) input of {name!r}")
            tagged[free[0]] = arg
        params["$inputs"] = tagged
        weights = {a: self._weight(name, a, *spec) for a, spec in attrs.items()}
        self.graph.add_node(f"pnnx:{op_type}", inputs, outputs, name=name, params=params, attrs=weights,
                            source=where)

    def _arity(self, name: str, inputs: list, outputs: list, n_in: int, n_out: int) -> None:
        if len(inputs) != n_in or len(outputs) != n_out:
            raise self.fail(f"{name}: expects {n_in} inputs and {n_out} outputs, has {len(inputs)} and "
                            f"{len(outputs)}")

    # -- weights ------------------------------------------------------------------------------------------
    def _weight(self, op_name: str, attr: str, shape: tuple[int, ...], code: str) -> np.ndarray:
        dtype = annotation_dtype(code)
        if code == "null":
            return empty_array(np.dtype(np.float32))
        if dtype is None:
            raise self.fail(f"attribute @{attr} of {op_name!r} has dtype {code}, which is not supported")
        entry = f"{op_name}.{attr}"
        zf = self._open_zip(entry)
        if not shape and entry not in zf:
            return empty_array(dtype)  # pnnx writes no data for an attribute with an empty shape
        try:
            return zf.array(entry, dtype, shape, bfloat16=code == "bf16")
        except ModelFormatError as e:
            raise ModelFormatError(e.path, f"{e.detail} (attribute of {op_name!r} at {self.path.name}:"
                                   f"{self.line})", offset=e.offset) from None

    def _open_zip(self, entry: str) -> StoredZip:
        if self.zip is None:
            bin_path = bin_path_for(self.path)
            if not bin_path.exists():
                raise ModelFormatError(str(bin_path), f"weights file missing (needed for {entry!r} at "
                                       f"{self.path.name}:{self.line})")
            self.zip = StoredZip(bin_path)
        return self.zip

    # -- outputs ------------------------------------------------------------------------------------------
    def _name_outputs(self) -> None:
        seen: set[int] = {id(v) for v in self.graph.inputs}
        for i, v in enumerate(self.graph.outputs):
            if id(v) in seen or v.is_const:
                continue  # a graph input or a repeated output keeps its first name
            v.name = f"out{i}"
            seen.add(id(v))
