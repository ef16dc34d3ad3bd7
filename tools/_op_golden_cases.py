"""The cases tools/make_pnnx_op_goldens.py exports: name -> Case(module factory, input specs[, second specs for
dynamic dims]). Input specs: a shape (float32 normal), ("i64", shape, high), ("bool", shape), ("f16", shape),
("perm", shape) (distinct float32 values)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

Spec = tuple


@dataclass
class Case:
    build: Callable[[], nn.Module]
    inputs: list[Spec]
    inputs2: list[Spec] | None = None
    model: nn.Module | None = None


# -- tied and shared weights ---------------------------------------------------------------------------------------
class TiedEmbeddingHead(nn.Module):  # the embedding owns the weight; the LM head shares it (GPT-2, T5, BERT)
    def __init__(self):
        super().__init__()
        self.emb, self.ln, self.head = nn.Embedding(11, 8), nn.LayerNorm(8), nn.Linear(8, 11, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.ln(self.emb(ids)))


class TiedHeadOwns(nn.Module):  # the head owns it; the embedding's weight arrives as an extra operand
    def __init__(self):
        super().__init__()
        self.head, self.emb = nn.Linear(8, 11, bias=False), nn.Embedding(11, 8)
        self.emb.weight = self.head.weight

    def forward(self, ids):
        return self.head(torch.tanh(self.emb(ids)))


class TiedTwoEmbeddings(nn.Module):
    def __init__(self):
        super().__init__()
        self.e1, self.e2 = nn.Embedding(11, 8), nn.Embedding(11, 8)
        self.e2.weight = self.e1.weight

    def forward(self, a, b):
        return self.e1(a) + self.e2(b)


class FunctionalEmbedding(nn.Module):  # F.embedding on a weight computed at run time
    def forward(self, ids, table):
        return F.embedding(ids, table * 2.0), F.embedding(ids[:, -1:], table)


# -- issue 18's refusals ----------------------------------------------------------------------------------------
class GRN(nn.Module):  # ConvNeXt-V2's global response norm, channels last, timm's addcmul form
    def __init__(self):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.randn(6)), nn.Parameter(torch.randn(6))

    def forward(self, x):
        gx = x.norm(p=2, dim=(1, 2), keepdim=True)
        nx = gx / (gx.mean(dim=-1, keepdim=True) + 1e-6)
        return x + torch.addcmul(self.bias, self.weight, x * nx)


class Addcmul(nn.Module):
    def forward(self, x, a, b):
        return torch.addcmul(x, a, b, value=-0.75), torch.addcmul(x, a, b)


class Conv1D(nn.Module):  # GPT-2's Conv1D: weight (in, out), addmm on the flattened rows
    def __init__(self, nx: int, nf: int):
        super().__init__()
        self.nf = nf
        self.weight, self.bias = nn.Parameter(torch.randn(nx, nf) * 0.2), nn.Parameter(torch.randn(nf))

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size_out)


class Gpt2Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.proj = Conv1D(8, 16), Conv1D(16, 8)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Addmm(nn.Module):  # run-time operands, alpha and beta, a broadcast row
    def forward(self, bias, a, b):
        return torch.addmm(bias, a, b, beta=0.5, alpha=-2.0), torch.addmm(bias[0], a, b)


class Baddbmm(nn.Module):
    def forward(self, x, a, b):
        return torch.baddbmm(x, a, b, beta=0.25, alpha=1.5), torch.baddbmm(x[:1], a, b)


class ShapeAs(nn.Module):  # LeViT's reshape_as; expand_as; type_as both ways
    def forward(self, x, y, ids):
        return (x.reshape_as(y), x[:, :1].expand_as(x), x.type_as(ids), ids.type_as(x) * 0.5,
                (x > 0).type_as(x))


class RMSNorms(nn.Module):  # T5 / LLaMA: nn.RMSNorm with and without eps and affine, and F.rms_norm
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.RMSNorm(8, eps=1e-6), nn.RMSNorm([4, 8], elementwise_affine=False)
        with torch.no_grad():
            self.a.weight.uniform_(0.5, 1.5)
        self.w = nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x):
        return self.a(x), self.b(x), F.rms_norm(x * 3.0, (8,), self.w, 1e-5)


class LlamaRMSNorm(nn.Module):  # the hand-written form (pow, mean, rsqrt) HF LLaMA uses
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + 1e-6))


class SliceCopyPnnx(nn.Module):  # pnnx's own tools/pnnx/tests/test_Tensor_slice_copy.py, smaller shapes
    def forward(self, x, y, z, w):
        x, y, z, w = x.clone(), y.clone(), z.clone(), w.clone()
        xx = x[8]
        x[2:10, ...] += 1
        xx[..., 1] = xx[..., -1] * 3
        x1 = x.clone()
        xxx = x[2:-1, 5, ...]
        x[:, :, 3, ::2].clamp_(0, 0.5)
        xx[:, 3, ::2] = xx[:, 4, 1::2].exp_()
        x[:, :, ::2, :] = x1[:, :, ::2, :].pow(2)
        xxx[:, :, :] /= 2
        y[..., -1, -5:-1] = y[..., -4, 1:5] - 11
        z[:1] = z[-1:] * z[3:4]
        w[40::2] = w[4:44:4] + 23
        return x, y, z, w


class YoloDecode(nn.Module):  # in-place writes on slices of an activation, then a view (YOLOv5's Detect)
    def forward(self, x):
        y = x.sigmoid()
        y[..., 0:2] = y[..., 0:2] * 2.0 - 0.5
        y[..., 2:4] = (y[..., 2:4] * 2) ** 2
        return y.view(1, -1, 6)


class WriteAliasing(nn.Module):  # views taken before and after in-place writes that overlap them
    def forward(self, x):
        a = x * 1.0
        before = a[:, 1] * 1.0
        a[:, 1] = 7.0
        after = a[:, 0:2]
        b = x * 1.0
        v = b[:, :2]
        v.mul_(2.0)
        return a, before, after * 1.0, b


class Scatters(nn.Module):  # torch.slice_scatter / select_scatter, a filled slice, a cast into int64
    def forward(self, x, y, ids):
        a = torch.slice_scatter(x, y[:, :2], dim=1, start=1, end=5, step=2)
        b = torch.select_scatter(x, y[:, 0], 1, -1)
        c = x.clone()
        c[:, 1:3] = 4.0
        d = ids.clone()
        d[:, :2] = y[:, :2] * 3.0  # a float source into an int64 tensor: truncated, as torch does
        return a, b, c, d


class IndexPuts(nn.Module):
    def forward(self, x, y, idx, m):
        a = x.clone()
        a[idx] = y[0]
        b = x.clone()
        b[m] = 0.5
        c = x.index_put((idx,), y[:2], accumulate=True)
        d = x.clone()
        d[idx, idx] = -1.0
        return a, b, c, d


class MaskedFills(nn.Module):
    def forward(self, x, m, ids):
        a = x.masked_fill(m, float("-inf"))
        b = x.masked_fill(m[:1], x[0, 0])  # a 0-d tensor value, a broadcast mask
        c = x.clone()
        c.masked_fill_(x > 0.5, 3.0)
        d = ids.masked_fill(m, -7)
        return a, b, c, d


class Creation(nn.Module):  # arange / zeros / ones / full / new_* / *_like with sizes from the input's shape
    def forward(self, x, ids):
        n, s = x.size(0), x.size(1)
        return (torch.arange(s), torch.arange(1, s, 2, dtype=torch.float32) * 0.5, torch.zeros(n, s) + x,
                torch.ones(s, s, dtype=torch.bool).tril(), torch.full((n, s), 1.5) * x, x.new_zeros((2, s)) + 1,
                x.new_ones(n, 3), torch.zeros_like(x, dtype=torch.int64), torch.ones_like(ids),
                torch.full_like(x, -2.0), torch.arange(s).unsqueeze(0).expand(n, s) + ids)


class Gathers(nn.Module):
    def forward(self, x, idx, ids):
        return (torch.gather(x, -1, idx), torch.gather(x, 0, idx[:2]), torch.index_select(x, 1, ids),
                torch.index_select(x, -2, ids[:1]))


class Scans(nn.Module):
    def forward(self, x, ids, m):
        return torch.cumsum(x, dim=1), torch.cumsum(ids, -1), torch.cumsum(m, 0), torch.cumsum(x, 0)


class TopKs(nn.Module):
    def forward(self, x):
        v, i = torch.topk(x, 3, dim=-1)
        v2, i2 = torch.topk(x, 2, dim=0, largest=False)
        return v, i, v2, i2


class Repeats(nn.Module):
    def forward(self, x):
        return torch.repeat_interleave(x, 2, dim=0), x.repeat_interleave(3, dim=-1), torch.repeat_interleave(x, 2)


class Transposes(nn.Module):
    def forward(self, x, v):
        return x.t(), torch.t(x) * 2, v.t() + 1


class Activations(nn.Module):  # functional and module forms
    def __init__(self):
        super().__init__()
        self.glu, self.ls, self.ss, self.selu, self.celu = nn.GLU(1), nn.LogSigmoid(), nn.Softsign(), nn.SELU(), \
            nn.CELU(0.5)

    def forward(self, x):
        x = x * 4.0
        return (F.glu(x, dim=-1), F.logsigmoid(x), F.softsign(x), F.selu(x), F.celu(x, 1.3), self.glu(x),
                self.ls(x), self.ss(x), self.selu(x), self.celu(x))


class StdVar(nn.Module):
    def forward(self, x):
        return (torch.std(x, dim=1, keepdim=True), torch.var(x, dim=(0, 2), unbiased=False), torch.std(x),
                x.var(-1), torch.var(x, dim=-1, correction=0, keepdim=True))


class FunctionalConvs(nn.Module):  # F.conv_transpose1d / 2d and F.conv1d with parameter weights
    def __init__(self):
        super().__init__()
        self.w1, self.b1 = nn.Parameter(torch.randn(6, 4, 3) * 0.3), nn.Parameter(torch.randn(6))
        self.wt1 = nn.Parameter(torch.randn(4, 3, 3) * 0.3)
        self.wt2 = nn.Parameter(torch.randn(4, 2, 3, 3) * 0.3)

    def forward(self, x, x2):
        return (F.conv1d(x, self.w1, self.b1, stride=2, padding=1),
                F.conv_transpose1d(x, self.wt1, stride=2, padding=1, output_padding=1),
                F.conv_transpose2d(x2, self.wt2, stride=2, padding=1, groups=2))


class Volumetric(nn.Module):  # a video net's 3-D convolutions and poolings (R3D / X3D / SlowFast style)
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv3d(3, 4, 3, stride=(1, 2, 2), padding=1)
        self.temporal = nn.Conv3d(4, 4, (3, 1, 1), padding="same", dilation=(2, 1, 1), groups=2, bias=False)
        self.w = nn.Parameter(torch.randn(2, 4, 1, 2, 2) * 0.3)
        self.pool = nn.MaxPool3d((1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1))
        self.gap = nn.AdaptiveAvgPool3d(1)

    def forward(self, x):
        y = self.pool(torch.relu(self.stem(x)))
        y = y + self.temporal(y)
        return (self.gap(y).flatten(1),
                F.avg_pool3d(y, 2, ceil_mode=True),
                F.avg_pool3d(y, (1, 3, 3), stride=1, padding=(0, 1, 1), count_include_pad=False),
                F.max_pool3d(y, (2, 2, 2), stride=2, ceil_mode=True),
                F.adaptive_max_pool3d(y, (1, 3, 1)),
                F.conv3d(y, self.w, stride=(2, 1, 1), padding="valid"))


class Unfolds(nn.Module):  # im2col as T2T-ViT's soft split and local-attention blocks write it
    def __init__(self):
        super().__init__()
        self.split = nn.Unfold(3, padding=1, stride=2)

    def forward(self, x):
        return (self.split(x).transpose(1, 2),
                F.unfold(x, (2, 3), dilation=(2, 1), padding=(1, 0), stride=(1, 2)),
                F.unfold(x * 2.0, 1))


class EmptyDims(nn.Module):  # a zero-size region: a write that changes nothing (a cat with an empty slice hangs
    def forward(self, x):  # pnnx's converter)
        a = x.clone()
        a[:, 2:2] = 5.0
        return a, x[:, 1:1] + 1.0


class HalfOps(nn.Module):  # float16 operands as pnnx writes them (an in-model cast)
    def forward(self, x, m):
        h = x.half()
        return h.masked_fill(m, 0.0), torch.cumsum(h, 1).float(), h.type_as(x)


class MoreActivations(nn.Module):  # softmin, Softmax2d, the shrinks and Threshold
    def __init__(self):
        super().__init__()
        self.sm2d, self.hs, self.ss, self.ts = nn.Softmax2d(), nn.Hardshrink(0.3), nn.Softshrink(0.4), nn.Tanhshrink()
        self.th = nn.Threshold(0.1, -2.0)

    def forward(self, x):
        return (F.softmin(x, dim=1), self.sm2d(x), self.hs(x), F.hardshrink(x, 0.7), self.ss(x),
                F.softshrink(x, 0.2), self.ts(x), F.tanhshrink(x), self.th(x), F.threshold(x, -0.3, 5.0))


class Pads(nn.Module):  # the 1-D and 3-D padding modules
    def __init__(self):
        super().__init__()
        self.c1, self.r1, self.e1 = nn.ConstantPad1d((2, 1), 1.5), nn.ReflectionPad1d(2), nn.ReplicationPad1d((0, 3))
        self.c3, self.e3 = nn.ConstantPad3d(1, -1.0), nn.ReplicationPad3d((1, 0, 0, 1, 2, 0))

    def forward(self, x, v):
        return self.c1(x), self.r1(x), self.e1(x), self.c3(v), self.e3(v)


class Narrows(nn.Module):  # narrow, unflatten, mv, bitwise ops
    def forward(self, x, ids, m):
        return (torch.narrow(x, 1, 1, 3), x.narrow(-1, -3, 2), x.unflatten(1, (2, 3)), torch.mv(x, x[0]),
                torch.bitwise_and(ids, 6), ids.bitwise_or(ids.flip(0)), torch.bitwise_xor(m, m.flip(1)))


class IndexTensors(nn.Module):  # advanced indexing by run-time index tensors (pnnx Tensor.index with $expr)
    def forward(self, x, a, b, c, m, ids):
        rows = a.view(-1, 1)
        return (x[a], x[rows, b], x[a, c % 5, c], x[a - 4], x[a.int(), rows.int() % 5], m[rows, b], ids[a, c % 5],
                x[-1 - a, :, c], x[:, b], x[:, rows, b])


class IndexMask(nn.Module):  # transformers' padding mask: mask[batch_idx, kv_idx] with broadcast arange views
    def forward(self, x, mask):
        batch = torch.arange(mask.shape[0]).view(-1, 1, 1, 1)
        kv = torch.arange(mask.shape[1]).view(1, 1, 1, -1)
        last = x[torch.arange(x.shape[0]), mask.long().sum(1) - 1]  # CLIP's pooled token
        return mask.bool()[batch, kv], last


class IndexConstant(nn.Module):  # constant 1-D index tensors: pnnx writes them inline (expr=[[2,0],[1,-1]])
    def __init__(self):
        super().__init__()
        self.register_buffer("rows", torch.tensor([2, 0, -1]))
        self.register_buffer("cols", torch.tensor([1, -1, 3]))

    def forward(self, x):
        return x[self.rows, self.cols], x[self.rows] * 2.0


class RepeatQueries(nn.Module):  # DETR's object queries: a parameter repeated to the run-time batch
    def __init__(self):
        super().__init__()
        self.q = nn.Parameter(torch.randn(1, 4, 3))

    def forward(self, x):
        return x + self.q.repeat(x.shape[0], 1, 1), self.q.repeat(x.shape[0], 2, 1)


class Meshgrids(nn.Module):  # torch.meshgrid in a dynamic export: aten::meshgrid + prim::ListUnpack (2 to 4 items)
    def forward(self, x, a, b, c):
        h, w = x.shape[2], x.shape[3]
        gy, gx = torch.meshgrid(torch.arange(h).type_as(x) + 0.5, torch.arange(w).type_as(x) + 0.5, indexing="ij")
        p, q = torch.meshgrid(a, b, indexing="xy")
        r, s, t = torch.meshgrid(a, b * 2.0, c, indexing="xy")
        u, v, w3 = torch.meshgrid(a, b, c, indexing="ij")
        k0, k1, k2, k3 = torch.meshgrid(c, a, b, c - 1.0, indexing="ij")
        return (torch.stack((gx, gy), -1).view(-1, 2), p - q, r, s, t, u, v, w3, k0 + k1, k2 * k3,
                torch.meshgrid(torch.arange(w), torch.arange(h), indexing="xy")[1])


class AtenNewFull(nn.Module):  # x.new_full with a size from the input's shape: aten::new_full in a dynamic export
    def forward(self, x):
        n, h, w = x.shape[0], x.shape[2], x.shape[3]
        return (x.new_full((h * w, 1), 8.0), x.new_full((h, w + 1), 3, dtype=torch.int64),
                x.new_full((n, h), 1, dtype=torch.bool), x.new_full((w, n * 2), 5, dtype=torch.float32) + x[0, 0, 0, 0],
                x.new_full((n, 2, w), -1.5))


class AdaptivePoolNone(nn.Module):  # output_size with None (keep that dim), which pnnx writes as 0: CRNN heads
    def __init__(self):
        super().__init__()
        self.avg, self.max = nn.AdaptiveAvgPool2d((1, None)), nn.AdaptiveMaxPool2d((None, 3))

    def forward(self, x):
        return self.avg(x), F.adaptive_avg_pool2d(x, (None, 2)), self.max(x), F.adaptive_max_pool2d(x, (2, None))


# -- recurrent layers: every (directions, layers, batch_first) with and without an initial state -------------------
RNN_CONFIGS = [(bi, layers, bf) for bi in (False, True) for layers in (1, 2) for bf in (False, True)]
FEW_CONFIGS = [(False, 1, False, True), (True, 2, True, False), (True, 1, False, True), (False, 2, True, False),
               (True, 2, False, True), (True, 2, True, True)]  # (bidirectional, layers, batch_first, state)


class Recurrents(nn.Module):
    """One module per config and state use, each fed time-major `xt` (T, B, I) or batch-first `xb` (B, T, I);
    states are sliced from `h0` / `c0` (4, B, Hout). Without a state every output is returned (out, h_n[, c_n]);
    with one, alternately all of them and `out` alone (pnnx then writes one output). An LSTM without a projection
    returns `out` alone: its h_n and c_n cannot be told apart in the file."""

    def __init__(self, kind: str, configs, proj: int = 0, nonlinearity: str = "tanh"):
        super().__init__()
        self.kind, self.configs, self.proj = kind, list(configs), proj
        extra = {"proj_size": proj} if proj else ({"nonlinearity": nonlinearity} if kind == "RNN" else {})
        self.mods = nn.ModuleList(getattr(nn, kind)(3, 4, num_layers=layers, bidirectional=bi, batch_first=bf,
                                                    **extra)
                                  for bi, layers, bf, _ in self.configs)

    def forward(self, xt, xb, h0, c0):
        outs = []
        for k, (mod, (bi, layers, bf, state)) in enumerate(zip(self.mods, self.configs, strict=True)):
            x, rows = (xb if bf else xt), layers * (2 if bi else 1)
            if not state:
                res = mod(x)
            elif self.kind == "LSTM":
                res = mod(x, (h0[:rows], c0[:rows]))
            else:
                res = mod(x, h0[:rows])
            out, hn = res
            if state and (k // 2) % 2 or (self.kind == "LSTM" and not self.proj):  # h_n, c_n: same shape, and
                # pnnx lists the outputs in the order they are read: the engine refuses them (pnnx_export_bugs.md)
                outs.append(out)
            else:
                outs += [out, *(hn if self.kind == "LSTM" else (hn,))]
        return tuple(outs)


class RecurrentForms(nn.Module):
    """Forms beside the configs: no bias, dropout between layers (eval: none), only h_n read (pnnx then writes
    h_n as the line's one output), a GRU over an LSTM's output, the state passed as a keyword."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(3, 4, num_layers=2, bias=False, dropout=0.3)
        self.gru = nn.GRU(4, 5, bias=False, batch_first=True, bidirectional=True)
        self.rnn = nn.RNN(3, 4, num_layers=2, dropout=0.5, nonlinearity="relu")

    def forward(self, x, h0):
        y = self.lstm(x)[0]
        _, hg = self.gru(y.transpose(0, 1), hx=h0)
        _, hr = self.rnn(x)
        return y, hg, hr


class CrnnHead(nn.Module):  # an OCR model's sequence head: conv features -> (T, N, C) -> 2-layer BiLSTM -> classes
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.rnn = nn.LSTM(8, 6, num_layers=2, bidirectional=True)
        self.fc = nn.Linear(12, 5)

    def forward(self, img):
        f = torch.relu(self.conv(img)).mean(2).permute(2, 0, 1)
        return F.log_softmax(self.fc(self.rnn(f)[0]), dim=-1)


def _recurrents(kind: str, proj: int = 0, nonlinearity: str = "tanh", configs=None):
    configs = configs or [(*c, state) for c in RNN_CONFIGS for state in (True, False)]  # stateful lines first:
    # the input-check corpus samples the first line of each param set
    return lambda: Recurrents(kind, configs, proj, nonlinearity)


def _rnn_inputs(t: int, b: int, hout: int = 4) -> list[Spec]:
    return [(t, b, 3), (b, t, 3), (4, b, hout), (4, b, 4)]


CASES: dict[str, Case] = {
    "tied_embedding_head": Case(TiedEmbeddingHead, [("i64", (2, 5), 11)]),
    "tied_head_owns": Case(TiedHeadOwns, [("i64", (2, 5), 11)]),
    "tied_two_embeddings": Case(TiedTwoEmbeddings, [("i64", (2, 5), 11), ("i64", (5,), 11)]),
    "functional_embedding": Case(FunctionalEmbedding, [("i64", (2, 4), 10), (10, 3)]),
    "grn_addcmul": Case(GRN, [(2, 5, 4, 6)]),
    "addcmul": Case(Addcmul, [(3, 4), (3, 1), (1, 4)]),
    "gpt2_conv1d": Case(Gpt2Mlp, [(2, 5, 8)], [(2, 9, 8)]),
    "addmm": Case(Addmm, [(1, 5), (3, 4), (4, 5)]),
    "baddbmm": Case(Baddbmm, [(2, 3, 5), (2, 3, 4), (2, 4, 5)]),
    "shape_as": Case(ShapeAs, [(2, 6), (3, 4), ("i64", (2, 6), 9)]),
    "rms_norm": Case(RMSNorms, [(2, 3, 4, 8)]),
    "llama_rms_norm": Case(LlamaRMSNorm, [(2, 5, 8)], [(1, 7, 8)]),
    "slice_copy_pnnx": Case(SliceCopyPnnx, [(12, 7, 9, 10), (7, 9, 10), (9, 10), (60,)]),
    "yolo_decode": Case(YoloDecode, [(1, 3, 4, 6)]),
    "write_aliasing": Case(WriteAliasing, [(3, 4)]),
    "scatters": Case(Scatters, [(3, 6), (3, 6), ("i64", (3, 6), 50)]),
    "index_puts": Case(IndexPuts, [(3, 4), (3, 4), ("i64", (2,), 3), ("bool", (3, 4))]),
    "masked_fills": Case(MaskedFills, [(3, 4), ("bool", (3, 4)), ("i64", (3, 4), 9)]),
    "meshgrids": Case(Meshgrids, [(2, 3, 4, 6), (4,), (5,), (3,)], [(1, 3, 5, 7), (6,), (2,), (4,)]),
    "aten_new_full": Case(AtenNewFull, [(2, 3, 4, 6)], [(1, 3, 5, 7)]),
    "adaptive_pool_none": Case(AdaptivePoolNone, [(2, 3, 6, 8)], [(1, 3, 5, 7)]),
    "creation": Case(Creation, [(3, 4), ("i64", (3, 4), 5)], [(2, 6), ("i64", (2, 6), 5)]),
    "gathers": Case(Gathers, [(3, 5), ("i64", (3, 2), 3), ("i64", (4,), 5)]),
    "scans": Case(Scans, [(3, 5), ("i64", (3, 5), 7), ("bool", (3, 5))]),
    "topk": Case(TopKs, [("perm", (4, 6))]),
    "repeat_interleave": Case(Repeats, [(2, 3)]),
    "transposes": Case(Transposes, [(3, 5), (4,)]),
    "activations": Case(Activations, [(3, 6)]),
    "std_var": Case(StdVar, [(3, 4, 5)]),
    "functional_convs": Case(FunctionalConvs, [(2, 4, 7), (1, 4, 5, 5)]),
    "empty_dims": Case(EmptyDims, [(3, 4)]),
    "volumetric": Case(Volumetric, [(1, 3, 5, 9, 11)]),
    "unfolds": Case(Unfolds, [(1, 3, 7, 8)], [(2, 3, 7, 8)]),
    "half_ops": Case(HalfOps, [(3, 4), ("bool", (3, 4))]),
    "more_activations": Case(MoreActivations, [(2, 3, 4, 5)]),
    "pads": Case(Pads, [(2, 3, 6), (1, 2, 3, 4, 5)]),
    "narrows": Case(Narrows, [(6, 6), ("i64", (6, 6), 16), ("bool", (6, 6))]),
    "index_tensors": Case(IndexTensors, [(4, 5, 6), ("i64", (3,), 4), ("i64", (2,), 5), ("i64", (3,), 6),
                                         ("bool", (4, 5)), ("i64", (4, 5), 50)],
                          [(5, 5, 7), ("i64", (6,), 5), ("i64", (4,), 5), ("i64", (6,), 7), ("bool", (5, 5)),
                           ("i64", (5, 5), 50)]),
    "index_mask": Case(IndexMask, [(2, 6, 4), ("i64", (2, 6), 2)], [(3, 5, 4), ("i64", (3, 5), 2)]),
    "index_constant": Case(IndexConstant, [(4, 5, 2)]),
    "repeat_runtime": Case(RepeatQueries, [(2, 4, 3)], [(3, 4, 3)]),
    "lstm": Case(_recurrents("LSTM"), _rnn_inputs(5, 2), _rnn_inputs(8, 3)),
    "gru": Case(_recurrents("GRU"), _rnn_inputs(5, 2), _rnn_inputs(8, 3)),
    "rnn_tanh": Case(_recurrents("RNN"), _rnn_inputs(5, 2), _rnn_inputs(8, 3)),
    "rnn_relu": Case(_recurrents("RNN", nonlinearity="relu", configs=FEW_CONFIGS), _rnn_inputs(5, 2),
                     _rnn_inputs(8, 3)),
    "crnn_head": Case(CrnnHead, [(2, 3, 4, 9)], [(1, 3, 4, 13)]),
    "recurrent_forms": Case(RecurrentForms, [(5, 2, 3), (2, 2, 5)], [(7, 3, 3), (2, 3, 5)]),
    "lstm_proj": Case(_recurrents("LSTM", proj=2, configs=FEW_CONFIGS), _rnn_inputs(5, 2, hout=2),
                      _rnn_inputs(8, 3, hout=2)),
}
