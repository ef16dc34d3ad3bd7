"""Fixture networks that together exercise every op of issue 2 the architecture fixtures leave out ("misc_*")."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MiscActivations(nn.Module):
    """Activations, elementwise math, softmax/log_softmax and a raw nn.Parameter (pnnx.Attribute)."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.prelu = nn.PReLU(c)
        self.leaky = nn.LeakyReLU(0.15)
        self.elu = nn.ELU(alpha=0.7)
        self.gelu_tanh = nn.GELU(approximate="tanh")
        self.scale = nn.Parameter(torch.rand(1, c, 1, 1) + 0.5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = self.prelu(self.conv(x))
        b = self.leaky(x) + self.elu(x) * self.scale
        c = torch.tanh(a) - F.hardsigmoid(b) + nn.functional.hardswish(a * 0.5)
        d = F.silu(c) + self.gelu_tanh(b) + F.gelu(a)
        e = torch.sqrt(torch.abs(d) + 1e-3) * torch.exp(torch.neg(torch.clamp(d, min=-2.0, max=3.0)))
        f = torch.clamp(e, max=1.5) / (torch.sigmoid(d) + 1.0) - F.relu6(d * 4.0)
        return F.softmax(f, dim=1), F.log_softmax(f.flatten(2), dim=-1)


class MiscNormPool(nn.Module):
    """Normalisations that pnnx cannot fold and every pooling variant in the issue."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.bn_in = nn.BatchNorm2d(c)
        self.gn = nn.GroupNorm(4, c)
        self.inorm = nn.InstanceNorm2d(c, affine=True)
        self.inorm_plain = nn.InstanceNorm2d(c)
        self.ln = nn.LayerNorm(14)
        self.avg_pad = nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=True)
        self.avg_nopad = nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False)
        self.avg_ceil = nn.AvgPool2d(3, stride=2, ceil_mode=True)
        self.max_ceil = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        self.amax_pool = nn.AdaptiveMaxPool2d((4, 3))
        self.aavg_pool = nn.AdaptiveAvgPool2d((5, 3))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        x = torch.relu(self.bn_in(x))
        g = self.gn(x)
        i = self.inorm(x) + self.inorm_plain(x)
        n = self.ln(g + i)
        pools = (self.avg_pad(n), self.avg_nopad(n), self.max_ceil(n))
        p = torch.cat([pools[0] + pools[1], pools[2]], dim=1)
        return p, self.avg_ceil(n), self.amax_pool(n), self.aavg_pool(n)


class MiscConvResize(nn.Module):
    """Conv padding variants, dilation, groups, standalone F.pad modes, transposed convs and every resize form."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.same = nn.Conv2d(c, c, 3, padding="same")
        self.same_dil = nn.Conv2d(c, c, 3, padding="same", dilation=2, groups=2)
        self.reflect = nn.Conv2d(c, c, 3, padding=1, padding_mode="reflect")
        self.replicate = nn.Conv2d(c, c, (3, 5), padding=(1, 2), padding_mode="replicate", bias=False)
        self.dil_group = nn.Conv2d(c, 2 * c, 3, stride=2, padding=2, dilation=2, groups=4)
        self.deconv = nn.ConvTranspose2d(2 * c, c, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.deconv_plain = nn.ConvTranspose2d(c, 4, 4, stride=2, padding=1, bias=False)
        self.up_near = nn.Upsample(scale_factor=2, mode="nearest")
        self.up_size = nn.Upsample(size=(20, 14), mode="bilinear", align_corners=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = self.same(x) + self.same_dil(x)
        b = self.reflect(torch.relu(a)) + self.replicate(a)
        p = torch.relu(F.pad(b, (1, 2, 0, 1), mode="constant", value=0.5))
        q = torch.tanh(F.pad(b, (2, 1, 1, 2), mode="reflect"))
        r = torch.sigmoid(F.pad(b, (1, 1, 2, 0), mode="replicate"))
        down = self.dil_group(b)
        up = self.deconv(down)
        up2 = self.deconv_plain(up)
        i1 = F.interpolate(down, scale_factor=2.0, mode="bilinear", align_corners=False)
        i2 = F.interpolate(down, scale_factor=(2.0, 1.5), mode="bilinear", align_corners=True)
        i3 = F.interpolate(up, size=(7, 9), mode="nearest")
        i4 = F.interpolate(up, size=(11, 13), mode="bilinear", align_corners=False)
        return p + q[:, :, 1:-1, :] * 0.5, r, up2, i1 + self.up_near(down), i2, i3, i4, self.up_size(up)


class MiscShapes(nn.Module):
    """Shape ops, reductions, channel shuffle and a nested tuple output."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 1)
        self.fc = nn.Linear(6, 5, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n, c, h, w = x.shape
        x = self.conv(x)
        # Channel shuffle written out the way ShuffleNet does it.
        shuf = x.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)
        a, b = torch.chunk(shuf, 2, dim=1)
        s1, s2, s3 = torch.split(x, [2, 2, 4], dim=1)
        st = torch.stack([a, b * 2.0], dim=2)
        un = torch.unbind(st, dim=2)
        sel = x[:, 3]
        sl = x[:, 1:7:2, ::2, 1:]
        red = (
            torch.mean(sl, dim=(2, 3), keepdim=True)
            + torch.sum(sl, dim=3, keepdim=True).amax(dim=2, keepdim=True)
            - torch.amin(s3, dim=1, keepdim=True).amin(dim=(2, 3), keepdim=True)
        )
        sq = torch.squeeze(red, 3).squeeze(2)
        un2 = torch.unsqueeze(sq, 1).unsqueeze(-1)
        flat = torch.flatten(un[0] - un[1], start_dim=1, end_dim=2)
        t = torch.transpose(flat, 1, 2)
        perm = (s1 * s2).permute(0, 3, 1, 2).reshape(n, w, -1)
        lin = self.fc(perm[:, :, :6])
        sum_all = torch.sum(sel, dim=(1, 2)) + torch.mean(x, dim=(1, 2, 3))
        mm = torch.bmm(t[:, :6, :], t[:, :6, :].transpose(1, 2))
        return (t, un2), (lin, sum_all), mm


class MiscModuleForms(nn.Module):
    """The other spelling of each op: nn.* modules where the fixtures above use F.*, and F.* where they use nn.*.

    pnnx keeps the spelling (nn.Tanh vs F.tanh, nn.MaxPool2d vs F.max_pool2d, ...), so both must lower.
    """

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(c, c, 3, 3) * 0.2)
        self.b = nn.Parameter(torch.randn(c) * 0.1)
        self.lin_w = nn.Parameter(torch.randn(6, c) * 0.3)
        self.gamma, self.beta = nn.Parameter(torch.rand(c) + 0.5), nn.Parameter(torch.randn(c) * 0.1)
        self.register_buffer("mean", torch.randn(c) * 0.1)
        self.register_buffer("var", torch.rand(c) + 0.5)
        self.mods = nn.ModuleDict(
            {
                "tanh": nn.Tanh(),
                "sigmoid": nn.Sigmoid(),
                "silu": nn.SiLU(),
                "softmax": nn.Softmax(dim=1),
                "log_softmax": nn.LogSoftmax(dim=-1),
                "flatten": nn.Flatten(1),
                "zero_pad": nn.ZeroPad2d((1, 0, 2, 1)),
                "reflect_pad": nn.ReflectionPad2d(1),
                "replicate_pad": nn.ReplicationPad2d((0, 2, 1, 0)),
                "dropout": nn.Dropout(0.3),
                "identity": nn.Identity(),
                "up_bilinear": nn.UpsamplingBilinear2d(scale_factor=2),
                "up_nearest": nn.UpsamplingNearest2d(size=(18, 21)),
            }
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        m = self.mods
        y = F.conv2d(x, self.w, self.b, stride=1, padding=1)
        y = F.batch_norm(y, self.mean, self.var, self.gamma, self.beta, training=False, eps=1e-3)
        y = m["identity"](m["dropout"](m["silu"](y)))
        a = m["tanh"](F.max_pool2d(m["zero_pad"](y), 2, stride=2))
        b = m["sigmoid"](F.avg_pool2d(m["reflect_pad"](y), 3, stride=2, padding=1, count_include_pad=False))
        c = F.adaptive_max_pool2d(m["replicate_pad"](y), (3, 4)) + F.adaptive_avg_pool2d(y, 1)
        n = F.layer_norm(F.group_norm(y, 2), (y.shape[-1],)) + F.instance_norm(y)
        feats = m["flatten"](F.adaptive_avg_pool2d(n, 1))
        logits = F.linear(feats, self.lin_w)
        up = m["up_bilinear"](a) + F.leaky_relu(m["up_nearest"](b)[:, :, :, :20], 0.1) * F.elu(a.mean())
        return m["softmax"](up), m["log_softmax"](logits), c, F.hardtanh(n, -0.5, 0.5)
