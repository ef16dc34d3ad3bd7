"""Hand-written fixture networks: UNet, transformer encoder, a dynamic-shape net and a two-input net."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def _conv_bn_relu(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class UNet(nn.Module):
    """Classic UNet (double conv, maxpool down, ConvTranspose2d or upsample up, skip concat) with three levels."""

    def __init__(self, base: int = 8, classes: int = 3) -> None:
        super().__init__()
        self.enc1 = nn.Sequential(_conv_bn_relu(3, base), _conv_bn_relu(base, base))
        self.enc2 = nn.Sequential(_conv_bn_relu(base, base * 2), _conv_bn_relu(base * 2, base * 2))
        self.mid = nn.Sequential(_conv_bn_relu(base * 2, base * 4), _conv_bn_relu(base * 4, base * 4))
        self.pool = nn.MaxPool2d(2)
        self.up2 = nn.ConvTranspose2d(base * 4, base * 2, kernel_size=2, stride=2)
        self.dec2 = nn.Sequential(_conv_bn_relu(base * 4, base * 2), _conv_bn_relu(base * 2, base * 2))
        self.up1 = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.reduce1 = nn.Conv2d(base * 2, base, 1)
        self.dec1 = nn.Sequential(_conv_bn_relu(base * 2, base), _conv_bn_relu(base, base))
        self.head = nn.Conv2d(base, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        m = self.mid(self.pool(e2))
        d2 = self.dec2(torch.cat([self.up2(m), e2], dim=1))
        u1 = F.interpolate(self.reduce1(d2), scale_factor=2.0, mode="nearest")
        d1 = self.dec1(torch.cat([u1, e1], dim=1)) + self.up1(self.reduce1(d2))
        return self.head(d1)


class _Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class MhaBlock(nn.Module):
    """Pre-norm encoder block around nn.MultiheadAttention(batch_first=True)."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = _Mlp(dim, dim * 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class ManualAttnBlock(nn.Module):
    """Hand-written attention: qkv projection, reshape/permute, unbind, matmul, scale, softmax."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, dim * 3), nn.Linear(dim, dim)
        self.mlp = _Mlp(dim, dim * 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.qkv(self.ln1(x)).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * self.scale, dim=-1)
        y = torch.matmul(attn, v).transpose(1, 2).reshape(b, n, c)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class SdpaBlock(nn.Module):
    """Attention through F.scaled_dot_product_attention, q/k/v split with torch.chunk."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, dim * 3), nn.Linear(dim, dim)
        self.mlp = _Mlp(dim, dim * 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = torch.chunk(self.qkv(self.ln1(x)), 3, dim=-1)
        q, k, v = (t.reshape(b, n, self.heads, c // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class TransformerEncoder(nn.Module):
    """Token projection + learned position embedding, three encoder block styles, final LN, mean pool, head."""

    def __init__(self, in_dim: int = 16, dim: int = 32, heads: int = 4, tokens: int = 12, classes: int = 5) -> None:
        super().__init__()
        self.embed = nn.Linear(in_dim, dim)
        self.pos = nn.Parameter(torch.randn(1, tokens, dim) * 0.1)
        self.blocks = nn.Sequential(MhaBlock(dim, heads), ManualAttnBlock(dim, heads), SdpaBlock(dim, heads))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.blocks(self.embed(x) + self.pos))
        return self.head(x.mean(dim=1))


class DynamicSeg(nn.Module):
    """Exported with inputshape2 so batch, H and W stay dynamic.

    The decoder upsamples to the skip tensor's own spatial size (size from a tensor shape) and the dense head
    flattens with reshape(n, -1, c); a global branch gives a fixed-size vector per image.
    """

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.down = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU6())
        self.deep = nn.Sequential(nn.Conv2d(16, 16, 3, stride=2, padding=1), nn.Hardswish())
        self.fuse = nn.Conv2d(8 + 16 + 16, 6, 1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = self.stem(x)
        d = self.down(s)
        e = self.deep(d)
        up_d = F.interpolate(d, size=s.shape[2:], mode="bilinear", align_corners=False)
        up_e = F.interpolate(e, size=(s.size(2), s.size(3)), mode="nearest")
        y = torch.sigmoid(self.fuse(torch.cat([s, up_d, up_e], dim=1)))
        dense = y.permute(0, 2, 3, 1).reshape(y.size(0), -1, 6)
        pooled = self.pool(e).squeeze(3).squeeze(2)
        vec = self.fc(pooled) * torch.unsqueeze(pooled.mean(dim=1), 1)
        return dense, vec


class TwoInputs(nn.Module):
    """An f32 image and i64 token ids: conv features modulated by a mean token embedding."""

    def __init__(self, vocab: int = 50, dim: int = 8) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.conv = nn.Conv2d(4, dim, 3, padding=1)
        self.out = nn.Linear(dim, 6)

    def forward(self, image: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        t = self.emb(ids).mean(dim=1)
        f = self.conv(image) + t.view(t.size(0), -1, 1, 1) * 2.0
        pooled = torch.flatten(f, 2).mean(dim=2)
        return self.out(torch.relu(pooled))


class TinyViT(nn.Module):
    """ViT: conv patch embedding, class token expanded over the batch and concatenated, position embedding,
    torch's own nn.TransformerEncoderLayer (norm_first, GELU), class-token readout."""

    def __init__(self, patch: int = 8, dim: int = 32, depth: int = 2, heads: int = 4, classes: int = 10) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 0.2)
        self.pos_embed = nn.Parameter(torch.randn(1, 1 + (32 // patch) ** 2, dim) * 0.1)
        layer = nn.TransformerEncoderLayer(
            dim, heads, dim * 2, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, depth, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.patch_embed(x).flatten(2).transpose(1, 2)
        cls = self.cls_token.expand(x.shape[0], -1, -1)
        h = self.encoder(torch.cat([cls, tokens], dim=1) + self.pos_embed)
        return self.head(self.norm(h)[:, 0])


def _conv_bn_silu(cin: int, cout: int, k: int = 1, s: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, s, k // 2, bias=False), nn.BatchNorm2d(cout), nn.SiLU())


class _C3(nn.Module):
    """YOLOv5 CSP block: two 1x1 branches, residual bottlenecks on one, concat, 1x1 fuse."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        mid = cout // 2
        self.cv1, self.cv2 = _conv_bn_silu(cin, mid), _conv_bn_silu(cin, mid)
        self.m = nn.Sequential(_conv_bn_silu(mid, mid), _conv_bn_silu(mid, mid, 3))
        self.cv3 = _conv_bn_silu(2 * mid, cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.cv1(x)
        return self.cv3(torch.cat([a + self.m(a), self.cv2(x)], dim=1))


class TinyYolo(nn.Module):
    """YOLOv5-style detector: Focus space-to-depth slicing, C3 blocks, SPPF (chained 5x5 max pools), a
    nearest-upsample FPN and a decoding head (view/permute, sigmoid, grid and anchor arithmetic)."""

    def __init__(self, classes: int = 3, anchors: int = 2) -> None:
        super().__init__()
        self.na, self.no = anchors, classes + 5
        self.focus = _conv_bn_silu(12, 16, 3)
        self.down1, self.c3_1 = _conv_bn_silu(16, 32, 3, 2), _C3(32, 32)
        self.down2, self.c3_2 = _conv_bn_silu(32, 64, 3, 2), _C3(64, 64)
        self.sppf_in, self.sppf_out = _conv_bn_silu(64, 32), _conv_bn_silu(128, 64)
        self.pool = nn.MaxPool2d(5, 1, 2)
        self.lateral, self.c3_up = _conv_bn_silu(64, 32), _C3(64, 32)
        self.heads = nn.ModuleList([nn.Conv2d(32, anchors * self.no, 1), nn.Conv2d(64, anchors * self.no, 1)])
        self.register_buffer("anchor_wh", torch.tensor([[[10.0, 13.0]], [[16.0, 30.0]]]).view(1, 2, 1, 1, 2))

    def _decode(self, i: int, x: torch.Tensor, stride: float) -> torch.Tensor:
        b, _, h, w = x.shape
        p = self.heads[i](x).view(b, self.na, self.no, h, w).permute(0, 1, 3, 4, 2).contiguous().sigmoid()
        ys = torch.arange(h, dtype=torch.float32).view(1, 1, h, 1, 1).expand(1, 1, h, w, 1)
        xs = torch.arange(w, dtype=torch.float32).view(1, 1, 1, w, 1).expand(1, 1, h, w, 1)
        xy = (p[..., 0:2] * 2.0 - 0.5 + torch.cat([xs, ys], dim=-1)) * stride
        wh = (p[..., 2:4] * 2.0) ** 2 * self.anchor_wh * (stride / 8.0)
        return torch.cat([xy, wh, p[..., 4:]], dim=-1).view(b, -1, self.no)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]], dim=1)
        p3 = self.c3_1(self.down1(self.focus(x)))
        p4 = self.c3_2(self.down2(p3))
        s = self.sppf_in(p4)
        s1 = self.pool(s)
        s2 = self.pool(s1)
        p4 = self.sppf_out(torch.cat([s, s1, s2, self.pool(s2)], dim=1))
        up = F.interpolate(self.lateral(p4), scale_factor=2.0, mode="nearest")
        p3 = self.c3_up(torch.cat([up, p3], dim=1))
        dets = torch.cat([self._decode(0, p3, 8.0), self._decode(1, p4, 16.0)], dim=1)
        return dets, p4
