"""RNN CPU kernel (LSTM, GRU, tanh/relu RNN, LSTM projection) vs the op's numpy reference, at and below the max
shape (shorter sequences, smaller batches), with and without initial states, and no per-call temporaries. The
reference itself is checked against torch by the pnnx op goldens (lstm, gru, rnn_tanh, rnn_relu, lstm_proj)."""

from __future__ import annotations

import numpy as np
import pytest
from op_harness import build_kernel, check_kernel, infos_of, kernel_peak_bytes, make_node

from engine.ops.recurrent import gates, suffix

RNG = np.random.default_rng(18)


def rnn_node(mode: str, layers: int, bi: bool, batch_first: bool, states: int, outs: int, proj: int = 0,
             hid: int = 5, fan_in: int = 3):
    dirs, hout = 2 if bi else 1, proj or hid
    attrs = {}
    for layer in range(layers):
        for d in range(dirs):
            s, width = suffix(layer, d), fan_in if layer == 0 else dirs * hout
            attrs |= {"weight_ih" + s: RNG.standard_normal((gates(mode) * hid, width)).astype(np.float32) * 0.5,
                      "weight_hh" + s: RNG.standard_normal((gates(mode) * hid, hout)).astype(np.float32) * 0.5,
                      "bias_ih" + s: RNG.standard_normal(gates(mode) * hid).astype(np.float32) * 0.3,
                      "bias_hh" + s: RNG.standard_normal(gates(mode) * hid).astype(np.float32) * 0.3}
            if proj:
                attrs["weight_hr" + s] = RNG.standard_normal((proj, hid)).astype(np.float32) * 0.5
    params = {"mode": mode, "hidden_size": hid, "num_layers": layers, "bidirectional": bi,
              "batch_first": batch_first, "proj_size": proj}
    return make_node("RNN", 1 + states, outs, params, attrs), hout, dirs * layers


def arrays(node, t: int, b: int, states: int, hout: int, rows: int, hid: int = 5) -> list[np.ndarray]:
    shape = (b, t, 3) if node.params["batch_first"] else (t, b, 3)
    xs = [RNG.standard_normal(shape).astype(np.float32)]
    if states:
        xs.append(RNG.standard_normal((rows, b, hout)).astype(np.float32))
    if states > 1:
        xs.append(RNG.standard_normal((rows, b, hid)).astype(np.float32))
    return xs


CONFIGS = [(layers, bi, bf) for layers in (1, 2) for bi in (False, True) for bf in (False, True)]


@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN_TANH", "RNN_RELU"])
@pytest.mark.parametrize(("layers", "bi", "bf"), CONFIGS)
@pytest.mark.parametrize("with_state", [False, True])
def test_kernel_matches_reference_at_and_below_max_shape(mode, layers, bi, bf, with_state):
    states = (2 if mode == "LSTM" else 1) if with_state else 0
    outs = 3 if mode == "LSTM" else 2
    node, hout, rows = rnn_node(mode, layers, bi, bf, states, outs)
    big = arrays(node, 7, 3, states, hout, rows)
    check_kernel(node, big, rtol=1e-4, atol=1e-5)
    check_kernel(node, arrays(node, 4, 2, states, hout, rows), big, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("layers", "bi", "bf"), [(1, False, False), (2, True, True)])
def test_lstm_projection(layers, bi, bf):
    node, hout, rows = rnn_node("LSTM", layers, bi, bf, 2, 3, proj=2)
    big = arrays(node, 6, 3, 2, hout, rows)
    check_kernel(node, big, rtol=1e-4, atol=1e-5)
    check_kernel(node, arrays(node, 2, 1, 2, hout, rows), big, rtol=1e-4, atol=1e-5)


def test_only_the_outputs_asked_for():
    node, hout, rows = rnn_node("GRU", 2, True, False, 0, 1)
    check_kernel(node, arrays(node, 5, 2, 0, hout, rows), rtol=1e-4, atol=1e-5)


def test_float32_runs_the_kernel_not_the_reference():
    node, hout, rows = rnn_node("LSTM", 1, False, False, 0, 3)
    fn, _ = build_kernel(node, infos_of(arrays(node, 5, 2, 0, hout, rows), node=node))
    assert not getattr(fn, "is_fallback", False)


def test_float64_runs_through_the_reference_path():
    node, hout, rows = rnn_node("GRU", 1, True, False, 1, 2)
    xs = [a.astype(np.float64) for a in arrays(node, 4, 2, 1, hout, rows)]
    check_kernel(node, xs, rtol=1e-6, atol=1e-7)


def test_kernel_allocates_no_temporaries():
    node, hout, rows = rnn_node("LSTM", 2, True, True, 2, 3, hid=32)
    xs = arrays(node, 20, 4, 2, hout, rows, hid=32)
    assert kernel_peak_bytes(node, xs) < 16 * 1024
