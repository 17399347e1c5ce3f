"""Agreeing across ranks before a step changes any state, for every algorithm alike."""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping, Sequence
from typing import Any

from hvd_compress import ops
from hvd_compress.ops import call_names
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


def _call_text(v: Any) -> str | None:
    """An op's name or option as the user wrote it (``OneBitAdam``, ``10``, ``True``), or None for no plain value.
    Options are validated to their types, so equal values give equal text without ``_value_text``'s floats."""
    if isinstance(v, enum.Enum):
        return v.name
    if isinstance(v, (str, bool, int)):
        return str(v)
    return _value_text(v)


def _group_items(group: dict[str, Any], keys: Sequence[str] | None = None) -> list[tuple[str, str]]:
    """``group_text``'s entries as (key, exact text) pairs."""
    if keys is None:
        keys = sorted(k for k in group if k != "params")
        keys = [*(k for k in LEARNING_RATES if k in keys), *(k for k in keys if k not in LEARNING_RATES)]
    texts = ((k, _value_text(group[k])) for k in keys if k in group)
    return [(k, t) for k, t in texts if t is not None]


def group_text(group: dict[str, Any], keys: Sequence[str] | None = None) -> str:
    """A param group's hyper-parameters, exactly, as text: the ``keys`` it has (those an algorithm's rule reads),
    or, for a wrapped optimizer whose rule may read any of them, every plain entry but its parameters, the learning
    rate first (torch's ``lr``, Keras's ``learning_rate``: what a user most often sets on one rank) and the rest by
    name (the same text whatever order a rank added them in)."""
    return ", ".join(f"{k}={t}" for k, t in _group_items(group, keys))


def _detail_lines(call: Mapping[str, Any] | None, groups: Sequence[dict[str, Any]],
                  keys: Sequence[str] | None) -> list[str]:
    """The "key=value" lines of a tagged name's details: the call's own (its op and options), then each param
    group's hyper-parameters (named "lr", or "lr (group 1)" where there are several groups)."""
    lines = [f"{k}={t}" for k, t in ((k, _call_text(v)) for k, v in (call or {}).items()) if t is not None]
    for g, group in enumerate(groups):
        lines += [f"{k}={t}" if len(groups) == 1 else f"{k} (group {g})={t}" for k, t in _group_items(group, keys)]
    return lines


def tagged(name: str, groups: Sequence[dict[str, Any]], keys: Sequence[str] | None = None,
           call: Mapping[str, Any] | None = None) -> str:
    """``name`` with ``call`` (the op and its options) and ``groups``' hyper-parameters (``group_text``) after a "|",
    as "key=value" lines: the core hashes the whole name into the signature it compares across ranks before any
    data moves, so ranks whose op, options or hyper-parameters differ raise MismatchError on every rank instead of
    stepping apart silently, at no cost in bytes or calls; its message shows the name before the "|" and names each
    line that differs, with every rank's value (``cpp/src/signature.cc``). Take the groups on the program's thread
    (a bucket reducing in the background must not read an lr the program sets meanwhile)."""
    return f"{name}|" + "\n".join(_detail_lines(call, groups, keys))


def with_details(name: str, details: Mapping[str, Any]) -> str:
    """``name`` with ``details`` as ``tagged`` writes them: hashed into the signature, named with every rank's value
    where they differ."""
    lines = [f"{k}={t}" for k, t in ((k, _call_text(v)) for k, v in details.items()) if t is not None]
    return f"{name}|" + "\n".join(lines)


#: A line of the core's MismatchError that names a field whose value differs: "  <field>: rank 0=...".
_DIFFERING = re.compile(r"^  (.+?): rank 0=", re.MULTILINE)


def differing_fields(e: MismatchError) -> list[str]:
    """The fields (signature fields, details of the call names) whose values the core's message lists as
    different between ranks, a group's hyper-parameter without its " (group k)"."""
    return [re.sub(r" \(group \d+\)$", "", f) for f in _DIFFERING.findall(str(e))]


def mismatch_explained(e: MismatchError, who: str, groups: Sequence[dict[str, Any]] | None,
                       keys: Sequence[str] | None = None) -> MismatchError:
    """``e`` (raised on every rank), with this rank's hyper-parameters where some of them differ between ranks (the
    core's message names each differing one with every rank's value): what the user must make equal, and the usual
    cause. Any other mismatch (the ops, their options, the tensors) is returned as it is: its message names what
    differs."""
    if not groups:
        return e
    hyper = {k for g in groups for k in (keys if keys is not None else g) if k != "params"}
    if not hyper.intersection(differing_fields(e)):
        return e
    listed = "; ".join(f"group {k}: {group_text(g, keys)}" for k, g in enumerate(groups))
    return MismatchError(
        f"{e}\n  {who}: the hyper-parameters listed above differ between ranks, which would step them apart (e.g. "
        f"a schedule or ReduceLROnPlateau fed one rank's own metric; average it first). This rank's: {listed}. "
        f"Step not taken, state unchanged")


def nonfinite_everywhere(xp: Backend, buffers: Sequence[Tensor], meter: CommMeter, name: str) -> int:
    """How many of ``buffers`` hold a NaN/Inf, summed over all ranks (one tiny allreduce).

    The core checks each collective's input on every rank, but with several buffers a later one's rejection
    would come after an earlier one's state (error feedback, moments) changed: agreeing first keeps a rejected
    step free of side effects."""
    local = sum(int(xp.any_nonfinite(b)) for b in buffers)
    return counts_everywhere(xp, buffers[0], [local], meter, call_names.suffixed(name, ".finite"))[0]


def counts_everywhere(xp: Backend, like: Tensor, counts: Sequence[int], meter: CommMeter, name: str) -> list[int]:
    """Each of this rank's ``counts`` summed over all ranks (one tiny allreduce; ``like``: a tensor of the
    backend's kind and device)."""
    flags = xp.float32_like(len(counts), like)
    for i, c in enumerate(counts):
        xp.add_(flags[i:i + 1], float(c))
    meter.run(ops.allreduce_, flags, op=ReduceOp.Sum, name=name)
    return [int(xp.max(flags[i:i + 1])) for i in range(len(counts))]
