"""Building an algorithm's options dataclass from ``DistributedOptimizer``'s keyword options, for every
algorithm alike: unknown names and invalid values raise before anything is set up, and the message lists
everything the call accepts, so a user can correct it from the message alone."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from hvd_compress.ops.horovod_args import NOTE

#: The options both faces take for every algorithm beside its own: its buckets (popped before parsing).
BUCKET_OPTIONS = ("bucket_mb", "overlap")


def option_names(options_cls: type, also: Sequence[str] = BUCKET_OPTIONS) -> list[str]:
    """The names ``DistributedOptimizer`` takes for an algorithm: its options' fields, then ``also``."""
    names = [f.name for f in dataclasses.fields(options_cls)]
    return names + [n for n in also if n not in names]


def parse_options(options_cls: type, op_name: str, given: dict[str, Any],
                  also: Sequence[str] = BUCKET_OPTIONS) -> Any:
    """The one parser of every algorithm's options: ``options_cls(**given)``, validated. ``TypeError`` for unknown
    options, naming every option the call takes (the fields, ``also`` taken by the face, Horovod's arguments at
    their defaults), and for a missing required one (a field without a default; ``options_cls.REQUIRED`` maps its
    name to what to give)."""
    fields = dataclasses.fields(options_cls)
    hints = getattr(options_cls, "REQUIRED", {})
    for f in fields:
        if f.name not in given and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise TypeError(f"op={op_name} needs {f.name}={hints.get(f.name, '<value>')}")
    unknown = sorted(set(given) - {f.name for f in fields})
    if unknown:
        raise TypeError(f"op={op_name} got unknown options {unknown}; it takes "
                        f"{', '.join(option_names(options_cls, also))}, {NOTE}")
    options = options_cls(**given)
    options.validate(op_name)
    return options
