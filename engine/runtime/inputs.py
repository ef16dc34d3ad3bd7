"""Input shapes: each input's max shape for an instance, the checks on every request's arrays, and those arrays as
the kernels read them in place."""

from __future__ import annotations

import numpy as np

from engine.errors import ArenaOverflowError, EngineError, ShapeError
from engine.ir import Graph, Value

SMALL_READ_ONLY = 16 * 1024  # bytes below which copying a read-only input is cheaper than a writeable view of it


def resolve_max_shapes(graph: Graph, max_shapes) -> dict[str, tuple[int, ...]]:
    """Each input's max shape: the given one, else the file's; a dynamic dim without a max is an error."""
    given = dict(max_shapes or {})
    names = {v.name for v in graph.inputs}
    unknown = sorted(set(given) - names)
    try:
        if unknown:
            raise EngineError(f"max_shapes names unknown inputs {unknown}; the model's inputs are {sorted(names)}")
        return {v.name: _max_shape(v, given.get(v.name)) for v in graph.inputs}
    except EngineError as e:  # named by its file: a caller with several models must tell which one refused
        if graph.path:
            e.args = (f"{graph.path}: {e}", *e.args[1:])
        raise


def _max_shape(v: Value, given) -> tuple[int, ...]:
    file_shape = v.shape
    if given is None:
        if file_shape is None or any(d is None or d < 0 for d in file_shape):
            raise EngineError(f"input {v.name!r} has dynamic shape {file_shape}; pass max_shapes="
                              f"{{{v.name!r}: (...)}} to Model.instance (or --max-shape on the command line)")
        return tuple(int(d) for d in file_shape)
    shape = tuple(int(d) for d in given)
    if file_shape is not None:
        if len(shape) != len(file_shape):
            raise ShapeError(f"max shape {shape} of input {v.name!r} has rank {len(shape)}, the model's "
                             f"{file_shape} has rank {len(file_shape)}")
        for i, (g, f) in enumerate(zip(shape, file_shape, strict=True)):
            if f is not None and f >= 0 and g != f:
                raise ShapeError(f"max shape of input {v.name!r}: dim {i} is fixed to {f} in the model, got {g}")
    if any(d <= 0 for d in shape):
        raise ShapeError(f"max shape {shape} of input {v.name!r} must be positive")
    return shape


def check_inputs(graph: Graph, max_shapes: dict[str, tuple[int, ...]], inputs) -> list[np.ndarray]:
    """The request's arrays in graph-input order, after checking names, dtypes and shapes."""
    # `in` before indexing: a mapping that fills in missing keys (a defaultdict) must not make up an input
    if len(inputs) != len(graph.inputs) or not all(v.name in inputs for v in graph.inputs):
        names = [v.name for v in graph.inputs]
        extra = sorted(set(inputs) - set(names))
        missing = [n for n in names if n not in inputs]
        raise EngineError(f"inputs do not match the model: unknown {extra}, missing {missing}; expected {names}")
    return [_check_input(v, max_shapes[v.name], inputs[v.name]) for v in graph.inputs]


def _check_input(v: Value, max_shape: tuple[int, ...], a) -> np.ndarray:
    if type(a) is np.ndarray and a.shape == max_shape and (v.dtype is None or a.dtype == v.dtype):
        return a  # the usual request of a fixed-shape model: every check below holds (max shapes are positive)
    a = np.asarray(a)
    # the byte order is host_input's to fix (newbyteorder costs a request ~0.3 us: only when the dtype differs)
    if v.dtype is not None and a.dtype != v.dtype and a.dtype.newbyteorder("=") != v.dtype:
        raise EngineError(f"input {v.name!r}: expected dtype {np.dtype(v.dtype).name}, got {a.dtype.name}")
    if a.ndim != len(max_shape):
        raise ShapeError(f"input {v.name!r}: expected rank {len(max_shape)} (max shape {max_shape}), "
                         f"got shape {a.shape}")
    for i, (d, m) in enumerate(zip(a.shape, max_shape, strict=True)):
        fixed = v.shape is not None and v.shape[i] is not None and v.shape[i] >= 0
        if fixed and d != m:
            raise ShapeError(f"input {v.name!r}: dim {i} is fixed to {m}, got {d} (shape {a.shape})")
        if d > m:
            raise ArenaOverflowError(f"input {v.name!r}: dim {i} is {d}, larger than the instance's max {m} "
                                     f"(max shape {max_shape}); create an instance with larger max_shapes")
        if d == 0:
            raise ShapeError(f"input {v.name!r}: dim {i} is empty (shape {a.shape})")
    return a


def host_input(a: np.ndarray) -> np.ndarray:
    """A checked input as kernels read it where the caller holds it: C-contiguous, aligned, in native byte order
    and writeable; `a` itself where it is all that already (the usual case), else the copy it takes.

    - not C-contiguous (a slice, a transpose) or not aligned (data at an odd offset of a buffer): copied, since
      kernels take dense aligned arrays (oneDNN reads raw pointers, numba compiles per layout and alignment);
    - in the other byte order: copied into native order, which kernels compute in;
    - read-only (a request's bytes): seen through a writeable view rather than passed as it is, since a read-only
      array would make numba compile a second variant of every loop it reaches on the first request. No kernel
      writes a graph input (the compiler never runs an op in place on one). Below SMALL_READ_ONLY bytes it is
      copied instead: the view costs ~2.5 us, a copy that small less.
    """
    if not a.dtype.isnative:
        return np.array(a, dtype=a.dtype.newbyteorder("="), order="C")
    if not (a.flags.c_contiguous and a.flags.aligned):
        return np.array(a, order="C")
    if not a.flags.writeable:
        return np.array(a) if a.nbytes < SMALL_READ_ONLY else np.asarray(_WriteableView(a))
    return a


class _WriteableView:
    """The memory of a read-only C-contiguous array as a writeable array's buffer; keeps the array alive."""

    __slots__ = ("__array_interface__", "array")

    def __init__(self, a: np.ndarray):
        self.array = a
        self.__array_interface__ = {"version": 3, "shape": a.shape, "typestr": a.dtype.str,
                                    "data": (a.__array_interface__["data"][0], False)}
