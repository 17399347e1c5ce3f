"""Reference Sum/Average allreduce (cpp/src/dense_allreduce.cc).

The core widens half types to float32 and sums in float32 (float32/float64 in their own precision);
here the sum is exact in float64 and rounded once to the storage dtype, so a test allows the
few ulps that a float32 summation order can differ by.
"""

from __future__ import annotations

import numpy as np

from hvd_compress.reference.dtypes import round_to


def allreduce(inputs: list[np.ndarray], op: str = "Average", dtype: str = "float32") -> list[np.ndarray]:
    """Each virtual rank's result of ``allreduce(op)`` over ``inputs`` (one array per rank)."""
    if op not in ("Sum", "Average"):
        raise ValueError(f"reference allreduce: op {op!r} is not Sum or Average")
    if len({np.shape(x) for x in inputs}) != 1:
        raise ValueError("reference allreduce: ranks have different shapes")
    total = np.sum([np.asarray(x, dtype=np.float64) for x in inputs], axis=0)
    if op == "Average":
        total = total / len(inputs)
    out = round_to(total, dtype)
    return [out.copy() for _ in inputs]
