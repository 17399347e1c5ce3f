"""Rounding of float64 values to the storage dtypes the core supports (NumPy has no bfloat16)."""

from __future__ import annotations

import numpy as np

SUPPORTED = ("float16", "bfloat16", "float32", "float64")


def _bf16_round(x: np.ndarray) -> np.ndarray:
    f = np.asarray(x, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    nan = np.isnan(f)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    out = u.astype(np.uint32).view(np.float32).astype(np.float64)
    out[nan] = np.nan
    return out


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """``x`` rounded (to nearest even) to ``dtype`` and returned as float64."""
    x = np.asarray(x, dtype=np.float64)
    if dtype == "float64":
        return x.copy()
    if dtype == "float32":
        return x.astype(np.float32).astype(np.float64)
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float64)
    if dtype == "bfloat16":
        # float64 -> float32 -> bfloat16 rounds twice, exactly as the core does (it narrows from float32).
        return _bf16_round(x.astype(np.float32))
    raise ValueError(f"unsupported dtype {dtype!r}; one of {SUPPORTED}")


def ulp(x: np.ndarray, dtype: str) -> np.ndarray:
    """Spacing of ``dtype`` at each |x| (one unit in the last place)."""
    mant = {"float16": 10, "bfloat16": 7, "float32": 23, "float64": 52}[dtype]
    tiny = {"float16": 2.0**-14, "bfloat16": 2.0**-126, "float32": 2.0**-126, "float64": 2.0**-1022}[dtype]
    a = np.maximum(np.abs(np.asarray(x, dtype=np.float64)), tiny)
    return 2.0 ** (np.floor(np.log2(a)) - mant)
