"""timm image models of the real-world suite: CNNs, vision transformers and hybrids, each built from its own model
class at a small width and depth (random weights, nothing downloaded) with the family's characteristic blocks."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import timm
from _realworld_spec import Feed, Spec
from timm.layers import BatchNormAct2d
from timm.models import byobnet, cspnet, efficientnet, ghostnet, metaformer, regnet, resnet
from timm.models import fastvit as timm_fastvit
from timm.models import mobilenetv3 as timm_mobilenetv3
from timm.models import mobilevit as timm_mobilevit
from timm.utils.model import reparameterize_model
from torch import nn

IMG = [Feed("image", (1, 3, 64, 64))]
NUM_CLASSES = 10


def _timm(name: str, **kwargs) -> nn.Module:
    return timm.create_model(name, pretrained=False, num_classes=NUM_CLASSES, **kwargs)


def resnet18() -> nn.Module:
    return resnet.ResNet(resnet.BasicBlock, [1, 1, 1, 1], channels=(8, 16, 24, 32), stem_width=16,
                         num_classes=NUM_CLASSES)


def resnet50d() -> nn.Module:
    # resnet50d: the deep 3-conv stem and average-pool downsampling shortcuts, Bottleneck blocks.
    return resnet.ResNet(resnet.Bottleneck, [1, 1, 1, 1], channels=(8, 12, 16, 24), stem_width=8, stem_type="deep",
                         avg_down=True, num_classes=NUM_CLASSES)


def seresnext() -> nn.Module:
    return resnet.ResNet(resnet.Bottleneck, [1, 1, 1, 1], channels=(8, 12, 16, 24), stem_width=16, cardinality=4,
                         base_width=32, block_args={"attn_layer": "se"}, num_classes=NUM_CLASSES)


def regnety() -> nn.Module:
    cfg = regnet.RegNetCfg(depth=6, w0=8, wa=8.0, wm=2.0, group_size=8, se_ratio=0.25, stem_width=8)
    return regnet.RegNet(cfg, num_classes=NUM_CLASSES)


def efficientnet_b0() -> nn.Module:
    return _narrow_head(efficientnet._gen_efficientnet("efficientnet_b0", channel_multiplier=0.1,
                                                       depth_multiplier=0.3, num_classes=NUM_CLASSES))


def efficientnetv2() -> nn.Module:
    # efficientnetv2_rw_t's layout: FusedMBConv (EdgeResidual) early stages, MBConv with SE later.
    return efficientnet._gen_efficientnetv2_s("efficientnetv2_rw_t", channel_multiplier=0.25, depth_multiplier=0.2,
                                              rw=True, num_classes=NUM_CLASSES)


def _narrow_head(model: nn.Module, width: int = 64) -> nn.Module:
    """MobileNetV3/V4, EfficientNet and GhostNet keep a 1280-wide 1x1 head conv at any width multiplier (most of a
    small model's bytes); a narrow one keeps the same ops."""
    old = model.conv_head
    model.conv_head = nn.Conv2d(old.in_channels, width, 1, bias=old.bias is not None)
    for name in ("norm_head", "bn2"):  # MobileNetV3/V4's and EfficientNet's names for the head's norm
        norm = getattr(model, name, None)
        if isinstance(norm, BatchNormAct2d):
            setattr(model, name, BatchNormAct2d(width, act_layer=type(norm.act)))
    model.classifier = nn.Linear(width, NUM_CLASSES)
    return model


def mobilenetv3() -> nn.Module:
    return _narrow_head(timm_mobilenetv3._gen_mobilenet_v3("mobilenetv3_large_100", channel_multiplier=0.1,
                                                           depth_multiplier=0.34, num_classes=NUM_CLASSES))


def mobilenetv4_conv() -> nn.Module:
    return _narrow_head(timm_mobilenetv3._gen_mobilenet_v4("mobilenetv4_conv_small", channel_multiplier=0.25,
                                                           num_classes=NUM_CLASSES))


def mobilenetv4_hybrid() -> nn.Module:
    # Universal inverted bottlenecks plus mobile multi-query attention blocks.
    return _narrow_head(timm_mobilenetv3._gen_mobilenet_v4("mobilenetv4_hybrid_medium", channel_multiplier=0.125,
                                                           num_classes=NUM_CLASSES))


def _ghost_cfgs() -> list:
    # GhostNet-V1's stage table with fewer blocks per stage: (kernel, hidden, out, se ratio, stride).
    return [
        [[3, 16, 16, 0, 1]],
        [[3, 48, 24, 0, 2]],
        [[5, 72, 40, 0.25, 2]],
        [[3, 240, 80, 0, 2], [3, 184, 80, 0, 1]],
        [[3, 480, 112, 0.25, 1]],
        [[5, 672, 160, 0.25, 2]],
        [[5, 960, 160, 0.25, 1]],
    ]


def _ghostnet(version: str) -> nn.Module:
    return _narrow_head(ghostnet.GhostNet(_ghost_cfgs(), width=0.1, version=version, num_classes=NUM_CLASSES))


def ghostnet_v1() -> nn.Module:
    return _ghostnet("v1")


def ghostnet_v2() -> nn.Module:
    return _ghostnet("v2")  # adds the DFC attention branch: avg-pool, (1,5)/(5,1) depthwise convs, sigmoid, upsample


def repvgg() -> nn.Module:
    cfg = byobnet.model_cfgs["repvgg_a0"]
    blocks = tuple(replace(b, d=d, c=c) for b, d, c in zip(cfg.blocks, (1, 2, 2, 1), (8, 16, 24, 32), strict=True))
    model = byobnet.ByobNet(replace(cfg, blocks=blocks, stem_chs=8), num_classes=NUM_CLASSES)
    return reparameterize_model(model.eval())  # the deployed form: one 3x3 conv per block


def cspdarknet() -> nn.Module:
    cfg = cspnet.model_cfgs["cspdarknet53"]
    stages = replace(cfg.stages, depth=(1, 1, 1, 1, 1), out_chs=(8, 16, 16, 24, 32))
    return cspnet.CspNet(replace(cfg, stem=replace(cfg.stem, out_chs=8), stages=stages), num_classes=NUM_CLASSES)


def cspresnet() -> nn.Module:
    cfg = cspnet.model_cfgs["cspresnet50"]
    stages = replace(cfg.stages, depth=(1, 1, 1, 1), out_chs=(16, 24, 32, 48))
    return cspnet.CspNet(replace(cfg, stem=replace(cfg.stem, out_chs=16), stages=stages), num_classes=NUM_CLASSES)


def convnext() -> nn.Module:
    return _timm("convnext_atto", depths=(1, 1, 2, 1), dims=(8, 16, 24, 32))


def convnextv2() -> nn.Module:
    return _timm("convnextv2_atto", depths=(1, 1, 2, 1), dims=(8, 16, 24, 32))  # GRN in every block


def vit() -> nn.Module:
    return _timm("vit_tiny_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)


def deit() -> nn.Module:
    # The distilled DeiT: class and distillation tokens, two heads averaged at eval.
    return _timm("deit_tiny_distilled_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)


def swin() -> nn.Module:
    # Two blocks per stage so the second one shifts its windows (torch.roll + the attention mask).
    return _timm("swin_tiny_patch4_window7_224", img_size=64, window_size=4, embed_dim=16, depths=(2, 2),
                 num_heads=(1, 2))


def beit() -> nn.Module:
    return _timm("beit_base_patch16_224", img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2,
                 use_rel_pos_bias=True, use_abs_pos_emb=False, init_values=0.1)


def mobilevit() -> nn.Module:
    cfg = timm_mobilevit.model_cfgs["mobilevit_xxs"]

    def shrink(block):
        if isinstance(block, tuple):
            return tuple(shrink(b) for b in block)
        kwargs = dict(block.block_kwargs or {})
        if "transformer_dim" in kwargs:
            kwargs.update(transformer_dim=16, transformer_depth=1)
        return replace(block, d=1, c=max(8, int(block.c) // 4), block_kwargs=kwargs)

    blocks = tuple(shrink(b) for b in cfg.blocks)
    return byobnet.ByobNet(replace(cfg, blocks=blocks, stem_chs=8, num_features=32), num_classes=NUM_CLASSES)


def efficientformer() -> nn.Module:
    # Its attention biases are fixed at 7x7 tokens: the input must be 224x224.
    return _timm("efficientformer_l1", depths=(1, 1, 1, 2), embed_dims=(16, 24, 32, 48), num_vit=1)


def efficientformerv2() -> nn.Module:
    return _timm("efficientformerv2_s0", depths=(1, 1, 2, 2), embed_dims=(16, 24, 32, 48), num_vit=2, img_size=64)


def efficientvit_mit() -> nn.Module:
    # MIT's EfficientViT-B: MBConv stages, then lite multi-scale linear attention (ReLU kernel).
    return _timm("efficientvit_b0", widths=(8, 8, 16, 16, 24), depths=(1, 1, 1, 1, 1), head_dim=8,
                 head_widths=(48, 64))


def efficientvit_msra() -> nn.Module:
    # Microsoft's EfficientViT-M: cascaded group attention in local windows.
    return _timm("efficientvit_m0", img_size=64, embed_dim=(16, 24, 24), key_dim=(4, 4, 4), depth=(1, 1, 1),
                 num_heads=(2, 2, 2), window_size=(4, 4, 4))


def levit() -> nn.Module:
    return _timm("levit_128s", img_size=64, embed_dim=(16, 24, 32), key_dim=8, depth=(1, 1, 1), num_heads=(2, 2, 2))


def poolformer() -> nn.Module:
    # poolformer_s12's arguments (GroupNorm with one group, layer scale, GELU MLP) at depths 1 and dims 8-32.
    return metaformer.MetaFormer(depths=(1, 1, 1, 1), dims=(8, 16, 24, 32), downsample_norm=None, mlp_act=nn.GELU,
                                 mlp_bias=True, norm_layers=metaformer.GroupNorm1, layer_scale_init_values=1e-5,
                                 res_scale_init_values=None, use_mlp_head=False, num_classes=NUM_CLASSES)


def fastvit() -> nn.Module:
    # fastvit_sa12's layout: RepMixer stages, then conditional positional encoding and attention in the last one.
    model = timm_fastvit.FastVit(
        layers=(1, 1, 1, 1),
        embed_dims=(8, 16, 32, 32),  # each a multiple of the one before (grouped patch-embedding convs)
        token_mixers=("repmixer", "repmixer", "repmixer", "attention"),
        pos_embs=(None, None, None, partial(timm_fastvit.RepConditionalPosEnc, spatial_shape=(7, 7))),
        mlp_ratios=(3, 3, 3, 3),
        num_classes=NUM_CLASSES,
    )
    return reparameterize_model(model.eval())  # the deployed form, as fastvit's README exports it


def _spec(name: str, family: str, arch: str, build, size: int = 64, **kwargs) -> Spec:
    return Spec(name, family, arch, build, [Feed("image", (1, 3, size, size))], **kwargs)


SPECS = [
    _spec("resnet18", "cnn", "timm ResNet, BasicBlock [1,1,1,1], widths 8-32", resnet18),
    _spec("resnet50d", "cnn", "timm ResNet-D: deep stem, avg-pool downsample, Bottleneck [1,1,1,1]", resnet50d),
    _spec("seresnext", "cnn", "timm SE-ResNeXt: grouped Bottleneck (cardinality 4) with squeeze-excitation",
          seresnext),
    _spec("regnety", "cnn", "timm RegNetY: group width 8, SE 0.25, depth 6, widths 8-64", regnety),
    _spec("efficientnet_b0", "cnn", "timm EfficientNet-B0 layout, width 0.1, depth 0.3", efficientnet_b0),
    _spec("efficientnetv2", "cnn", "timm EfficientNetV2 (rw_t layout): FusedMBConv + MBConv/SE, width 0.25",
          efficientnetv2),
    _spec("mobilenetv3", "cnn", "timm MobileNetV3-Large layout, width 0.1, depth 0.34: hard-swish, SE, hard-sigmoid",
          mobilenetv3),
    _spec("mobilenetv4_conv", "cnn", "timm MobileNetV4-Conv-Small layout, width 0.25: universal inverted bottlenecks",
          mobilenetv4_conv),
    _spec("mobilenetv4_hybrid", "hybrid", "timm MobileNetV4-Hybrid-Medium layout, width 0.125: UIB + mobile MQA",
          mobilenetv4_hybrid),
    _spec("ghostnet", "cnn", "timm GhostNet V1, width 0.1, one block per stage", ghostnet_v1),
    _spec("ghostnetv2", "cnn", "timm GhostNet V2 (DFC attention), width 0.1", ghostnet_v2),
    _spec("repvgg", "cnn", "timm RepVGG-A0 layout, widths 8-32, reparameterised (deploy form)", repvgg),
    _spec("cspdarknet", "cnn", "timm CSPDarkNet-53 layout, one block per stage, widths 8-32", cspdarknet),
    _spec("cspresnet", "cnn", "timm CSPResNet-50 layout, one block per stage, widths 16-48", cspresnet),
    _spec("convnext", "cnn", "timm ConvNeXt (atto layout), depths 1,1,2,1, dims 8-32", convnext),
    _spec("convnextv2", "cnn", "timm ConvNeXt-V2 (atto layout, GRN), depths 1,1,2,1, dims 8-32", convnextv2),
    _spec("vit", "vit", "timm ViT: 32x32 image, patch 8, dim 32, 2 blocks, 2 heads", vit, size=32),
    _spec("deit", "vit", "timm DeiT distilled: class + distillation tokens, dim 32, 2 blocks", deit, size=32),
    _spec("swin", "vit", "timm Swin: 64x64, patch 4, window 4, dims 16/32, 2 blocks per stage (shifted)", swin),
    _spec("beit", "vit", "timm BEiT: relative position bias, layer scale, dim 32, 2 blocks", beit, size=32),
    _spec("mobilevit", "hybrid", "timm MobileViT-XXS layout at quarter width, 1 transformer block (dim 16) per stage",
          mobilevit),
    _spec("efficientformer", "hybrid", "timm EfficientFormer-L1 layout: pool mixers, 1 attention block, dims 16-48",
          efficientformer, size=224),
    _spec("efficientformerv2", "hybrid", "timm EfficientFormerV2-S0 layout: 2 attention blocks, dims 16-48",
          efficientformerv2),
    _spec("efficientvit_b", "hybrid", "timm EfficientViT-B0 (MIT) layout: lite multi-scale linear attention",
          efficientvit_mit),
    _spec("efficientvit_m", "hybrid", "timm EfficientViT-M0 (MSRA) layout: cascaded group attention, window 4",
          efficientvit_msra),
    _spec("levit", "hybrid", "timm LeViT-128S layout: dims 16-32, one block per stage", levit),
    _spec("poolformer", "hybrid", "timm PoolFormer-S12 layout: dims 8-32, one block per stage", poolformer),
    _spec("fastvit", "hybrid", "timm FastViT-SA12 layout, reparameterised: RepMixer + CPE + attention", fastvit),
]
