"""ResNet-50 v1.5 in plain PyTorch, defined here (torchvision cannot import beside the CPU
torch wheel). Same architecture as hpcai500_tf.models.resnet: the stride sits in the 3x3
convolution of each downsampling bottleneck; BN momentum 0.9 (PyTorch's 0.1), epsilon 1e-5.
"""

from __future__ import annotations

import torch
from torch import nn

STAGE_FILTERS = (64, 128, 256, 512)
RESNET50_BLOCKS = (3, 4, 6, 3)


def _bn(channels: int, zero_gamma: bool = False) -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(channels, eps=1e-5, momentum=0.1)
    if zero_gamma:
        nn.init.zeros_(bn.weight)
    return bn


class Bottleneck(nn.Module):
    def __init__(self, in_channels: int, filters: int, stride: int):
        super().__init__()
        out = filters * 4
        self.conv1 = nn.Conv2d(in_channels, filters, 1, bias=False)
        self.bn1 = _bn(filters)
        self.conv2 = nn.Conv2d(filters, filters, 3, stride=stride, padding=1, bias=False)
        self.bn2 = _bn(filters)
        self.conv3 = nn.Conv2d(filters, out, 1, bias=False)
        self.bn3 = _bn(out, zero_gamma=True)
        self.relu = nn.ReLU(inplace=True)
        self.projection = None
        if stride != 1 or in_channels != out:
            self.projection = nn.Sequential(
                nn.Conv2d(in_channels, out, 1, stride=stride, bias=False), _bn(out)
            )

    def forward(self, x):
        shortcut = x if self.projection is None else self.projection(x)
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return self.relu(y + shortcut)


class ResNet50V15(nn.Module):
    def __init__(
        self,
        num_classes: int = 1000,
        width: float = 1.0,
        blocks: tuple[int, ...] = RESNET50_BLOCKS,
        channels: int = 3,
    ):
        super().__init__()
        stem = max(8, int(64 * width))
        layers = [
            nn.Conv2d(channels, stem, 7, stride=2, padding=3, bias=False),
            _bn(stem),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2, padding=1),
        ]
        in_channels = stem
        for stage, (filters, count) in enumerate(zip(STAGE_FILTERS, blocks, strict=True)):
            filters = max(8, int(filters * width))
            for block in range(count):
                stride = 2 if block == 0 and stage > 0 else 1
                layers.append(Bottleneck(in_channels, filters, stride))
                in_channels = filters * 4
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(in_channels, num_classes)
        nn.init.normal_(self.fc.weight, std=0.01)
        nn.init.zeros_(self.fc.bias)
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.features(x)
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))
