"""Tensor.index (torch's advanced indexing, `x[rows, cols]`) on hand-written .pnnx.param lines: the forms pnnx writes
that the engine reads (their numbers against torch are the index_* cases of test_pnnx_op_goldens.py), and the forms
it refuses at load, naming the op, the file and the line, instead of guessing."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.errors import EngineError, ModelFormatError, ShapeError, UnsupportedOpError
from engine.formats.pnnx.writer import write_pnnx


def write(tmp_path, body: str):
    lines = [ln.strip() for ln in body.strip().splitlines() if ln.strip()]
    return write_pnnx(tmp_path / "m.pnnx.param", f"7767517\n{len(lines)} {len(lines)}\n" + "\n".join(lines) + "\n",
                      {})


def refused(tmp_path, body: str, error: type[Exception], *words: str) -> str:
    path = write(tmp_path, body)
    with pytest.raises(error) as info:
        engine.load(path).instance("cpu")
    text = str(info.value)
    assert "m.pnnx.param:" in text and all(w in text for w in words), text
    return text


STATIC_MASK = """
pnnx.Input in0 0 1 0 #0=(1,16)bool
Tensor.index Tensor.index_54 1 1 0 1 expr=[[0],[0]] #0=(1,16)bool #1=(1,1,1,16)bool
pnnx.Output out 1 0 1
"""


def test_a_static_mask_index_that_lost_its_indices_is_refused_asking_for_inputshape2(tmp_path):
    # transformers' mask[batch_idx, kv_idx] exported without inputshape2 (BERT, GPT-2, LLaMA, T5, DETR)
    text = refused(tmp_path, STATIC_MASK, UnsupportedOpError, "Tensor.index", "inputshape2", "m.pnnx.param:4")
    assert "[[0],[0]]" in text


def test_inline_one_d_constants_run(tmp_path):
    path = write(tmp_path, """
        pnnx.Input in0 0 1 0 #0=(4,5,2)f32
        Tensor.index op 1 1 0 1 expr=[None,[4,-1,0]] #0=(4,5,2)f32 #1=(4,3,2)f32
        pnnx.Output out 1 0 1
    """)
    x = np.arange(40, dtype=np.float32).reshape(4, 5, 2)
    (got,) = engine.load(path).instance("cpu").run({"in0": x}).values()
    np.testing.assert_array_equal(got, x[:, [4, -1, 0]])


@pytest.mark.parametrize("expr, words", [
    ("[[True,False,True,True]]", ("bool mask",)),
    ("[@0]", ("not a list of integers",)),  # pnnx leaves `@k` for a constant it cannot print (int32)
    ("[[1.5,2.0]]", ("not a list of integers",)),
    ("[0,[1]]", ("item 0 that is not a list of integers",)),
    ("add(@0,1)", ("not a list",)),
])
def test_inline_forms_not_understood_are_refused(tmp_path, expr, words):
    refused(tmp_path, f"""
        pnnx.Input in0 0 1 0 #0=(4,5)f32
        Tensor.index op 1 1 0 1 expr={expr} #0=(4,5)f32 #1=(3,5)f32
        pnnx.Output out 1 0 1
    """, UnsupportedOpError, "Tensor.index", *words)


def test_inline_constants_without_annotations_are_refused(tmp_path):
    refused(tmp_path, """
        pnnx.Input in0 0 1 0 #0=(4,5)f32
        Tensor.index op 1 1 0 1 expr=[[1,2]]
        pnnx.Output out 1 0 1
    """, UnsupportedOpError, "Tensor.index", "inputshape2")


LISTED = """
pnnx.Input in0 0 1 0 #0=(4,5,6)f32
pnnx.Input in1 0 1 1 #1=(3){code}
pnnx.Expression list 1 1 1 2 expr={expr} #1=(3){code}
Tensor.index op 2 1 0 2 3 $input=0 $expr=2 #0=(4,5,6)f32 #3={out}
pnnx.Output out 1 0 3
"""


@pytest.mark.parametrize("code, expr, words", [
    ("u8", "[@0]", ("bool mask",)),  # torch's deprecated uint8 mask (a bool one runs: test_pnnx_data_dependent.py)
    ("f32", "[@0]", ("float32 index",)),
    ("i64", "[1,@0]", ("not a tensor",)),
    ("i64", "@0", ("not a list",)),
])
def test_index_lists_not_understood_are_refused(tmp_path, code, expr, words):
    refused(tmp_path, LISTED.format(code=code, expr=expr, out="(3,5,6)f32"), UnsupportedOpError, "Tensor.index",
            *words)


def test_an_index_out_of_range_is_an_error_at_run_time_not_an_answer(tmp_path):
    path = write(tmp_path, LISTED.format(code="i64", expr="[None,@0]", out="(4,3,6)f32"))
    inst = engine.load(path).instance("cpu")
    x = np.zeros((4, 5, 6), np.float32)
    inst.run({"in0": x, "in1": np.array([0, -5, 4])})  # the edges of [-5, 5) are in range
    for bad in ([0, 5, 1], [-6, 0, 0]):
        with pytest.raises(EngineError, match="out of range"):
            inst.run({"in0": x, "in1": np.array(bad)})


def test_indices_apart_put_their_shape_first(tmp_path):
    # torch (and numpy): x[a, :, c] with a, c of shape (3,) gives (3, 5), not (5, 3)
    path = write(tmp_path, """
        pnnx.Input in0 0 1 0 #0=(4,5,6)f32
        pnnx.Input in1 0 1 1 #1=(3)i64
        pnnx.Input in2 0 1 2 #2=(3)i32
        pnnx.Expression list 2 1 1 2 3 expr=[@0,None,sub(@1,1)] #1=(3)i64 #2=(3)i32
        Tensor.index op 2 1 0 3 4 $input=0 $expr=3 #0=(4,5,6)f32 #4=(3,5)f32
        pnnx.Output out 1 0 4
    """)
    x = np.random.default_rng(0).standard_normal((4, 5, 6)).astype(np.float32)
    a, c = np.array([3, 0, -1]), np.array([1, 6, 2], np.int32)
    (got,) = engine.load(path).instance("cpu").run({"in0": x, "in1": a, "in2": c}).values()
    want = np.stack([x[a[i], :, c[i] - 1] for i in range(3)])
    np.testing.assert_array_equal(got, want)


def test_an_index_annotation_that_contradicts_the_indexing_is_refused(tmp_path):
    refused(tmp_path, LISTED.format(code="i64", expr="[@0]", out="(4,3,6)f32"), ModelFormatError, "op")
    refused(tmp_path, LISTED.format(code="i64", expr="[None,None,None,@0]", out="(4,5,6,3)f32"), ShapeError,
            "Index dims")
