"""Framework-neutral API of hvd_compress (layer 2 of DESIGN.md): ops, runtime, collectives."""

from hvd_compress.ops.collectives import adasum_fused_, allreduce_, broadcast_, grouped_allreduce_
from hvd_compress.ops.constants import Adasum, Average, OneBitAdam, OneBitLamb, ReduceOp, Sum
from hvd_compress.ops.errors import (
    CommError,
    CommTimeoutError,
    LaunchError,
    MismatchError,
    NotInitializedError,
    UsageError,
)
from hvd_compress.ops.runtime import comm_stats, init, is_initialized, rank, set_timeout, shutdown, size

__all__ = [
    "Adasum",
    "Average",
    "CommError",
    "CommTimeoutError",
    "LaunchError",
    "MismatchError",
    "NotInitializedError",
    "OneBitAdam",
    "OneBitLamb",
    "ReduceOp",
    "Sum",
    "UsageError",
    "adasum_fused_",
    "allreduce_",
    "broadcast_",
    "comm_stats",
    "grouped_allreduce_",
    "init",
    "is_initialized",
    "rank",
    "set_timeout",
    "shutdown",
    "size",
]
