"""Sparse gradients reduced as Horovod reduces them: an allgather of every rank's indices and values."""

from __future__ import annotations

import torch

from hvd_compress import ops
from hvd_compress.ops import call_names
from hvd_compress.ops.constants import ReduceOp
from hvd_compress.torch.gather import allgather


def sparse_allreduce(
    grad: torch.Tensor | None, like: torch.Tensor, sparse_dim: int, op: ReduceOp, name: str
) -> torch.Tensor:
    """The Sum (or Average) over ranks of the sparse COO ``grad`` (None: this rank has none) of parameter ``like``.

    As Horovod's ``sparse_allreduce_async``: indices (transposed, so that the first dim is the entry count) and
    values are allgathered, and the result is coalesced here (duplicate indices summed) and divided by the world
    size for Average. Every rank gets the same tensor.
    """
    if op not in (ReduceOp.Sum, ReduceOp.Average):
        raise ValueError(f"sparse gradients are reduced with Sum or Average, not {op.name}")
    if grad is None:
        dense_shape = like.shape[sparse_dim:]
        indices = torch.zeros(sparse_dim, 0, dtype=torch.int64)
        values = torch.zeros(0, *dense_shape, dtype=like.dtype)
    else:
        indices, values = grad._indices(), grad._values()
    all_indices = allgather(indices.t().contiguous(), name=call_names.suffixed(name, ".indices"))
    all_values = allgather(values.contiguous(), name=call_names.suffixed(name, ".values"))
    out = torch.sparse_coo_tensor(all_indices.t(), all_values, like.shape).coalesce()
    if op == ReduceOp.Average:
        out = out / ops.size()
    return out
