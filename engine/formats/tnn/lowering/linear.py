"""TNN matrix layers -> canonical ops: InnerProduct -> Gemm, MatMul (a stored weight as a constant operand), Inverse
(of 2x2 matrices, by the adjugate), Einsum."""

from __future__ import annotations

import numpy as np

from engine.formats.tnn.lowering.context import F32, Ctx
from engine.formats.tnn.lowering.registry import handles


@handles("InnerProduct")
def lower_inner_product(c: Ctx) -> None:
    n, has_bias, transpose, axis = c.i(0), c.i(1, 0), c.i(2, 0), c.i(3, 1)
    w = c.weight("weight")
    if w.size % max(n, 1):
        c.fail(f"weight has {w.size} values, not a multiple of num_output {n}")
    w = w.reshape(n, -1) if not transpose else w.reshape(-1, n).T
    attrs = {"weight": np.ascontiguousarray(w, dtype=F32)}
    bias = c.attr("bias", required=False)
    if has_bias and bias is not None and bias.size:
        attrs["bias"] = np.ascontiguousarray(bias.reshape(n), dtype=F32)
    shape = c.shape(c.inputs[0])
    if axis < 0 or shape is not None and axis >= len(shape):  # TNN indexes the dims with it: 0 <= axis < rank
        c.fail(f"axis {axis} is not one of the input's dims" + ("" if shape is None else f" ({len(shape)})"))
    x = c.inputs[0]
    if shape is None or len(shape) != axis + 1:
        x = c.tmp("Flatten", [x], {"start_dim": axis, "end_dim": -1})
    if shape is None or len(shape) <= axis + 1:
        return c.out("Gemm", [x], {}, attrs)
    # TNN keeps the rank: the dims after `axis` become 1
    y = c.tmp("Gemm", [x], {}, attrs)
    c.out("Reshape", [y], {"shape": [0] * axis + [n] + [1] * (len(shape) - axis - 1)})


@handles("MatMul")
def lower_matmul(c: Ctx) -> None:
    ins = list(c.inputs)
    if len(ins) == 1:
        w, pos = c.weight("weight"), c.i(0, 1)
        if not c.node.params.get("resource_dims", {}).get("weight"):  # v1: only the count is stored
            shape = c.shape(ins[0])
            if shape is None or len(shape) < 2:
                c.fail("cannot shape a v1 MatMul weight without the input shape")
            w = w.reshape(shape[-1], -1) if pos == 1 else w.reshape(-1, shape[-2])
        const = c.const(np.ascontiguousarray(w, dtype=F32), "weight")
        ins = [const, ins[0]] if pos == 0 else [ins[0], const]
    c.out("MatMul", ins[:2])


@handles("Inverse")
def lower_inverse(c: Ctx) -> None:
    """No params. CpuInverseLayerAcc inverts (..., 2, 2) matrices only: [[d, -b], [-c, a]] * (1 / (a*d - b*c)), in
    float32 as written there (a singular matrix gives infinities or NaN, as in TNN)."""
    if len(c.inputs) != 1:
        c.fail(f"takes one input, has {len(c.inputs)}")
    shape = c.shape(c.inputs[0])
    if shape is None or len(shape) < 2 or tuple(shape[-2:]) != (2, 2):
        c.unsupported(f"of a {shape} input (TNN's acc inverts (..., 2, 2) matrices only)")
    r = len(shape)

    def entry(i: int, j: int):
        return c.tmp("Slice", [c.inputs[0]], {"starts": [i, j], "ends": [i + 1, j + 1], "axes": [r - 2, r - 1],
                                              "steps": [1, 1]})
    a, b, cc, d = entry(0, 0), entry(0, 1), entry(1, 0), entry(1, 1)
    det_inv = c.tmp("Reciprocal", [c.tmp("Sub", [c.tmp("Mul", [a, d]), c.tmp("Mul", [b, cc])])])
    top = c.tmp("Concat", [d, c.tmp("Neg", [b])], {"axis": r - 1})
    bottom = c.tmp("Concat", [c.tmp("Neg", [cc]), a], {"axis": r - 1})
    c.out("Mul", [c.tmp("Concat", [top, bottom], {"axis": r - 2}), det_inv])


def _labels(c: Ctx, term: str) -> tuple[str, str, bool]:
    pre, ell, post = term.partition("...")
    for label in pre + post:
        if not "a" <= label <= "z":
            c.unsupported(f"with subscript {label!r} (TNN's layer maps a..z only)")
    if len(set(pre + post)) != len(pre + post):
        c.unsupported(f"with a repeated subscript in {term!r} (a diagonal: TNN's layer refuses it)")
    return pre, post, bool(ell)


@handles("Einsum")
def lower_einsum(c: Ctx) -> None:
    """Param: the equation (operands split by ';'). TNN's only Einsum acc (CpuEinsumLayerAcc, torch's einsum
    ported) multiplies exactly two operands, then sums the contracted dims one by one at their original positions:
    with two or more contracted dims (of size > 1 in the first operand) and an output of rank > 0, the later sums
    land on the wrong axes, so that case is refused; a full contraction (`ij;ij->`) is its Dot, of shape (1,)."""
    if not c.args:
        c.fail("has no equation")
    # onnx2tnn writes ONNX's equation with its operands split by ';' (',' separates .tnnproto records)
    eq = c.args[0].replace(" ", "").replace(";", ",")
    if len(c.inputs) != 2:
        c.unsupported(f"of {len(c.inputs)} operands (TNN's acc multiplies two)")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != 2:
        c.fail(f"equation {eq!r} names {len(terms)} operands for 2 inputs")
    (p0, q0, e0), (p1, q1, e1) = (_labels(c, t) for t in terms)
    labels0, labels1 = p0 + q0, p1 + q1
    if arrow:
        out_pre, out_post, out_ell = _labels(c, rhs)
        out = out_pre + out_post
    else:
        out = "".join(sorted(label for label in set(labels0 + labels1) if (labels0 + labels1).count(label) == 1))
        out_ell = e0 or e1
    shape0 = c.shape(c.inputs[0])
    if shape0 is None:
        c.unsupported("of an operand of unknown shape")
    dims0 = dict(zip(p0, shape0[:len(p0)], strict=False)) | dict(zip(q0[::-1], shape0[::-1], strict=False))
    summed = [label for label in set(labels0) & set(labels1) if label not in out and dims0.get(label, 1) != 1]
    shape1 = c.shape(c.inputs[1])
    if shape1 is None:
        c.unsupported("of an operand of unknown shape")
    ell_dims = max(len(shape0) - len(labels0) if e0 else 0, len(shape1) - len(labels1) if e1 else 0)
    out_rank = len(out) + (ell_dims if out_ell else 0)
    if out_rank and len(summed) > 1:
        c.unsupported(f"{eq!r}: {len(summed)} contracted dims (TNN's acc sums all but the first at shifted axes)")
    if not out_rank and not summed:
        c.unsupported(f"{eq!r}: a scalar output without a contraction")
    if not out_rank:
        y = c.tmp("Einsum", list(c.inputs), {"equation": eq})
        return c.out("Reshape", [y], {"shape": [1]})
    c.out("Einsum", list(c.inputs), {"equation": eq})
