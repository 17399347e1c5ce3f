"""Reference int8/int4 block-quantized allreduce with worker error feedback (cpp/src/block_quant_allreduce.cc) over
n virtual ranks: the same float32 operations in the same order (scale = max |c| / Q per block of 64, code =
rint(c / scale) clamped to [-Q, Q], value = code * scale; the server sums the decoded chunks in rank order, divides
by n for Average and quantizes once), so the core matches it bit for bit."""

from __future__ import annotations

import numpy as np

BLOCK = 64
LEVELS = {8: 127, 4: 7}


def quantize(c: np.ndarray, bits: int) -> np.ndarray:
    """What ``c`` (float32, a multiple of 64 elements) stands for once quantized: per block, code * scale."""
    blocks = np.asarray(c, dtype=np.float32).reshape(-1, BLOCK)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    scale = (amax / np.float32(LEVELS[bits])).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        codes = np.where(scale == 0, np.float32(0), np.rint(blocks / scale))
    codes = np.clip(codes, -LEVELS[bits], LEVELS[bits]).astype(np.float32)
    return (codes * scale).astype(np.float32).reshape(-1)


def chunk_of(numel: int, n: int) -> int:
    chunk = -(-numel // n)
    return -(-chunk // BLOCK) * BLOCK


def block_quant_allreduce(xs: list[np.ndarray], errors: list[np.ndarray] | None, bits: int,
                          op: str = "Average") -> tuple[np.ndarray, list[np.ndarray] | None]:
    """(every rank's result, each rank's new error) of the core's call on ``xs`` with ``errors`` (or None)."""
    n, numel = len(xs), xs[0].size
    chunk = chunk_of(numel, n)
    padded = chunk * n
    sent, new_errors = [], []
    for r, x in enumerate(xs):
        c = np.zeros(padded, dtype=np.float32)
        c[:numel] = x if errors is None else (x + errors[r]).astype(np.float32)
        q = quantize(c, bits)
        sent.append(q)
        new_errors.append((c - q)[:numel].astype(np.float32))
    out = np.zeros(padded, dtype=np.float32)
    for j in range(n):
        total = np.zeros(chunk, dtype=np.float32)
        for q in sent:  # rank order
            total = (total + q[j * chunk : (j + 1) * chunk]).astype(np.float32)
        if op == "Average" and n > 1:
            total = (total / np.float32(n)).astype(np.float32)
        out[j * chunk : (j + 1) * chunk] = quantize(total, bits)
    return out[:numel].copy(), (new_errors if errors is not None else None)
