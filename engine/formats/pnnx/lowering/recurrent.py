"""pnnx nn.LSTM / nn.GRU / nn.RNN -> one `RNN` op (engine/ops/recurrent.py).

pnnx writes the module's constructor arguments as params (input_size, hidden_size, num_layers, bias, batch_first,
bidirectional, proj_size for LSTM, nonlinearity for RNN) and its parameters as torch names them
(@weight_ih_l0, @bias_hh_l1_reverse, @weight_hr_l0 ...). Operands: x, then h0 (and c0 for LSTM) when the call
passed an initial state; outputs: out, then h_n (and c_n) as far as the traced code read them. A module without
bias gets zero biases; dropout between layers acts in training only and is ignored, as torch's eval does.
Refused: a rank other than 3 (unbatched input, or a PackedSequence that pnnx flattened), an LSTM given h0
without c0, proj_size on a GRU or RNN, a nonlinearity other than tanh and relu, weights the params do not name.
"""

from __future__ import annotations

import numpy as np

from engine.formats.pnnx.lowering.context import Ctx
from engine.formats.pnnx.lowering.registry import handles
from engine.ops.recurrent import gates, suffix

_STATES = {"nn.LSTM": 2, "nn.GRU": 1, "nn.RNN": 1}


def _mode(ctx: Ctx) -> str:
    if ctx.type == "nn.LSTM":
        return "LSTM"
    if ctx.type == "nn.GRU":
        return "GRU"
    act = str(ctx.p("nonlinearity", "tanh"))
    if act not in ("tanh", "relu"):
        raise ctx.unsupported(f"nonlinearity={act!r}")
    return "RNN_" + act.upper()


def _weights(ctx: Ctx, mode: str, layers: int, dirs: int, hidden: int, proj: int) -> dict[str, np.ndarray]:
    has_bias = bool(ctx.p("bias", True))
    attrs: dict[str, np.ndarray] = {}
    for layer in range(layers):
        for d in range(dirs):
            s = suffix(layer, d)
            attrs["weight_ih" + s] = ctx.weight("weight_ih" + s)
            attrs["weight_hh" + s] = ctx.weight("weight_hh" + s)
            for name in ("bias_ih", "bias_hh"):
                b = ctx.weight(name + s, required=has_bias)
                attrs[name + s] = b if b is not None else np.zeros(gates(mode) * hidden, np.float32)
            if proj:
                attrs["weight_hr" + s] = ctx.weight("weight_hr" + s)
    extra = sorted(set(ctx.node.attrs) - set(attrs))
    if extra:
        raise ctx.fail(f"has weights {extra} that a {layers}-layer, {dirs}-direction module does not take")
    return attrs


@handles("nn.LSTM", "nn.GRU", "nn.RNN")
def recurrent(ctx: Ctx) -> None:
    mode = _mode(ctx)
    hidden, layers = int(ctx.p("hidden_size")), int(ctx.p("num_layers", 1))
    dirs = 2 if ctx.p("bidirectional", False) else 1
    proj = int(ctx.p("proj_size", 0))
    if hidden <= 0 or layers <= 0 or proj < 0 or (proj and (mode != "LSTM" or proj >= hidden)):
        raise ctx.fail(f"hidden_size={hidden}, num_layers={layers}, proj_size={proj} is not a valid {ctx.type}")
    ctx.p("dropout")  # between layers, in training only
    x = ctx.x()
    if ctx.rank(x) != 3:
        raise ctx.unsupported(f"a {ctx.rank(x)}-D input (only batched (T, B, I) / (B, T, I) sequences)")
    if x.shape[-1] not in (-1, int(ctx.p("input_size", x.shape[-1]))):
        raise ctx.fail(f"input has {x.shape[-1]} features, input_size is {ctx.p('input_size')}")
    states = len(ctx.node.inputs) - 1
    if states not in (0, _STATES[ctx.type]):
        raise ctx.unsupported(f"{states} initial-state operand(s) (takes none, or "
                              f"{'h0 and c0' if mode == 'LSTM' else 'h0'})")
    if len(ctx.node.outputs) > 1 + _STATES[ctx.type]:
        raise ctx.fail(f"has {len(ctx.node.outputs)} outputs")
    ctx.floats(*ctx.node.inputs)
    params = {"mode": mode, "hidden_size": hidden, "num_layers": layers, "bidirectional": dirs == 2,
              "batch_first": bool(ctx.p("batch_first", False)), "proj_size": proj}
    ctx.become("RNN", params, _weights(ctx, mode, layers, dirs, hidden, proj), inputs=list(ctx.node.inputs))
