"""Plumbing shared by the optimizer wrappers: subclassing the wrapped optimizer's class (so that
``isinstance``, LR schedulers and ``state_dict()`` keep working), counting backward passes, and
metering the bytes each wrapper moves."""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import Any

import torch

from hvd_compress import ops


def rewrap(optimizer: torch.optim.Optimizer, mixin: type) -> torch.optim.Optimizer:
    """A new optimizer of a subclass of ``type(optimizer)`` + ``mixin``'s methods, on the same param
    groups and with the same state. As Horovod does, so ``isinstance(new, type(optimizer))`` holds."""
    methods: dict[str, Any] = {}
    for klass in reversed(mixin.__mro__[:-1]):  # a mixin's own bases contribute too, nearest last
        methods.update({k: v for k, v in vars(klass).items() if not (k.startswith("__") and k.endswith("__"))})
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), methods)
    state = optimizer.state_dict()
    wrapped = cls.__new__(cls)
    accepted = inspect.signature(optimizer.__class__.__init__).parameters
    kwargs = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    optimizer.__class__.__init__(wrapped, optimizer.param_groups, **kwargs)
    wrapped.load_state_dict(state)
    return wrapped


def check_named_parameters(
    params: list[torch.nn.Parameter], named_parameters: Iterable[tuple[str, torch.nn.Parameter]] | None
) -> dict[int, str]:
    """Names by parameter id; every optimizer parameter must be named when names are given."""
    if named_parameters is None:
        return {id(p): f"param.{i}" for i, p in enumerate(params)}
    names = {id(p): n for n, p in named_parameters}
    missing = [i for i, p in enumerate(params) if id(p) not in names]
    if missing:
        raise ValueError(
            f"named_parameters does not name {len(missing)} parameter(s) of the optimizer (first at index {missing[0]})"
        )
    return names


class PassCounter:
    """Counts backward passes per parameter and refuses more than ``limit`` before a step."""

    def __init__(self, params: list[torch.nn.Parameter], limit: int) -> None:
        if limit < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {limit}")
        self.limit = limit
        self.counts = {id(p): 0 for p in params}

    def add(self, p: torch.Tensor) -> int:
        n = self.counts[id(p)] + 1
        if n > self.limit:
            raise RuntimeError(
                f"gradients were computed {n} times before step(); with backward_passes_per_step="
                f"{self.limit} call step() (or synchronize()) every {self.limit} backward passes"
            )
        self.counts[id(p)] = n
        return n

    def reset(self) -> None:
        for k in self.counts:
            self.counts[k] = 0


class CommMeter:
    """Bytes this wrapper's own collectives sent and received (thread-safe).

    Each core call reports its own bytes (``hvd_compress.ops.traffic``): ``run`` counts exactly the calls
    ``fn`` makes on the calling thread, whatever other threads (the Adasum background thread, a user's
    allreduce) communicate at the same time.
    """

    def __init__(self) -> None:
        self._traffic = ops.Traffic()

    def run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        with ops.counting(self._traffic):
            return fn(*args, **kwargs)

    def take(self) -> dict[str, int]:
        counts = self._traffic.take()
        return {"bytes_sent": counts["bytes_sent"], "bytes_received": counts["bytes_received"]}
