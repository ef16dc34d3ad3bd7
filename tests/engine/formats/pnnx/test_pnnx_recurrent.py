"""pnnx nn.LSTM / nn.GRU / nn.RNN lines the lowering refuses at load, naming the file and line, rather than
guessing: outputs whose role the file does not tell (pnnx lists them in the order the graph reads them, and an
LSTM's h_n and c_n have one shape without a projection), unbatched input, an LSTM state without c0, unknown
nonlinearities, proj_size on a GRU, weights the params do not name. The supported forms are checked against
torch by the pnnx op goldens (lstm, gru, rnn_tanh, rnn_relu, lstm_proj, recurrent_forms)."""

from __future__ import annotations

import numpy as np
import pytest

import engine
from engine.errors import ModelFormatError, ShapeError, UnsupportedOpError
from engine.formats.pnnx.writer import attribute_specs, write_pnnx

RNG = np.random.default_rng(18)
LSTM = ("batch_first=False bias=True bidirectional=False hidden_size=4 input_size=3 num_layers=1 proj_size={proj} "
        "@bias_hh_l0=(16)f32 @bias_ih_l0=(16)f32 @weight_hh_l0=(16,{hout})f32 @weight_ih_l0=(16,3)f32{extra}")
GRU = ("batch_first=False bias=True bidirectional=False hidden_size=4 input_size=3 num_layers=1{extra} "
       "@bias_hh_l0=(12)f32 @bias_ih_l0=(12)f32 @weight_hh_l0=(12,4)f32 @weight_ih_l0=(12,3)f32")


def model(tmp_path, op: str, params: str, ins: list[tuple[str, str]], outs: list[tuple[str, str]]):
    lines = [f"pnnx.Input in{i} 0 1 {name} #{name}={note}" for i, (name, note) in enumerate(ins)]
    notes = " ".join(f"#{n}={note}" for n, note in ins + outs)
    lines.append(f"{op} rnn {len(ins)} {len(outs)} {' '.join(n for n, _ in ins)} {' '.join(n for n, _ in outs)} "
                 f"{params} {notes}")
    lines.append(f"pnnx.Output out {len(outs)} 0 {' '.join(n for n, _ in outs)}")
    text = f"7767517\n{len(lines)} {len(lines)}\n" + "\n".join(lines) + "\n"
    weights = {k: RNG.standard_normal(shape).astype(dtype) for k, (shape, dtype) in attribute_specs(text).items()}
    return write_pnnx(tmp_path / "m.pnnx.param", text, weights)


X = ("x", "(5,2,3)f32")


def load(path):
    return engine.load(path).instance("cpu")


def test_lstm_states_without_a_projection_are_refused(tmp_path):
    path = model(tmp_path, "nn.LSTM", LSTM.format(proj=0, hout=4, extra=""), [X],
                 [("o", "(5,2,4)f32"), ("h", "(1,2,4)f32"), ("c", "(1,2,4)f32")])
    with pytest.raises(UnsupportedOpError, match=r"h_n or c_n.*pnnx_export_bugs") as e:
        load(path)
    assert "m.pnnx.param:4" in str(e.value)  # the nn.LSTM line


def test_a_lone_lstm_state_is_refused_but_a_lone_gru_state_is_h_n(tmp_path):
    with pytest.raises(UnsupportedOpError, match="h_n or c_n"):
        load(model(tmp_path, "nn.LSTM", LSTM.format(proj=0, hout=4, extra=""), [X], [("h", "(1,2,4)f32")]))
    inst = load(model(tmp_path, "nn.GRU", GRU.format(extra=""), [X], [("h", "(1,2,4)f32")]))
    (h,) = inst.run({"in0": RNG.standard_normal((5, 2, 3)).astype(np.float32)}).values()
    assert h.shape == (1, 2, 4)


def test_out_and_state_in_the_order_pnnx_lists_them(tmp_path):
    """pnnx writes the outputs in the order the graph reads them: (h_n, out) here; the roles follow the shapes."""
    path = model(tmp_path, "nn.GRU", GRU.format(extra=""), [X], [("h", "(1,2,4)f32"), ("o", "(5,2,4)f32")])
    got = load(path).run({"in0": RNG.standard_normal((5, 2, 3)).astype(np.float32)})
    assert [v.shape for v in got.values()] == [(1, 2, 4), (5, 2, 4)]


def test_static_sequence_as_long_as_the_state_rows_is_ambiguous(tmp_path):
    path = model(tmp_path, "nn.GRU", GRU.format(extra=""), [("x", "(1,2,3)f32")], [("h", "(1,2,4)f32")])
    with pytest.raises(UnsupportedOpError, match="h_n or out"):
        load(path)


def test_projected_lstm_states_are_told_apart(tmp_path):
    path = model(tmp_path, "nn.LSTM", LSTM.format(proj=2, hout=2, extra=" @weight_hr_l0=(2,4)f32"), [X],
                 [("c", "(1,2,4)f32"), ("o", "(5,2,2)f32"), ("h", "(1,2,2)f32")])
    got = load(path).run({"in0": RNG.standard_normal((5, 2, 3)).astype(np.float32)})
    assert [v.shape for v in got.values()] == [(1, 2, 4), (5, 2, 2), (1, 2, 2)]


@pytest.mark.parametrize(("op", "params", "ins", "error", "match"), [
    ("nn.GRU", GRU.format(extra=""), [("x", "(5,3)f32")], UnsupportedOpError, "2-D input"),
    ("nn.LSTM", LSTM.format(proj=0, hout=4, extra=""), [X, ("h0", "(1,2,4)f32")], UnsupportedOpError,
     "h0 and c0"),
    ("nn.RNN", GRU.format(extra=" nonlinearity=gelu").replace("12", "4"), [X], UnsupportedOpError, "gelu"),
    ("nn.GRU", GRU.format(extra=" proj_size=2"), [X], ModelFormatError, "not a valid nn.GRU"),
    ("nn.GRU", GRU.format(extra="") + " @weight_ih_l1=(12,4)f32", [X], ModelFormatError, "does not take"),
    ("nn.GRU", GRU.format(extra="").replace("input_size=3", "input_size=5"), [X], ModelFormatError,
     "input_size is 5"),
    ("nn.GRU", GRU.format(extra=""), [X, ("h0", "(2,2,4)f32")], ShapeError, "initial state"),
    # without biases, zeros of 3 x hidden_size are made: a hidden_size the weights do not have is refused first
    ("nn.GRU", GRU.format(extra="").replace("bias=True", "bias=False").replace("@bias_hh_l0=(12)f32 ", "")
     .replace("@bias_ih_l0=(12)f32 ", "").replace("hidden_size=4", "hidden_size=100000000000"), [X],
     ModelFormatError, "has 12 rows, hidden_size=100000000000 needs 300000000000"),
])
def test_refused_at_load(tmp_path, op, params, ins, error, match):
    path = model(tmp_path, op, params, ins, [("o", "(5,2,4)f32")])
    with pytest.raises(error, match=match) as e:
        load(path)
    assert "m.pnnx.param" in str(e.value)
