"""Agreeing across ranks before a step changes any state, for every algorithm alike."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

from hvd_compress import ops
from hvd_compress.ops.backend import Backend, Tensor
from hvd_compress.ops.constants import ReduceOp
from hvd_compress.ops.errors import MismatchError
from hvd_compress.ops.traffic import CommMeter

#: The names a face's param group gives its learning rate (torch, Keras).
LEARNING_RATES = ("lr", "learning_rate")


def _value_text(v: Any) -> str | None:
    """``v`` as exact text (a float as the shortest text that reads back as it: equal text, equal value), or None
    for what is no plain value (an object whose text may hold its address)."""
    if isinstance(v, (tuple, list)):
        items = [_value_text(x) for x in v]
        return None if None in items else "(" + ", ".join(items) + ")"  # type: ignore[arg-type]
    if v is None or isinstance(v, (bool, str)):
        return repr(v)
    try:
        return repr(float(v))  # a one-element tensor too (torch's lr may be one)
    except (TypeError, ValueError, RuntimeError):
        return None


def group_text(group: dict[str, Any], keys: Sequence[str] | None = None) -> str:
    """A param group's hyper-parameters, exactly, as text: the ``keys`` it has (those an algorithm's rule reads),
    or, for a wrapped optimizer whose rule may read any of them, every plain entry but its parameters, the learning
    rate first (torch's ``lr``, Keras's ``learning_rate``: what a user most often sets on one rank) and the rest by
    name (the same text whatever order a rank added them in)."""
    if keys is None:
        keys = sorted(k for k in group if k != "params")
        keys = [*(k for k in LEARNING_RATES if k in keys), *(k for k in keys if k not in LEARNING_RATES)]
    texts = ((k, _value_text(group[k])) for k in keys if k in group)
    return ", ".join(f"{k}={t}" for k, t in texts if t is not None)


def tagged(name: str, groups: Sequence[dict[str, Any]], keys: Sequence[str] | None = None) -> str:
    """``name`` with a hash of ``groups``' hyper-parameters (``group_text``): the core compares the ranks' names
    of every collective before any data moves, so ranks whose hyper-parameters differ raise MismatchError on every
    rank instead of stepping apart silently, at no cost in bytes or calls. Take the groups on the program's
    thread (a bucket reducing in the background must not read an lr the program sets meanwhile)."""
    text = "; ".join(group_text(g, keys) for g in groups)
    return f"{name}@{zlib.crc32(text.encode()):08x}"


def mismatch_explained(e: MismatchError, who: str, groups: Sequence[dict[str, Any]] | None,
                       keys: Sequence[str] | None = None) -> MismatchError:
    """``e`` (raised on every rank), with this rank's hyper-parameters where the names differed (``tagged``):
    what the user must make equal. Any other mismatch is returned as it is."""
    if "name (hash)" not in str(e) or not groups:
        return e
    listed = "; ".join(f"group {k}: {group_text(g, keys)}" for k, g in enumerate(groups))
    return MismatchError(
        f"{e}\n  {who}: each collective's name carries a hash of its param groups' hyper-parameters, which must "
        f"be equal on every rank (ranks whose lr, momentum, betas, eps or weight decay differ step apart: e.g. a "
        f"schedule or ReduceLROnPlateau fed one rank's own metric; average it first). This rank's: {listed}. "
        f"Step not taken, state unchanged")


def nonfinite_everywhere(xp: Backend, buffers: Sequence[Tensor], meter: CommMeter, name: str) -> int:
    """How many of ``buffers`` hold a NaN/Inf, summed over all ranks (one tiny allreduce).

    The core checks each collective's input on every rank, but with several buffers a later one's rejection
    would come after an earlier one's state (error feedback, moments) changed: agreeing first keeps a rejected
    step free of side effects."""
    local = sum(int(xp.any_nonfinite(b)) for b in buffers)
    return counts_everywhere(xp, buffers[0], [local], meter, f"{name}.finite")[0]


def counts_everywhere(xp: Backend, like: Tensor, counts: Sequence[int], meter: CommMeter, name: str) -> list[int]:
    """Each of this rank's ``counts`` summed over all ranks (one tiny allreduce; ``like``: a tensor of the
    backend's kind and device)."""
    flags = xp.float32_like(len(counts), like)
    for i, c in enumerate(counts):
        xp.add_(flags[i:i + 1], float(c))
    meter.run(ops.allreduce_, flags, op=ReduceOp.Sum, name=name)
    return [int(xp.max(flags[i:i + 1])) for i in range(len(counts))]
