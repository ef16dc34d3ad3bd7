"""Small but architecturally faithful classification networks for the PNNX fixtures.

torchvision constructors are used wherever they have a width/depth knob; where they do not (ResNet widths,
SqueezeNet, GoogLeNet) the network is re-assembled from torchvision's own building blocks with smaller channels.
"""

from __future__ import annotations

import importlib

import torch
from torch import nn
from torchvision.models import convnext, efficientnet, mobilenetv3, regnet, shufflenetv2
from torchvision.models.densenet import DenseNet
from torchvision.models.mobilenetv2 import MobileNetV2
from torchvision.models.resnet import BasicBlock, conv1x1

# `torchvision.models.googlenet` / `.squeezenet` are shadowed by the constructor functions of the same name.
_googlenet = importlib.import_module("torchvision.models.googlenet")
_squeezenet = importlib.import_module("torchvision.models.squeezenet")

NUM_CLASSES = 10


class SmallResNet18(nn.Module):
    """torchvision's ResNet-18 layout (BasicBlock, [2, 2, 2, 2], 7x7 stem, maxpool) at 1/8 of the width."""

    def __init__(self, widths: tuple[int, ...] = (8, 16, 32, 64), layers: tuple[int, ...] = (2, 2, 2, 2)) -> None:
        super().__init__()
        self.inplanes = widths[0]
        self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(widths[0], layers[0], 1)
        self.layer2 = self._make_layer(widths[1], layers[1], 2)
        self.layer3 = self._make_layer(widths[2], layers[2], 2)
        self.layer4 = self._make_layer(widths[3], layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[3], NUM_CLASSES)

    def _make_layer(self, planes: int, blocks: int, stride: int) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes, stride), nn.BatchNorm2d(planes))
        seq = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        seq += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*seq)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet() -> nn.Module:
    return SmallResNet18()


class WideResNet(nn.Module):
    """torchvision BasicBlocks at 96 and 128 channels on a 32x32 input: wide enough for the CPU engine's Winograd
    path (blocked 3x3 stride-1 convs with >= 96 channels and >= 16 output tiles), residuals included."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 96, 3, padding=1, bias=False), nn.BatchNorm2d(96), nn.ReLU(inplace=True))
        down = nn.Sequential(conv1x1(96, 128, 2), nn.BatchNorm2d(128))
        self.blocks = nn.Sequential(BasicBlock(96, 96), BasicBlock(96, 128, 2, down), BasicBlock(128, 128))
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(128, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))


def mobilenet_v2() -> nn.Module:
    # Full MobileNetV2 block table with the repeat counts cut to one or two.
    setting = [
        [1, 16, 1, 1],
        [6, 24, 2, 2],
        [6, 32, 2, 2],
        [6, 64, 2, 2],
        [6, 96, 1, 1],
        [6, 160, 1, 2],
        [6, 320, 1, 1],
    ]
    return MobileNetV2(num_classes=NUM_CLASSES, width_mult=0.25, inverted_residual_setting=setting)


def mobilenet_v3() -> nn.Module:
    setting, last_channel = mobilenetv3._mobilenet_v3_conf("mobilenet_v3_small", width_mult=0.5, reduced_tail=True)
    return mobilenetv3.MobileNetV3(setting, last_channel, num_classes=NUM_CLASSES)


class SmallSqueezeNet11(nn.Module):
    """torchvision's SqueezeNet 1.1 (same Fire layout, ceil-mode pools, conv classifier) at 1/4 of the width."""

    def __init__(self) -> None:
        super().__init__()
        fire = _squeezenet.Fire
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, kernel_size=3, stride=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
            fire(16, 4, 16, 16),
            fire(32, 4, 16, 16),
            nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
            fire(32, 8, 32, 32),
            fire(64, 8, 32, 32),
            nn.MaxPool2d(kernel_size=3, stride=2, ceil_mode=True),
            fire(64, 12, 48, 48),
            fire(96, 12, 48, 48),
            fire(96, 16, 64, 64),
            fire(128, 16, 64, 64),
        )
        self.classifier = nn.Sequential(
            nn.Dropout(p=0.5),
            nn.Conv2d(128, NUM_CLASSES, kernel_size=1),
            nn.ReLU(inplace=True),
            nn.AdaptiveAvgPool2d(1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.classifier(self.features(x)), 1)


def squeezenet() -> nn.Module:
    return SmallSqueezeNet11()


def shufflenet_v2() -> nn.Module:
    return shufflenetv2.ShuffleNetV2([2, 2, 2], [12, 24, 48, 96, 128], num_classes=NUM_CLASSES)


def densenet() -> nn.Module:
    return DenseNet(growth_rate=8, block_config=(2, 2, 2, 2), num_init_features=16, bn_size=2, num_classes=NUM_CLASSES)


class SmallGoogLeNet(nn.Module):
    """torchvision's GoogLeNet stem and Inception blocks (ceil-mode pools included) with 1/8 of the channels."""

    def __init__(self) -> None:
        super().__init__()
        basic, inception = _googlenet.BasicConv2d, _googlenet.Inception
        self.conv1 = basic(3, 8, kernel_size=7, stride=2, padding=3)
        self.maxpool1 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        self.conv2 = basic(8, 8, kernel_size=1)
        self.conv3 = basic(8, 24, kernel_size=3, padding=1)
        self.maxpool2 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        self.inception3a = inception(24, 8, 12, 16, 2, 4, 4)
        self.inception3b = inception(32, 16, 16, 24, 4, 12, 8)
        self.maxpool3 = nn.MaxPool2d(3, stride=2, ceil_mode=True)
        self.inception4a = inception(60, 24, 12, 26, 2, 6, 8)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.dropout = nn.Dropout(0.2)
        self.fc = nn.Linear(64, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool1(self.conv1(x))
        x = self.maxpool2(self.conv3(self.conv2(x)))
        x = self.maxpool3(self.inception3b(self.inception3a(x)))
        x = self.inception4a(x)
        return self.fc(self.dropout(torch.flatten(self.avgpool(x), 1)))


def googlenet() -> nn.Module:
    return SmallGoogLeNet()


def efficientnet_b0() -> nn.Module:
    setting, last_channel = efficientnet._efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.34)
    return efficientnet.EfficientNet(setting, dropout=0.2, num_classes=NUM_CLASSES, last_channel=last_channel)


def regnet_y() -> nn.Module:
    # RegNetY: quantised linear widths, group convs and squeeze-excitation, at a toy depth and width.
    params = regnet.BlockParams.from_init_params(depth=5, w_0=16, w_a=8.0, w_m=2.0, group_width=8, se_ratio=0.25)
    return regnet.RegNet(params, num_classes=NUM_CLASSES, stem_width=16)


def convnext_tiny() -> nn.Module:
    cfg = convnext.CNBlockConfig
    setting = [cfg(16, 32, 1), cfg(32, 64, 1), cfg(64, None, 2)]
    return convnext.ConvNeXt(setting, stochastic_depth_prob=0.0, layer_scale=1e-6, num_classes=NUM_CLASSES)
