"""Never silently wrong: every pnnx operator type the lowering handles (the registry, not a list kept here) is
loaded from a real line of it, then with one operand of another dtype or rank, an extra operand, a missing one,
and two operands in each other's role. The original must load; each mistyped one must be refused at load
(engine.load, then the instance's compile) with an error naming the file and the line, never give a result.

Some mistypings still describe a model torch runs, with the same output shape and dtype the line annotates
(torch promotes an int64 operand of torch.cat, broadcasts an operand of lower rank, concatenates in any order):
those are listed in VALID with torch's reason, and there the engine must answer, not refuse (golden outputs for
such forms are in test_pnnx_op_goldens.py). A mistyping that loads without being listed fails the test.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from mutations import Mutation, mutations, with_note
from op_corpus import samples

import engine
from engine.errors import EngineError, KernelError, ModelFormatError, ShapeError, UnsupportedOpError
from engine.formats.pnnx.lowering.lower import HANDLERS
from engine.formats.pnnx.param_values import parse_annotation
from engine.ops.expression import Input, parse

SAMPLES = samples()
LOAD_ERRORS = (ShapeError, UnsupportedOpError, ModelFormatError)

BITWISE = ("torch.bitwise_and", "torch.bitwise_or", "torch.bitwise_xor")
ELEMENTWISE = ("torch.eq", "torch.ne", "torch.lt", "torch.le", "torch.gt", "torch.ge", "torch.logical_and",
               "torch.logical_or", "torch.logical_xor", "torch.where", "pnnx.Expression", "aten::addcmul",
               "aten::clamp_min", "aten::clamp_max", *BITWISE)
# (types, mutation kind, roles (None: any), why torch runs the mistyped model and the engine must too)
VALID: list[tuple[tuple[str, ...], str, frozenset[str] | None, str]] = [
    (("torch.cat", "torch.concat", "torch.stack", "torch.where", "pnnx.Expression", "torch.eq", "torch.ne",
      "torch.lt", "torch.le", "torch.gt", "torch.ge"), "dtype", None,
     "torch promotes mixed dtypes (bool < int < float) and compares any two numbers"),
    (("torch.logical_and", "torch.logical_or", "torch.logical_xor", "torch.logical_not"), "dtype", None,
     "logical ops read any dtype as truth values"),
    (BITWISE, "dtype", None, "bitwise ops promote bool with integers (floats are refused)"),
    (("aten::addcmul", "F.softsign", "nn.Softsign", "Tensor.logsumexp", "torch.logsumexp", "torch.argmax",
      "torch.argmin", "torch.cumsum"), "dtype", None,
     "torch takes integers here (and cumsum, logsumexp bools); bools are refused where torch refuses them"),
    (("aten::argsort",), "dtype", frozenset({"@0"}), "torch sorts integers too; the indices are int64 either way"),
    (("Tensor.to", "Tensor.type", "Tensor.type_as", "torch.zeros_like"), "dtype", frozenset({"input"}),
     "a cast (or a dtype param) sets the output dtype whatever the input's"),
    (("Tensor.reshape_as", "Tensor.view_as", "Tensor.expand_as"), "dtype", frozenset({"other"}),
     "only the other operand's shape is read"),
    (("Tensor.copy", "Tensor.slice_copy", "torch.slice_scatter", "torch.select_scatter", "aten::select_scatter",
      "Tensor.index_put"), "dtype", frozenset({"src", "values", "@1"}),
     "a write casts its source to the target's dtype (copy_)"),
    (ELEMENTWISE + ("Tensor.masked_fill", "torch.addmm", "torch.baddbmm", "torch.matmul", "Tensor.matmul",
                    "F.scaled_dot_product_attention"), "rank-", None,
     "an operand of lower rank broadcasts to the same output (matmul and attention broadcast batch dims)"),
    (("pnnx.Expression",), "rank+", None, "a leading dim broadcasts into the output's dynamic dims"),
    (("torch.masked_select", "Tensor.masked_select"), "rank+", None,
     "x and the mask broadcast together; the result is 1-D whatever their ranks"),
    (("torch.masked_select", "Tensor.masked_select"), "rank-", None, "as above"),
    (("Tensor.copy", "Tensor.slice_copy", "Tensor.index_put"), "rank-", frozenset({"src", "values"}),
     "a write broadcasts a source of lower rank"),
    (("Tensor.copy", "Tensor.index_put"), "rank+", frozenset({"src", "values"}),
     "the source broadcasts to the written region (here its leading dim matches the target's)"),
    (("Tensor.expand", "Tensor.expand_as", "torch.tile"), "rank-", frozenset({"input"}),
     "expand and tile prepend size-1 dims to an input of lower rank"),
    (("Tensor.reshape", "Tensor.view", "torch.reshape", "Tensor.new_empty", "Tensor.new_full", "Tensor.new_ones",
      "Tensor.new_zeros"), "rank+", frozenset({"input"}),
     "a reshape with -1 to dynamic output dims takes any element count; new_* read only the input's dtype"),
    (("Tensor.reshape", "Tensor.view", "torch.reshape", "Tensor.new_empty", "Tensor.new_full",
      "Tensor.new_ones"), "rank-", frozenset({"input"}), "as above"),
    (("aten::meshgrid",), "missing", frozenset({"@1"}),
     "aten::meshgrid(Tensor[] tensors) without indexing is torch's other overload (ij, torch before 1.10)"),
    (("aten::new_full",), "rank+", frozenset({"@0"}), "aten::new_full reads only its self operand's dtype"),
    (("aten::new_full",), "rank-", frozenset({"@0"}), "as above"),
    (("Tensor.type_as",), "rank+", frozenset({"other"}), "only the other operand's dtype is read"),
    (("Tensor.type_as",), "rank-", frozenset({"other"}), "only the other operand's dtype is read"),
    (("torch.mean", "aten::std", "aten::var"), "rank+", None, "a reduction over every dim gives the same scalar"),
    (("torch.mean", "aten::std", "aten::var"), "rank-", None, "a reduction over every dim gives the same scalar"),
    (("torch.index_select",), "rank-", frozenset({"index"}), "a 0-d index selects one element and keeps the dim"),
    (("F.prelu",), "rank-", frozenset({"weight"}), "a 0-d weight is one slope for every channel"),
    (("F.rms_norm",), "missing", frozenset({"weight"}), "the weight is optional"),
    (("aten::_transformer_encoder_layer_fwd",), "missing", frozenset({"@18", "@19"}),
     "the mask operands are optional (None)"),
    (("nn.MultiheadAttention",), "dtype", frozenset({"attn_mask"}), "a bool mask is as valid as a float one"),
    (("nn.MultiheadAttention",), "extra", None, "one input more is the (query, key = value) form pnnx writes"),
    (("nn.MultiheadAttention",), "swap", None,
     "the mask is told by its rank and dtype, not its position: pnnx's own order is unreliable (attention.py)"),
    (("pnnx.Expression", "pnnx.SliceIndexes"), "extra", None, "an operand no @k refers to is not read"),
    (("torch.cat", "torch.concat", "torch.stack", "pnnx.Expression", "aten::addcmul", "torch.logical_and",
      "torch.logical_or", "torch.logical_xor", "aten::clamp_min", "aten::clamp_max", *BITWISE), "swap", None,
     "operands of one role (a list to join, expression operands, addcmul's three, a symmetric op) in another "
     "order still make a model of the same output shape"),
]


def _valid(op_type: str, m: Mutation) -> str | None:
    for types, kind, roles, why in VALID:
        if op_type in types and m.kind == kind and (roles is None or set(m.roles) <= roles):
            return why
    return None


def test_every_handled_type_has_a_sample():
    assert sorted(HANDLERS) == sorted(SAMPLES)


def _feeds(model) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {s.name: (rng.integers(0, 2, s.shape) if s.dtype.kind in "iub" else rng.standard_normal(s.shape))
            .astype(s.dtype) for s in model.inputs}


@pytest.mark.parametrize("op_type", sorted(SAMPLES))
def test_mistyped_operands_are_refused_at_load(op_type, tmp_path):
    for i, sample in enumerate(SAMPLES[op_type]):
        model = engine.load(sample.write(tmp_path / f"base{i}.pnnx.param"))
        model.instance("cpu").run(_feeds(model))  # the line as pnnx wrote it (or a sibling's) runs
        for k, (m, mutated) in enumerate(mutations(sample)):
            what = f"{op_type} ({sample.source}) with {m.text}"
            path = mutated.write(tmp_path / f"m{i}_{k}.pnnx.param")
            try:
                loaded = engine.load(path)
                inst = loaded.instance("cpu")
            except KernelError as e:  # a kernel that failed to build: not a refusal naming the model's line
                raise AssertionError(f"{what}: {e}") from e
            except LOAD_ERRORS as e:  # a listed form may be refused too: its output may not be what the line says
                assert re.search(rf"{re.escape(path.name)}:\d+", str(e)), f"{what}: no file:line in the error: {e}"
                continue
            except EngineError as e:
                raise AssertionError(f"{what}: {type(e).__name__} instead of a load error: {e}") from e
            assert _valid(op_type, m), f"{what}: loaded instead of being refused"
            inst.run(_feeds(loaded))  # listed valid: it runs


@pytest.mark.parametrize("code", ["f32", "u8", "rank+"])
def test_mistyped_index_tensors_of_tensor_index_are_refused_at_load(code, tmp_path):
    """Tensor.index reads its index tensors through its `$expr` list (operands of the list, not of the op, so the
    mutations above leave them alone): each one as a float, as a uint8 mask (deprecated in torch), or with a leading
    dim is refused. (An int32 index is valid, and so is a 0-d one, which broadcasts; an item computed in the list,
    `sub(@1,1)`, is the list expression's arithmetic, which promotes as torch does; a bool mask runs, through
    NonZero: test_pnnx_data_dependent.py.)"""
    sample = next(s for s in SAMPLES["Tensor.index"] if len(s.op.ins) == 2)
    (listed,) = [f for f in sample.feeders if f.outs[0] in sample.op.ins]
    items = parse(next(i for i in listed.items if i.startswith("expr=")).split("=", 1)[1]).items
    direct = [listed.ins[t.index] for t in items if isinstance(t, Input)]
    assert direct, listed.text()
    for operand in direct:
        shape, dtype = parse_annotation(sample.inputs[operand])
        mutated = (with_note(sample, operand, (2, *shape), dtype) if code == "rank+" else
                   with_note(sample, operand, shape, code))
        path = mutated.write(tmp_path / f"{operand}.pnnx.param")
        with pytest.raises(LOAD_ERRORS) as info:
            engine.load(path).instance("cpu")
        assert re.search(rf"{re.escape(path.name)}:\d+", str(info.value)), f"no file:line in the error: {info.value}"
