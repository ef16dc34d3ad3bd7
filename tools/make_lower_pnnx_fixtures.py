"""Writes tests/fixtures/pnnx_lower/<case>/: tiny real pnnx exports of the constructs lower_pnnx has to map
(MultiheadAttention variants, conv padding forms, slices/selects, splits, resize modes, reductions, ...), each
with its inputs and PyTorch outputs.

Run with the dev environment (torch + pnnx): `.venv-dev/bin/python tools/make_lower_pnnx_fixtures.py [case ...]`.
Each case folder holds model.pnnx.param, model.pnnx.bin and io.npz (in0.., out0..).
"""

from __future__ import annotations

import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "pnnx_lower"
PNNX = Path(sys.executable).parent / "pnnx"
torch.manual_seed(0)  # before the modules below are built: their weights are part of the fixtures


class MhaSelf(nn.Module):  # sequence-first, q = k = v: one input, packed in_proj
    def __init__(self):
        super().__init__()
        self.m = nn.MultiheadAttention(16, 4)

    def forward(self, x):
        return self.m(x, x, x, need_weights=False)[0]


class MhaSelfBatchFirst(nn.Module):  # batch-first self-attention: torch's fused MHA fast path when traced
    def __init__(self):
        super().__init__()
        self.m = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x):
        return self.m(x, x, x, need_weights=False)[0]


class MhaCross(nn.Module):  # batch-first, kdim/vdim: separate projection weights, float mask input
    def __init__(self):
        super().__init__()
        self.m = nn.MultiheadAttention(16, 4, kdim=8, vdim=12, batch_first=True)

    def forward(self, q, k, v, mask):
        return self.m(q, k, v, attn_mask=mask, need_weights=False)[0]


class MhaKV(nn.Module):  # sequence-first, key = value, bool mask input
    def __init__(self):
        super().__init__()
        self.m = nn.MultiheadAttention(8, 2)

    def forward(self, q, kv, mask):
        return self.m(q, kv, kv, attn_mask=mask, need_weights=False)[0]


class MhaKeyPadding(nn.Module):  # key_padding_mask (N, S): pnnx writes it like an attn_mask
    def __init__(self, batch_first: bool):
        super().__init__()
        self.m = nn.MultiheadAttention(8, 2, batch_first=batch_first)

    def forward(self, q, kv, mask):
        return self.m(q, kv, kv, key_padding_mask=mask, need_weights=False)[0]


class ResizesExact(nn.Module):  # mode="nearest-exact": pixel-centre sampling
    def __init__(self):
        super().__init__()
        self.up = nn.Upsample(scale_factor=3, mode="nearest-exact")

    def forward(self, x):
        return (F.interpolate(x, size=(5, 7), mode="nearest-exact"),
                F.interpolate(x, scale_factor=(1.7, 0.6), mode="nearest-exact"), self.up(x))


class Convs(nn.Module):
    def __init__(self):
        super().__init__()
        self.same = nn.Conv2d(3, 4, (4, 3), padding="same", dilation=(2, 1))
        self.refl = nn.Conv2d(4, 4, 3, padding=2, padding_mode="replicate", groups=2, bias=False)
        self.c1 = nn.Conv1d(4, 6, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x):
        y = self.refl(F.hardtanh(self.same(x), -0.5, 0.5))
        z = self.c1(y.flatten(2))
        return self.up(F.mish(y)), F.softplus(z, beta=2.0)


class Cuts(nn.Module):
    def forward(self, x):
        a = x[:, 1, 2:5]  # slice with a select
        b = x[..., ::2].select(2, -1)
        c0, c1, c2 = torch.split(x, 3, dim=1)
        d = torch.chunk(x, 3, dim=3)
        m, i = torch.max(x, dim=1, keepdim=True)
        e = torch.cat([c0 * 2, c2], 1).repeat(1, 1, 2, 1)
        return a, b, c1 + d[2].sum(), m * i.float(), e, torch.argmax(x, dim=-1)


class RunTimeSlices(nn.Module):  # slice bounds computed from the input's (dynamic) shape
    def forward(self, x):
        h, w = x.size(2), x.size(3)
        return x[:, :, :h // 2], x[:, :, 1:h - 1, w // 3:w - 1:2], x[:, :, -(h // 2):]


class Resizes(nn.Module):
    def forward(self, x):
        a = F.interpolate(x, scale_factor=2, mode="nearest")
        b = F.interpolate(x, size=(5, 7), mode="bicubic", align_corners=False)
        c = F.interpolate(x, scale_factor=(1.5, 2.0), mode="bilinear", align_corners=False)
        d = F.pixel_shuffle(torch.cat([x, x], 1), 2)
        return a, b, c, F.pad(d, (1, 0, 2, 1), mode="replicate")


class ResizesRecompute(nn.Module):  # written as F.interpolate with recompute_scale_factor=True
    def forward(self, x):
        return (F.interpolate(x, scale_factor=1.5, mode="bilinear", recompute_scale_factor=True),
                F.interpolate(x, scale_factor=(1.7, 0.6), mode="nearest", recompute_scale_factor=True))


class Misc(nn.Module):
    def __init__(self):
        super().__init__()
        self.mp, self.ap, self.aap = nn.MaxPool1d(3, 2, 1), nn.AvgPool1d(2), nn.AdaptiveAvgPool1d(4)
        self.unshuffle, self.ct = nn.PixelUnshuffle(2), nn.ConvTranspose1d(4, 2, 3, stride=2, padding=1)

    def forward(self, x, y):
        a = F.normalize(x, dim=1) + torch.where(x > 0.1, x, y) + x.masked_fill(y < 0, 2.0)
        b = self.mp(x) + self.aap(self.ap(x)).sum(-1, keepdim=True)
        c = torch.logical_not(x > y).float() + torch.norm(x, dim=-1, keepdim=True)
        d = self.unshuffle(x.reshape(1, 1, 4, 6))
        e = torch.flip(x, [1]) + torch.roll(x, (1, -2), (2, 1))
        return a, b, c, d, e, self.ct(x), x.expand(2, 4, 6) + torch.tile(y, (1, 2, 1))[:, :4]


class Einsums(nn.Module):
    def forward(self, q, k):
        s = torch.einsum("bhid,bhjd->bhij", q, k)
        o = torch.einsum("bhij,bhjd->bhid", s.softmax(-1), k)
        return o, torch.einsum("bhid->bhdi", q), torch.einsum("bhij,bhjd->bdhi", s, k)


class Encoder(nn.Module):  # eval-mode fast path: traced as aten::_transformer_encoder_layer_fwd
    def __init__(self, norm_first: bool, activation: str):
        super().__init__()
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, activation=activation, batch_first=True,
                                           norm_first=norm_first)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, x):
        return self.enc(x)


class TimmAttention(nn.Module):  # timm's Attention with fused_attn off: q scaled first, q @ k.transpose(-2, -1)
    def __init__(self, dim: int = 16, heads: int = 2):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv, self.proj = nn.Linear(dim, dim * 3), nn.Linear(dim, dim)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


class HfSelfAttention(nn.Module):  # Hugging Face BERT's eager attention: / sqrt(d), + extended mask, softmax, dropout
    def __init__(self, dim: int = 16, heads: int = 4):
        super().__init__()
        self.heads, self.d = heads, dim // heads
        self.q, self.k, self.v = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.drop = nn.Dropout(0.1)

    def split(self, x):
        return x.view(x.shape[0], x.shape[1], self.heads, self.d).permute(0, 2, 1, 3)

    def forward(self, x, mask):
        q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d)
        scores = scores + (1.0 - mask[:, None, None, :]) * torch.finfo(torch.float32).min
        probs = self.drop(F.softmax(scores, dim=-1))
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        return ctx.view(x.shape[0], x.shape[1], -1)


class WindowAttention(nn.Module):  # Swin's windows: a learned relative position bias (heads, N, N) on the scores
    def __init__(self, dim: int = 8, heads: int = 2, tokens: int = 9):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv, self.bias = nn.Linear(dim, dim * 3), nn.Parameter(torch.randn(heads, tokens, tokens))

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * self.scale) @ k.transpose(-2, -1) + self.bias.unsqueeze(0)
        return (attn.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, n, c)


CASES = {
    "mha_self": (MhaSelf(), [(5, 2, 16)]),
    "mha_cross": (MhaCross(), [(2, 5, 16), (2, 7, 8), (2, 7, 12), (5, 7)]),
    "mha_kv_boolmask": (MhaKV(), [(4, 3, 8), (6, 3, 8), "bool(4,6)"]),
    "convs": (Convs(), [(1, 3, 9, 10)]),
    "cuts": (Cuts(), [(2, 9, 6, 8)]),
    "resizes": (Resizes(), [(1, 2, 4, 6)]),
    "misc": (Misc(), [(1, 4, 6), (1, 4, 6)]),
    "encoder_post_norm": (Encoder(False, "gelu"), [(2, 5, 16)]),
    "encoder_pre_norm": (Encoder(True, "relu"), [(2, 5, 16)]),
    "mha_self_batch_first": (MhaSelfBatchFirst(), [(2, 5, 16)]),
    "einsums": (Einsums(), [(1, 2, 5, 4), (1, 2, 5, 4)]),
    "resizes_recompute": (ResizesRecompute(), [(1, 2, 5, 7)]),
}
# Exported with a second input shape too (dims that differ become dynamic); io2.npz holds a run at that shape.
DYNAMIC = {
    "mha_self_dynamic": (MhaSelf(), [(5, 2, 16)], [(7, 3, 16)]),
    "cuts_dynamic": (Cuts(), [(2, 9, 6, 8)], [(3, 9, 5, 8)]),
    "resizes_recompute_dynamic": (ResizesRecompute(), [(1, 2, 5, 7)], [(1, 2, 9, 6)]),
    "slices_run_time_dynamic": (RunTimeSlices(), [(1, 3, 8, 10)], [(2, 3, 5, 13)]),
}

# Cases added later: built and exported last, so a full run leaves the weights and inputs of the ones above as
# they were.
ADDED = {
    "mha_key_padding_bool": (MhaKeyPadding(True), [(3, 5, 8), (3, 6, 8), "bool(3,6)"]),
    "mha_key_padding_float": (MhaKeyPadding(False), [(4, 2, 8), (6, 2, 8), (2, 6)]),
    "resizes_nearest_exact": (ResizesExact(), [(1, 2, 9, 11)]),
    "attention_timm": (TimmAttention(), [(2, 7, 16)]),
    "attention_hf_eager": (HfSelfAttention(), [(2, 6, 16), "padding(2,6)"]),
    "attention_windows": (WindowAttention(), [(4, 9, 8)]),
}


def make_input(spec, rng) -> np.ndarray:
    if isinstance(spec, str) and spec.startswith("padding"):  # Hugging Face's attention_mask: 1 keep, 0 padding
        n, s = (int(v) for v in spec[8:-1].split(","))
        return (np.arange(s)[None, :] < rng.integers(2, s + 1, size=(n, 1))).astype(np.float32)
    if isinstance(spec, str):  # a bool mask that never masks a whole row
        shape = tuple(int(s) for s in spec[5:-1].split(","))
        m = rng.random(shape) > 0.6
        m[..., 0] = False
        return m
    return rng.standard_normal(spec).astype(np.float32)


def shape_arg(xs: list[np.ndarray]) -> str:
    return ",".join("[" + ",".join(map(str, x.shape)) + "]" + ("bool" if x.dtype == bool else "f32") for x in xs)


def run_torch(model: nn.Module, xs: list[np.ndarray]) -> dict[str, np.ndarray]:
    with torch.no_grad():
        outs = model(*(torch.from_numpy(x) for x in xs))
    outs = outs if isinstance(outs, tuple) else (outs,)
    return {f"in{i}": x for i, x in enumerate(xs)} | {f"out{i}": o.numpy() for i, o in enumerate(outs)}


def export(name: str, model: nn.Module, specs: list, rng, specs2: list | None = None) -> None:
    model.eval()
    xs = [make_input(s, rng) for s in specs]
    xs2 = None if specs2 is None else [make_input(s, rng) for s in specs2]
    with tempfile.TemporaryDirectory() as tmp:
        pt = Path(tmp) / "model.pt"
        # under no_grad, as inference code runs, eval-mode transformer layers take torch's fused fast paths
        with torch.no_grad():
            torch.jit.trace(model, tuple(torch.from_numpy(x) for x in xs), check_trace=False).save(str(pt))
        cmd = [str(PNNX), str(pt), f"inputshape={shape_arg(xs)}"]
        if xs2 is not None:
            cmd.append(f"inputshape2={shape_arg(xs2)}")
        subprocess.run(cmd, cwd=tmp, check=True, capture_output=True)
        dst = OUT / name
        dst.mkdir(parents=True, exist_ok=True)
        for suffix in (".pnnx.param", ".pnnx.bin"):
            shutil.copy(Path(tmp) / f"model{suffix}", dst / f"model{suffix}")
    np.savez_compressed(OUT / name / "io.npz", **run_torch(model, xs))
    if xs2 is not None:
        np.savez_compressed(OUT / name / "io2.npz", **run_torch(model, xs2))
    print(name, "exported")


def main(only: set[str]) -> None:
    """Exports every case, or only the named ones (their random inputs then differ from a full run's)."""
    rng = np.random.default_rng(20261122)
    for name, (model, specs) in CASES.items():
        if not only or name in only:
            export(name, model, specs, rng)
    for name, (model, specs, specs2) in DYNAMIC.items():
        if not only or name in only:
            export(name, model, specs, rng, specs2)
    for name, (model, specs) in ADDED.items():  # last: the inputs of the cases above stay as they were
        if not only or name in only:
            export(name, model, specs, rng)


if __name__ == "__main__":
    main(set(sys.argv[1:]))
