"""Building an algorithm's options dataclass from ``DistributedOptimizer``'s keyword options, for every
algorithm alike: unknown names and invalid values raise before anything is set up."""

from __future__ import annotations

import dataclasses
from typing import Any


def build_options(options_cls: type, op_name: str, given: dict[str, Any]) -> Any:
    """``options_cls(**given)``, validated; ``TypeError`` naming unknown options and the ones it takes."""
    names = [f.name for f in dataclasses.fields(options_cls)]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise TypeError(f"op={op_name} got unknown options {unknown}; it takes {', '.join(names)}")
    options = options_cls(**given)
    options.validate(op_name)
    return options
