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
