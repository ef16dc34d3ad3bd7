"""Gemm (torch Linear: y = act(x @ weight.T + bias + z) over the last axis, with the optional residual input z of the
output's shape and the fused activation of SPEC.md's epilogue), MatMul (numpy matmul) and Einsum (numpy's einsum:
letters, one ellipsis per term, an explicit or implicit output)."""

from __future__ import annotations

import numpy as np

from engine.errors import ShapeError, UnsupportedOpError
from engine.ir import Node
from engine.ops.epilogue import EPILOGUES, apply_activation
from engine.ops.registry import OpDef, TensorInfo, register


def gemm_weight(node: Node) -> np.ndarray:
    w = node.attrs.get("weight")
    if w is None or w.ndim != 2:
        raise ShapeError(f"{node.where()}: Gemm needs a 2-D 'weight' attr (N, K), got "
                         f"{None if w is None else w.shape}")
    return w


def infer_gemm(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    shape = tuple(ins[0].shape)
    w = gemm_weight(node)
    if not shape or shape[-1] != w.shape[1]:
        raise ShapeError(f"{node.where()}: Gemm input {shape} does not end in K={w.shape[1]} (weight {w.shape})")
    b = node.attrs.get("bias")
    if b is not None and b.size != w.shape[0]:
        raise ShapeError(f"{node.where()}: Gemm bias has {b.size} values for {w.shape[0]} outputs")
    act = node.params.get("activation")
    if act is not None and act not in EPILOGUES:
        raise UnsupportedOpError(f"Gemm with fused activation {act!r}", node.name, node.where())
    out = shape[:-1] + (w.shape[0],)
    if len(ins) > 2 or (len(ins) == 2 and tuple(ins[1].shape) != out):
        raise ShapeError(f"{node.where()}: Gemm takes x and an optional residual of the output's shape {out}, got "
                         f"{[tuple(i.shape) for i in ins]}")
    return [TensorInfo(out, ins[0].dtype)]


def gemm_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    x = arrays[0]
    infer_gemm(node, [TensorInfo(np.shape(a), np.asarray(a).dtype) for a in arrays])
    y = x.astype(np.float64) @ gemm_weight(node).astype(np.float64).T
    if node.attrs.get("bias") is not None:
        y += node.attrs["bias"].astype(np.float64).ravel()
    if len(arrays) > 1:
        y += np.asarray(arrays[1], np.float64)
    apply_activation(node.params.get("activation"), node.params.get("activation_params"), y)
    return [y.astype(x.dtype)]


def matmul_shape(node: Node, a: tuple, b: tuple) -> tuple[int, ...]:
    """numpy matmul's result shape (1-D operands promoted then dropped, batch dims broadcast)."""
    if not a or not b:
        raise ShapeError(f"{node.where()}: MatMul operands must be at least 1-D, got {a} and {b}")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ShapeError(f"{node.where()}: MatMul inner dims differ: {a} @ {b}")
    try:
        batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    except ValueError:
        raise ShapeError(f"{node.where()}: MatMul batch dims do not broadcast: {a} @ {b}") from None
    out = tuple(batch) + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def infer_matmul(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if any(i.dtype == np.bool_ for i in ins[:2]):
        raise ShapeError(f"{node.where()}: MatMul of bool (torch has no bool matmul)")
    shape = matmul_shape(node, tuple(ins[0].shape), tuple(ins[1].shape))
    return [TensorInfo(shape, np.result_type(ins[0].dtype, ins[1].dtype))]


def matmul_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    a, b = arrays[0], arrays[1]
    matmul_shape(node, a.shape, b.shape)
    dtype = np.result_type(a.dtype, b.dtype)
    if np.issubdtype(dtype, np.floating):
        return [np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(dtype)]
    return [np.matmul(a, b)]


# -- Einsum ------------------------------------------------------------------------------------------------------
def _term(node: Node, term: str, shape: tuple[int, ...] | None) -> tuple[str, str, int]:
    """(labels before the ellipsis, labels after it, the ellipsis' dim count; -1 without one)."""
    letters = term.replace("...", "")
    if term.count("...") > 1 or (letters and not letters.isalpha()):
        raise ShapeError(f"{node.where()}: Einsum term {term!r} (letters and at most one ellipsis)")
    pre, _, post = term.partition("...")
    if "..." not in term:
        return pre, "", -1
    return pre, post, -1 if shape is None else len(shape) - len(pre) - len(post)


def einsum_shape(node: Node, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    eq = str(node.params.get("equation", "")).replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise ShapeError(f"{node.where()}: Einsum {eq!r} names {len(terms)} operands, got {len(shapes)}")
    sizes: dict[str, int] = {}
    counts: dict[str, int] = {}
    ellipses = []
    for term, shape in zip(terms, shapes, strict=True):
        pre, post, n_ell = _term(node, term, shape)
        if n_ell < -1 or (n_ell == -1 and len(pre) != len(shape)):
            raise ShapeError(f"{node.where()}: Einsum term {term!r} does not fit a rank-{len(shape)} operand")
        dims = shape[:len(pre)] + (shape[len(shape) - len(post):] if post else ())
        if n_ell >= 0:
            ellipses.append(shape[len(pre):len(pre) + n_ell])
        for label, d in zip(pre + post, dims, strict=True):
            if sizes.setdefault(label, d) != d:
                raise ShapeError(f"{node.where()}: Einsum label {label!r} is {sizes[label]} and {d} in {eq!r}")
            counts[label] = counts.get(label, 0) + 1
    try:
        ell = tuple(np.broadcast_shapes(*ellipses)) if ellipses else ()
    except ValueError:
        raise ShapeError(f"{node.where()}: Einsum ellipsis dims {ellipses} do not broadcast") from None
    if not arrow:
        return ell + tuple(sizes[label] for label in sorted(label for label, n in counts.items() if n == 1))
    pre, post, _ = _term(node, rhs, None)
    if len(set(pre + post)) != len(pre + post) or set(pre + post) - set(sizes):
        raise ShapeError(f"{node.where()}: Einsum output {rhs!r} repeats a label or names one no operand has")
    return (tuple(sizes[label] for label in pre) + (ell if "..." in rhs else ()) +
            tuple(sizes[label] for label in post))


def _einsum_infer(node: Node, ins: list[TensorInfo]) -> list[TensorInfo]:
    if any(np.dtype(i.dtype).kind != "f" for i in ins) or len({np.dtype(i.dtype) for i in ins}) != 1:
        raise ShapeError(f"{node.where()}: Einsum takes floating-point operands of one type, got "
                         f"{', '.join(str(np.dtype(i.dtype)) for i in ins)}")
    return [TensorInfo(einsum_shape(node, [tuple(i.shape) for i in ins]), ins[0].dtype)]


def einsum_reference(node: Node, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """numpy's einsum in float64."""
    xs = [np.asarray(a) for a in arrays]
    einsum_shape(node, [x.shape for x in xs])
    out = np.einsum(str(node.params["equation"]).replace(" ", ""), *[x.astype(np.float64) for x in xs])
    return [np.asarray(out).astype(xs[0].dtype)]


register(
    OpDef("Einsum", _einsum_infer, einsum_reference, arity=(1, 8)),
)
register(
    OpDef("Gemm", infer_gemm, gemm_reference, arity=(1, 2), float_inputs=(0, 1)),  # x [, residual]
    OpDef("MatMul", infer_matmul, matmul_reference, arity=(2, 2)),
)
