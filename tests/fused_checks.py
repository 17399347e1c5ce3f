"""What the tests of the core's fused passes share: the two backends a bucket runs on, and the bit-for-bit check of
a fused run against the backend path it replaces."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hvd_compress.torch.backend import TorchBackend


def backend(name: str) -> tuple[object, object]:
    """The backend and its buffer maker: NumPy's (the TF/Keras face's) or torch's."""
    if name == "numpy":
        return pytest.importorskip("hvd_compress.tensorflow.backend").NumpyBackend, np.asarray
    return TorchBackend, torch.from_numpy


def counted(ran: dict[str, int], name: str, fn):
    """``fn``, counting its calls in ``ran[name]``: a fused-vs-backend comparison is void unless the fused pass ran."""
    def call(*args, **kwargs):
        ran[name] += 1
        return fn(*args, **kwargs)
    return call


def assert_identical(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """float32 ``got`` and ``want`` hold the same bits, else the count and the first that differs."""
    diff = np.flatnonzero(got.view(np.int32) != want.view(np.int32))
    assert diff.size == 0, (f"{what}: {diff.size} of {got.size} values differ, first {diff[0]}: "
                            f"fused {got[diff[0]]!r}, backend {want[diff[0]]!r}")
