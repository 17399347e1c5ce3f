"""Horovod's TF/Keras arguments that tune its own tensor fusion or device placement (``device_dense``,
``device_sparse``, ``num_groups``, ``groups``, ``scale_local_gradients``): hvd_compress's TF faces take them at
Horovod's defaults, so a script keeps its call, and refuse any other value (``bucket_mb`` sets the fusion here)."""

from __future__ import annotations

from typing import Any

DEFAULTS = {"device_dense": "", "device_sparse": "", "num_groups": 0, "groups": None, "scale_local_gradients": True}


def pop_horovod_defaults(options: dict[str, Any], what: str) -> None:
    """Remove Horovod's fusion/placement arguments from ``options``; ValueError for one not at its default."""
    for key, default in DEFAULTS.items():
        if key in options:
            value = options.pop(key)
            if value != default:
                raise ValueError(f"{what}: {key}={value!r} is not supported (Horovod's default {default!r} only; "
                                 "bucket_mb sets the fusion of the reductions)")
