"""pnnx ops whose result size depends on the data: torch.masked_select and Tensor.index with a bool mask
(`x[mask]`), lowered through NonZero, against numpy's boolean indexing (torch's semantics), one instance run with
masks of different counts (none selected included)."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.errors import EngineError, ModelFormatError, UnsupportedOpError
from engine.formats.pnnx.writer import write_pnnx

RNG = np.random.default_rng(21)


def write(tmp_path, body: str):
    lines = [ln.strip() for ln in body.strip().splitlines() if ln.strip()]
    return write_pnnx(tmp_path / "m.pnnx.param", f"7767517\n{len(lines)} {len(lines)}\n" + "\n".join(lines) + "\n",
                      {})


def masks(shape) -> list[np.ndarray]:
    return [RNG.random(shape) < 0.5, np.zeros(shape, bool), np.ones(shape, bool)]


@pytest.mark.parametrize("mask_shape", [(3, 4), (4,), (2, 1, 4)])
def test_masked_select_broadcasts_and_flattens(tmp_path, mask_shape):
    note = "(" + ",".join(map(str, mask_shape)) + ")bool"
    path = write(tmp_path, f"""
        pnnx.Input in0 0 1 0 #0=(3,4)f32
        pnnx.Input in1 0 1 1 #1={note}
        torch.masked_select op 2 1 0 1 2 $input=0 $mask=1 #0=(3,4)f32 #1={note} #2=(?)f32
        pnnx.Output out 1 0 2
    """)
    model = engine.load(path)
    assert model.outputs[0].shape == (-1,) and model.data_dependent_outputs == ["out0"]
    inst = model.instance("cpu")
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    for m in masks(mask_shape):
        (got,) = inst.run({"in0": x, "in1": m}).values()
        xb, mb = np.broadcast_arrays(x, m)
        np.testing.assert_array_equal(got, xb[mb])


def test_bool_mask_indexing_over_two_dims(tmp_path):
    path = write(tmp_path, """
        pnnx.Input in0 0 1 0 #0=(3,4,2)f32
        pnnx.Input in1 0 1 1 #1=(3,4)bool
        pnnx.Expression list 1 1 1 2 expr=[@0] #1=(3,4)bool
        Tensor.index op 2 1 0 2 3 $input=0 $expr=2 #0=(3,4,2)f32 #3=(?,2)f32
        pnnx.Output out 1 0 3
    """)
    inst = engine.load(path).instance("cpu")
    x = RNG.standard_normal((3, 4, 2)).astype(np.float32)
    for m in masks((3, 4)):
        (got,) = inst.run({"in0": x, "in1": m}).values()
        np.testing.assert_array_equal(got, x[m])


def test_bool_mask_after_a_whole_dim_and_with_an_index(tmp_path):
    path = write(tmp_path, """
        pnnx.Input in0 0 1 0 #0=(2,5,3)f32
        pnnx.Input in1 0 1 1 #1=(5)bool
        pnnx.Expression list 1 1 1 2 expr=[None,@0] #1=(5)bool
        Tensor.index op 2 1 0 2 3 $input=0 $expr=2 #0=(2,5,3)f32 #3=(2,?,3)f32
        pnnx.Output out 1 0 3
    """)
    inst = engine.load(path).instance("cpu")
    x = RNG.standard_normal((2, 5, 3)).astype(np.float32)
    for m in masks(5):
        (got,) = inst.run({"in0": x, "in1": m}).values()
        np.testing.assert_array_equal(got, x[:, m])


def test_a_mask_that_does_not_fit_its_dims_is_refused_with_the_line(tmp_path):
    path = write(tmp_path, """
        pnnx.Input in0 0 1 0 #0=(3,4)f32
        pnnx.Input in1 0 1 1 #1=(3)bool
        pnnx.Expression list 1 1 1 2 expr=[None,@0] #1=(3)bool
        Tensor.index op 2 1 0 2 3 $input=0 $expr=2 #0=(3,4)f32 #3=(3,?)f32
        pnnx.Output out 1 0 3
    """)
    with pytest.raises(ModelFormatError, match="does not match the dims") as e:
        engine.load(path)
    assert "m.pnnx.param:6" in str(e.value)


def test_a_dynamic_mask_must_match_the_dim_it_indexes(tmp_path):
    """x[mask] with both sizes known only at run time: equal sizes select as torch does; a mask of another size is
    an error for that run (torch's IndexError), never rows picked from the front of x."""
    path = write(tmp_path, """
        pnnx.Input in0 0 1 0 #0=(?,2)f32
        pnnx.Input in1 0 1 1 #1=(?)bool
        pnnx.Expression list 1 1 1 2 expr=[@0] #1=(?)bool
        Tensor.index op 2 1 0 2 3 $input=0 $expr=2 #0=(?,2)f32 #3=(?,2)f32
        pnnx.Output out 1 0 3
    """)
    inst = engine.load(path).instance("cpu", max_shapes={"in0": (6, 2), "in1": (6,)})
    x = RNG.standard_normal((5, 2)).astype(np.float32)
    for m in masks((5,)):
        (got,) = inst.run({"in0": x, "in1": m}).values()
        np.testing.assert_array_equal(got, x[m])
    with pytest.raises(EngineError, match="cannot reshape"):
        inst.run({"in0": x, "in1": np.ones(3, bool)})


def test_a_dynamic_mask_over_two_dims_is_refused(tmp_path):
    path = write(tmp_path, """
        pnnx.Input in0 0 1 0 #0=(?,?,2)f32
        pnnx.Input in1 0 1 1 #1=(?,?)bool
        pnnx.Expression list 1 1 1 2 expr=[@0] #1=(?,?)bool
        Tensor.index op 2 1 0 2 3 $input=0 $expr=2 #0=(?,?,2)f32 #3=(?,2)f32
        pnnx.Output out 1 0 3
    """)
    with pytest.raises(UnsupportedOpError, match="m.pnnx.param:6.*over 2 dims whose sizes are known only at run time"):
        engine.load(path)
