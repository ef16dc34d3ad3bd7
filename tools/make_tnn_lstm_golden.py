"""Writes tests/fixtures/tnn/lstm_golden.npz: torch.nn.LSTM outputs with the weights in ONNX/TNN layout.

TNN's LSTMONNX takes ONNX LSTM weights (gates i, o, f, c); torch orders them i, f, g(c), o. Run with the dev
environment: `.venv-dev/bin/python tools/make_tnn_lstm_golden.py`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "tnn" / "lstm_golden.npz"
TORCH_TO_ONNX = [0, 3, 1, 2]  # i f g o -> i o f g


def onnx_layout(lstm: torch.nn.LSTM, dirs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    def gates(t: torch.Tensor) -> np.ndarray:
        chunks = t.detach().numpy().reshape(4, lstm.hidden_size, *t.shape[1:])
        return chunks[TORCH_TO_ONNX].reshape(4 * lstm.hidden_size, *t.shape[1:])

    suffixes = ["", "_reverse"][:dirs]
    w = np.stack([gates(getattr(lstm, f"weight_ih_l0{s}")) for s in suffixes])
    r = np.stack([gates(getattr(lstm, f"weight_hh_l0{s}")) for s in suffixes])
    b = np.stack([np.concatenate([gates(getattr(lstm, f"bias_ih_l0{s}")), gates(getattr(lstm, f"bias_hh_l0{s}"))])
                  for s in suffixes])
    return w, r, b


def main() -> None:
    torch.manual_seed(0)
    cases = {}
    for name, bidir in (("fwd", False), ("bi", True)):
        dirs = 2 if bidir else 1
        lstm = torch.nn.LSTM(input_size=6, hidden_size=5, bidirectional=bidir).eval()
        x = torch.randn(7, 2, 6)
        h0, c0 = torch.randn(dirs, 2, 5), torch.randn(dirs, 2, 5)
        with torch.no_grad():
            y, (hn, cn) = lstm(x, (h0, c0))
        w, r, b = onnx_layout(lstm, dirs)
        arrays = {"x": x, "h0": h0, "c0": c0, "y": y, "hn": hn, "cn": cn}
        cases.update({f"{name}/{k}": v.numpy() for k, v in arrays.items()})
        cases.update({f"{name}/w": w, f"{name}/r": r, f"{name}/b": b})
    np.savez(OUT, **{k: np.ascontiguousarray(v, dtype=np.float32) for k, v in cases.items()})
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
