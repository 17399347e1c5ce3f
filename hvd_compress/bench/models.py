"""The models and data of the end-to-end benchmark: real data that ships inside a package (scikit-learn's
handwritten digits, 1797 8x8 images, 10 classes), three model shapes a user trains.

- ``mlp``: a wide ReLU MLP, communication-bound (most of a step is the gradient's bytes);
- ``cnn``: a small ReLU CNN, compute-heavier per parameter;
- ``cnn_bn``: the same CNN with BatchNorm after each convolution (each rank normalizes over its own batch, as under
  Horovod and DDP without SyncBatchNorm), the race's real-data model;
- ``transformer``: a small transformer encoder over the image's 8 rows as 8 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn


@dataclass
class Data:
    """Digits split once (the same split on every rank): standardized features, labels."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def digits(seed: int = 0) -> Data:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = x[order].astype(np.float32) / 16.0, y[order].astype(np.int64)
    x = (x - x.mean(0)) / (x.std(0) + 1e-3)
    cut = int(0.8 * len(x))
    t = torch.from_numpy
    return Data(t(x[:cut]), t(y[:cut]), t(x[cut:]), t(y[cut:]))


class Mlp(nn.Module):
    def __init__(self, width: int = 1536, depth: int = 3) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        fan_in = 64
        for _ in range(depth):
            layers += [nn.Linear(fan_in, width), nn.ReLU()]
            fan_in = width
        layers.append(nn.Linear(fan_in, 10))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Cnn(nn.Module):
    def __init__(self, channels: int = 64, batch_norm: bool = False) -> None:
        super().__init__()

        def conv(cin: int, cout: int) -> list[nn.Module]:
            return [nn.Conv2d(cin, cout, 3, padding=1), *([nn.BatchNorm2d(cout)] if batch_norm else []), nn.ReLU()]

        self.features = nn.Sequential(
            *conv(1, channels), *conv(channels, 2 * channels), nn.MaxPool2d(2),
            *conv(2 * channels, 2 * channels), nn.MaxPool2d(2),
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(2 * channels * 4, 256), nn.ReLU(), nn.Linear(256, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.view(-1, 1, 8, 8)))


class Transformer(nn.Module):
    def __init__(self, dim: int = 128, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(8, dim)
        self.pos = nn.Parameter(torch.zeros(8, dim))
        block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, activation="relu", batch_first=True)
        self.encoder = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.embed(x.view(-1, 8, 8)) + self.pos)
        return self.head(h.mean(1))


class CnnBn(Cnn):
    def __init__(self, channels: int = 64) -> None:
        super().__init__(channels, batch_norm=True)


MODELS = {"mlp": Mlp, "cnn": Cnn, "transformer": Transformer, "cnn_bn": CnnBn}
#: What ``make bench-e2e`` trains unless ``--models`` says otherwise.
E2E_MODELS = ("mlp", "cnn", "transformer")


def build(name: str, seed: int = 0, **options) -> nn.Module:
    """The model ``name`` (built with ``options``, e.g. ``width``) with weights from ``seed`` (the same on every
    rank)."""
    torch.manual_seed(seed)
    return MODELS[name](**options)
