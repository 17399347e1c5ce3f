"""The torch optimizers behind each kind an algorithm wraps (``algorithms.contract.Wraps``): the wrapper refuses
another class, or a flag the algorithm's rule would silently ignore, before anything is set up."""

from __future__ import annotations

from typing import Any

import torch

from hvd_compress.torch.birder import Birder
from hvd_compress.torch.lamb import Lamb

#: kind -> (the classes it takes, how the message names them)
_CLASSES: dict[str, tuple[type, str]] = {
    "adam": (torch.optim.Adam, "torch.optim.Adam or AdamW"),
    "lamb": (Lamb, "hc.Lamb"),
    "slamb-lamb": (Lamb, "hc.Lamb"),
    "birder": (Birder, "hc.Birder"),
    "sgd": (torch.optim.SGD, "torch.optim.SGD"),
    "any": (torch.optim.Optimizer, "a torch.optim.Optimizer"),
}
_REFUSED_FLAGS = {"adam": ("amsgrad", "maximize")}


def check_inner(optimizer: torch.optim.Optimizer, algorithm: Any) -> None:
    """TypeError/ValueError unless ``optimizer`` is of the kind ``algorithm.wraps`` names."""
    kind = algorithm.wraps.kind
    cls, names = _CLASSES[kind]
    if not isinstance(optimizer, cls):
        raise TypeError(f"op={algorithm.name} wraps {names}, got {type(optimizer).__name__}")
    for group in optimizer.param_groups:
        for flag in _REFUSED_FLAGS.get(kind, ()):
            if group.get(flag):
                raise ValueError(f"op={algorithm.name} does not support {flag}=True")
