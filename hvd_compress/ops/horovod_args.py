"""Horovod's ``DistributedOptimizer`` arguments (torch and TF/Keras) that a script passes at their defaults
(Horovod's MNIST examples pass ``gradient_predivide_factor=1.0``, ``compression=hvd.Compression.none``, ...):
hvd_compress takes each of them at Horovod's default with every op, so the script keeps its call, and refuses any
other value where the op does not interpret it, naming what the op takes. One table for both faces."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

#: Horovod's arguments that an op may not interpret, each at Horovod's default. ``compression``,
#: ``backward_passes_per_step``, ``op`` and ``process_set`` are taken by every op (checked where they are used).
DEFAULTS = {
    "gradient_predivide_factor": 1.0,
    "sparse_as_dense": False,
    "num_groups": 0,
    "groups": None,
    "device_dense": "",
    "device_sparse": "",
    "scale_local_gradients": True,
}

#: Why a value other than the default is refused, for the message.
_WHY = {
    "gradient_predivide_factor": "it applies to op=Average only, as in Horovod",
    "sparse_as_dense": "this op reduces dense gradients only",
    "num_groups": "bucket_mb sets the fusion of the reductions",
    "groups": "bucket_mb sets the fusion of the reductions",
    "device_dense": "hvd_compress places its reductions itself",
    "device_sparse": "hvd_compress places its reductions itself",
    "scale_local_gradients": "hvd_compress has no local-only gradients",
}

#: What the messages list after an op's own options.
NOTE = ("and Horovod's DistributedOptimizer arguments at their defaults (compression=Compression.none, "
        "backward_passes_per_step, " + ", ".join(f"{k}={v!r}" for k, v in DEFAULTS.items()) +
        ", process_set=global_process_set)")


def _is_default(value: Any, default: Any) -> bool:
    if value is default:
        return True
    try:
        return type(value) in (bool, int, float, str) and bool(value == default)
    except Exception:
        return False


def pop_horovod_defaults(options: dict[str, Any], what: str, keep: Iterable[str] = (),
                         takes: Iterable[str] = ()) -> None:
    """Remove Horovod's arguments (but those in ``keep``, which the caller interprets) from ``options``.
    ``ValueError`` for one not at Horovod's default, naming the options ``what`` takes (``takes``)."""
    keep = set(keep)
    for key, default in DEFAULTS.items():
        if key in keep or key not in options:
            continue
        value = options.pop(key)
        if not _is_default(value, default):
            names = list(takes)
            listed = f"; it takes {', '.join(names)}, {NOTE}" if names else ""
            raise ValueError(f"{what}: {key}={value!r} is not supported ({_WHY[key]}): leave it out or at Horovod's "
                             f"default {default!r}{listed}")
