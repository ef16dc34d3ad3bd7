"""Detection post-processing after a boolean mask, as pnnx exports it (tools/make_dd_goldens.py): the ops after
x[keep] follow the number of kept rows per run, exactly as torch computes them, for inputs where some, none and
all rows are kept; where torch raises for an input (a max over no rows, topk's k above the kept count) the run
raises; what cannot follow a size known only at run time is refused at load, naming the op, file and line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import engine
from engine.errors import EngineError, UnsupportedOpError

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "pnnx_dd"
REFUSED = {
    # pnnx folds view(-1, 2) to the traced (12, 2) when exported without inputshape2
    "view_fixed": ("Reshape", "cannot take every size it may have at run time", 8),
    # torch.arange(x[keep].size(0)): a size known only at run time, read as a value
    "size_query_dyn": ("Expression", "reads the size of an input whose size depends on the data", 8),
    "softmax_kept": ("Softmax", "cannot follow a size known only at run time", 8),
    # torch.chunk of the kept rows, pieces of the traced (3, 3) in a static export
    "chunk_rows": ("Split", "cannot take every size it may have at run time", 8),
}
RUNS = ("some", "none", "all")
# float32 sums in another order than torch's (its vectorised accumulators): equal to an ulp, not bit for bit;
# every other case moves or selects values and matches exactly
SUMMED = {"cat_rows_then_sum", "mean_columns", "mean_rows", "sum_all", "sum_columns", "sum_rows"}


def cases() -> list[str]:
    return sorted(p.name for p in FIXTURES.iterdir() if p.name not in REFUSED)


@pytest.mark.parametrize("case", cases())
def test_runs_as_torch_for_some_none_and_all_rows_kept(case):
    model = engine.load(FIXTURES / case / "model.pnnx.param")
    inst = model.instance("cpu", max_shapes={"in0": (6, 4), "in1": (6,)} if case.endswith("_dyn") else None)
    for run in RUNS:
        io = np.load(FIXTURES / case / f"io_{run}.npz")
        feeds = {"in0": io["in0"], "in1": io["in1"]}
        if "raises" in io:
            with pytest.raises(EngineError):
                inst.run(feeds)
            continue
        got = inst.run(feeds)
        for name in (k for k in io.files if k.startswith("out")):
            assert got[name].dtype == io[name].dtype and got[name].shape == io[name].shape, (case, run, name)
            if case in SUMMED:
                np.testing.assert_allclose(got[name], io[name], rtol=1e-6, atol=0, err_msg=f"{case} {run} {name}")
            else:
                np.testing.assert_array_equal(got[name], io[name], err_msg=f"{case} {run} {name}")


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_what_cannot_follow_the_kept_rows_is_refused_at_load(case):
    op, why, line = REFUSED[case]
    with pytest.raises(UnsupportedOpError, match=why) as e:
        engine.load(FIXTURES / case / "model.pnnx.param").instance("cpu")
    assert f"model.pnnx.param:{line}: unsupported op '{op}" in str(e.value)


def test_the_server_facing_shapes_follow_the_kept_rows():
    """The outputs whose size follows the kept rows are -1 there (a server auto-completes them); a sum over the
    kept rows has its fixed shape but still mixes the rows of a whole batch, so it is data-dependent too."""
    cat = engine.load(FIXTURES / "cat_rows_two_masks" / "model.pnnx.param")
    assert cat.outputs[0].shape == (-1, 4) and cat.data_dependent_outputs == ["out0"]
    total = engine.load(FIXTURES / "sum_rows" / "model.pnnx.param")
    assert total.outputs[0].shape == (4,) and total.data_dependent_outputs == ["out0"]
