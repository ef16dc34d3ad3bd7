"""Writes tests/fixtures/ops/attention.npz: PyTorch's attention on long sequences (more keys than one tile of the
fused CPU kernel), with causal, boolean and additive masks and rows whose every key is masked, both as
F.scaled_dot_product_attention gives them (zeros) and as an explicit softmax / nn.MultiheadAttention gives them
(NaN). One head of width 4 keeps the file small.

Run with the dev environment (torch): `.venv-dev/bin/python tools/make_attention_goldens.py`.
Each case `c` is stored as `c/op`, `c/params` (JSON), `c/in<i>`, `c/out0` (the layout of make_op_goldens_nonspatial.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "ops" / "attention.npz"
RNG = np.random.default_rng(20261125)
CASES: dict[str, np.ndarray] = {}


def case(name: str, inputs: list[np.ndarray], out: torch.Tensor, params: dict) -> None:
    CASES[f"{name}/op"] = np.array("Attention")
    CASES[f"{name}/params"] = np.array(json.dumps(params))
    for i, a in enumerate(inputs):
        CASES[f"{name}/in{i}"] = a
    CASES[f"{name}/out0"] = out.numpy()


def qkv(L: int, S: int, d: int = 4) -> list[np.ndarray]:
    """Values on a 1/32 grid: exact in float32 and they compress."""
    return [(np.round(RNG.standard_normal((1, 1, n, d)) * 64) / 32).astype(np.float32) for n in (L, S, S)]


def t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a)


def explicit(q, k, v, mask: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(d) + mask) v written out, as timm / Hugging Face eager code and torch's MHA compute it."""
    s = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    return (s + mask).softmax(-1) @ v


def main() -> None:
    q, k, v = qkv(1100, 1100)
    case("long_causal", [q, k, v], F.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=True),
         {"is_causal": True})

    q, k, v = qkv(300, 1300)
    # structured (padded keys, a band per query, three queries with nothing to attend to) so it compresses
    keys = np.arange(1300)
    keep = (keys[None, :] < 1200) & (np.abs(keys[None, :] - np.arange(300)[:, None]) % 7 != 3)
    keep[[0, 117, 299]] = False
    sdpa = F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=t(keep))
    case("long_bool_dead_rows_sdpa", [q, k, v, keep], sdpa, {"masked_rows": "zero"})
    additive = np.where(keep, 0.0, -np.inf).astype(np.float32)
    case("long_bool_dead_rows_softmax", [q, k, v, keep], explicit(t(q), t(k), t(v), t(additive)),
         {"masked_rows": "nan"})
    case("long_additive_dead_rows_softmax", [q, k, v, additive], explicit(t(q), t(k), t(v), t(additive)),
         {"masked_rows": "nan"})

    q, k, v = qkv(40, 2600)
    bias = (RNG.standard_normal((1, 2600)) * 3).astype(np.float32)  # a finite additive mask over many key tiles
    case("many_key_tiles_bias", [q, k, v, bias], F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=t(bias)),
         {})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **CASES)
    print(f"wrote {len(CASES)} arrays to {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
