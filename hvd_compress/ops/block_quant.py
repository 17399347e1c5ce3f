"""The core's int8/int4 block-quantized allreduce with worker error feedback
(cpp/include/hvdc/block_quant_allreduce.h; the per-element format: cpp/include/hvdc/elementwise/block_quant.h;
NumPy mirror: hvd_compress/reference/block_quant.py): op=DiLoCo's int8 and int4 outer gradients."""

from __future__ import annotations

from typing import Any

from hvd_compress import _core
from hvd_compress.ops import runtime
from hvd_compress.ops.constants import ReduceOp
from hvd_compress.ops.tensors import as_core_buffer
from hvd_compress.ops.traffic import Traffic, record

#: Bits of each block-quantized wire format.
BITS = {"int8": 8, "int4": 4}


def block_quant_allreduce_(tensor: Any, bits: int, error: Any = None, op: Any = ReduceOp.Average,
                           name: str | None = None, traffic: Traffic | None = None) -> Any:
    """Replace ``tensor`` (contiguous float32, CPU) by its int8 (``bits`` 8) or int4 (4) block-quantized reduction
    over all ranks, in place; ``error`` (float32, the same numel, or None) is added before quantizing and becomes
    what this rank's quantization lost. Bad input on any rank (another dtype, a non-finite value) raises on every
    rank with ``tensor`` and ``error`` unchanged; ranks with other ``bits`` raise ``MismatchError``."""
    counts = _core.block_quant_allreduce(runtime.get_in_order(), as_core_buffer(tensor),
                                         None if error is None else as_core_buffer(error), int(bits), int(op),
                                         name or "")
    record(counts, traffic)
    return tensor
