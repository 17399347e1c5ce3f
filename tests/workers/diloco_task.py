"""The task of the DiLoCo tests, shared by the worker and the test (which replays it in the NumPy reference): a few
parameters stepped by plain SGD at lr 1/2 on the gradient of a quadratic with a rank- and step-dependent target, all
in float32 with products by powers of two (exact), so torch's SGD and NumPy agree to the bit."""

from __future__ import annotations

import numpy as np

SHAPES = [(64, 64), (64, 64), (32, 64), (32, 64), (16,)]  # strided fragments of about equal size
SIZES = [int(np.prod(s)) for s in SHAPES]
INNER_LR = 0.5
STEPS = 9

#: name -> DiLoCo options of each run compared with the reference at every rank count.
CONFIGS = {
    "plain": {"sync_every": 3},
    "momentum": {"sync_every": 2, "nesterov": False, "outer_momentum": 0.5, "outer_lr": 1.0},
    "stream": {"sync_every": 4, "fragments": 2, "sync_delay": 1, "mix": 0.5},
    "stream3": {"sync_every": 6, "fragments": 3, "sync_delay": 2},
    "fp16": {"sync_every": 2, "fragments": 2, "outer_compression": "fp16"},
    "bf16": {"sync_every": 3, "sync_delay": 1, "mix": 0.25, "outer_compression": "bf16"},
    "int8": {"sync_every": 2, "outer_compression": "int8"},
    "int4": {"sync_every": 4, "fragments": 2, "sync_delay": 1, "outer_compression": "int4"},
}
#: name -> (DiLoCo options, the torch outer optimizer's class name in torch.optim, its arguments) of the runs with an
#: outer optimizer of the user's (torch only): the paper's Nesterov SGD, and Adam on fragments with a delay.
OUTER = {
    "outer_sgd": ({"sync_every": 3}, "SGD", {"lr": 0.7, "momentum": 0.9, "nesterov": True}),
    "outer_adam": ({"sync_every": 4, "fragments": 2, "sync_delay": 1}, "Adam", {"lr": 0.05}),
}
#: The outer optimizer's run resumed mid-phase (a sync in flight), in one process and at 2 -> 3 ranks.
OUTER_RESUME = ("outer_adam", 6)
#: (config, step after which the checkpoint is taken): mid-phase, and with a sync in flight where there is a delay.
RESUMES = [("stream", 6), ("fp16", 3), ("plain", 4), ("int4", 6)]
#: The 2 -> 3 rank resume: the config and the step of the 2-rank checkpoint (a sync in flight).
REGROW = ("stream", 6)


def initial() -> np.ndarray:
    return np.random.default_rng(0).standard_normal(sum(SIZES)).astype(np.float32)


def gradient(rank: int, step: int, flat: np.ndarray) -> np.ndarray:
    target = np.random.default_rng(1000 * step + rank).standard_normal(flat.size).astype(np.float32)
    return np.float32(0.25) * (flat - target)


def inner_step(rank: int, step: int, flat: np.ndarray) -> np.ndarray:
    """What the worker's torch.optim.SGD(lr=0.5) does to the flat parameters at ``step``."""
    return flat - np.float32(INNER_LR) * gradient(rank, step, flat)
