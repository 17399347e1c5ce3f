"""Shared bits of the TensorFlow/Keras workers: results as pickles (no torch import in a TF process)."""

from __future__ import annotations

import hashlib
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np


def out_dir() -> Path:
    return Path(sys.argv[1])


def save(rank: int, payload: dict[str, Any]) -> None:
    with open(out_dir() / f"rank{rank}.pkl", "wb") as f:
        pickle.dump(payload, f)


def digest(arrays: list[Any]) -> str:
    """A hash of the bytes of ``arrays`` (tensors or variables) in order."""
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(np.asarray(a)).tobytes())
    return h.hexdigest()


def outcome(fn: Callable[[], object]) -> str:
    """``"Type: message"`` of what ``fn()`` raised, or ``"no error"``."""
    try:
        fn()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"
