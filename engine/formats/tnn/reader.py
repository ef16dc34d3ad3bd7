"""TNN models (`x.tnnproto` + `x.tnnmodel`) into the IR, layer types kept verbatim (`tnn:Convolution`).

Each node keeps the layer's positional parameter tokens in `params["args"]` and its resource buffers in
`attrs`. Ints of the resource (such as `has_bias`) go to `params["resource"]`, the stored TNN data type codes
and dims (None for v1 buffers) to `params["resource_types"]` and `params["resource_dims"]`. Constant-map
entries become const values; a DynamicRangeQuantized* layer also gets the stored scale of each int8 constant
operand k as `attrs["input{k}_scale"]`. Blob scales of quantized models are kept in `graph.meta["tnn_blob_scales"]`
for the lowering (lowering/ beside this file), which turns all of this into canonical ops.
"""

from __future__ import annotations

from pathlib import Path

from engine.errors import ModelFormatError
from engine.formats.tnn.constants import INPUT_DTYPES
from engine.formats.tnn.tnnmodel import RawBuffer, TnnModelData, TnnResource, read_model
from engine.formats.tnn.tnnproto import TnnLayer, TnnProto, parse_proto
from engine.ir import Graph, Value

DYNAMIC_RANGE_PREFIX = "DynamicRangeQuantized"
DYNAMIC_RANGE_SCALE_SUFFIX = "_dynamic_range_quant_scale"


def weights_path(proto_path: str | Path) -> Path:
    p = Path(proto_path)
    return p.with_name(p.name[: -len(".tnnproto")] + ".tnnmodel") if p.name.endswith(".tnnproto") \
        else p.with_suffix(".tnnmodel")


def load_graph(path: str | Path, *, weights: bool = True) -> Graph:
    """The graph of a `.tnnproto`, with the weights of the `.tnnmodel` beside it.

    `weights=False` reads the proto alone (graph structure only): inputs that name constant-map entries
    become placeholder values without data.
    """
    proto = parse_proto(path)
    model = None
    if weights:
        wpath = weights_path(path)
        if not wpath.exists():
            raise ModelFormatError(str(wpath), f"weights file missing (expected beside {Path(path).name})")
        model = read_model(wpath)
    return build_graph(proto, model)


def build_graph(proto: TnnProto, model: TnnModelData | None) -> Graph:
    g = Graph(path=proto.path, meta={"format": "tnn", "version": proto.version, "layers": len(proto.layers)})
    if model is not None:
        g.meta["weights"] = model.path
        g.meta["weights_version"] = model.version
    blobs: dict[str, Value] = {}
    for spec in proto.inputs:
        v = g.value(spec.name, spec.shape, INPUT_DTYPES[spec.dtype_code])
        g.inputs.append(v)
        blobs[spec.name] = v
    consts = {} if model is None else model.consts
    for layer in proto.layers:
        _add_layer(g, proto, layer, blobs, consts, model)
    for name in proto.outputs:
        if name not in blobs:
            raise ModelFormatError(proto.path, f"output {name!r} is not produced by any layer", line=proto.output_line)
        g.outputs.append(blobs[name])
    if model is not None:
        _check_resources(proto, model, blobs)
        g.meta["tnn_blob_scales"] = {b: _fields(r)[1] for b, r in model.blob_scales.items()}
    return g


def _add_layer(g: Graph, proto: TnnProto, layer: TnnLayer, blobs: dict[str, Value],
               consts: dict[str, RawBuffer], model: TnnModelData | None) -> None:
    ins = []
    for name in layer.inputs:
        if name not in blobs:
            if name in consts:
                blobs[name] = g.value(name, const=consts[name].data)
            elif model is None:
                blobs[name] = g.value(name)  # a constant-map entry we have no weights for
            else:
                raise ModelFormatError(proto.path, f"layer {layer.name!r}: input {name!r} is neither a graph input, "
                                                   "an earlier layer's output nor a stored constant", line=layer.line)
        ins.append(blobs[name])
    outs = [g.value(name) for name in layer.outputs]
    params: dict = {"args": list(layer.params)}
    attrs: dict = {}
    res = None if model is None else model.resources.get(layer.name)
    if res is not None:
        params["resource"], attrs = _fields(res)
        params["resource_types"] = {k: f.code for k, f in res.fields.items() if isinstance(f, RawBuffer)}
        params["resource_dims"] = {k: f.dims for k, f in res.fields.items() if isinstance(f, RawBuffer)}
        params["resource_type"] = res.type
    if layer.type.startswith(DYNAMIC_RANGE_PREFIX):
        # TNN keeps the scale of an int8 constant operand in the constant map as `<name>_dynamic_range_quant_scale`
        for k, name in enumerate(layer.inputs):
            scale = consts.get(name + DYNAMIC_RANGE_SCALE_SUFFIX)
            if scale is not None:
                attrs[f"input{k}_scale"] = scale.data
    g.add_node(f"tnn:{layer.type}", ins, outs, name=layer.name, params=params, attrs=attrs,
               source=f"{Path(proto.path).name}:{layer.line}")
    for v in outs:
        blobs[v.name] = v


def _fields(res: TnnResource) -> tuple[dict, dict]:
    """(non-array fields, array fields) of a resource."""
    ints = {k: f for k, f in res.fields.items() if not isinstance(f, RawBuffer)}
    arrays = {k: f.data for k, f in res.fields.items() if isinstance(f, RawBuffer)}
    return ints, arrays


def _check_resources(proto: TnnProto, model: TnnModelData, blobs: dict[str, Value]) -> None:
    layers = {layer.name for layer in proto.layers}
    for name, res in model.resources.items():
        if name not in layers:
            raise ModelFormatError(model.path, f"resource for layer {name!r}, which the .tnnproto does not have",
                                   offset=res.offset)
    for blob, res in model.blob_scales.items():
        if blob not in blobs:
            raise ModelFormatError(model.path, f"blob scale for {blob!r}, which no layer produces", offset=res.offset)

