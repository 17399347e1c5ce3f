"""Framework-neutral Hierarchical-1-bit-All-Reduce (paper 004, Section 4; specs/birder.md section 4): the
call into the core's ``hierarchical_compressed_allreduce`` (cpp/include/hvdc/hierarchical_allreduce.h).

It carries Birder's +/-1 payload (``PAYLOAD_SIGN``: the result is +/-1.0, the same on every rank) and the
scaled 1-bit payload of 1-bit Adam/LAMB (``PAYLOAD_SCALED``). ``hierarchical=False`` makes every rank its
own node (the flat Birder allreduce); ``True`` uses the node topology of ``init()`` (MPI shared-memory
nodes, or ``HVDC_LOCAL_SIZE`` consecutive ranks).

State sizes, with d the buffer's numel, N the world size, m_loc the ranks per node (1 when flat) and
dpad = ``padded_numel(d, N)``: the worker error (and Birder's moments) c1 = dpad / m_loc, the server error
c2 = dpad / N (``state_numels``).
"""

from __future__ import annotations

from typing import Any

from hvd_compress import _core
from hvd_compress.ops import runtime
from hvd_compress.ops.tensors import as_core_buffer
from hvd_compress.ops.traffic import Traffic, record

PAYLOAD_SIGN = 1  # Birder: +/-1, one bit per element, no scale
PAYLOAD_SCALED = 2  # 1-bit Adam/LAMB: sign bits and one float32 scale per piece


def padded_numel(numel: int, world_size: int) -> int:
    """``numel`` rounded up to a multiple of 8 * world_size."""
    return int(_core.hierarchical_padded_numel(int(numel), int(world_size)))


def node_size(hierarchical: bool) -> int:
    """Ranks per node of the collective: this rank's node size when hierarchical, else 1."""
    return int(runtime.get().node_size()) if hierarchical else 1


def state_numels(numel: int, hierarchical: bool) -> tuple[int, int]:
    """(c1, c2): elements of this rank's worker error (and moments) and of its server error."""
    world = runtime.size()
    dpad = padded_numel(numel, world)
    return dpad // node_size(hierarchical), dpad // world


def bucket_seed(seed: int, bucket: int) -> int:
    """The Philox key of bucket ``bucket``'s draws under the optimizer's ``seed``: ``seed`` XOR (bucket << 32).

    The core keys a call's draws (seed, step, stream, element) with ``element`` the index in that call's padded
    buffer (spec 4; B7: the layout decides only who draws which number), so two buckets reduced at the
    same step with one seed would draw the same uniforms for their first elements. Each bucket therefore keys
    with its own seed: its index in the key's high word. Bucket 0 keeps ``seed``, so a model of one bucket draws
    what the unbucketed rule draws; for seeds below 2**32 no two (seed, bucket) pairs share a key.
    """
    if not 0 <= bucket < 1 << 32:
        raise ValueError(f"bucket index must be in [0, 2**32), got {bucket}")
    return int(seed) ^ (int(bucket) << 32)


def hierarchical_compressed_allreduce_(
    buffer: Any,
    worker_error: Any,
    server_error: Any,
    *,
    payload: int = PAYLOAD_SIGN,
    hierarchical: bool = True,
    seed: int = 0,
    step: int = 0,
    moments: tuple[Any, Any] | None = None,
    beta: float = 0.95,
    eps: float = 1e-8,
    uniforms: tuple[Any, Any] | None = None,
    name: str | None = None,
    traffic: Traffic | None = None,
) -> Any:
    """Replace ``buffer`` (contiguous CPU float32) by its Hierarchical-1-bit-All-Reduce; returns ``buffer``.

    ``moments=(m, b)`` (c1 float32 each): Birder's "grad" mode (spec B5), the input is the gradient and the
    quantized value is the ratio m / (b + eps) of the moments updated from the node-mean gradient.
    ``uniforms=(UW, US)``: injected draws, UW (nodes, dpad) and US (dpad,) float32; otherwise Philox
    (seed, step, stream = node index for workers, 0xFFFFFFFF for the server, element index). Bad input on
    any rank (sizes, NaN/Inf, nodes of unequal size) raises ``UsageError`` on every rank with the state
    unchanged.
    """
    m, b = (as_core_buffer(t) for t in moments) if moments is not None else (None, None)
    uw, us = (as_core_buffer(t) for t in uniforms) if uniforms is not None else (None, None)
    counts = runtime.get_in_order().hierarchical_compressed_allreduce(
        as_core_buffer(buffer), as_core_buffer(worker_error), as_core_buffer(server_error),
        payload=int(payload), hierarchical=bool(hierarchical), seed=int(seed), step=int(step) & 0xFFFFFFFF,
        m=m, b=b, beta=float(beta), eps=float(eps), worker_uniforms=uw, server_uniforms=us, name=name or "",
    )
    record(counts, traffic)
    return buffer
