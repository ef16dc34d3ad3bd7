"""Model: a loaded, optimized graph with its input/output specs; `instance()` compiles it for a device."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.ir import Graph, Value
from engine.ir.dtypes import kserve_name
from engine.runtime.extents import dependent_outputs
from engine.runtime.instance import Instance
from engine.runtime.loading import check_supported, prepare, read_graph
from engine.runtime.options import EngineOptions


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]  # -1 marks a dynamic dimension

    @property
    def datatype(self) -> str:
        """The KServe v2 datatype name ("FP32", ...)."""
        return kserve_name(self.dtype)


def _reaches_quantize(value: Value) -> bool:
    """Whether a TnnQuantize reads `value` or anything computed from it."""
    seen, todo = set(), [value]
    while todo:
        v = todo.pop()
        for node in v.consumers:
            if node.op_type == "TnnQuantize":
                return True
            if id(node) not in seen:
                seen.add(id(node))
                todo.extend(node.outputs)
    return False


class Model:
    def __init__(self, graph: Graph, path: str | Path | None = None, options: EngineOptions | None = None):
        self.graph = graph
        self.path = str(path or graph.path)
        self.options = options  # its instances' settings unless one is given its own (None: the environment's)
        self.inputs: list[TensorSpec] = [spec_of(v) for v in graph.inputs]
        self.outputs: list[TensorSpec] = [spec_of(v) for v in graph.outputs]
        # outputs whose size depends on the input's values (NonZero...): refused at load where it cannot follow
        self.data_dependent_outputs: list[str] = dependent_outputs(graph)
        # inputs from which an int8 quantization is reached: a NaN there meets it (ops/quant.py refuse_nan), and a
        # server can refuse it per request before batching, so that it does not fail the requests batched with it
        self.quantized_inputs: list[str] = [v.name for v in graph.inputs if _reaches_quantize(v)]

    @property
    def format(self) -> str:
        return str(self.graph.meta.get("format", ""))

    def op_counts(self) -> dict[str, int]:
        return self.graph.op_counts()

    def instance(self, device: str = "cpu", max_shapes: Mapping[str, tuple[int, ...]] | None = None,
                 threads: int | None = None, options: EngineOptions | None = None) -> Instance:
        """Compiles for `device` at `max_shapes` (None: the shapes in the file) and allocates the arena once.

        `threads` sets the CPU kernel and BLAS thread count while this instance runs (default: the
        NNSERVE_NUM_THREADS setting, else the CPUs the process's affinity and cgroup quota allow, at most 8). `options`
        are the engine's settings (default: the model's, from `load`, else the environment's,
        engine/runtime/options.py).
        """
        return Instance(self.graph, device=device, max_shapes=max_shapes, threads=threads,
                        options=options if options is not None else self.options)

    def __repr__(self) -> str:
        return f"Model({self.path!r}, inputs={self.inputs}, outputs={self.outputs})"


def spec_of(v: Value) -> TensorSpec:
    shape = tuple(-1 if d is None or d < 0 else int(d) for d in (v.shape or ()))
    return TensorSpec(v.name, np.dtype(v.dtype if v.dtype is not None else np.float32), shape)


def load(path: str | Path, options: EngineOptions | None = None) -> Model:
    """Reads a .pnnx.param or .tnnproto model (weights beside it), lowers and optimizes it. `options`: the
    settings its instances take (None: the environment's, read when an instance is made); a caller that reads
    its settings once (the server) passes them here."""
    graph = read_graph(path)
    check_supported(graph)  # every unknown format op at once, before lowering stops at the first
    graph = prepare(graph)
    check_supported(graph)
    return Model(graph, path, options)
