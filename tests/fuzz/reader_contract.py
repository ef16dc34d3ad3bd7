"""What the model readers promise on malformed input, as one check shared by the bounded hypothesis runs in
`make test` (test_reader_fuzz.py) and the long coverage-guided run of `make fuzz` (fuzz_readers.py).

A model is given as the bytes of its graph file and of its weights file. Reading it (the format's reader from
engine/formats/registry.py) either succeeds or raises ModelFormatError naming one of the two files and a line or
byte offset (or, for a weight, the graph file's line in its message), or UnsupportedOpError naming the graph
file and line. Lowering a graph that was read may refuse it with any EngineError. Anything else — another
exception type, an allocation larger than the files can justify, a hang — breaks the contract.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from engine.errors import EngineError, ModelFormatError, UnsupportedOpError
from engine.formats.registry import FORMATS
from engine.formats.tnn.serializer import Serializer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SEED_LIMIT = 48 * 1024  # weights files up to this size make seeds: small inputs keep each run fast
KINDS = ("pnnx", "tnn")


def write_model(kind: str, folder: Path, graph: bytes, weights: bytes) -> Path:
    """Writes the two files of a `kind` model into `folder`; the graph file's path."""
    fmt = FORMATS[kind]
    graph_name, weights_name = fmt.files
    (folder / graph_name).write_bytes(graph)
    (folder / weights_name).write_bytes(weights)
    return folder / graph_name


def check_model(kind: str, folder: Path, graph: bytes, weights: bytes) -> str:
    """Reads (and lowers) the model; returns "ok", "refused" or "refused by lowering", or raises AssertionError
    (a contract broken) or the unexpected exception itself."""
    fmt = FORMATS[kind]
    graph_path = write_model(kind, folder, graph, weights)
    weights_path = folder / fmt.files[1]
    try:
        g = fmt.read(graph_path)
    except ModelFormatError as e:
        assert e.path in (str(graph_path), str(weights_path)), f"error names another file: {e!r}"
        located = e.line is not None or e.offset is not None or re.search(rf"{re.escape(graph_path.name)}:\d+",
                                                                           str(e))
        assert located, f"error names no line or byte offset: {e}"
        return "refused"
    except UnsupportedOpError as e:
        assert re.search(rf"{re.escape(str(graph_path))}:\d+", str(e)), f"error names no file and line: {e}"
        return "refused"
    try:
        fmt.lower(g)
    except EngineError:
        return "refused by lowering"
    return "ok"


def _fixture_seeds(kind: str) -> list[tuple[str, bytes, bytes]]:
    graph_name, weights_name = FORMATS[kind].files
    seeds = []
    for folder in sorted(FIXTURES.glob("*/*")):
        graph, weights = folder / graph_name, folder / weights_name
        if graph.is_file() and weights.is_file() and weights.stat().st_size <= SEED_LIMIT:
            seeds.append((f"{folder.parent.name}/{folder.name}", graph.read_bytes(), weights.read_bytes()))
    return seeds


def _int8_tnn_seed() -> tuple[str, bytes, bytes]:
    """A quantized TNN model (int8 filter, int32 bias, float scales, blob scales): no committed fixture is one."""
    layers = ["QuantizedConvolution c 1 1 x y 1 3 4 3 3 1 1 1 1 1 -1 1 1 1"]
    records = ["1 0 1 4206624772", "x 4 1 3 5 5", " ", "y", f" {len(layers)}", *layers]
    proto = "".join(f'"{r} ,"\n' for r in records).encode()
    s = Serializer(2)
    s.u32(s.magic), s.i32(3)
    s.i32(1), s.string("Convolution"), s.string("c"), s.string("c"), s.i32(1)
    s.raw(np.arange(-54, 54, dtype=np.int8).reshape(4, 3, 3, 3)), s.raw(np.arange(4, dtype=np.int32))
    s.raw(np.array([0.011, 0.02, 0.005, 0.03], np.float32))
    for blob, n in (("x", 3), ("y", 4)):
        s.i32(600), s.string("BlobScale"), s.string(f"{blob}_scale_data_")
        s.raw(np.full(n, 0.05, np.float32)), s.raw(np.zeros(n, np.int32))
    return "hand-made/int8_conv", proto, s.getvalue()


def seeds(kind: str) -> list[tuple[str, bytes, bytes]]:
    """(name, graph bytes, weights bytes) of small valid models: the committed fixtures (both TNN proto
    versions, fp32 and fp16 weights) and, for TNN, an int8 model."""
    out = _fixture_seeds(kind)
    if kind == "tnn":
        out.append(_int8_tnn_seed())
    return out
