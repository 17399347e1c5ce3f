"""Shared bits of the worker scripts that the tests launch under mpirun/horovodrun."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}


def out_dir() -> Path:
    return Path(sys.argv[1])


def save(rank: int, payload: dict[str, Any]) -> None:
    torch.save(payload, out_dir() / f"rank{rank}.pt")


def rank_input(rank: int, numel: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """A deterministic, rank-dependent input that the test can re-create."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    return torch.randn(numel, generator=g, dtype=torch.float64).to(dtype)


def outcome(fn: Callable[[], object]) -> str:
    """``"Type: message"`` of what ``fn()`` raised, or ``"no error"``; the tests check both."""
    try:
        fn()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def flat_parameters(*modules: torch.nn.Module) -> torch.Tensor:
    """A copy of ``modules``' parameters, one flat tensor."""
    return torch.cat([p.detach().reshape(-1) for m in modules for p in m.parameters()]).clone()


def set_exact_average_gradients(params: list[torch.nn.Parameter], losses: list[Callable[[], torch.Tensor]]) -> None:
    """Each parameter's ``.grad``: the average of its gradient under each of ``losses`` (one per rank), summed in
    float64, then float32: what op=Average reduces, as a one-process reference computes it."""
    grads = [torch.zeros_like(p, dtype=torch.float64) for p in params]
    for fn in losses:
        for acc, x in zip(grads, torch.autograd.grad(fn(), params), strict=True):
            acc.add_(x.double(), alpha=1 / len(losses))
    for p, acc in zip(params, grads, strict=True):
        p.grad = acc.float()


def digits_images(rank: int, size: int) -> tuple[torch.Tensor, ...]:
    """scikit-learn's digits as (N, 1, 8, 8) images in [0, 1]: this rank's shard of the 1297 training images and
    the same 500 held-out ones on every rank (x, y, x_test, y_test)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))
    test, train = perm[:500], perm[500:]
    mine = train[rank::size]
    return x[mine], y[mine], x[test], y[test]


def small_wrapped(op: str, **options: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A small ReLU MLP (8 -> 16 -> 2, seed 0) and ``hc.DistributedOptimizer`` with ``op`` (a name of ``hc``) over the
    inner optimizer that op wraps (hc.Lamb for 1-bit LAMB and SLAMB, hc.Birder for Birder, else Adam)."""
    import hvd_compress.torch as hc

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    if op in ("OneBitLamb", "SLAMB"):
        base = hc.Lamb(model.parameters(), lr=1e-2)
    elif op == "Birder":
        base = hc.Birder(model.parameters(), lr=1e-3)
    else:
        base = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, hc.DistributedOptimizer(base, named_parameters=model.named_parameters(), op=getattr(hc, op),
                                          **options)


class UnusedMiddle(torch.nn.Module):
    """An MLP whose middle layer gets no gradient: it holds back its bucket and the later ones during backward."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.unused = torch.nn.Linear(8, 64), torch.nn.Linear(64, 64)
        self.b, self.c = torch.nn.Linear(64, 64), torch.nn.Linear(64, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))
