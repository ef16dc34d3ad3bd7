"""Tensor.repeat with counts computed at run time (`query.repeat(batch, 1, 1)`, exported with inputshape2): the form
the engine runs (its numbers against torch: the repeat_runtime case of test_pnnx_op_goldens.py) and the forms it
refuses at load instead of guessing."""

from __future__ import annotations

import pytest

import engine
from engine.errors import UnsupportedOpError
from engine.formats.pnnx.writer import write_pnnx

BODY = """
pnnx.Input in0 0 1 0 #0=(?,4,3)f32
pnnx.Input in1 0 1 1 #1={x}f32
pnnx.Expression sizes 1 1 0 2 expr={sizes} #0=(?,4,3)f32
Tensor.repeat op 2 1 1 2 3 $input=1 $sizes=2 #1={x}f32 #3=(?,4,3)f32
pnnx.Output out 1 0 3
"""


@pytest.mark.parametrize("x, sizes, words", [
    ("(2,4,3)", "[size(@0,0),1,1]", "dims not of static size 1"),  # x's dim 0 is 2: a tile, not an expand
    ("(1,4,3)", "[size(@0,0),1]", "one count per dim"),
    ("(1,4,3)", "size(@0,0)", "one count per dim"),
])
def test_runtime_repeats_not_understood_are_refused(tmp_path, x, sizes, words):
    text = BODY.format(x=x, sizes=sizes)
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    path = write_pnnx(tmp_path / "m.pnnx.param", f"7767517\n{len(lines)} {len(lines)}\n" + "\n".join(lines) + "\n",
                      {})
    with pytest.raises(UnsupportedOpError, match=words) as info:
        engine.load(path)
    assert "m.pnnx.param:6" in str(info.value)
