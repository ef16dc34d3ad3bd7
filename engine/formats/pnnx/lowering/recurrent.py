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
                if b is None:  # zeros sized by hidden_size, a number from the file: checked before allocating
                    rows = attrs["weight_ih" + s].shape[0]
                    if rows != gates(mode) * hidden:
                        raise ctx.fail(f"@weight_ih{s} has {rows} rows, hidden_size={hidden} needs "
                                       f"{gates(mode) * hidden}")
                    b = np.zeros(rows, np.float32)
                attrs[name + s] = b
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
    attrs = _weights(ctx, mode, layers, dirs, hidden, proj)
    roles = _roles(ctx, x, params, proj or hidden)
    if roles == list(ROLES[:len(roles)]):
        ctx.become("RNN", params, attrs, inputs=list(ctx.node.inputs))
        return
    by_role = dict(zip(roles, ctx.node.outputs, strict=True))
    last = max(map(ROLES.index, roles))
    outs = [by_role.get(r) or ctx.graph.value(f"{ctx.node.name}/{r}") for r in ROLES[:last + 1]]
    ctx.emit("RNN", list(ctx.node.inputs), params, attrs, outputs=outs)
    ctx.done()


ROLES = ("out", "h_n", "c_n")


def _fits(annotated: int, expected: int) -> bool:
    return annotated == expected or -1 in (annotated, expected)


def _roles(ctx: Ctx, x, params: dict, hout: int) -> list[str]:
    """Which of out, h_n, c_n each output of the line is, told by its annotated shape: pnnx lists a recurrent
    module's outputs in the order the graph goes on to read them, not in the module's order, and writes a single
    output for out, h_n or c_n alike (docs/pnnx_export_bugs.md). A state's first dim is the constant L·D; out's
    is T (or B), which a dynamic export annotates as unknown. An output that fits no role, or more than one (an
    LSTM's h_n and c_n without a projection have one shape), is refused rather than guessed."""
    d, rows = 2 if params["bidirectional"] else 1, params["num_layers"] * (2 if params["bidirectional"] else 1)
    t, b = (x.shape[1], x.shape[0]) if params["batch_first"] else (x.shape[0], x.shape[1])
    states = {"h_n": hout} | ({"c_n": params["hidden_size"]} if params["mode"] == "LSTM" else {})
    out_shape = (b, t, d * hout) if params["batch_first"] else (t, b, d * hout)
    roles: list[str] = []
    for v in ctx.node.outputs:
        shape = v.shape
        if shape is None or len(shape) != 3:
            raise ctx.unsupported(f"output {v.name!r} without a 3-D annotation (its role cannot be told)")
        fit = [r for r, w in states.items() if shape[0] == rows and shape[2] == w and _fits(shape[1], b)]
        if shape[2] == d * hout and _fits(shape[0], out_shape[0]) and _fits(shape[1], out_shape[1]) \
                and not (fit and out_shape[0] == -1):  # a dynamic out's first dim is annotated unknown, not L·D
            fit.append("out")
        if len(fit) != 1 or fit[0] in roles:
            raise ctx.unsupported(f"output {v.name!r} annotated {tuple(shape)}, which could be "
                                  f"{' or '.join(fit) or 'none of out, h_n, c_n'} (pnnx does not list these "
                                  f"outputs in a fixed order; see docs/pnnx_export_bugs.md)")
        roles.append(fit[0])
    return roles
